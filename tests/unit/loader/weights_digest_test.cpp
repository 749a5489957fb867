// The weights digest (loader/weights_digest.h): content, not location; the memo is used when the files are the same
// and ignored when they may have changed.
#include "loader/weights_digest.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace kestrel {
namespace {
namespace fs = std::filesystem;

std::string weights_bytes() {
  std::string s;
  for (int r = 0; r < 4099; ++r)
    for (int i = 0; i < 256; ++i) s.push_back(static_cast<char>(i));
  return s;
}

void write(const fs::path& p, const std::string& bytes) {
  std::ofstream o(p, std::ios::binary | std::ios::trunc);
  o << bytes;
}

class WeightsDigestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("kestrel-digest-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "a");
    write(root_ / "a" / "config.json", "{\"a\": 1}\n");
    write(root_ / "a" / "model.safetensors", weights_bytes());
    fs::create_directories(root_ / "a" / "sub");  // not a file: not part of the digest
    memo_ = (root_ / "memo").string();
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path root_;
  std::string memo_;
};

// Expected digests computed independently with Python's hashlib from the encoding in weights_digest.h:
//   field = lambda s: struct.pack('<Q', len(s)) + s
//   files = {'config.json': b'{"a": 1}\n', 'model.safetensors': bytes(range(256)) * 4099}
//   dir:    sha256(field(b'kestrel-weights-v1') + b''.join(field(n.encode()) + sha256(files[n]).digest()
//                                                          for n in sorted(files)))
//   single: sha256(field(b'kestrel-weights-v1') + field(b'') + sha256(files['model.safetensors']).digest())
constexpr const char* kDirDigest = "0b01696e9229b2c922e1fe771b685bf839ef85a6c4638b950bc1dd5ef5740c6e";
constexpr const char* kFileDigest = "d3c6eb3a43c3e63a5680efb414c4c83e775b08605f42e25671825c86aa543897";

TEST_F(WeightsDigestTest, KnownVectorsForADirectoryAndASingleFile) {
  auto d = weights_digest((root_ / "a").string(), "");
  ASSERT_TRUE(d) << d.error().message();
  EXPECT_EQ(d->hex, kDirDigest);
  EXPECT_EQ(d->files, 2);
  EXPECT_EQ(d->bytes, 9 + 256 * 4099);
  EXPECT_EQ(d->hashed_bytes, d->bytes);
  auto f = weights_digest((root_ / "a" / "model.safetensors").string(), "");
  ASSERT_TRUE(f) << f.error().message();
  EXPECT_EQ(f->hex, kFileDigest);
}

TEST_F(WeightsDigestTest, SameBytesElsewhereGiveTheSameDigestAndChangedBytesDoNot) {
  fs::copy(root_ / "a", root_ / "b", fs::copy_options::recursive);
  auto a = weights_digest((root_ / "a").string(), memo_);
  auto b = weights_digest((root_ / "b").string(), memo_);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->hex, b->hex);
  // A renamed single file keeps its digest.
  fs::rename(root_ / "b" / "model.safetensors", root_ / "b" / "renamed.gguf");
  auto r = weights_digest((root_ / "b" / "renamed.gguf").string(), memo_);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->hex, kFileDigest);
  // One byte of the weights changed (same size): another digest.
  std::string w = weights_bytes();
  w[123457] ^= 1;
  write(root_ / "a" / "model.safetensors", w);
  auto c = weights_digest((root_ / "a").string(), memo_);
  ASSERT_TRUE(c);
  EXPECT_NE(c->hex, a->hex);
  // A renamed file inside a directory changes it too (the set of files is part of the model).
  fs::rename(root_ / "b" / "renamed.gguf", root_ / "b" / "other.safetensors");
  auto n = weights_digest((root_ / "b").string(), memo_);
  ASSERT_TRUE(n);
  EXPECT_NE(n->hex, a->hex);
}

TEST_F(WeightsDigestTest, TheMemoSavesTheReadsAndIsIgnoredWhenTheFileMayHaveChanged) {
  auto first = weights_digest((root_ / "a").string(), memo_);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->hashed_bytes, first->bytes);
  auto again = weights_digest((root_ / "a").string(), memo_);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->hex, kDirDigest);
  EXPECT_EQ(again->hashed_bytes, 0);
  // Same size, new content and a new modification time: the memo entry no longer matches and the file is re-read.
  std::string w = weights_bytes();
  w[7] ^= 0x40;
  write(root_ / "a" / "model.safetensors", w);
  struct timespec ts[2] = {{0, UTIME_OMIT}, {1234567890, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, (root_ / "a" / "model.safetensors").c_str(), ts, 0), 0);
  auto changed = weights_digest((root_ / "a").string(), memo_);
  ASSERT_TRUE(changed);
  EXPECT_EQ(changed->hashed_bytes, static_cast<int64_t>(w.size()));
  EXPECT_NE(changed->hex, kDirDigest);
  // A memo entry that does not parse is ignored (re-read, same digest) and rewritten.
  for (const auto& e : fs::directory_iterator(fs::path(memo_) / "weights-digests")) write(e.path(), "garbage\nzz\n");
  auto garbled = weights_digest((root_ / "a").string(), memo_);
  ASSERT_TRUE(garbled);
  EXPECT_EQ(garbled->hex, changed->hex);
  EXPECT_EQ(garbled->hashed_bytes, garbled->bytes);
  auto healed = weights_digest((root_ / "a").string(), memo_);
  ASSERT_TRUE(healed);
  EXPECT_EQ(healed->hashed_bytes, 0);
}

TEST_F(WeightsDigestTest, MissingOrEmptyModelIsAnError) {
  auto m = weights_digest((root_ / "nowhere").string(), memo_);
  ASSERT_FALSE(m);
  EXPECT_NE(m.error().message().find("nowhere"), std::string::npos);
  fs::create_directories(root_ / "empty");
  EXPECT_FALSE(weights_digest((root_ / "empty").string(), memo_));
}

}  // namespace
}  // namespace kestrel
