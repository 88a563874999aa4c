// Tests for mesh/layout.h: every contract checked at every point of the domain for every flat
// layout with up to 4 modes (sizes 1..4, strides from kStrides plus every permuted row-major
// stride set), a seeded random sample of larger and nested layouts, and the reference vectors
// of the team's research notes on PyTorch (prior_art_pytorch.md section 2.3).
#include <spmd/mesh/layout.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <spmd/core/error.h>
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::expect_throws;

Layout L(std::string_view text) {
  return Layout::parse(text);
}

// Offsets by an odometer over the leaves (independent of Layout::operator()).
std::vector<int64_t> offsets(const Layout& layout) {
  const auto& sizes = layout.leaf_sizes();
  const auto& strides = layout.leaf_strides();
  std::vector<int64_t> crd(sizes.size(), 0);
  std::vector<int64_t> out;
  while (true) {
    int64_t off = 0;
    for (size_t k = 0; k < sizes.size(); ++k) off += crd[k] * strides[k];
    out.push_back(off);
    size_t k = sizes.size();
    while (k > 0 && ++crd[k - 1] == sizes[k - 1]) crd[--k] = 0;
    if (k == 0) break;
  }
  return out;
}

bool injective(const std::vector<int64_t>& offs) {
  std::set<int64_t> seen(offs.begin(), offs.end());
  return seen.size() == offs.size();
}

// Largest size*stride over the modes of size > 1 (1 when there are none).
int64_t extent(const Layout& layout) {
  int64_t e = 1;
  for (int k = 0; k < layout.num_leaves(); ++k) {
    if (layout.leaf_sizes()[k] > 1)
      e = std::max(e, layout.leaf_sizes()[k] * layout.leaf_strides()[k]);
  }
  return e;
}

constexpr int64_t kStrides[] = {0, 1, 2, 3, 4};

// Calls fn(layout) for every flat layout with 0..max_modes modes, sizes 1..4 and strides from
// kStrides, then for every size tuple with each permutation of its row-major strides (tractable
// layouts with transposed modes, and the same spaced out by 2).
template <class F>
void for_each_layout(int max_modes, F&& fn) {
  fn(Layout());
  for (int n = 1; n <= max_modes; ++n) {
    std::vector<int> digit(2 * n, 0);  // size index and stride index per mode
    const int nstrides = static_cast<int>(std::size(kStrides));
    while (true) {
      std::vector<int64_t> sizes(n), strides(n);
      for (int k = 0; k < n; ++k) {
        sizes[k] = digit[2 * k] + 1;
        strides[k] = kStrides[digit[2 * k + 1]];
      }
      fn(Layout(sizes, strides));
      int k = 2 * n - 1;
      while (k >= 0) {
        int base = (k % 2 == 0) ? 4 : nstrides;
        if (++digit[k] < base) break;
        digit[k--] = 0;
      }
      if (k < 0) break;
    }
    std::vector<int64_t> sizes(n, 1);
    while (true) {
      Layout rm = Layout::row_major(sizes);
      std::vector<int> perm(n);
      std::iota(perm.begin(), perm.end(), 0);
      do {
        std::vector<int64_t> strides(n), spaced(n);
        for (int k = 0; k < n; ++k) {
          strides[k] = rm.leaf_strides()[perm[k]];
          spaced[k] = 2 * strides[k];
        }
        fn(Layout(sizes, strides));
        fn(Layout(sizes, spaced));
      } while (std::next_permutation(perm.begin(), perm.end()));
      int k = n - 1;
      while (k >= 0 && ++sizes[k] > 4) sizes[k--] = 1;
      if (k < 0) break;
    }
  }
}

// A seeded sample of larger layouts: up to 5 leaves, sizes up to 8 (at most 1024 coordinates),
// strides either random small
// numbers or a permuted row-major set (tractable), some nested.
template <class F>
void for_each_random_layout(int count, F&& fn) {
  std::mt19937_64 rng(12345);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int t = 0; t < count; ++t) {
    int n = static_cast<int>(uniform(1, 5));
    std::vector<int64_t> sizes(n), strides(n);
    int64_t total = 1;
    for (int k = 0; k < n; ++k) {
      sizes[k] = uniform(1, 8);
      if (total * sizes[k] > 1024) sizes[k] = 1;  // keeps the domain small enough to enumerate
      total *= sizes[k];
    }
    if (uniform(0, 1) == 0) {
      for (int k = 0; k < n; ++k) strides[k] = uniform(0, 40);
    } else {
      Layout rm = Layout::row_major(sizes);
      std::vector<int> perm(n);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      int64_t gap = uniform(1, 3);
      for (int k = 0; k < n; ++k) strides[k] = rm.leaf_strides()[perm[k]] * gap;
    }
    Layout flat(sizes, strides);
    if (n >= 2 && uniform(0, 2) == 0) {
      // Nest the first two leaves as one mode: ((a,b),c,...).
      std::vector<Layout> modes{Layout({sizes[0], sizes[1]}, {strides[0], strides[1]})};
      for (int k = 2; k < n; ++k) modes.push_back(Layout(sizes[k], strides[k]));
      fn(Layout::from_modes(modes));
    } else {
      fn(flat);
    }
  }
}

// Every check of one unary contract runs over the exhaustive set and the random sample.
// Stops at the first layout that failed, so one bug does not print a million failures.
template <class F>
void for_all(F&& fn) {
  auto guarded = [&](const Layout& l) {
    if (!::testing::Test::HasFailure()) fn(l);
  };
  for_each_layout(4, guarded);
  for_each_random_layout(3000, guarded);
}

#define LAYOUT_CONTEXT(l) "layout " << (l)

// ---- printing, parsing, structure -------------------------------------------------------------

TEST(Layout, PrintsAndParses) {
  EXPECT_EQ(Layout(8, 1).to_string(), "8:1");
  EXPECT_EQ(Layout({2, 4}, {4, 1}).to_string(), "(2,4):(4,1)");
  EXPECT_EQ(Layout({8}, {1}).to_string(), "(8):(1)");
  EXPECT_EQ(Layout().to_string(), "():()");
  EXPECT_EQ(nest(Layout({2, 2}, {4, 1})).to_string(), "((2,2)):((4,1))");
  EXPECT_EQ(fmt::format("{}", L("((2,2),2):((4,1),2)")), "((2,2),2):((4,1),2)");
  for (const char* text : {"8:1", "(2,4):(4,1)", "(8):(1)", "():()", "((2,2)):((4,1))",
                           "((2,(3,1)),2):((12,(4,1)),1)"}) {
    EXPECT_EQ(L(text).to_string(), text);
  }
  EXPECT_EQ(L("(8,):(1,)"), Layout({8}, {1}));
  EXPECT_EQ(L(" ( 2 , 4 ) : ( 4 , 1 ) "), Layout({2, 4}, {4, 1}));
  expect_throws<MeshError>([] { L("(2,4):(4)"); }, {"different nesting"});
  expect_throws<MeshError>([] { L("(2,4)"); }, {"expected ':'", "(2,4)"});
  expect_throws<MeshError>([] { L("(2,x):(1,1)"); }, {"expected an integer"});
  expect_throws<MeshError>([] { L("0:1"); }, {"sizes must be >= 1"});
  expect_throws<MeshError>([] { L("2:-1"); }, {"strides >= 0"});
  expect_throws<MeshError>([] { L("(4294967296,4294967296):(1,1)"); }, {"overflows"});
}

TEST(Layout, ModesAndStructure) {
  Layout l = L("((2,2),4):((4,1),8)");
  EXPECT_EQ(l.num_modes(), 2);
  EXPECT_EQ(l.mode(0), L("(2,2):(4,1)"));
  EXPECT_EQ(l.mode(1), L("4:8"));
  EXPECT_EQ(l.top_level_sizes(), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(l.depth(), 2);
  EXPECT_EQ(L("8:1").num_modes(), 1);
  EXPECT_EQ(L("8:1").mode(0), L("8:1"));
  EXPECT_EQ(L("8:1").depth(), 0);
  EXPECT_EQ(Layout().num_modes(), 0);
  EXPECT_EQ(size(Layout()), 1);
  EXPECT_EQ(Layout::row_major({2, 3, 4}), L("(2,3,4):(12,4,1)"));
  EXPECT_EQ(Layout::from_modes({L("8:1"), L("(2,2):(4,1)")}), L("(8,(2,2)):(1,(4,1))"));
  EXPECT_NE(L("8:1"), L("(8):(1)"));
  EXPECT_NE(std::hash<Layout>{}(L("(2,4):(4,1)")), std::hash<Layout>{}(L("(2,4):(1,2)")));
  expect_throws<MeshError>([&] { l.mode(2); }, {"mode 2 is out of range", "((2,2),4):((4,1),8)"});
  expect_throws<MeshError>([&] { l(16); }, {"index 16 is outside the domain [0, 16)"});
}

// ---- notes section 2.3: all 25 reference rows -------------------------------------------------

TEST(LayoutReference, Coalesce) {
  EXPECT_EQ(coalesce(L("(3,2):(2,1)")), L("6:1"));          // 1
  EXPECT_EQ(coalesce(L("(3,2):(4,1)")), L("(3,2):(4,1)"));  // 2
  EXPECT_EQ(coalesce(L("(2,2,2):(4,2,1)")), L("8:1"));      // 3
  EXPECT_EQ(coalesce(L("(2,1,3):(3,7,1)")), L("6:1"));      // 4
  EXPECT_EQ(coalesce(L("(2,2):(4,2)")), L("4:2"));          // 5
  EXPECT_EQ(coalesce(L("(1,1):(1,1)")), L("1:1"));          // 6 (_MeshLayout: never stride 0)
}

TEST(LayoutReference, Composition) {
  EXPECT_EQ(composition(L("(6,2):(2,1)"), L("3:2")), L("3:2"));                  // 7
  EXPECT_EQ(composition(L("8:1"), L("(2,2,2):(4,2,1)")), L("(2,2,2):(4,2,1)"));  // 8
  EXPECT_EQ(composition(L("4:2"), L("(2,2):(2,1)")), L("(2,2):(4,2)"));          // 9
  EXPECT_EQ(composition(L("8:1"), L("(4,2):(2,1)")), L("(4,2):(2,1)"));          // 10
}

TEST(LayoutReference, Complement) {
  EXPECT_EQ(complement(L("4:1"), 8), L("2:4"));           // 11
  EXPECT_EQ(complement(L("2:2"), 4), L("2:1"));           // 12
  EXPECT_EQ(complement(L("(2,2):(4,1)"), 8), L("2:2"));   // 13
  EXPECT_EQ(complement(L("3:2"), 12), L("(2,2):(6,1)"));  // 14
}

TEST(LayoutReference, CodomainAndGlobalRanks) {
  EXPECT_EQ(codomain(L("(2,3):(3,1)")), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));  // 15
  EXPECT_EQ(codomain(L("(2,3):(1,2)")), (std::vector<int64_t>{0, 2, 4, 1, 3, 5}));
  using Groups = std::vector<std::vector<int64_t>>;
  EXPECT_EQ(global_ranks(L("4:1"), 16),
            (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));   // 16
  EXPECT_EQ(global_ranks(L("4:2"), 8), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));          // 17
  EXPECT_EQ(global_ranks(L("(2,2):(4,1)"), 8), (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}}));  // 18
  EXPECT_EQ(global_ranks(L("2:4"), 8), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));      // 19
  EXPECT_EQ(global_ranks(L("2:2"), 8), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(global_ranks(L("2:1"), 8), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
}

TEST(LayoutReference, NonOverlapAndCosize) {
  EXPECT_TRUE(check_non_overlap(L("(2,3):(6,1)")));  // 20
  EXPECT_FALSE(check_non_overlap(L("(2,3):(2,1)")));
  EXPECT_FALSE(check_non_overlap(L("(4,2):(1,1)")));
  EXPECT_EQ(cosize(L("(2,2):(4,1)")), 6);  // 21
  EXPECT_EQ(cosize(L("2:4")), 5);
  EXPECT_EQ(cosize(L("(2,4):(4,1)")), 8);
}

TEST(LayoutReference, Remap) {
  std::vector<int64_t> four{0, 1, 2, 3};
  EXPECT_EQ(remap(L("2:2"), four), (RankTable{{2, 2}, {0, 2, 1, 3}}));  // 22
  std::vector<int64_t> tens{10, 20, 30, 40};
  EXPECT_EQ(remap(L("2:2"), tens), (RankTable{{2, 2}, {10, 30, 20, 40}}));  // 23
  std::vector<int64_t> eight(8);
  std::iota(eight.begin(), eight.end(), 0);
  EXPECT_EQ(remap(L("(2,2):(4,1)"), eight),
            (RankTable{{2, 2, 2}, {0, 1, 4, 5, 2, 3, 6, 7}}));  // 24
  EXPECT_EQ(remap(L("(4,2):(2,1)"), eight),
            (RankTable{{1, 4, 2}, {0, 1, 2, 3, 4, 5, 6, 7}}));  // 25
}

// ---- contracts at every point of the domain ---------------------------------------------------

TEST(LayoutContract, EvaluationSizeCosizeCodomain) {
  int64_t count = 0;
  for_all([&](const Layout& l) {
    ++count;
    std::vector<int64_t> offs = offsets(l);
    ASSERT_EQ(size(l), static_cast<int64_t>(offs.size())) << LAYOUT_CONTEXT(l);
    for (int64_t i = 0; i < size(l); ++i)
      ASSERT_EQ(l(i), offs[i]) << LAYOUT_CONTEXT(l) << " at " << i;
    ASSERT_EQ(codomain(l), offs) << LAYOUT_CONTEXT(l);
    ASSERT_EQ(cosize(l), *std::max_element(offs.begin(), offs.end()) + 1) << LAYOUT_CONTEXT(l);
    ASSERT_EQ(Layout::parse(l.to_string()), l) << LAYOUT_CONTEXT(l);
  });
  EXPECT_GT(count, 150000);
}

TEST(LayoutContract, Coalesce) {
  for_all([&](const Layout& l) {
    Layout c = coalesce(l);
    ASSERT_EQ(size(c), size(l)) << LAYOUT_CONTEXT(l);
    ASSERT_EQ(offsets(c), offsets(l)) << LAYOUT_CONTEXT(l) << " -> " << c;
    ASSERT_LE(c.depth(), 1) << LAYOUT_CONTEXT(l) << " -> " << c;
    if (c.num_leaves() == 1) {
      ASSERT_TRUE(c.is_scalar()) << LAYOUT_CONTEXT(l) << " -> " << c;
    }
    for (int k = 0; k < c.num_leaves(); ++k) {
      if (c.leaf_sizes()[k] == 1) {
        ASSERT_EQ(c, Layout(1, 1)) << LAYOUT_CONTEXT(l) << " -> " << c;
      }
      if (k + 1 < c.num_leaves()) {
        ASSERT_NE(c.leaf_sizes()[k + 1] * c.leaf_strides()[k + 1], c.leaf_strides()[k])
            << LAYOUT_CONTEXT(l) << " -> " << c << " left mergeable modes";
      }
    }
    ASSERT_EQ(coalesce(c), c) << LAYOUT_CONTEXT(l);
  });
}

TEST(LayoutContract, FilterKeepsTheImage) {
  for_all([&](const Layout& l) {
    Layout f = filter(l);
    std::vector<int64_t> a = offsets(l), b = offsets(f);
    ASSERT_EQ(std::set<int64_t>(a.begin(), a.end()), std::set<int64_t>(b.begin(), b.end()))
        << LAYOUT_CONTEXT(l) << " -> " << f;
    for (int k = 0; k < f.num_leaves(); ++k) {
      ASSERT_TRUE(f.leaf_strides()[k] != 0 || f.leaf_sizes()[k] == 1) << LAYOUT_CONTEXT(l);
    }
  });
}

TEST(LayoutContract, CheckNonOverlapMatchesEnumeration) {
  int64_t injective_count = 0;
  for_all([&](const Layout& l) {
    bool expected = injective(offsets(l));
    injective_count += expected;
    ASSERT_EQ(check_non_overlap(l), expected) << LAYOUT_CONTEXT(l);
    if (is_tractable(l)) {
      ASSERT_TRUE(expected) << LAYOUT_CONTEXT(l) << " is tractable";
    }
  });
  EXPECT_GT(injective_count, 10000);
}

TEST(LayoutContract, Complement) {
  int64_t tractable = 0;
  for_all([&](const Layout& l) {
    Layout f = filter(l);
    int64_t e = extent(l);
    if (!is_tractable(f)) {
      std::string m = expect_throws<MeshError>([&] { complement(l, 2 * e); }, {"complement"});
      ASSERT_FALSE(m.empty()) << LAYOUT_CONTEXT(l);
      return;
    }
    for (int64_t world : {int64_t{1}, e, 3 * e, e + 1, cosize(l)}) {
      ++tractable;
      Layout c = complement(l, world);
      std::vector<int64_t> co = offsets(c);
      ASSERT_EQ(co[0], 0) << LAYOUT_CONTEXT(l);
      ASSERT_TRUE(std::is_sorted(co.begin(), co.end()) && injective(co))
          << LAYOUT_CONTEXT(l) << " complement " << c << " must ascend";
      int64_t m = size(c) * size(f);
      ASSERT_GE(m, world) << LAYOUT_CONTEXT(l) << " complement " << c;
      ASSERT_LT(m, world + e) << LAYOUT_CONTEXT(l) << " complement " << c;
      if (world % e == 0) {
        ASSERT_EQ(m, world) << LAYOUT_CONTEXT(l) << " complement " << c;
      }
      std::vector<int64_t> all, fo = offsets(f);
      for (int64_t x : co) {
        for (int64_t y : fo) all.push_back(x + y);
      }
      std::sort(all.begin(), all.end());
      std::vector<int64_t> expected(m);
      std::iota(expected.begin(), expected.end(), 0);
      ASSERT_EQ(all, expected) << LAYOUT_CONTEXT(l) << " complement " << c << " world " << world;
    }
  });
  EXPECT_GT(tractable, 10000);
}

TEST(LayoutContract, GlobalRanksRemapAndRadixIndex) {
  std::mt19937_64 rng(7);
  for_all([&](const Layout& l) {
    if (!is_tractable(l)) {
      expect_throws<MeshError>([&] { global_ranks(l, 2 * extent(l)); }, {"global_ranks"});
      return;
    }
    for (int64_t world : {extent(l), 2 * extent(l)}) {
      Layout c = complement(l, world);
      auto groups = global_ranks(l, world);
      std::vector<int64_t> co = offsets(c), lo = offsets(l);
      ASSERT_EQ(groups.size(), co.size()) << LAYOUT_CONTEXT(l);
      std::vector<int64_t> seen;
      for (size_t g = 0; g < groups.size(); ++g) {
        ASSERT_EQ(groups[g].size(), lo.size());
        for (size_t i = 0; i < lo.size(); ++i) {
          ASSERT_EQ(groups[g][i], co[g] + lo[i]) << LAYOUT_CONTEXT(l) << " group " << g;
          // The mixed-radix digits recover the coordinate and the group from the position.
          ASSERT_EQ(radix_index(l, groups[g][i]), static_cast<int64_t>(i)) << LAYOUT_CONTEXT(l);
          ASSERT_EQ(radix_index(c, groups[g][i]), static_cast<int64_t>(g)) << LAYOUT_CONTEXT(l);
          seen.push_back(groups[g][i]);
        }
      }
      std::sort(seen.begin(), seen.end());
      for (int64_t k = 0; k < world; ++k) ASSERT_EQ(seen[k], k) << LAYOUT_CONTEXT(l);

      std::vector<int64_t> rank_map(world);
      std::iota(rank_map.begin(), rank_map.end(), 100);
      std::shuffle(rank_map.begin(), rank_map.end(), rng);
      RankTable table = remap(l, rank_map);
      ASSERT_EQ(table.shape[0], size(c));
      std::vector<int64_t> top = l.top_level_sizes();
      ASSERT_EQ(std::vector<int64_t>(table.shape.begin() + 1, table.shape.end()), top);
      ASSERT_EQ(static_cast<int64_t>(table.values.size()), world);
      for (size_t g = 0; g < co.size(); ++g) {
        for (size_t i = 0; i < lo.size(); ++i) {
          ASSERT_EQ(table.values[g * lo.size() + i], rank_map[co[g] + lo[i]]) << LAYOUT_CONTEXT(l);
        }
      }
    }
    if (extent(l) > 1) {
      expect_throws<MeshError>([&] { global_ranks(l, extent(l) + 1); }, {"does not tile"});
    }
  });
}

TEST(LayoutContract, IndexOfInvertsInjectiveLayouts) {
  for_all([&](const Layout& l) {
    std::vector<int64_t> offs = offsets(l);
    if (!injective(offs)) return;
    std::set<int64_t> image(offs.begin(), offs.end());
    for (int64_t i = 0; i < size(l); ++i) {
      ASSERT_EQ(index_of(l, offs[i]), std::optional<int64_t>(i)) << LAYOUT_CONTEXT(l);
    }
    if (!is_tractable(l) && size(l) > 64) return;  // the enumerating fallback is quadratic here
    for (int64_t o = -1; o <= cosize(l); ++o) {
      if (!image.count(o)) {
        ASSERT_EQ(index_of(l, o), std::nullopt) << LAYOUT_CONTEXT(l) << " " << o;
      }
    }
  });
}

TEST(LayoutContract, NestSpliceAndCoordinates) {
  std::mt19937_64 rng(11);
  for_all([&](const Layout& l) {
    Layout n = nest(l);
    ASSERT_EQ(n.num_modes(), 1);
    ASSERT_EQ(n.mode(0), l);
    ASSERT_EQ(offsets(n), offsets(l));
    ASSERT_EQ(n.top_level_sizes(), std::vector<int64_t>{size(l)});

    int modes = l.num_modes();
    int start = static_cast<int>(std::uniform_int_distribution<int>(0, modes)(rng));
    int end = static_cast<int>(std::uniform_int_distribution<int>(start, modes)(rng));
    Layout r = L("(2,3):(5,7)");
    Layout s = splice(l, start, end, r);
    ASSERT_EQ(s.num_modes(), modes - (end - start) + 2) << LAYOUT_CONTEXT(l);
    for (int i = 0; i < start; ++i) ASSERT_EQ(s.mode(i), l.mode(i));
    ASSERT_EQ(s.mode(start), L("2:5"));
    ASSERT_EQ(s.mode(start + 1), L("3:7"));
    for (int i = end; i < modes; ++i) ASSERT_EQ(s.mode(i - end + start + 2), l.mode(i));

    std::vector<int64_t> top = l.top_level_sizes();
    for (int64_t i = 0; i < std::min<int64_t>(size(l), 64); ++i) {
      std::vector<int64_t> crd = idx2crd(i, top);
      ASSERT_EQ(crd2idx(crd, top), i);
      ASSERT_EQ(crd2offset(crd, l), l(i)) << LAYOUT_CONTEXT(l);
    }
  });
  expect_throws<MeshError>([] { splice(L("(2,2):(2,1)"), 1, 3, L("2:1")); },
                           {"range [1, 3) is invalid"});
}

// R = A o B: R(c) == A(B(c)) at every c whenever the preconditions hold. A: every layout with up
// to 3 modes; B: every scalar with sizes 1..4 and strides from kStrides, plus the row-major
// factorisations of size(A) (the unflatten case); every pair of layouts with up to 2 modes;
// then a random sample with nested B.
TEST(LayoutContract, Composition) {
  int64_t composed = 0, refused = 0;
  auto check = [&](const Layout& a, const Layout& b) {
    Layout r;
    try {
      r = composition(a, b);
    } catch (const MeshError& e) {
      ++refused;
      std::string m = e.what();
      ASSERT_NE(m.find(a.to_string()), std::string::npos) << m;
      ASSERT_NE(m.find(b.to_string()), std::string::npos) << m;
      return;
    }
    ++composed;
    ASSERT_EQ(size(r), size(b)) << a << " o " << b << " = " << r;
    if (!b.is_scalar()) {
      ASSERT_EQ(r.num_modes(), b.num_modes()) << a << " o " << b << " = " << r;
    }
    std::vector<int64_t> ro = offsets(r), bo = offsets(b), ao = offsets(a);
    for (size_t c = 0; c < bo.size(); ++c) {
      ASSERT_EQ(ro[c], ao[bo[c]]) << a << " o " << b << " = " << r << " at " << c;
    }
  };
  for_each_layout(3, [&](const Layout& a) {
    for (int64_t s = 1; s <= 4; ++s) {
      for (int64_t d : kStrides) {
        if ((s - 1) * d < size(a)) check(a, Layout(s, d));
      }
    }
    int64_t n = size(a);
    for (int64_t p = 1; p <= n; ++p) {
      if (n % p) continue;
      check(a, Layout::row_major({p, n / p}));
      for (int64_t q = 1; q <= n / p; ++q) {
        if ((n / p) % q == 0) check(a, Layout::row_major({p, q, n / p / q}));
      }
    }
  });
  for_each_layout(2, [&](const Layout& a) {
    for_each_layout(2, [&](const Layout& b) {
      if (cosize(b) <= size(a)) check(a, b);
    });
  });
  std::mt19937_64 rng(3);
  std::vector<Layout> bs;
  for_each_random_layout(400, [&](const Layout& b) { bs.push_back(b); });
  for_each_random_layout(400, [&](const Layout& a) {
    for (int t = 0; t < 20; ++t) check(a, bs[rng() % bs.size()]);
    check(a, Layout::row_major({size(a)}));
  });
  EXPECT_GT(composed, 100000);
  EXPECT_GT(refused, 1000);
}

TEST(LayoutContract, CompositionErrorsNameBothLayouts) {
  expect_throws<MeshError>([] { composition(L("(4,4):(5,1)"), L("6:1")); },
                           {"(4,4):(5,1) o 6:1", "shape divisibility"});
  expect_throws<MeshError>([] { composition(L("(3,2):(10,1)"), L("2:3")); },
                           {"(3,2):(10,1) o 2:3", "stride divisibility"});
  expect_throws<MeshError>([] { composition(L("4:1"), L("8:1")); },
                           {"4:1 o 8:1", "cosize(B) must not exceed size(A)"});
}

TEST(LayoutContract, ComplementErrorsSayWhy) {
  expect_throws<MeshError>([] { complement(L("(2,2):(1,1)"), 4); },
                           {"complement", "(2,2):(1,1)", "overlaps", "(0,1) and (1,0)"});
  expect_throws<MeshError>([] { complement(L("(2,2):(3,1)"), 12); },
                           {"complement", "(2,2):(3,1)", "not tractable"});
}

}  // namespace
}  // namespace spmd
