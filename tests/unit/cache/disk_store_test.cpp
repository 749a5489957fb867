// DiskStore: the local-disk tier (cache/disk_store.h).
#include "cache/disk_store.h"

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <fcntl.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <filesystem>
#include <thread>

#include "tier_test_util.h"

namespace kestrel {
namespace {

using tiertest::bytes_of;
using tiertest::count_files;
using tiertest::key_of;
using tiertest::ScratchDir;

std::unique_ptr<DiskStore> open_store(const std::string& dir, int64_t budget,
                                      std::function<int(const Digest&)> fault = nullptr) {
  DiskStoreOptions o;
  o.dir = dir;
  o.budget_bytes = budget;
  o.write_fault = std::move(fault);
  auto s = DiskStore::open(std::move(o));
  EXPECT_TRUE(s) << s.error().message();
  return s ? std::move(*s) : nullptr;
}

std::optional<std::vector<uint8_t>> must_get(DiskStore& s, const Digest& k) {
  auto r = s.get(k);
  EXPECT_TRUE(r) << r.error().message();
  return r ? *r : std::nullopt;
}

// Sets a file's access and modify times to `sec` seconds after the epoch.
void set_time(const std::string& path, int64_t sec) {
  const struct timespec t[2] = {{sec, 0}, {sec, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), t, 0), 0) << path;
}

TEST(DiskStore, PutGetContainsErase) {
  ScratchDir d;
  auto s = open_store(d.path(), 1 << 20);
  ASSERT_TRUE(s);
  const auto a = bytes_of(1, 1000);
  EXPECT_FALSE(must_get(*s, key_of(1)).has_value());
  ASSERT_TRUE(s->put(key_of(1), a).is_ok());
  EXPECT_TRUE(*s->contains(key_of(1)));
  EXPECT_FALSE(*s->contains(key_of(2)));
  EXPECT_EQ(must_get(*s, key_of(1)), a);
  // One file, at the fan-out path.
  const std::string hex = to_hex(key_of(1));
  EXPECT_EQ(s->path_of(key_of(1)), d.path() + "/" + hex.substr(0, 2) + "/" + hex.substr(2, 2) + "/" + hex);
  EXPECT_TRUE(std::filesystem::is_regular_file(s->path_of(key_of(1))));
  TierStoreStats st = s->stats();
  EXPECT_EQ(st.objects, 1);
  EXPECT_EQ(st.bytes, 1000);
  EXPECT_EQ(st.writes, 1);
  EXPECT_EQ(st.write_bytes, 1000);
  EXPECT_EQ(st.reads, 2);
  EXPECT_EQ(st.hits, 1);
  EXPECT_EQ(st.read_bytes, 1000);
  EXPECT_EQ(st.errors, 0);
  EXPECT_GT(st.write_ns, 0);
  EXPECT_GT(st.read_ns, 0);
  ASSERT_TRUE(s->erase(key_of(1)).is_ok());
  ASSERT_TRUE(s->erase(key_of(1)).is_ok());  // absent is fine
  EXPECT_FALSE(*s->contains(key_of(1)));
  EXPECT_FALSE(std::filesystem::exists(s->path_of(key_of(1))));
  EXPECT_EQ(s->stats().objects, 0);
  EXPECT_EQ(s->stats().bytes, 0);
}

TEST(DiskStore, PutOfAStoredKeyIsANoOp) {
  ScratchDir d;
  auto s = open_store(d.path(), 1 << 20);
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->put(key_of(1), bytes_of(1, 100)).is_ok());
  ASSERT_TRUE(s->put(key_of(1), bytes_of(2, 300)).is_ok());
  EXPECT_EQ(must_get(*s, key_of(1)), bytes_of(1, 100));  // the first write stands
  EXPECT_EQ(s->stats().writes, 1);
  EXPECT_EQ(s->stats().duplicates, 1);
  EXPECT_EQ(s->stats().bytes, 100);
}

TEST(DiskStore, EvictsLeastRecentlyUsedToStayInBudget) {
  ScratchDir d;
  auto s = open_store(d.path(), 3 * 100);
  ASSERT_TRUE(s);
  for (uint32_t i = 1; i <= 3; ++i) ASSERT_TRUE(s->put(key_of(i), bytes_of(i, 100)).is_ok());
  ASSERT_TRUE(must_get(*s, key_of(1)).has_value());  // 2 is now the least recently used
  ASSERT_TRUE(s->put(key_of(4), bytes_of(4, 100)).is_ok());
  EXPECT_FALSE(*s->contains(key_of(2)));
  EXPECT_FALSE(std::filesystem::exists(s->path_of(key_of(2))));
  for (uint32_t i : {1u, 3u, 4u}) EXPECT_EQ(must_get(*s, key_of(i)), bytes_of(i, 100)) << i;
  // A bigger object evicts as many as it needs, oldest first (3, then 4; 1 and 4 were read after 3).
  ASSERT_TRUE(s->put(key_of(5), bytes_of(5, 150)).is_ok());
  EXPECT_FALSE(*s->contains(key_of(3)));
  EXPECT_FALSE(*s->contains(key_of(1)));
  EXPECT_TRUE(*s->contains(key_of(4)));
  const TierStoreStats st = s->stats();
  EXPECT_EQ(st.evictions, 3);
  EXPECT_EQ(st.bytes, 250);
  EXPECT_LE(st.bytes, 300);
  EXPECT_EQ(count_files(d.path()), 2 + 1);  // two objects and LOCK
}

TEST(DiskStore, ObjectLargerThanTheBudgetIsRefused) {
  ScratchDir d;
  auto s = open_store(d.path(), 100);
  ASSERT_TRUE(s);
  const Status st = s->put(key_of(1), bytes_of(1, 101));
  EXPECT_EQ(st.code(), StatusCode::kTooLarge);
  EXPECT_EQ(s->stats().errors, 1);
  EXPECT_EQ(s->stats().objects, 0);
}

TEST(DiskStore, ReopenKeepsObjectsAndTheirRecency) {
  ScratchDir d;
  {
    auto s = open_store(d.path(), 1 << 20);
    ASSERT_TRUE(s);
    for (uint32_t i = 1; i <= 4; ++i) ASSERT_TRUE(s->put(key_of(i), bytes_of(i, 100)).is_ok());
    // File times decide the order after a restart; make them distinct (coarse clocks may give equal ones).
    for (uint32_t i = 1; i <= 4; ++i) set_time(s->path_of(key_of(i)), 1000000 + i);
    // A read records its use on disk.
    ASSERT_TRUE(must_get(*s, key_of(1)).has_value());
    struct stat st;
    ASSERT_EQ(::stat(s->path_of(key_of(1)).c_str(), &st), 0);
    EXPECT_GT(st.st_atim.tv_sec, 1000004);
  }
  {
    auto s = open_store(d.path(), 1 << 20);
    ASSERT_TRUE(s);
    EXPECT_EQ(s->stats().objects, 4);
    EXPECT_EQ(s->stats().bytes, 400);
    for (uint32_t i = 1; i <= 4; ++i) EXPECT_EQ(must_get(*s, key_of(i)), bytes_of(i, 100)) << i;
  }
  for (uint32_t i = 1; i <= 4; ++i) {
    const std::string hex = to_hex(key_of(i));
    set_time(d.path() + "/" + hex.substr(0, 2) + "/" + hex.substr(2, 2) + "/" + hex, 1000000 + i);
  }
  // A smaller budget at open evicts the least recently used: 1 and 2 go, 3 and 4 stay.
  auto s = open_store(d.path(), 200);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->stats().objects, 2);
  EXPECT_EQ(s->stats().evictions, 2);
  EXPECT_FALSE(*s->contains(key_of(1)));
  EXPECT_FALSE(*s->contains(key_of(2)));
  EXPECT_EQ(must_get(*s, key_of(3)), bytes_of(3, 100));
  EXPECT_EQ(must_get(*s, key_of(4)), bytes_of(4, 100));
}

TEST(DiskStore, ScanIgnoresForeignFilesAndRemovesStaleTemporaries) {
  ScratchDir d;
  {
    auto s = open_store(d.path(), 1 << 20);
    ASSERT_TRUE(s);
    ASSERT_TRUE(s->put(key_of(1), bytes_of(1, 10)).is_ok());
  }
  std::filesystem::create_directories(d.path() + "/ab/cd");
  { std::ofstream(d.path() + "/tmp/crashed-writer.0") << "partial"; }
  { std::ofstream(d.path() + "/ab/cd/not-a-key") << "x"; }
  { std::ofstream(d.path() + "/ab/cd/" + std::string(64, 'e')) << "misplaced"; }  // wrong fan-out directory
  auto s = open_store(d.path(), 1 << 20);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->stats().objects, 1);
  EXPECT_TRUE(std::filesystem::is_empty(d.path() + "/tmp"));
}

TEST(DiskStore, OneOwnerPerDirectory) {
  ScratchDir d;
  auto s = open_store(d.path(), 1 << 20);
  ASSERT_TRUE(s);
  DiskStoreOptions o;
  o.dir = d.path();
  auto second = DiskStore::open(o);
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code(), StatusCode::kUnavailable);
  s.reset();
  EXPECT_TRUE(DiskStore::open(o));  // released with its owner
}

TEST(DiskStore, FileRemovedBehindItsBackIsAMiss) {
  ScratchDir d;
  auto s = open_store(d.path(), 1 << 20);
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->put(key_of(1), bytes_of(1, 10)).is_ok());
  std::filesystem::remove(s->path_of(key_of(1)));
  EXPECT_FALSE(must_get(*s, key_of(1)).has_value());
  EXPECT_FALSE(*s->contains(key_of(1)));
  EXPECT_EQ(s->stats().bytes, 0);
  EXPECT_EQ(s->stats().errors, 0);
}

TEST(DiskStore, FailedWriteIsCountedAndLeavesNoTemporaryFile) {
  ScratchDir d;
  int fault = ENOSPC;
  auto s = open_store(d.path(), 1 << 20, [&](const Digest&) { return fault; });
  ASSERT_TRUE(s);
  Status st = s->put(key_of(1), bytes_of(1, 4096));
  EXPECT_EQ(st.code(), StatusCode::kIo);
  EXPECT_NE(st.message().find("No space left"), std::string::npos) << st.message();
  fault = EIO;
  st = s->put(key_of(2), bytes_of(2, 4096));
  EXPECT_NE(st.message().find("Input/output error"), std::string::npos) << st.message();
  EXPECT_TRUE(std::filesystem::is_empty(d.path() + "/tmp"));
  EXPECT_FALSE(*s->contains(key_of(1)));
  TierStoreStats stats = s->stats();
  EXPECT_EQ(stats.errors, 2);
  EXPECT_EQ(stats.objects, 0);
  EXPECT_EQ(stats.bytes, 0);
  fault = 0;  // the device recovered: the same key can be written now
  ASSERT_TRUE(s->put(key_of(1), bytes_of(1, 4096)).is_ok());
  EXPECT_EQ(must_get(*s, key_of(1)), bytes_of(1, 4096));
}

// A real full filesystem: a 64 KiB tmpfs (needs CAP_SYS_ADMIN; skipped where mounting is not allowed).
class TmpfsMount {
 public:
  explicit TmpfsMount(const std::string& dir) : dir_(dir) {
    mounted_ = ::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=64k") == 0;
    errno_ = errno;
  }
  ~TmpfsMount() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  int error() const { return errno_; }

 private:
  std::string dir_;
  bool mounted_ = false;
  int errno_ = 0;
};

TEST(DiskStore, FullFilesystemIsAnErrorNotACrash) {
  ScratchDir d;
  TmpfsMount m(d.path());
  if (!m.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(m.error()) << ")";
  auto s = open_store(d.path(), 1 << 20);  // budget far above the filesystem
  ASSERT_TRUE(s);
  int stored = 0;
  Status failure;
  for (uint32_t i = 0; i < 64 && failure.is_ok(); ++i) {
    failure = s->put(key_of(i), bytes_of(i, 10000));
    if (failure.is_ok()) ++stored;
  }
  ASSERT_FALSE(failure.is_ok()) << "64 x 10 kB fitted into 64 KiB";
  EXPECT_EQ(failure.code(), StatusCode::kIo);
  EXPECT_NE(failure.message().find("No space left"), std::string::npos) << failure.message();
  EXPECT_GE(stored, 1);
  EXPECT_EQ(s->stats().errors, 1);
  EXPECT_EQ(s->stats().objects, stored);
  EXPECT_TRUE(std::filesystem::is_empty(d.path() + "/tmp"));
  for (int i = 0; i < stored; ++i)
    EXPECT_EQ(must_get(*s, key_of(static_cast<uint32_t>(i))), bytes_of(static_cast<uint32_t>(i), 10000));
  // Room made by erasing: writes work again.
  ASSERT_TRUE(s->erase(key_of(0)).is_ok());
  EXPECT_TRUE(s->put(key_of(1000), bytes_of(1000, 10000)).is_ok());
  s.reset();
}

TEST(DiskStore, ConcurrentWritersAndReadersStayConsistent) {
  ScratchDir d;
  auto s = open_store(d.path(), 40 * 500);
  ASSERT_TRUE(s);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&s, t] {
      for (uint32_t i = 0; i < 200; ++i) {
        const uint32_t k = (i * 7 + static_cast<uint32_t>(t)) % 100;  // overlapping keys across threads
        EXPECT_TRUE(s->put(key_of(k), bytes_of(k, 500)).is_ok());
        auto g = s->get(key_of((k + 3) % 100));
        ASSERT_TRUE(g);
        if (g->has_value()) {
          EXPECT_EQ(**g, bytes_of((k + 3) % 100, 500));
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  const TierStoreStats st = s->stats();
  EXPECT_LE(st.bytes, 40 * 500);
  EXPECT_EQ(st.bytes, st.objects * 500);
  EXPECT_EQ(st.errors, 0);
  EXPECT_EQ(count_files(d.path()), st.objects + 1);  // + LOCK
  EXPECT_TRUE(std::filesystem::is_empty(d.path() + "/tmp"));
}

}  // namespace
}  // namespace kestrel
