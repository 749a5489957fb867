// GGUF parser: a well-formed file (built here byte by byte) parses with every value type; each
// corrupt variant (truncation anywhere, huge counts, bad types, misaligned / overlapping / out-of-file
// tensors) gives one error line naming the file and the key or tensor, and never crashes (ASan+UBSan in
// the debug preset). The converter-written files in tests/data/gguf are parsed too.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "loader/gguf.h"
#include "loader/gguf_config.h"

namespace kestrel {
namespace {

// Little-endian GGUF byte builder.
struct Gguf {
  std::vector<uint8_t> b;
  template <typename T>
  Gguf& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof v);
    return *this;
  }
  Gguf& str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  void pad(size_t a) {
    while (b.size() % a) b.push_back(0);
  }
};

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> ne;
  uint32_t type;
  uint64_t offset;
};

// Header with n_kv KVs written by `kvs`, then the tensor infos, padding and `data_bytes` of data.
std::vector<uint8_t> build(uint64_t n_kv, const std::function<void(Gguf&)>& kvs, const std::vector<TensorSpec>& ts,
                           size_t data_bytes, uint32_t version = 3, size_t align = 32) {
  Gguf g;
  g.b = {'G', 'G', 'U', 'F'};
  g.put<uint32_t>(version).put<uint64_t>(ts.size()).put<uint64_t>(n_kv);
  kvs(g);
  for (const auto& t : ts) {
    g.str(t.name).put<uint32_t>(static_cast<uint32_t>(t.ne.size()));
    for (uint64_t d : t.ne) g.put<uint64_t>(d);
    g.put<uint32_t>(t.type).put<uint64_t>(t.offset);
  }
  g.pad(align);
  g.b.resize(g.b.size() + data_bytes, 0x11);
  return g.b;
}

// A valid file: one KV of every type (scalar, string, array of u32, array of strings, nested
// array) and three tensors: F32 [4, 2], Q8_0 [32, 2] (2 blocks of 34 B), MXFP4 [64] (2 × 17 B).
void good_kvs(Gguf& g) {
  g.str("general.architecture").put<uint32_t>(8).str("kimi-k3");
  g.str("k.u8").put<uint32_t>(0).put<uint8_t>(200);
  g.str("k.i8").put<uint32_t>(1).put<int8_t>(-3);
  g.str("k.u16").put<uint32_t>(2).put<uint16_t>(60000);
  g.str("k.i16").put<uint32_t>(3).put<int16_t>(-300);
  g.str("k.u32").put<uint32_t>(4).put<uint32_t>(4000000000u);
  g.str("k.i32").put<uint32_t>(5).put<int32_t>(-7);
  g.str("k.f32").put<uint32_t>(6).put<float>(1.5f);
  g.str("k.bool").put<uint32_t>(7).put<uint8_t>(1);
  g.str("k.u64").put<uint32_t>(10).put<uint64_t>(1ull << 40);
  g.str("k.i64").put<uint32_t>(11).put<int64_t>(-(1ll << 40));
  g.str("k.f64").put<uint32_t>(12).put<double>(-2.25);
  g.str("k.arr").put<uint32_t>(9).put<uint32_t>(4).put<uint64_t>(3).put<uint32_t>(0).put<uint32_t>(1).put<uint32_t>(0);
  g.str("k.strs").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(2).str("a").str("bc");
  g.str("k.nested").put<uint32_t>(9).put<uint32_t>(9).put<uint64_t>(1).put<uint32_t>(5).put<uint64_t>(1).put<int32_t>(9);
}
constexpr uint64_t kGoodKvs = 15;
const std::vector<TensorSpec> kGoodTensors = {
    {"a", {4, 2}, 0, 0}, {"q", {32, 2}, 8, 32}, {"m", {64}, 39, 128}};
constexpr size_t kGoodData = 128 + 34;

std::vector<uint8_t> good() { return build(kGoodKvs, good_kvs, kGoodTensors, kGoodData); }

std::string err(const std::vector<uint8_t>& b) {
  auto r = parse_gguf(b, "f.gguf");
  return r ? std::string() : r.error().message();
}

void expect_error(const std::vector<uint8_t>& b, const std::vector<std::string>& parts) {
  const std::string m = err(b);
  ASSERT_FALSE(m.empty()) << "accepted a corrupt file";
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  EXPECT_NE(m.find("f.gguf"), std::string::npos) << m;
  for (const auto& p : parts) EXPECT_NE(m.find(p), std::string::npos) << "'" << p << "' not in: " << m;
}

TEST(Gguf, GoodFileParsesEveryValueType) {
  const auto b = good();
  auto r = parse_gguf(b, "f.gguf");
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->version, 3u);
  EXPECT_EQ(r->alignment, 32u);
  EXPECT_EQ(*r->find("general.architecture")->as_string(), "kimi-k3");
  EXPECT_EQ(*r->find("k.u8")->as_int(), 200);
  EXPECT_EQ(*r->find("k.i8")->as_int(), -3);
  EXPECT_EQ(*r->find("k.u16")->as_int(), 60000);
  EXPECT_EQ(*r->find("k.i16")->as_int(), -300);
  EXPECT_EQ(*r->find("k.u32")->as_int(), 4000000000ll);
  EXPECT_EQ(*r->find("k.i32")->as_int(), -7);
  EXPECT_EQ(*r->find("k.f32")->as_double(), 1.5);
  EXPECT_FALSE(r->find("k.f32")->as_int());
  EXPECT_EQ(*r->find("k.bool")->as_int(), 1);
  EXPECT_EQ(*r->find("k.u64")->as_int(), 1ll << 40);
  EXPECT_EQ(*r->find("k.i64")->as_int(), -(1ll << 40));
  EXPECT_EQ(*r->find("k.f64")->as_double(), -2.25);
  const GgufValue* arr = r->find("k.arr");
  ASSERT_TRUE(arr->is_array());
  EXPECT_EQ(arr->size(), 3u);
  EXPECT_EQ(*arr->as_int(1), 1);
  EXPECT_FALSE(arr->as_int(3));
  EXPECT_EQ(*r->find("k.strs")->as_string(1), "bc");
  EXPECT_EQ(*r->find("k.nested")->nested.at(0).as_int(0), 9);
  ASSERT_EQ(r->tensors.size(), 3u);
  const GgufTensorInfo* q = r->tensor("q");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, GgmlType::kQ8_0);
  EXPECT_EQ(q->nbytes, 68u);
  EXPECT_EQ(q->shape(), (std::vector<int64_t>{2, 32}));
  EXPECT_EQ(r->tensor("m")->nbytes, 34u);
  EXPECT_EQ(r->data_start % 32, 0u);
  EXPECT_EQ(r->data_start + kGoodData, b.size());
}

TEST(Gguf, Version2Accepted) { EXPECT_EQ(err(build(kGoodKvs, good_kvs, kGoodTensors, kGoodData, 2)), ""); }

TEST(Gguf, EveryTruncationFailsCleanly) {
  const auto b = good();
  for (size_t n = 0; n < b.size(); ++n) {
    std::vector<uint8_t> t(b.begin(), b.begin() + static_cast<long>(n));
    EXPECT_NE(err(t), "") << "truncated to " << n << " bytes was accepted";
  }
}

TEST(Gguf, BadMagicAndVersion) {
  auto b = good();
  b[0] = 'X';
  expect_error(b, {"bad magic"});
  expect_error(build(kGoodKvs, good_kvs, kGoodTensors, kGoodData, 1), {"version 1"});
  expect_error(build(kGoodKvs, good_kvs, kGoodTensors, kGoodData, 4), {"version 4"});
}

TEST(Gguf, HugeCounts) {
  auto b = good();
  std::memset(b.data() + 8, 0xff, 8);  // n_tensors
  expect_error(b, {"tensor count"});
  b = good();
  std::memset(b.data() + 16, 0xff, 8);  // n_kv
  expect_error(b, {"metadata count"});
  // A string length and an array count far past the file.
  expect_error(build(1, [](Gguf& g) { g.str("s").put<uint32_t>(8).put<uint64_t>(1ull << 62); }, {}, 0),
               {"key 's'", "past end"});
  expect_error(build(1, [](Gguf& g) { g.str("a").put<uint32_t>(9).put<uint32_t>(12).put<uint64_t>(1ull << 61); }, {}, 0),
               {"key 'a'", "larger than the file"});
}

TEST(Gguf, BadValueTypes) {
  expect_error(build(1, [](Gguf& g) { g.str("x").put<uint32_t>(13).put<uint32_t>(0); }, {}, 0),
               {"key 'x'", "unknown value type 13"});
  expect_error(build(1, [](Gguf& g) { g.str("x").put<uint32_t>(9).put<uint32_t>(77).put<uint64_t>(0); }, {}, 0),
               {"key 'x'", "unknown array element type 77"});
  expect_error(build(1, [](Gguf& g) { g.str("b").put<uint32_t>(7).put<uint8_t>(2); }, {}, 0), {"key 'b'", "bool"});
  expect_error(build(2, [](Gguf& g) {
                 g.str("d").put<uint32_t>(4).put<uint32_t>(1);
                 g.str("d").put<uint32_t>(4).put<uint32_t>(2);
               }, {}, 0),
               {"duplicate key 'd'"});
  // Arrays nested too deep.
  expect_error(build(1, [](Gguf& g) {
                 g.str("n");
                 g.put<uint32_t>(9);
                 for (int i = 0; i < 5; ++i) g.put<uint32_t>(9).put<uint64_t>(1);
                 g.put<uint32_t>(0).put<uint64_t>(0);
               }, {}, 0),
               {"key 'n'", "nested"});
}

TEST(Gguf, BadAlignment) {
  for (uint32_t a : {0u, 3u, 1u << 21})
    expect_error(build(1, [a](Gguf& g) { g.str("general.alignment").put<uint32_t>(4).put<uint32_t>(a); }, {}, 0),
                 {"general.alignment"});
  // Custom alignment honoured: 64 makes offset 32 misaligned.
  expect_error(build(1, [](Gguf& g) { g.str("general.alignment").put<uint32_t>(4).put<uint32_t>(64); },
                     {{"a", {4}, 0, 0}, {"b", {4}, 0, 32}}, 128, 3, 64),
               {"tensor 'b'", "alignment 64"});
}

TEST(Gguf, BadTensors) {
  auto one = [](TensorSpec t, size_t data = 4096) { return build(0, [](Gguf&) {}, {std::move(t)}, data); };
  expect_error(one({"t", {4}, 31, 0}), {"tensor 't'", "unknown ggml type 31"});
  expect_error(one({"t", {}, 0, 0}), {"tensor 't'", "n_dims 0"});
  expect_error(one({"t", {1, 1, 1, 1, 1}, 0, 0}), {"tensor 't'", "n_dims 5"});
  expect_error(one({"t", {0}, 0, 0}), {"tensor 't'", "out of range"});
  expect_error(one({"t", {1ull << 40, 1ull << 40}, 0, 0}), {"tensor 't'", "overflows"});
  expect_error(one({"t", {16}, 8, 0}), {"tensor 't'", "block size 32"});
  expect_error(one({"t", {4}, 0, 8}), {"tensor 't'", "not a multiple of the alignment"});
  expect_error(one({"t", {2048}, 0, 0}), {"tensor 't'", "past end of file"});
  expect_error(one({"t", {4}, 0, 1ull << 62}), {"tensor 't'", "past end of file"});
  expect_error(build(0, [](Gguf&) {}, {{"a", {16}, 0, 0}, {"b", {16}, 0, 32}}, 128), {"overlaps"});
  expect_error(build(0, [](Gguf&) {}, {{"a", {4}, 0, 0}, {"a", {4}, 0, 32}}, 128), {"duplicate tensor name 'a'"});
}

TEST(Gguf, ConverterFilesParseAndGiveAConfig) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(KESTREL_TEST_DATA "/gguf")) {
    if (e.path().extension() != ".gguf") continue;
    ++n;
    auto f = GgufFile::open(e.path().string());
    ASSERT_TRUE(f) << f.error().message();
    EXPECT_EQ(f->header().version, 3u);
    auto c = model_config_from_gguf(f->header(), e.path().string());
    ASSERT_TRUE(c) << c.error().message();
    EXPECT_GT(c->text.num_hidden_layers, 0);
  }
  EXPECT_GE(n, 5);
}

TEST(Gguf, ConfigErrorsNameTheKey) {
  auto b = build(1, [](Gguf& g) { g.str("general.architecture").put<uint32_t>(8).str("llama"); }, {}, 0);
  auto h = parse_gguf(b, "f.gguf");
  ASSERT_TRUE(h);
  auto c = model_config_from_gguf(*h, "f.gguf");
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message().find("'llama' is not supported"), std::string::npos) << c.error().message();
  b = build(1, [](Gguf& g) { g.str("general.architecture").put<uint32_t>(8).str("kimi-k3"); }, {}, 0);
  h = parse_gguf(b, "f.gguf");
  c = model_config_from_gguf(*h, "f.gguf");
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message().find("kimi-k3.block_count"), std::string::npos) << c.error().message();
}

}  // namespace
}  // namespace kestrel
