#include "server/stop_matcher.h"

#include <gtest/gtest.h>

namespace kestrel::server {
namespace {

std::string feed(StopMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces) out += m.push(p);
  return out + m.flush();
}

TEST(StopMatcher, NoStopsPassesThrough) {
  StopMatcher m({});
  EXPECT_EQ(feed(m, {"ab", "cd"}), "abcd");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, MatchAcrossPieces) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.push("hello S"), "hello ");
  EXPECT_EQ(m.push("T"), "");
  EXPECT_EQ(m.push("OP and more"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("x"), "");
  EXPECT_EQ(m.matched(), "STOP");
}

TEST(StopMatcher, FalsePrefixIsReleased) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(feed(m, {"ST", "ART", "!"}), "START!");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, EarliestOfSeveral) {
  StopMatcher m({"world", "lo w"});
  EXPECT_EQ(feed(m, {"hel", "lo wor", "ld"}), "hel");
}

TEST(StopMatcher, HeldTextFlushedAtEnd) {
  StopMatcher m({"abc"});
  EXPECT_EQ(m.push("xxab"), "xx");
  EXPECT_EQ(m.flush(), "ab");
}

TEST(StopMatcher, Utf8StopString) {
  StopMatcher m({"\xC3\xA9t\xC3\xA9"});  // "été"
  EXPECT_EQ(feed(m, {"un \xC3", "\xA9t", "\xC3\xA9 chaud"}), "un ");
}

}  // namespace
}  // namespace kestrel::server
