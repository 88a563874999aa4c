// Tests for matmul, addmm and bmm: torch.matmul's shape rules (1-d operands, broadcast batch
// dims), every dtype, transposed/narrowed/expanded operands, against a naive triple loop.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <strings.h>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>

#include <spmd/core/parallel.h>
#include <spmd/ops/ops.h>
#include <spmd/tensor/compare.h>
#include <spmd/tensor/kernels/cpu_kernels.h>
#include <spmd/tensor/random.h>
#include "tests/support/test_support.h"
#include "tests/tensor/reference.h"

namespace spmd {
namespace {

using testing::broadcast;
using testing::broadcast_index;
using testing::element;
using testing::expect_throws;
using testing::expect_values;
using testing::Gen;
using testing::layout_name;
using testing::round_to;
using testing::unravel;

// torch.matmul in double: result shape and values (before rounding).
struct Product {
  Shape shape;
  std::vector<double> values;
};

Product reference_matmul(const Tensor& a, const Tensor& b) {
  const Shape sa = a.dim() == 1 ? Shape{1, a.size(0)} : a.shape();
  const Shape sb = b.dim() == 1 ? Shape{b.size(0), 1} : b.shape();
  const Shape batch_a(sa.begin(), sa.end() - 2);
  const Shape batch_b(sb.begin(), sb.end() - 2);
  const Shape batch = broadcast(batch_a, batch_b);
  const int64_t n = sa[sa.size() - 2];
  const int64_t k = sa.back();
  const int64_t m = sb.back();
  Product p;
  p.shape = batch;
  if (a.dim() > 1) p.shape.push_back(n);
  if (b.dim() > 1) p.shape.push_back(m);
  Shape full = batch;
  full.push_back(n);
  full.push_back(m);
  for (int64_t i = 0; i < shape_numel(full); ++i) {
    const auto index = unravel(i, full);
    const std::vector<int64_t> bi(index.begin(), index.end() - 2);
    auto ia = broadcast_index(bi, batch_a);
    auto ib = broadcast_index(bi, batch_b);
    double acc = 0;
    for (int64_t l = 0; l < k; ++l) {
      std::vector<int64_t> xa = ia;
      std::vector<int64_t> xb = ib;
      if (a.dim() > 1) xa.push_back(index[index.size() - 2]);
      xa.push_back(l);
      xb.push_back(l);
      if (b.dim() > 1) xb.push_back(index.back());
      acc += element(a, xa) * element(b, xb);
    }
    p.values.push_back(acc);
  }
  return p;
}

TEST(Matmul, MatchesReferenceForShapesDTypesAndLayouts) {
  Gen gen(21);
  int checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t n = gen.uniform(0, 5);
    const int64_t k = gen.uniform(0, 5);
    const int64_t m = gen.uniform(0, 5);
    const int rank_a = static_cast<int>(gen.uniform(1, 4));
    const int rank_b = static_cast<int>(gen.uniform(1, 4));
    const Shape batch = gen.shape(0, 2);
    Shape sa = rank_a == 1 ? Shape{k} : gen.broadcastable_to(batch);
    Shape sb = rank_b == 1 ? Shape{k} : gen.broadcastable_to(batch);
    if (rank_a > 1) {
      sa.push_back(n);
      sa.push_back(k);
    }
    if (rank_b > 1) {
      sb.push_back(k);
      sb.push_back(m);
    }
    const DType da = kAllDTypes[gen.uniform(0, 6)];
    const DType db = gen.uniform(0, 2) ? da : kAllDTypes[gen.uniform(0, 6)];
    const auto la = gen.layout();
    const auto lb = gen.layout();
    const Tensor a = gen.tensor(sa, da, la);
    const Tensor b = gen.tensor(sb, db, lb);
    const std::string context = fmt::format("matmul({} {} {}, {} {} {})", da, shape_str(sa),
                                            layout_name(la), db, shape_str(sb), layout_name(lb));
    const DType want_dtype = promote_types(da, db);
    if (want_dtype == DType::Bool) {
      expect_throws<Unsupported>([&] { matmul(a, b); }, {"matmul", "bool"});
      continue;
    }
    const Tensor out = matmul(a, b);
    const Product p = reference_matmul(a, b);
    ASSERT_EQ(out.shape(), p.shape) << context;
    ASSERT_EQ(out.dtype(), want_dtype) << context;
    std::vector<double> want;
    for (double v : p.values) want.push_back(round_to(want_dtype, v));
    expect_values(out, want, 0, 0, context);
    ++checked;
  }
  EXPECT_GT(checked, 300);
}

TEST(Matmul, LargerOperandsThroughEigenBlocking) {
  // Beyond Eigen's small-matrix path, with every row/column-major combination.
  for (DType d : {DType::F32, DType::F64, DType::BF16}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const Tensor a0 = randn(ta ? Shape{70, 130} : Shape{130, 70}, 1, d);
        const Tensor b0 = randn(tb ? Shape{90, 70} : Shape{70, 90}, 2, d);
        const Tensor a = ta ? a0.transpose(0, 1) : a0;
        const Tensor b = tb ? b0.transpose(0, 1) : b0;
        const Product p = reference_matmul(a, b);
        const double tol = d == DType::BF16 ? 1e-2 : d == DType::F32 ? 1e-5 : 1e-12;
        std::vector<double> want;
        for (double v : p.values) want.push_back(round_to(d, v));
        expect_values(matmul(a, b), want, tol, tol,
                      fmt::format("{} matmul, a transposed {}, b transposed {}", d, ta, tb));
      }
    }
  }
}

// Note [Matmul on BLAS]: the first product loads OpenBLAS on one thread. In a fresh process (the
// threadsafe death-test style runs the body in a new process of this binary), there is one thread
// before it (a linked OpenBLAS would have started its workers before main) and after it (the
// products are too small for our pool), and the OPENBLAS_NUM_THREADS set for the load is gone
// again. (ThreadSanitizer keeps a thread of its own.)
int64_t process_threads() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoll(line.substr(8));
  }
  return -1;
}

[[noreturn]] void first_products_on_one_thread() {
#if defined(__SANITIZE_THREAD__)
  const int64_t expected = process_threads();
#else
  const int64_t expected = 1;
#endif
  auto fail = [](const std::string& why) {
    std::fputs(why.c_str(), stderr);
    std::exit(1);
  };
  if (std::getenv("OPENBLAS_NUM_THREADS") != nullptr) fail("OPENBLAS_NUM_THREADS is set");
  if (process_threads() != expected) {
    fail(fmt::format("{} threads before the first product", process_threads()));
  }
  for (DType d : {DType::F32, DType::F64}) {
    const Tensor a = randn({6, 5}, 1, d);
    const Tensor b = randn({5, 4}, 2, d);
    const std::vector<double> got = matmul(a, b).to_vector<double>();
    const std::vector<double> want = reference_matmul(a, b).values;
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::abs(got[i] - want[i]) > 1e-5) fail(fmt::format("{} product: wrong value", d));
    }
  }
  if (process_threads() != expected) {
    fail(fmt::format("{} threads after the first products", process_threads()));
  }
  if (std::getenv("OPENBLAS_NUM_THREADS") != nullptr) fail("OPENBLAS_NUM_THREADS left set");
  std::exit(0);
}

TEST(Matmul, LoadsBlasWithoutItsThreads) {
  if (std::getenv("OPENBLAS_NUM_THREADS") != nullptr) {
    GTEST_SKIP() << "OPENBLAS_NUM_THREADS is set: OpenBLAS then starts the threads asked for";
  }
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(first_products_on_one_thread(), ::testing::ExitedWithCode(0), "");
}

// Note [OpenBLAS core type]: whether /proc/cpuinfo lists every AVX-512 subset OpenBLAS's SkylakeX
// kernels use.
bool cpuinfo_has_avx512_gemm() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line);
    std::set<std::string> flags{std::istream_iterator<std::string>(words), {}};
    return flags.count("avx512f") && flags.count("avx512cd") && flags.count("avx512bw") &&
           flags.count("avx512dq") && flags.count("avx512vl");
  }
  return false;
}

// The first product of a fresh process (the one that loads the library) against the reference.
bool first_product_is_right() {
  const Tensor a = randn({6, 5}, 1);
  const Tensor b = randn({5, 4}, 2);
  const std::vector<double> got = matmul(a, b).to_vector<double>();
  const std::vector<double> want = reference_matmul(a, b).values;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::abs(got[i] - want[i]) > 1e-5) return false;
  }
  return true;
}

// In a fresh process whose OPENBLAS_CORETYPE is `user_choice` (nullptr: unset) before the first
// product: the kernel set OpenBLAS loaded, and the variable as the user left it.
[[noreturn]] void first_product_kernels(const char* user_choice) {
  auto fail = [](const std::string& why) {
    std::fputs(why.c_str(), stderr);
    std::exit(1);
  };
  if (user_choice == nullptr) {
    unsetenv("OPENBLAS_CORETYPE");
  } else {
    setenv("OPENBLAS_CORETYPE", user_choice, 1);
  }
  if (!first_product_is_right()) fail("wrong value");
  const std::string library = cpu_kernels::matmul_library();
  const char* left = std::getenv("OPENBLAS_CORETYPE");
  if (user_choice == nullptr && left != nullptr)
    fail(fmt::format("OPENBLAS_CORETYPE left {}", left));
  if (user_choice != nullptr && (left == nullptr || std::string(left) != user_choice)) {
    fail("the user's OPENBLAS_CORETYPE was changed");
  }
  if (library == "Eigen") std::exit(0);  // no OpenBLAS here: nothing chose a kernel set
  const std::string core = library.substr(library.find(' ') + 1);
  const std::string expected =
      user_choice != nullptr ? user_choice : (cpuinfo_has_avx512_gemm() ? "SkylakeX" : core);
  if (strcasecmp(core.c_str(), expected.c_str()) != 0) {
    fail(fmt::format("OpenBLAS loaded {}, expected {}", core, expected));
  }
  std::exit(0);
}

TEST(Matmul, LoadsOpenBlasAvx512KernelsUnlessTheUserChoseOthers) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(first_product_kernels(nullptr), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(first_product_kernels("Haswell"), ::testing::ExitedWithCode(0), "");
}

// In a fresh process with SPMD_OPENBLAS=`choice` (Note [Matmul on BLAS]): the first product's
// values against the reference, then exit code 0 when the library it ran on is `want` (else 1,
// saying which).
[[noreturn]] void first_product_on(const char* choice, const std::string& want) {
  setenv("SPMD_OPENBLAS", choice, 1);
  if (!first_product_is_right()) {
    std::fputs("wrong value", stderr);
    std::exit(1);
  }
  const std::string library = cpu_kernels::matmul_library();
  if (library.rfind(want, 0) != 0) {
    std::fputs(fmt::format("ran on {}, expected {}", library, want).c_str(), stderr);
    std::exit(1);
  }
  std::exit(0);
}

// SPMD_OPENBLAS names the library file: one that does not load, or is not OpenBLAS, leaves the
// products on Eigen with one warning naming the file and what to do; `none` chooses Eigen without
// a word; the soname loads OpenBLAS as the default search does.
TEST(Matmul, SpmdOpenblasChoosesTheLibraryAndSaysWhenItCannotLoad) {
#if !SPMD_HAVE_OPENBLAS
  GTEST_SKIP() << "this build has no OpenBLAS";
#endif
  // (No product before the EXPECT_EXITs: each child runs this body again up to its own.)
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(first_product_on("/nonexistent/libopenblas.so.0", "Eigen"),
              ::testing::ExitedWithCode(0),
              "spmdsim: warning: OpenBLAS could not be loaded \\(/nonexistent/libopenblas.so.0: "
              ".*Eigen's GEMM instead.*SPMD_OPENBLAS");
  EXPECT_EXIT(first_product_on("libm.so.6", "Eigen"), ::testing::ExitedWithCode(0),
              "spmdsim: warning: libm.so.6 lacks OpenBLAS's entry points");
  EXPECT_EXIT(first_product_on("none", "Eigen"), ::testing::ExitedWithCode(0),
              ::testing::Not(::testing::HasSubstr("warning")));
  EXPECT_EXIT(first_product_on("libopenblas.so.0", "OpenBLAS"), ::testing::ExitedWithCode(0),
              ::testing::Not(::testing::HasSubstr("warning")));
}

// Note [Parallel matmul] (tensor/kernels/matmul.cpp): a product split over threads (row blocks of
// one matrix, or batch items) equals the product on one thread bit for bit, for every layout,
// row counts that leave a few rows after the last block, depths beyond Eigen's k-blocking, and
// addmm's accumulation; and it matches the reference.
TEST(Matmul, SplitOverThreadsIsBitwiseTheSame) {
  struct Case {
    int64_t batch, n, k, m;
  };
  const std::vector<Case> cases = {{1, 300, 70, 200}, {1, 97, 100, 129}, {1, 145, 1100, 40},
                                   {1, 1000, 64, 17}, {3, 130, 90, 64},  {5, 64, 257, 96},
                                   {1, 481, 33, 300}};
  const int saved = num_threads();
  int split = 0;
  for (DType d : {DType::F32, DType::F64, DType::BF16}) {
    for (const Case& c : cases) {
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
          const Tensor a0 = randn(ta ? Shape{c.batch, c.k, c.n} : Shape{c.batch, c.n, c.k}, 3, d);
          const Tensor b0 = randn(tb ? Shape{c.batch, c.m, c.k} : Shape{c.batch, c.k, c.m}, 4, d);
          const Tensor a = ta ? a0.transpose(1, 2) : a0;
          const Tensor b = tb ? b0.transpose(1, 2) : b0;
          const Tensor bias = randn({c.batch, c.n, c.m}, 5, d);
          const std::string context = fmt::format(
              "{} [{}, {}, {}] x [{}, {}], a transposed {}, "
              "b transposed {}",
              d, c.batch, c.n, c.k, c.k, c.m, ta, tb);
          set_num_threads(1);
          const Tensor one = matmul(a, b);
          const Tensor one_addmm =
              c.batch == 1 ? addmm(bias.select(0, 0), a.select(0, 0), b.select(0, 0), 2.0, 0.5)
                           : Tensor();
          set_num_threads(4);
          const Tensor many = matmul(a, b);
          const Tensor many_addmm =
              c.batch == 1 ? addmm(bias.select(0, 0), a.select(0, 0), b.select(0, 0), 2.0, 0.5)
                           : Tensor();
          set_num_threads(saved);
          EXPECT_TRUE(equal(one, many)) << context;
          if (c.batch == 1) EXPECT_TRUE(equal(one_addmm, many_addmm)) << context;
          if (ta && tb && d == DType::F64) {
            const Tensor a2 = a.select(0, 0);
            const Tensor b2 = b.select(0, 0);
            const Product p = reference_matmul(a2, b2);
            expect_values(many.select(0, 0), p.values, 1e-11, 1e-11, context);
          }
          ++split;
        }
      }
    }
  }
  EXPECT_EQ(split, 3 * 7 * 4);
}

TEST(Matmul, Addmm) {
  Gen gen(22);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t n = gen.uniform(0, 4);
    const int64_t k = gen.uniform(0, 4);
    const int64_t m = gen.uniform(0, 4);
    const DType d = kAllDTypes[gen.uniform(0, 6)];
    const DType dc = gen.uniform(0, 1) ? d : kAllDTypes[gen.uniform(0, 6)];
    const Tensor a = gen.tensor({n, k}, d, gen.layout());
    const Tensor b = gen.tensor({k, m}, d, gen.layout());
    const Shape sc = gen.broadcastable_to({n, m});
    const Tensor c = gen.tensor(sc, dc, gen.layout());
    const double alphas[] = {1, 0.5, -2, 3};
    const double betas[] = {1, 0, 0.5, -1};
    const double alpha = alphas[gen.uniform(0, 3)];
    const double beta = betas[gen.uniform(0, 3)];
    const std::string context =
        fmt::format("addmm(c {} {}, a {} [{}, {}], b [{}, {}], beta {}, alpha {})", dc,
                    shape_str(sc), d, n, k, k, m, beta, alpha);
    const DType want_dtype = promote_types(dc, d);
    if (want_dtype == DType::Bool) {
      expect_throws<Unsupported>([&] { addmm(c, a, b, beta, alpha); }, {"addmm", "bool"});
      continue;
    }
    if (!is_floating(want_dtype) && (alpha != std::trunc(alpha) || beta != std::trunc(beta))) {
      expect_throws<Unsupported>([&] { addmm(c, a, b, beta, alpha); }, {"addmm", "alpha"});
      continue;
    }
    const Tensor out = addmm(c, a, b, beta, alpha);
    ASSERT_EQ(out.shape(), (Shape{n, m})) << context;
    ASSERT_EQ(out.dtype(), want_dtype) << context;
    const Product p = reference_matmul(a, b);
    std::vector<double> want;
    for (int64_t i = 0; i < n * m; ++i) {
      const double cv = round_to(want_dtype, element(c, broadcast_index(unravel(i, {n, m}), sc)));
      want.push_back(round_to(
          want_dtype, (beta == 0 ? 0 : beta * cv) + alpha * p.values[static_cast<std::size_t>(i)]));
    }
    expect_values(out, want, 0, 0, context);
  }
  // beta == 0 ignores c entirely, NaN included.
  const Tensor out = addmm(full({2, 2}, NAN), ones({2, 3}), ones({3, 2}), 0.0, 2.0);
  EXPECT_EQ(testing::values(out), (std::vector<double>(4, 6.0)));
}

TEST(Matmul, Bmm) {
  Gen gen(23);
  for (int trial = 0; trial < 100; ++trial) {
    const int64_t batch = gen.uniform(0, 3);
    const int64_t n = gen.uniform(0, 4);
    const int64_t k = gen.uniform(0, 4);
    const int64_t m = gen.uniform(0, 4);
    const DType d = kAllDTypes[gen.uniform(0, 5)];  // not Bool
    const Tensor a = gen.tensor({batch, n, k}, d, gen.layout());
    const Tensor b = gen.tensor({batch, k, m}, d, gen.layout());
    const Tensor out = bmm(a, b);
    const Product p = reference_matmul(a, b);
    ASSERT_EQ(out.shape(), (Shape{batch, n, m}));
    std::vector<double> want;
    for (double v : p.values) want.push_back(round_to(d, v));
    expect_values(out, want, 0, 0,
                  fmt::format("bmm {} [{}, {}, {}] @ [{}, {}, {}]", d, batch, n, k, batch, k, m));
  }
}

TEST(Matmul, Errors) {
  expect_throws<ShapeError>([] { matmul(full({}, 1), ones({2})); },
                            {"matmul", "at least 1 dim", "[]"});
  expect_throws<ShapeError>(
      [] {
        matmul(ones({2, 3}), ones({4, 5}));
      },
      {"matmul", "[2, 3]", "[4, 5]", "3 and 4"});
  expect_throws<ShapeError>([] { matmul(ones({3}), ones({4})); }, {"matmul", "[3]", "[4]"});
  expect_throws<ShapeError>(
      [] {
        matmul(ones({2, 2, 3}), ones({3, 3, 4}));
      },
      {"matmul", "[2]", "[3]"});
  expect_throws<Unsupported>(
      [] {
        matmul(ones({2, 2}, DType::Bool), ones({2, 2}, DType::Bool));
      },
      {"matmul", "bool"});
  expect_throws<ShapeError>(
      [] {
        addmm(ones({2, 2}), ones({2, 3, 1}), ones({3, 2}));
      },
      {"addmm", "2-d", "[2, 3, 1]"});
  expect_throws<ShapeError>(
      [] {
        addmm(ones({3, 2}), ones({2, 3}), ones({3, 2}));
      },
      {"addmm", "[3, 2]", "[2, 2]"});
  expect_throws<ShapeError>(
      [] {
        addmm(ones({2, 2}), ones({2, 3}), ones({2, 2}));
      },
      {"addmm", "[2, 3]", "[2, 2]"});
  expect_throws<ShapeError>(
      [] {
        bmm(ones({2, 2, 3}), ones({3, 3, 2}));
      },
      {"bmm", "[2, 2, 3]", "[3, 3, 2]"});
  expect_throws<ShapeError>([] { bmm(ones({2, 3}), ones({3, 2})); }, {"bmm", "[2, 3]"});
  expect_throws<ShapeError>([] { bmm(ones({2, 2, 3}), ones({2, 4, 2})); }, {"bmm", "3 and 4"});
}

}  // namespace
}  // namespace spmd
