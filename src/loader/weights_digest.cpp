#include "loader/weights_digest.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

namespace kestrel {
namespace fs = std::filesystem;

namespace {

using Bytes32 = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) { ok_ = ctx_ && EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) == 1; }
  void update(const void* p, size_t n) { ok_ = ok_ && EVP_DigestUpdate(ctx_.get(), p, n) == 1; }
  void field(const std::string& s) {
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(s.size()) >> (8 * i));
    update(len, sizeof len);
    update(s.data(), s.size());
  }
  bool finish(Bytes32& out) {
    unsigned n = 0;
    return ok_ && EVP_DigestFinal_ex(ctx_.get(), out.data(), &n) == 1 && n == out.size();
  }

 private:
  struct Free {
    void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
  };
  std::unique_ptr<EVP_MD_CTX, Free> ctx_;
  bool ok_ = false;
};

std::string hex(const Bytes32& d) {
  static const char* k = "0123456789abcdef";
  std::string s(64, '0');
  for (size_t i = 0; i < d.size(); ++i) s[2 * i] = k[d[i] >> 4], s[2 * i + 1] = k[d[i] & 15];
  return s;
}

bool unhex(const std::string& s, Bytes32& d) {
  if (s.size() != 64) return false;
  auto v = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
  for (size_t i = 0; i < d.size(); ++i) {
    const int hi = v(s[2 * i]), lo = v(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    d[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return true;
}

struct FileJob {
  std::string name;  // relative to the model directory ("" for a single-file model)
  fs::path path;     // canonical
  struct stat st {};
  Bytes32 sum{};
  bool from_memo = false;
  Status status;
};

// What the memo keys a file's digest on: if any of these changed, the bytes may have.
std::string identity(const FileJob& f) {
  std::ostringstream o;
  o << "kestrel-file-sha256-v1 " << f.st.st_size << ' ' << f.st.st_mtim.tv_sec << '.' << f.st.st_mtim.tv_nsec << ' '
    << f.st.st_ino << ' ' << f.st.st_dev;
  return o.str();
}

fs::path memo_path(const std::string& memo_dir, const FileJob& f) {
  Sha256 h;
  h.field(f.path.string());
  Bytes32 d{};
  h.finish(d);
  return fs::path(memo_dir) / "weights-digests" / hex(d);
}

bool read_memo(const std::string& memo_dir, FileJob& f) {
  std::ifstream in(memo_path(memo_dir, f));
  std::string id, sum;
  if (!in || !std::getline(in, id) || !std::getline(in, sum)) return false;
  return id == identity(f) && unhex(sum, f.sum);
}

// Best effort: a memo that cannot be written costs a re-read next time, nothing else.
void write_memo(const std::string& memo_dir, const FileJob& f) {
  const fs::path p = memo_path(memo_dir, f);
  std::error_code ec;
  fs::create_directories(p.parent_path(), ec);
  const fs::path tmp = p.string() + ".tmp" + std::to_string(::getpid()) + "." +
                       std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << identity(f) << '\n' << hex(f.sum) << '\n';
    if (!out.flush()) {
      fs::remove(tmp, ec);
      return;
    }
  }
  fs::rename(tmp, p, ec);
  if (ec) fs::remove(tmp, ec);
}

Status hash_file(FileJob& f) {
  const int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error("weights digest: cannot open " + f.path.string());
  Sha256 h;
  std::vector<uint8_t> buf(4 << 20);
  int64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      ::close(fd);
      return io_error("weights digest: read error in " + f.path.string());
    }
    if (n == 0) break;
    h.update(buf.data(), static_cast<size_t>(n));
    total += n;
  }
  ::close(fd);
  if (total != f.st.st_size) return io_error("weights digest: " + f.path.string() + " changed size while being read");
  if (!h.finish(f.sum)) return io_error("weights digest: SHA-256 failed");
  return Status::ok();
}

}  // namespace

Result<WeightsDigest> weights_digest(const std::string& model_path, const std::string& memo_dir) {
  const auto t0 = std::chrono::steady_clock::now();
  std::error_code ec;
  const fs::path root = fs::canonical(model_path, ec);
  if (ec) return not_found("weights digest: " + model_path + ": " + ec.message());
  std::vector<FileJob> files;
  if (fs::is_directory(root, ec)) {
    for (const auto& e : fs::directory_iterator(root, ec)) {
      if (!e.is_regular_file(ec)) continue;
      FileJob f;
      f.name = e.path().filename().string();
      f.path = fs::canonical(e.path(), ec);
      if (ec) return io_error("weights digest: " + e.path().string() + ": " + ec.message());
      files.push_back(std::move(f));
    }
    if (ec) return io_error("weights digest: cannot list " + root.string() + ": " + ec.message());
  } else {
    FileJob f;
    f.path = root;
    files.push_back(std::move(f));
  }
  if (files.empty()) return not_found("weights digest: no files in " + root.string());
  std::sort(files.begin(), files.end(), [](const FileJob& a, const FileJob& b) { return a.name < b.name; });
  for (auto& f : files) {
    if (::stat(f.path.c_str(), &f.st) != 0) return io_error("weights digest: cannot stat " + f.path.string());
    f.from_memo = !memo_dir.empty() && read_memo(memo_dir, f);
  }

  // Files not in the memo, hashed in parallel (one file per thread at a time: SHA-256 of one stream is serial).
  std::vector<FileJob*> todo;
  for (auto& f : files)
    if (!f.from_memo) todo.push_back(&f);
  std::sort(todo.begin(), todo.end(), [](const FileJob* a, const FileJob* b) { return a->st.st_size > b->st.st_size; });
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < todo.size();) {
      todo[i]->status = hash_file(*todo[i]);
      if (todo[i]->status.is_ok() && !memo_dir.empty()) write_memo(memo_dir, *todo[i]);
    }
  };
  const size_t n_threads = std::min<size_t>(todo.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < n_threads; ++t) pool.emplace_back(work);
  if (n_threads > 0) work();
  for (auto& t : pool) t.join();

  WeightsDigest out;
  Sha256 h;
  h.field("kestrel-weights-v1");
  for (const auto& f : files) {
    if (!f.status.is_ok()) return f.status;
    h.field(f.name);
    h.update(f.sum.data(), f.sum.size());
    out.files += 1;
    out.bytes += f.st.st_size;
    if (!f.from_memo) out.hashed_bytes += f.st.st_size;
  }
  Bytes32 d{};
  if (!h.finish(d)) return io_error("weights digest: SHA-256 failed");
  out.hex = hex(d);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace kestrel
