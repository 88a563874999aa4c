// Tests for tensor/tensor.h: views and storage sharing, reshape (view vs copy), chunk/split,
// contiguous/clone/to, item/to_vector, fill_/copy_ with broadcasting and conversion, printing,
// and the errors each of them raises.
#include <spmd/tensor/tensor.h>

#include <gtest/gtest.h>

#include <sstream>

#include <spmd/ops/ops.h>
#include "tests/support/test_support.h"
#include "tests/tensor/reference.h"

namespace spmd {
namespace {

using testing::element;
using testing::expect_throws;
using testing::Gen;
using testing::values;

// arange(n) as F32 in `shape`, written without the ops under test.
Tensor iota(const Shape& shape) {
  Tensor t = empty(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(i);
  return t;
}

std::vector<double> iota_values(int64_t n) {
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(static_cast<double>(i));
  return v;
}

TEST(Tensor, UndefinedTensorThrows) {
  Tensor t;
  EXPECT_FALSE(t.defined());
  expect_throws<Error>([&] { t.size(0); }, {"undefined"});
  expect_throws<Error>([&] { t.narrow(0, 0, 1); }, {"narrow", "undefined"});
  expect_throws<Error>([&] { add(t, t); }, {"add", "undefined"});
  EXPECT_EQ(t.to_string(), "tensor(undefined)");
}

TEST(Tensor, ConstructorChecksBounds) {
  auto storage = Storage::allocate(6 * sizeof(float));
  EXPECT_NO_THROW(Tensor(storage, {2, 3}, {3, 1}, 0, DType::F32));
  EXPECT_NO_THROW(Tensor(storage, {3, 2}, {1, 3}, 0, DType::F32));
  EXPECT_NO_THROW(Tensor(storage, {0, 5}, {5, 1}, 100, DType::F32));  // empty: nothing reached
  expect_throws<ShapeError>(
      [&] {
        Tensor(storage, {2, 3}, {3, 1}, 1, DType::F32);
      },
      {"Tensor", "past the end", "offset 1", "24 bytes"});
  expect_throws<ShapeError>(
      [&] {
        Tensor(storage, {2, 3}, {3, 1}, 0, DType::F64);
      },
      {"Tensor", "past the end"});
  expect_throws<ShapeError>(
      [&] {
        Tensor(storage, {2, 3}, {3, -1}, 0, DType::F32);
      },
      {"Tensor", "before the start", "[3, -1]"});
  expect_throws<ShapeError>(
      [&] {
        Tensor(storage, {2, 3}, {3}, 0, DType::F32);
      },
      {"Tensor", "1 strides for 2 dims"});
  expect_throws<ShapeError>([&] { Tensor(storage, {-1}, {1}, 0, DType::F32); }, {"Tensor", "-1"});
}

TEST(Tensor, Metadata) {
  Tensor t = iota({2, 3, 4});
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_TRUE(t.device().is_cpu());
  expect_throws<ShapeError>([&] { t.size(3); }, {"Tensor::size", "dim 3", "[2, 3, 4]"});
  expect_throws<Unsupported>([&] { t.data<double>(); }, {"Tensor::data", "f32", "f64"});
}

TEST(Tensor, NarrowSelectTransposePermuteShareStorage) {
  Tensor t = iota({3, 4});
  Tensor n = t.narrow(1, 1, 2);
  EXPECT_EQ(n.shape(), (Shape{3, 2}));
  EXPECT_EQ(n.storage(), t.storage());
  EXPECT_FALSE(n.is_contiguous());
  EXPECT_EQ(values(n), (std::vector<double>{1, 2, 5, 6, 9, 10}));
  EXPECT_EQ(values(t.select(0, -1)), (std::vector<double>{8, 9, 10, 11}));
  EXPECT_EQ(values(t.select(1, 2)), (std::vector<double>{2, 6, 10}));
  Tensor tt = t.transpose(0, 1);
  EXPECT_EQ(tt.shape(), (Shape{4, 3}));
  EXPECT_EQ(element(tt, {3, 1}), 7);
  Tensor p = iota({2, 3, 4}).permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(element(p, {3, 1, 2}), 1 * 12 + 2 * 4 + 3);
  // Writing through a view changes the source.
  t.narrow(0, 1, 1).fill_(-1);
  EXPECT_EQ(values(t.select(0, 1)), (std::vector<double>{-1, -1, -1, -1}));
  EXPECT_EQ(t.narrow(0, 3, 0).numel(), 0);
  Tensor s = iota({});
  EXPECT_TRUE(s.transpose(0, -1).is_same(s));
}

TEST(Tensor, ViewErrorsNameOpShapeAndRange) {
  Tensor t = iota({3, 4});
  expect_throws<ShapeError>([&] { t.narrow(1, 3, 2); },
                            {"narrow", "start 3 and length 2", "size 4", "[3, 4]"});
  expect_throws<ShapeError>([&] { t.narrow(0, -1, 1); }, {"narrow"});
  expect_throws<ShapeError>([&] { t.narrow(2, 0, 1); }, {"narrow", "dim 2"});
  expect_throws<ShapeError>([&] { t.select(0, 3); }, {"select", "index 3", "size 3"});
  expect_throws<ShapeError>([&] { t.select(1, -5); }, {"select", "index -5"});
  expect_throws<ShapeError>([&] { t.transpose(0, 2); }, {"transpose", "dim 2"});
  expect_throws<ShapeError>([&] { t.permute({0, 0}); }, {"permute", "[0, 0]", "[3, 4]"});
  expect_throws<ShapeError>([&] { t.permute({0}); }, {"permute", "[0]"});
  expect_throws<ShapeError>([&] { t.unsqueeze(3); }, {"unsqueeze", "dim 3"});
  expect_throws<ShapeError>([&] { t.expand({3, 5}); }, {"expand", "[3, 4]", "[3, 5]"});
  expect_throws<ShapeError>([&] { t.expand({4}); }, {"expand", "fewer dims"});
  expect_throws<ShapeError>([&] { t.expand({-1, 3, 4}); }, {"expand", "-1"});
}

TEST(Tensor, ChunkFollowsTorch) {
  auto sizes = [](const std::vector<Tensor>& pieces) {
    std::vector<int64_t> s;
    for (const Tensor& p : pieces) s.push_back(p.size(0));
    return s;
  };
  EXPECT_EQ(sizes(iota({5}).chunk(4)), (std::vector<int64_t>{2, 2, 1}));
  EXPECT_EQ(sizes(iota({3}).chunk(4)), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(sizes(iota({8}).chunk(4)), (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(sizes(iota({6}).chunk(4)), (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(sizes(iota({0}).chunk(3)), (std::vector<int64_t>{0, 0, 0}));
  // The free function is the method (it gave one piece for an empty dim).
  EXPECT_EQ(sizes(chunk(iota({0}), 3)), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(sizes(chunk(iota({5}), 4)), (std::vector<int64_t>{2, 2, 1}));
  // A huge count of an empty dim is refused, not allocated (chunk_ranges formed size + chunks - 1).
  expect_throws<ShapeError>([] { chunk(iota({0}), std::numeric_limits<int64_t>::max()); },
                            {"chunk", "at most"});
  expect_throws<ShapeError>([] { chunk(iota({3}), -2); }, {"chunk", "positive", "got -2"});
  EXPECT_EQ(sizes(iota({1}).chunk(1)), (std::vector<int64_t>{1}));
  const auto pieces = iota({2, 7}).chunk(3, -1);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(values(pieces[2]), (std::vector<double>{6, 13}));
  EXPECT_EQ(pieces[1].storage(), pieces[0].storage());
  expect_throws<ShapeError>([] { iota({4}).chunk(0); }, {"chunk", "positive", "got 0"});
  // The pieces cover the dim in order, for every size and count.
  for (int64_t n = 0; n <= 9; ++n) {
    for (int64_t k = 1; k <= 5; ++k) {
      const auto ps = iota({n}).chunk(k);
      int64_t next = 0;
      const int64_t piece = (n + k - 1) / k;
      for (const Tensor& p : ps) {
        EXPECT_LE(p.size(0), std::max<int64_t>(piece, 0));
        for (double v : values(p)) EXPECT_EQ(v, static_cast<double>(next++));
      }
      EXPECT_EQ(next, n);
      EXPECT_LE(static_cast<int64_t>(ps.size()), k);
    }
  }
}

TEST(Tensor, Split) {
  const auto pieces = iota({2, 6}).split({1, 0, 5}, 1);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].shape(), (Shape{2, 1}));
  EXPECT_EQ(pieces[1].shape(), (Shape{2, 0}));
  EXPECT_EQ(values(pieces[2]), (std::vector<double>{1, 2, 3, 4, 5, 7, 8, 9, 10, 11}));
  expect_throws<ShapeError>(
      [] {
        iota({5, 2}).split({2, 2});
      },
      {"split", "[2, 2]", "add up to 4", "size 5", "[5, 2]"});
  expect_throws<ShapeError>([] { iota({5}).split({7, -2}); }, {"split", "[7, -2]"});
}

TEST(Tensor, ReshapeIsAViewWhenStridesAllowElseACopy) {
  Tensor t = iota({2, 3, 4});
  Tensor r = t.reshape({6, -1});
  EXPECT_EQ(r.shape(), (Shape{6, 4}));
  EXPECT_EQ(r.storage(), t.storage());
  EXPECT_EQ(values(r), iota_values(24));
  // Narrowing the last dim keeps rows mergeable in the leading dims only.
  Tensor n = t.narrow(2, 0, 2);
  Tensor merged = n.reshape({6, 2});
  EXPECT_EQ(merged.storage(), t.storage());
  Tensor flat = n.reshape({12});
  EXPECT_NE(flat.storage(), t.storage());
  EXPECT_EQ(values(flat), values(n));
  // A transposed tensor flattens only by copying; view refuses.
  Tensor tt = iota({3, 4}).transpose(0, 1);
  Tensor c = tt.reshape({-1});
  EXPECT_NE(c.storage(), tt.storage());
  EXPECT_EQ(values(c), (std::vector<double>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  expect_throws<ShapeError>([&] { tt.view({12}); }, {"view", "[12]", "[4, 3]", "reshape"});
  // Size-1 dims and 0-d tensors.
  Tensor row = iota({1, 3});
  EXPECT_EQ(row.transpose(0, 1).view({3}).storage(), row.storage());
  Tensor s = iota({1}).reshape({});
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.reshape({1, 1, 1}).shape(), (Shape{1, 1, 1}));
  EXPECT_EQ(iota({0, 3}).reshape({3, -1, 5}).shape(), (Shape{3, 0, 5}));
  // Errors.
  expect_throws<ShapeError>(
      [&] {
        t.reshape({5, -1});
      },
      {"reshape", "[5, -1]", "24 elements", "[2, 3, 4]"});
  expect_throws<ShapeError>([&] { t.reshape({-1, -1}); }, {"reshape", "only one", "-1"});
  expect_throws<ShapeError>([&] { t.reshape({25}); }, {"reshape", "[25]"});
  expect_throws<ShapeError>([&] { t.reshape({-2, 12}); }, {"reshape", "invalid size -2"});
  expect_throws<ShapeError>([&] { iota({0}).reshape({0, -1}); }, {"reshape", "[0, -1]"});
  expect_throws<ShapeError>([&] { t.reshape({int64_t{1} << 62, 8}); }, {"reshape"});
}

TEST(Tensor, ReshapeViewMatchesCopyOnRandomViews) {
  Gen gen(7);
  for (int trial = 0; trial < 200; ++trial) {
    const Shape shape = gen.shape(0, 4);
    const Tensor t = gen.tensor(shape, DType::F32, gen.layout());
    // Reshape to a random factorisation of numel by splitting / merging.
    Shape target;
    int64_t rest = t.numel();
    if (rest == 0) {
      target = {0, gen.uniform(1, 3)};
    } else {
      for (int64_t f : {2, 3}) {
        while (rest % f == 0 && gen.uniform(0, 1)) {
          target.push_back(f);
          rest /= f;
        }
      }
      target.push_back(rest);
      if (gen.uniform(0, 1)) target.insert(target.begin(), 1);
    }
    const Tensor r = t.reshape(target);
    EXPECT_EQ(r.shape(), target);
    EXPECT_EQ(values(r), values(t)) << shape_str(shape) << " -> " << shape_str(target);
    // A view was taken exactly when the strides allow one: then it shares storage.
    bool view_ok = true;
    try {
      const Tensor v = t.view(target);
      EXPECT_EQ(v.storage(), t.storage());
    } catch (const ShapeError&) {
      view_ok = false;
    }
    EXPECT_EQ(r.storage() == t.storage(), view_ok)
        << shape_str(shape) << " -> " << shape_str(target);
  }
}

TEST(Tensor, UnsqueezeSqueezeExpand) {
  Tensor t = iota({2, 3});
  EXPECT_EQ(t.unsqueeze(0).shape(), (Shape{1, 2, 3}));
  EXPECT_EQ(t.unsqueeze(-1).shape(), (Shape{2, 3, 1}));
  EXPECT_EQ(t.unsqueeze(1).squeeze(1).shape(), (Shape{2, 3}));
  EXPECT_EQ(t.squeeze(0).shape(), (Shape{2, 3}));  // size != 1: unchanged
  EXPECT_EQ(iota({}).unsqueeze(0).shape(), (Shape{1}));
  Tensor e = iota({3, 1}).expand({2, 3, 4});
  EXPECT_EQ(e.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(e.strides(), (Strides{0, 1, 0}));
  EXPECT_EQ(element(e, {1, 2, 3}), 2);
  EXPECT_EQ(iota({3}).expand({0, 3}).numel(), 0);
  EXPECT_EQ(iota({2, 3}).expand({-1, 3}).strides(), (Strides{3, 1}));
}

TEST(Tensor, ContiguousCloneTo) {
  Tensor t = iota({3, 4});
  EXPECT_TRUE(t.contiguous().is_same(t));
  Tensor tt = t.transpose(0, 1);
  Tensor c = tt.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_NE(c.storage(), t.storage());
  EXPECT_EQ(values(c), values(tt));
  Tensor k = t.clone();
  EXPECT_NE(k.storage(), t.storage());
  k.fill_(0);
  EXPECT_EQ(element(t, {1, 1}), 5);
  EXPECT_TRUE(t.to(DType::F32).is_same(t));
  EXPECT_TRUE(t.to(cpu()).is_same(t));
  for (DType d : kAllDTypes) {
    Tensor conv = tt.to(d);
    EXPECT_EQ(conv.dtype(), d);
    EXPECT_EQ(conv.shape(), tt.shape());
    std::vector<double> want = values(tt);
    for (double& v : want) v = testing::round_to(d, v);
    EXPECT_EQ(values(conv), want) << d;
  }
}

TEST(Tensor, ItemAndToVector) {
  Tensor t = iota({2, 3});
  EXPECT_EQ(t.select(0, 1).select(0, 2).item<float>(), 5.0f);
  EXPECT_EQ(t.narrow(1, 2, 1).narrow(0, 1, 1).item<int64_t>(), 5);
  EXPECT_EQ(full({}, 2.75, DType::BF16).item<double>(), 2.75);
  EXPECT_EQ(static_cast<float>(full({1, 1}, -1.5, DType::F16).item<Half>()), -1.5f);
  EXPECT_TRUE(full({}, 3, DType::I32).item<bool>());
  EXPECT_EQ(full({}, 3.9, DType::F64).item<int32_t>(), 3);
  EXPECT_EQ(static_cast<float>(full({}, 1, DType::Bool).item<BFloat16>()), 1.0f);
  expect_throws<ShapeError>([&] { t.item<float>(); }, {"item", "[2, 3]", "6 elements"});
  expect_throws<ShapeError>([&] { iota({0}).item<float>(); }, {"item", "[0]"});

  EXPECT_EQ(t.transpose(0, 1).to_vector<int32_t>(), (std::vector<int32_t>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(t.to_vector<double>(), (std::vector<double>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(t.to_vector<bool>(), (std::vector<bool>{false, true, true, true, true, true}));
  EXPECT_EQ(t.to_vector<int64_t>().size(), 6u);
  EXPECT_EQ(static_cast<float>(t.to_vector<BFloat16>()[5]), 5.0f);
  EXPECT_EQ(static_cast<float>(t.to_vector<Half>()[4]), 4.0f);
  EXPECT_TRUE(iota({0, 2}).to_vector<float>().empty());
}

TEST(Tensor, FillConvertsAndSaturates) {
  for (DType d : kAllDTypes) {
    Tensor t = empty({2, 5}, d);
    t.narrow(1, 1, 3).fill_(2.5);
    std::vector<double> got = values(t.narrow(1, 1, 3));
    for (double v : got) EXPECT_EQ(v, testing::round_to(d, 2.5)) << d;
  }
  // A value the integer dtype cannot hold is refused (PyTorch: "value cannot be converted");
  // INT64_MAX, which becomes 2^63 as a double, saturates back.
  expect_throws<Unsupported>([] { full({2}, 1e20, DType::I32); }, {"full", "1e+20", "i32"});
  expect_throws<Unsupported>([] { full({1}, NAN, DType::I64); }, {"full", "nan", "i64"});
  EXPECT_EQ(full({1}, static_cast<double>(std::numeric_limits<int64_t>::max()), DType::I64)
                .item<int64_t>(),
            std::numeric_limits<int64_t>::max());
  EXPECT_TRUE(std::isinf(values(full({1}, 1e6, DType::F16))[0]));
  expect_throws<ShapeError>([] { iota({3}).expand({2, 3}).fill_(1); }, {"fill_", "expanded"});
}

TEST(Tensor, CopyBroadcastsAndConvertsEveryDTypePair) {
  Gen gen(11);
  for (DType dst_dtype : kAllDTypes) {
    for (DType src_dtype : kAllDTypes) {
      for (int trial = 0; trial < 4; ++trial) {
        const Shape shape = gen.shape(0, 4);
        const Shape src_shape = gen.broadcastable_to(shape);
        const testing::Layout src_layout = gen.layout();
        const testing::Layout dst_layout =
            gen.uniform(0, 1) ? testing::Layout::Transposed : testing::Layout::Narrowed;
        Tensor src = gen.tensor(src_shape, src_dtype, src_layout);
        Tensor dst = gen.tensor(shape, dst_dtype, dst_layout);
        const Tensor before_src = src.clone();
        dst.copy_(src);
        std::vector<double> want;
        for (int64_t i = 0; i < dst.numel(); ++i) {
          const auto index = testing::unravel(i, shape);
          want.push_back(testing::round_to(
              dst_dtype, element(src, testing::broadcast_index(index, src_shape))));
        }
        testing::expect_values(
            dst, want, 0, 0,
            fmt::format("copy_ {} {} ({}) into {} {} ({})", src_dtype, shape_str(src_shape),
                        testing::layout_name(src_layout), dst_dtype, shape_str(shape),
                        testing::layout_name(dst_layout)));
        EXPECT_EQ(values(src), values(before_src));
      }
    }
  }
}

TEST(Tensor, TransposedCopiesOfLargeMatricesGoThroughTiles) {
  // Big enough for Note [Transposed copies], with ragged tiles, batches, conversions, and the
  // destination transposed instead of the source.
  Gen gen(12);
  const std::pair<DType, DType> conversions[] = {
      {DType::F32, DType::F32}, {DType::BF16, DType::F32}, {DType::I32, DType::F64}};
  for (auto [from, to] : conversions) {
    const Tensor src = gen.tensor({3, 45, 70}, from, testing::Layout::Contiguous);
    const Tensor t = src.transpose(1, 2).narrow(1, 1, 66);
    Tensor dst = empty(t.shape(), to);
    dst.copy_(t);
    std::vector<double> want = values(t);
    for (double& v : want) v = testing::round_to(to, v);
    testing::expect_values(dst, want, 0, 0, fmt::format("{} -> {} transposed source", from, to));
    Tensor back = empty({3, 45, 66}, to);
    back.transpose(1, 2).copy_(dst);
    testing::expect_values(back.transpose(1, 2), want, 0, 0,
                           fmt::format("{} -> {} transposed destination", from, to));
  }
  // Large enough that the tiles are spread over threads.
  const Tensor big = gen.tensor({1100, 1100}, DType::F32, testing::Layout::Transposed);
  testing::expect_values(big.contiguous(), values(big), 0, 0, "1100 x 1100 transposed");
}

TEST(Tensor, CopyHandlesOverlapAndRejectsBadDestinations) {
  // Shifting a buffer onto itself reads the old values, as if copied aside first.
  Tensor t = iota({6});
  t.narrow(0, 1, 5).copy_(t.narrow(0, 0, 5));
  EXPECT_EQ(values(t), (std::vector<double>{0, 0, 1, 2, 3, 4}));
  Tensor m = iota({3, 3});
  m.copy_(m.transpose(0, 1));
  EXPECT_EQ(values(m), (std::vector<double>{0, 3, 6, 1, 4, 7, 2, 5, 8}));
  Tensor same = iota({4});
  same.copy_(same);
  EXPECT_EQ(values(same), iota_values(4));
  expect_throws<ShapeError>(
      [] {
        iota({2, 3}).copy_(iota({3, 2}));
      },
      {"copy_", "[3, 2]", "[2, 3]"});
  expect_throws<ShapeError>([] { iota({3}).copy_(iota({2, 3})); }, {"copy_", "[2, 3]", "[3]"});
  expect_throws<ShapeError>(
      [] {
        iota({1, 3}).expand({2, 3}).copy_(iota({2, 3}));
      },
      {"copy_", "expanded"});
  expect_throws<Error>([] { iota({3}).copy_(Tensor()); }, {"copy_", "undefined"});
}

TEST(Tensor, PrintsValuesShapeAndDType) {
  EXPECT_EQ(iota({2, 3}).to_string(),
            "tensor([[0., 1., 2.],\n        [3., 4., 5.]], shape=[2, 3], dtype=f32)");
  EXPECT_EQ(full({}, 1.5, DType::F64).to_string(), "tensor(1.5000, shape=[], dtype=f64)");
  EXPECT_EQ(from_vector<int64_t>({-3, 10, 7}).to_string(),
            "tensor([-3, 10,  7], shape=[3], dtype=i64)");
  EXPECT_EQ(from_vector<bool>({true, false}).to_string(),
            "tensor([ True, False], shape=[2], dtype=bool)");
  EXPECT_EQ(empty({0, 3}).to_string(), "tensor([], shape=[0, 3], dtype=f32)");
  EXPECT_EQ(from_vector<float>({1e-5f, 1.0f}).to_string(),
            "tensor([1.0000e-05, 1.0000e+00], shape=[2], dtype=f32)");
  EXPECT_EQ(from_vector<float>({NAN, -INFINITY, 0.5f}).to_string(),
            "tensor([   nan,   -inf, 0.5000], shape=[3], dtype=f32)");
  std::ostringstream os;
  os << iota({2}).to(DType::BF16);
  EXPECT_EQ(os.str(), "tensor([0., 1.], shape=[2], dtype=bf16)");
  EXPECT_EQ(fmt::format("{}", iota({1})), "tensor([0.], shape=[1], dtype=f32)");
}

TEST(Tensor, PrintingSummarizesLargeTensors) {
  // Integral floats within a factor 1000 of each other print as "1000."; torch switches to
  // scientific notation beyond that, and so do we.
  const std::string big = (iota({40, 40}) + 1000.0).to_string();
  EXPECT_NE(big.find("tensor([[1000., 1001., 1002., ..., 1037., 1038., 1039.],\n"),
            std::string::npos)
      << big;
  EXPECT_NE(big.find("[2560., 2561., 2562., ..., 2597., 2598., 2599.]]"), std::string::npos) << big;
  EXPECT_NE(big.find("\n        ...,\n"), std::string::npos) << big;
  EXPECT_NE(big.find("shape=[40, 40], dtype=f32)"), std::string::npos);
  EXPECT_LT(big.size(), 450u);
  EXPECT_NE((iota({2000}) + 1000.0).to_string().find("2997., 2998., 2999.]"), std::string::npos);
  EXPECT_NE(iota({100, 100}).to_string().find("[9.9000e+03, 9.9010e+03, 9.9020e+03, ..., "),
            std::string::npos);
  // Long rows that are not summarized wrap instead of running past 80 columns (the last line
  // also carries shape and dtype).
  const std::string row = iota({40}).to_string();
  ASSERT_NE(row.find('\n'), std::string::npos) << row;
  for (std::size_t start = 0, end; (end = row.find('\n', start)) != std::string::npos;
       start = end + 1) {
    EXPECT_LE(end - start, 80u) << row;
  }
}

}  // namespace
}  // namespace spmd
