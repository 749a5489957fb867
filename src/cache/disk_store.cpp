#include "cache/disk_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <tuple>
#include <vector>

namespace kestrel {
namespace {

namespace fs = std::filesystem;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string errno_text(int e) { return std::strerror(e); }

bool is_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool parse_hex_key(std::string_view s, Digest& out) {
  if (s.size() != 64 || !is_hex(s)) return false;
  auto nib = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (size_t i = 0; i < 32; ++i) out[i] = static_cast<uint8_t>(nib(s[2 * i]) << 4 | nib(s[2 * i + 1]));
  return true;
}

// mkdir that accepts an existing directory.
bool ensure_dir(const std::string& p) { return ::mkdir(p.c_str(), 0755) == 0 || errno == EEXIST; }

// Writes all of `n` bytes, retrying short writes and EINTR; errno is set on failure.
bool write_all(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

Result<std::unique_ptr<DiskStore>> DiskStore::open(DiskStoreOptions opts) {
  if (opts.dir.empty()) return invalid_argument("disk store: empty directory");
  if (opts.budget_bytes <= 0) return invalid_argument("disk store: budget must be positive");
  std::error_code ec;
  fs::create_directories(fs::path(opts.dir) / "tmp", ec);
  if (ec) return io_error("disk store: cannot create " + opts.dir + ": " + ec.message());
  std::unique_ptr<DiskStore> s(new DiskStore(std::move(opts)));
  const std::string lock_path = s->opts_.dir + "/LOCK";
  s->lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (s->lock_fd_ < 0) return io_error("disk store: cannot open " + lock_path + ": " + errno_text(errno));
  // The index lives in this process's memory; a second owner would overrun the budget and race the eviction.
  if (::flock(s->lock_fd_, LOCK_EX | LOCK_NB) != 0)
    return unavailable("disk store: " + s->opts_.dir + " is in use by another process");
  // Temporary files left by a writer that crashed between write and rename.
  for (const auto& e : fs::directory_iterator(fs::path(s->opts_.dir) / "tmp", ec)) fs::remove(e.path(), ec);
  KESTREL_RETURN_IF_ERROR(s->scan());
  return s;
}

DiskStore::~DiskStore() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

std::string DiskStore::path_of(const Digest& key) const {
  const std::string hex = to_hex(key);
  return opts_.dir + "/" + hex.substr(0, 2) + "/" + hex.substr(2, 2) + "/" + hex;
}

Status DiskStore::scan() {
  struct Found {
    int64_t time_ns;
    Digest key;
    int64_t size;
  };
  std::vector<Found> found;
  std::error_code ec;
  const fs::path root(opts_.dir);
  for (const auto& l1 : fs::directory_iterator(root, ec)) {
    const std::string n1 = l1.path().filename().string();
    if (n1.size() != 2 || !is_hex(n1) || !l1.is_directory(ec)) continue;
    for (const auto& l2 : fs::directory_iterator(l1.path(), ec)) {
      const std::string n2 = l2.path().filename().string();
      if (n2.size() != 2 || !is_hex(n2) || !l2.is_directory(ec)) continue;
      for (const auto& f : fs::directory_iterator(l2.path(), ec)) {
        const std::string name = f.path().filename().string();
        Digest key;
        if (!parse_hex_key(name, key) || name.compare(0, 2, n1) != 0 || name.compare(2, 2, n2) != 0) continue;
        struct stat st;
        if (::stat(f.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
        // Reads refresh atime explicitly (relatime mounts would not), writes set mtime: the later is the last use.
        const int64_t at = st.st_atim.tv_sec * 1000000000ll + st.st_atim.tv_nsec;
        const int64_t mt = st.st_mtim.tv_sec * 1000000000ll + st.st_mtim.tv_nsec;
        found.push_back({std::max(at, mt), key, static_cast<int64_t>(st.st_size)});
      }
    }
  }
  if (ec) return io_error("disk store: cannot scan " + opts_.dir + ": " + ec.message());
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return std::tie(a.time_ns, a.key) < std::tie(b.time_ns, b.key);
  });
  std::lock_guard<std::mutex> lock(mu_);
  for (const Found& f : found) {  // oldest first, so the most recent ends at the front
    lru_.push_front(f.key);
    index_.emplace(f.key, Entry{f.size, lru_.begin(), ++generation_});
    bytes_ += f.size;
  }
  evict_for(0);  // the budget may have shrunk since the last run
  return Status::ok();
}

void DiskStore::drop_locked(const Digest& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  bytes_ -= it->second.size;
  lru_.erase(it->second.lru);
  index_.erase(it);
}

void DiskStore::evict_for(int64_t need) {
  while (!lru_.empty() && bytes_ + reserved_ + need > opts_.budget_bytes) {
    const Digest victim = lru_.back();
    if (::unlink(path_of(victim).c_str()) != 0 && errno != ENOENT) ++stats_.errors;
    drop_locked(victim);
    ++stats_.evictions;
  }
}

void DiskStore::count_read_error(int64_t t0) {
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.errors;
  stats_.read_ns += now_ns() - t0;
}

Status DiskStore::write_file(const Digest& key, std::span<const uint8_t> bytes, std::string& tmp_path) {
  const int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return io_error("disk store: cannot create " + tmp_path + ": " + errno_text(errno));
  const int fault = opts_.write_fault ? opts_.write_fault(key) : 0;
  bool ok = write_all(fd, bytes.data(), fault != 0 ? bytes.size() / 2 : bytes.size());
  if (ok && fault != 0) {
    ok = false;
    errno = fault;
  }
  const int write_errno = errno;
  // close() can report a deferred write error (NFS, quota), so it counts.
  const bool closed = ::close(fd) == 0;
  const int close_errno = errno;
  if (!ok || !closed) {
    ::unlink(tmp_path.c_str());
    return io_error("disk store: writing " + tmp_path + " failed: " + errno_text(!ok ? write_errno : close_errno));
  }
  const std::string final_path = path_of(key);
  const std::string l1 = final_path.substr(0, opts_.dir.size() + 3);
  const std::string l2 = final_path.substr(0, opts_.dir.size() + 6);
  if (!ensure_dir(l1) || !ensure_dir(l2) || ::rename(tmp_path.c_str(), final_path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp_path.c_str());
    return io_error("disk store: cannot place " + final_path + ": " + errno_text(e));
  }
  return Status::ok();
}

Status DiskStore::put(const Digest& key, std::span<const uint8_t> bytes) {
  const int64_t t0 = now_ns();
  const int64_t size = static_cast<int64_t>(bytes.size());
  std::string tmp_path;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (size > opts_.budget_bytes) {
      ++stats_.errors;
      stats_.write_ns += now_ns() - t0;
      return too_large("disk store: object of " + std::to_string(size) + " bytes exceeds the budget of " +
                       std::to_string(opts_.budget_bytes));
    }
    if (index_.count(key) != 0 || pending_.count(key) != 0) {
      ++stats_.duplicates;
      stats_.write_ns += now_ns() - t0;
      return Status::ok();
    }
    evict_for(size);
    reserved_ += size;
    pending_.insert(key);
    tmp_path = opts_.dir + "/tmp/" + to_hex(key) + "." + std::to_string(tmp_seq_++);
  }
  const Status st = write_file(key, bytes, tmp_path);
  std::lock_guard<std::mutex> lock(mu_);
  pending_.erase(key);
  reserved_ -= size;
  if (st.is_ok()) {
    lru_.push_front(key);
    index_.emplace(key, Entry{size, lru_.begin(), ++generation_});
    bytes_ += size;
    ++stats_.writes;
    stats_.write_bytes += size;
  } else {
    ++stats_.errors;
  }
  stats_.write_ns += now_ns() - t0;
  return st;
}

Result<std::optional<std::vector<uint8_t>>> DiskStore::get(const Digest& key) {
  const int64_t t0 = now_ns();
  auto finish = [&](bool hit, int64_t nbytes) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.reads;
    stats_.hits += hit ? 1 : 0;
    stats_.read_bytes += nbytes;
    stats_.read_ns += now_ns() - t0;
  };
  uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it == index_.end()) {
      ++stats_.reads;
      stats_.read_ns += now_ns() - t0;
      return std::optional<std::vector<uint8_t>>();
    }
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    generation = it->second.generation;
  }
  const std::string path = path_of(key);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) {  // evicted or erased since the lookup, or removed behind our back: a miss
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = index_.find(key);
        if (it != index_.end() && it->second.generation == generation) drop_locked(key);
      }
      finish(false, 0);
      return std::optional<std::vector<uint8_t>>();
    }
    count_read_error(t0);
    return io_error("disk store: cannot open " + path + ": " + errno_text(e));
  }
  struct stat st;
  std::vector<uint8_t> data;
  bool ok = ::fstat(fd, &st) == 0;
  if (ok) {
    data.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (ok && got < data.size()) {
      const ssize_t r = ::read(fd, data.data() + got, data.size() - got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) ok = false;  // an error, or the file shrank under us
      else got += static_cast<size_t>(r);
    }
  }
  const int e = errno;
  if (ok) {
    // Keep the use on disk too, so the recency order survives a restart.
    const struct timespec times[2] = {{0, UTIME_NOW}, {0, UTIME_OMIT}};
    ::futimens(fd, times);
  }
  ::close(fd);
  if (!ok) {
    count_read_error(t0);
    return io_error("disk store: reading " + path + " failed: " + errno_text(e));
  }
  finish(true, static_cast<int64_t>(data.size()));
  return std::optional<std::vector<uint8_t>>(std::move(data));
}

Result<bool> DiskStore::contains(const Digest& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.count(key) != 0;
}

Status DiskStore::erase(const Digest& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (index_.count(key) == 0) return Status::ok();
  const std::string path = path_of(key);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    const int e = errno;
    ++stats_.errors;
    return io_error("disk store: cannot remove " + path + ": " + errno_text(e));
  }
  drop_locked(key);
  return Status::ok();
}

TierStoreStats DiskStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  TierStoreStats s = stats_;
  s.objects = static_cast<int64_t>(index_.size());
  s.bytes = bytes_;
  return s;
}

}  // namespace kestrel
