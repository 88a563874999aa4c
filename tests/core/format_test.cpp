// Tests for the one rank-list formatter family (core/format.h) and the one call-site formatter
// (core/call_site.h).
#include <spmd/core/format.h>

#include <gtest/gtest.h>

#include <spmd/core/call_site.h>

namespace spmd {
namespace {

TEST(RanksStr, ListsTheRanksInTheirOrder) {
  EXPECT_EQ(ranks_str({}), "[]");
  EXPECT_EQ(ranks_str({3}), "[3]");
  EXPECT_EQ(ranks_str({0, 4, 1}), "[0, 4, 1]");
}

TEST(RanksCompact, CollapsesRunsOfThreeOrMore) {
  EXPECT_EQ(ranks_compact({}), "");
  EXPECT_EQ(ranks_compact({3}), "3");
  EXPECT_EQ(ranks_compact({0, 1}), "0,1");
  EXPECT_EQ(ranks_compact({0, 1, 2}), "0-2");
  EXPECT_EQ(ranks_compact({0, 1, 2, 3, 8}), "0-3,8");
  EXPECT_EQ(ranks_compact({0, 1, 3}), "0,1,3");
  EXPECT_EQ(ranks_compact({0, 2, 3, 4, 6, 7}), "0,2-4,6,7");
}

TEST(RanksCompact, EveryRankAppearsExactlyOnce) {
  // Every subset of 0..7: expanding the text gives the subset back.
  for (int mask = 0; mask < 256; ++mask) {
    std::vector<int> ranks;
    for (int r = 0; r < 8; ++r) {
      if (mask & (1 << r)) ranks.push_back(r);
    }
    std::vector<int> back;
    const std::string text = ranks_compact(ranks);
    for (size_t i = 0; i < text.size();) {
      size_t end = text.find(',', i);
      if (end == std::string::npos) end = text.size();
      const std::string part = text.substr(i, end - i);
      const size_t dash = part.find('-');
      const int lo = std::stoi(part.substr(0, dash));
      const int hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
      EXPECT_TRUE(dash == std::string::npos || hi - lo >= 2) << text;
      for (int r = lo; r <= hi; ++r) back.push_back(r);
      i = end + 1;
    }
    EXPECT_EQ(back, ranks) << text;
  }
}

TEST(RanksText, NamesOneRankOrSeveral) {
  EXPECT_EQ(ranks_text({}), "no ranks");
  EXPECT_EQ(ranks_text({3}), "rank 3");
  EXPECT_EQ(ranks_text({0, 1}), "ranks 0,1");
  EXPECT_EQ(ranks_text({0, 1, 2, 3, 4, 5, 6, 7}), "ranks 0-7");
  EXPECT_EQ(ranks_text({0, 2, 3}), "ranks 0,2,3");
}

TEST(SiteText, PrintsTheBaseNameAndTheLine) {
  EXPECT_EQ(site_text("/home/u/src/train.cpp", 42), "train.cpp:42");
  EXPECT_EQ(site_text("train.cpp", 7), "train.cpp:7");
  EXPECT_EQ(site_text("", 0), ":0");
  const SourceLocation here = SourceLocation::current();
  EXPECT_EQ(site_text(here), "format_test.cpp:" + std::to_string(here.line()));
  EXPECT_EQ(site_text(here), site_text(here.file_name(), here.line()));
}

}  // namespace
}  // namespace spmd
