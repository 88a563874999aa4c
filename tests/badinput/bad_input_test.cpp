// The bad-input conformance test: one row per hostile input to a public function of tensor/,
// ops/, sim/, mesh/, collectives/, dtensor/, debug/ and runtime/, and to the `spmd` and `spmdrun`
// tools. Each row names the spmd::Error type it must throw (the most specific one, compared by
// type_name(), so a base Error or an InternalError does not pass for a ShapeError) and fragments
// its message must hold, the first being the operation the message must start with. A CLI row
// runs the built tool and expects exit code 2 and the fragments in its output. Nothing may crash,
// hang or corrupt memory: CI runs this test under ASan+UBSan (scripts/test), where a huge
// allocation returns null (allocator_may_return_null=1) so that it reaches the OutOfMemoryError
// path.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <unistd.h>

#include <spmd/spmd.h>
#include "tests/support/run_command.h"

namespace spmd {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int kIntMax = std::numeric_limits<int>::max();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

struct ApiCase {
  std::string name;
  std::function<void()> body;
  std::string type;                    // Error::type_name() of the expected error
  std::vector<std::string> fragments;  // fragments[0]: the operation the message starts with
};

struct CliCase {
  std::string name;
  std::string command;  // after the tool's path
  std::vector<std::string> fragments;
  bool spmdrun = false;
};

// gtest prints a row by its name.
void PrintTo(const ApiCase& c, std::ostream* os) {
  *os << c.name;
}
void PrintTo(const CliCase& c, std::ostream* os) {
  *os << c.name;
}

// A few values most rows share: one World (meshes of different Worlds differ), meshes built on
// use (they are cheap).
World w4() {
  static const World world = World::sim(4);
  return world;
}
DeviceMesh mesh22() {
  return init_device_mesh(w4(), {2, 2}, {"dp", "tp"});
}
DeviceMesh mesh4() {
  return init_device_mesh(w4(), {4}, {"x"});
}
LocalTensor lt4(const Shape& shape = {4, 4}) {
  return LocalTensor::replicate(w4(), ones(shape));
}
DTensor dt22(const Shape& shape = {4, 4}) {
  return distribute_tensor(ones(shape), mesh22(), {Shard{0}, Replicate{}});
}
PerRank<std::vector<int64_t>> splits(std::vector<int64_t> s) {
  return PerRank<std::vector<int64_t>>(std::move(s));
}
std::string nested(int depth) {
  return std::string(static_cast<size_t>(depth), '(') + "2" +
         std::string(static_cast<size_t>(depth), ')');
}
std::string nested_layout(int depth) {
  return nested(depth) + ":" + nested(depth);
}
std::string mesh_json_with_dim(const std::string& dim) {
  return R"({"format": "spmdsim.DeviceMesh", "version": 1, "device_type": "cpu", "world_size": 4,
             "rank_map": [0, 1, 2, 3], "root": {"shape": [4], "dim_names": ["x"]},
             "flattened": {}, "dims": [")" +
         dim + R"("], "dim_names": ["x"]})";
}
std::string trace_json(const std::string& event) {
  return R"({"traceEvents": [)" + event + "]}";
}
// Sets an environment variable for one row's body (each row runs alone in its process under
// CTest; the variable is gone again when the body ends).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

// "weight_decay" -> "WeightDecay": a hyperparameter in a row's name.
std::string field_name(const std::string& field) {
  std::string out;
  bool upper = true;
  for (char c : field) {
    if (c == '_') {
      upper = true;
      continue;
    }
    out += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
    upper = false;
  }
  return out;
}
std::string event(const std::string& fields) {
  return R"({"name": "all_reduce", "ph": "X", "pid": 0, "tid": 0, "ts": 1.0, "dur": 2.0, )" +
         fields + "}";
}

// ---- tensor/ ----------------------------------------------------------------------------------

std::vector<ApiCase> tensor_cases() {
  return {
      {"ZerosNegativeSize",
       [] {
         zeros({2, -1});
       },
       "ShapeError",
       {"zeros", "-1", "[2, -1]"}},
      {"ZerosNumelOverflows",
       [] {
         zeros({kMax, kMax});
       },
       "ShapeError",
       {"zeros", "too many"}},
      {"EmptyNumelOverflowsBytes",
       [] {
         empty({int64_t{1} << 31, int64_t{1} << 31});
       },
       "ShapeError",
       {"empty", "too many"}},
      {"OnesHugeAllocation",
       [] { ones({int64_t{1} << 50}); },
       "OutOfMemoryError",
       {"ones", "[1125899906842624]", "4503599627370496 bytes"}},
      {"FullNaNIntoInt",
       [] { full({2}, kNaN, DType::I32); },
       "Unsupported",
       {"full", "nan", "i32"}},
      {"FullInfIntoInt",
       [] { full({2}, kInf, DType::I64); },
       "Unsupported",
       {"full", "inf", "i64"}},
      {"FullOutOfRangeIntoInt",
       [] { full({2}, 1e10, DType::I32); },
       "Unsupported",
       {"full", "10000000000", "i32"}},
      {"ArangeNegative", [] { arange(-3); }, "ShapeError", {"arange", "-3"}},
      {"ArangeHuge", [] { arange(kMax); }, "ShapeError", {"arange", "too many"}},
      {"RandnNegative", [] { randn({-2}, 0); }, "ShapeError", {"randn", "-2"}},
      {"RandOverflow",
       [] {
         rand({kMax, 2}, 0);
       },
       "ShapeError",
       {"rand", "too many"}},
      {"FromVectorMiscount",
       [] {
         from_vector<float>({1, 2, 3}, {2, 2});
       },
       "ShapeError",
       {"from_vector", "3 values"}},
      {"FromVectorOverflow",
       [] {
         from_vector<float>({1}, {kMax, kMax});
       },
       "ShapeError",
       {"from_vector", "too many"}},
      {"NumelOfUndefined", [] { Tensor().numel(); }, "Error", {"Tensor::numel", "undefined"}},
      {"ShapeOfUndefined", [] { Tensor().shape(); }, "Error", {"Tensor::shape", "undefined"}},
      {"DimOfUndefined", [] { Tensor().dim(); }, "Error", {"Tensor::dim", "undefined"}},
      {"DTypeOfUndefined", [] { Tensor().dtype(); }, "Error", {"Tensor::dtype", "undefined"}},
      {"StridesOfUndefined", [] { Tensor().strides(); }, "Error", {"Tensor::strides", "undefined"}},
      {"NbytesOfUndefined", [] { Tensor().nbytes(); }, "Error", {"Tensor::nbytes", "undefined"}},
      {"SizeOfUndefined", [] { Tensor().size(0); }, "Error", {"Tensor::size", "undefined"}},
      {"CloneOfUndefined", [] { Tensor().clone(); }, "Error", {"Tensor::clone", "undefined"}},
      {"ItemOfUndefined", [] { Tensor().item<float>(); }, "Error", {"Tensor::item", "undefined"}},
      {"AddUndefined", [] { add(ones({2}), Tensor()); }, "Error", {"add", "undefined"}},
      {"ConstructorNullStorage",
       [] { Tensor(nullptr, {2}, {1}, 0, DType::F32); },
       "ShapeError",
       {"Tensor", "storage"}},
      {"ConstructorStridesMiscount",
       [] {
         Tensor(Storage::allocate(16), {2, 2}, {1}, 0, DType::F32);
       },
       "ShapeError",
       {"Tensor", "[2, 2]", "[1]"}},
      {"ConstructorNegativeOffset",
       [] { Tensor(Storage::allocate(16), {2}, {1}, -1, DType::F32); },
       "ShapeError",
       {"Tensor", "offset -1"}},
      {"ConstructorNegativeSize",
       [] { Tensor(Storage::allocate(16), {-2}, {1}, 0, DType::F32); },
       "ShapeError",
       {"Tensor", "[-2]"}},
      {"ConstructorOutOfStorage",
       [] { Tensor(Storage::allocate(16), {5}, {1}, 0, DType::F32); },
       "ShapeError",
       {"Tensor", "16 bytes"}},
      {"ConstructorStrideOverflow",
       [] { Tensor(Storage::allocate(16), {3}, {kMax}, 0, DType::F32); },
       "ShapeError",
       {"Tensor", "[3]"}},
      {"ConstructorOffsetOverflow",
       [] { Tensor(Storage::allocate(16), {1}, {1}, kMax, DType::F32); },
       "ShapeError",
       {"Tensor", "16 bytes"}},
      {"ConstructorNumelOverflow",
       [] {
         Tensor(Storage::allocate(16), {kMax, kMax}, {0, 0}, 0, DType::F32);
       },
       "ShapeError",
       {"Tensor", "too many"}},
      {"ConstructorBadDType",
       [] { Tensor(Storage::allocate(16), {2}, {1}, 0, static_cast<DType>(42)); },
       "Unsupported",
       {"Tensor", "DType(42)"}},
      {"ChunkHugeView",
       [] { ones({1}).expand({int64_t{1} << 44}).chunk(int64_t{1} << 44); },
       "ShapeError",
       {"chunk", "17592186044416"}},
      {"ChunkNegative", [] { ones({4}).chunk(-3); }, "ShapeError", {"chunk", "-3"}},
      {"ToDeviceWithoutKernels", [] { ones({2}).to(cuda(0)); }, "Unsupported", {"to"}},
      {"StorageAllocateHuge",
       [] { Storage::allocate(std::size_t{1} << 62); },
       "OutOfMemoryError",
       {"Storage::allocate", "4611686018427387904 bytes"}},
      {"NarrowHugeLength",
       [] { ones({4}).narrow(0, 1, kMax); },
       "ShapeError",
       {"narrow", "out of bounds"}},
      {"NarrowHugeStart",
       [] { ones({4}).narrow(0, kMax, kMax); },
       "ShapeError",
       {"narrow", "out of bounds"}},
      {"NarrowMinStart",
       [] { ones({4}).narrow(0, kMin, 2); },
       "ShapeError",
       {"narrow", "out of bounds"}},
      {"NarrowDimMin", [] { ones({4}).narrow(kMin, 0, 1); }, "ShapeError", {"narrow", "dim"}},
      {"SelectMin", [] { ones({4}).select(0, kMin); }, "ShapeError", {"select", "index"}},
      {"ChunkZero", [] { ones({4}).chunk(0); }, "ShapeError", {"chunk", "positive"}},
      {"ChunkHugeEmpty", [] { zeros({0}).chunk(kMax); }, "ShapeError", {"chunk", "[0]"}},
      {"ChunkHugeDimMin", [] { ones({3}).chunk(2, kMin); }, "ShapeError", {"chunk", "dim"}},
      {"SplitOverflow",
       [] {
         ones({4}).split({kMax, kMax, 2});
       },
       "ShapeError",
       {"split", "[4]"}},
      {"SplitNegative",
       [] {
         ones({4}).split({6, -2});
       },
       "ShapeError",
       {"split", "-2"}},
      {"TransposeDimMax",
       [] {
         ones({2, 2}).transpose(0, kMax);
       },
       "ShapeError",
       {"transpose", "dim"}},
      {"PermuteMin",
       [] {
         ones({2, 2}).permute({0, kMin});
       },
       "ShapeError",
       {"permute", "dims"}},
      {"ReshapeTwoInferred",
       [] {
         ones({4}).reshape({-1, -1});
       },
       "ShapeError",
       {"reshape", "-1"}},
      {"ReshapeOverflow",
       [] {
         ones({4}).reshape({kMax, kMax});
       },
       "ShapeError",
       {"reshape"}},
      {"ReshapeMin", [] { ones({4}).reshape({kMin}); }, "ShapeError", {"reshape"}},
      {"ViewOverflow",
       [] {
         ones({4}).view({kMax, 2});
       },
       "ShapeError",
       {"view"}},
      {"ExpandOverflow",
       [] {
         ones({1, 1}).expand({kMax, kMax});
       },
       "ShapeError",
       {"expand", "too many"}},
      {"ExpandNegative", [] { ones({1}).expand({-5}); }, "ShapeError", {"expand", "-5"}},
      {"UnsqueezeMax", [] { ones({2}).unsqueeze(kMax); }, "ShapeError", {"unsqueeze", "dim"}},
      {"SqueezeMin", [] { ones({2}).squeeze(kMin); }, "ShapeError", {"squeeze", "dim"}},
      {"ItemOfMany", [] { ones({2}).item<float>(); }, "ShapeError", {"item", "2 elements"}},
      {"ItemNaNToInt",
       [] { full({}, kNaN).item<int32_t>(); },
       "Unsupported",
       {"item", "nan", "i32"}},
      {"ItemHugeToInt",
       [] { full({}, 1e30).item<int64_t>(); },
       "Unsupported",
       {"item", "e+30", "i64"}},
      {"ToVectorNaNToInt",
       [] {
         from_vector<float>({1, NAN}).to_vector<int32_t>();
       },
       "Unsupported",
       {"to_vector", "nan", "i32", "element 1"}},
      {"ToVectorInfToInt",
       [] { from_vector<double>({-INFINITY}).to_vector<int64_t>(); },
       "Unsupported",
       {"to_vector", "-inf", "i64"}},
      {"ToNaNIntoInt",
       [] {
         from_vector<float>({1, 2, NAN}).to(DType::I32);
       },
       "Unsupported",
       {"to", "element 2", "[2]", "nan", "i32"}},
      {"ToInfIntoInt",
       [] {
         from_vector<double>({INFINITY}).reshape({1, 1}).to(DType::I64);
       },
       "Unsupported",
       {"to", "element 0", "[0, 0]", "inf", "i64"}},
      {"ToOutOfRangeIntoInt",
       [] {
         from_vector<float>({0, -3e9}).to(DType::I32);
       },
       "Unsupported",
       {"to", "element 1", "-3000000000", "i32"}},
      {"ToNarrowingI64IntoI32",
       [] {
         from_vector<int64_t>({1, int64_t{1} << 40}).to(DType::I32);
       },
       "Unsupported",
       {"to", "element 1", "1099511627776", "i32"}},
      {"ToNaNInExpandedView",
       [] { full({1}, kNaN).expand({int64_t{1} << 40}).to(DType::I64); },
       "Unsupported",
       {"to", "element 0", "nan", "i64"}},
      {"ToBF16NaNIntoInt",
       [] { full({3}, kNaN, DType::BF16).to(DType::I32); },
       "Unsupported",
       {"to", "element 0", "nan", "bf16"}},
      {"CopyNaNIntoInt",
       [] { zeros({2}, DType::I32).copy_(full({2}, kNaN)); },
       "Unsupported",
       {"copy_", "element 0", "nan", "i32"}},
      {"ItemI64IntoI32",
       [] { full({}, 1e12, DType::I64).item<int32_t>(); },
       "Unsupported",
       {"item", "1000000000000", "i32"}},
      {"FillNaNIntoInt",
       [] { zeros({2}, DType::I64).fill_(kNaN); },
       "Unsupported",
       {"fill_", "nan", "i64"}},
      {"CopyToUndefined",
       [] { Tensor().copy_(ones({1})); },
       "Error",
       {"Tensor::copy_", "undefined"}},
      {"CopyBroadcastMismatch", [] { zeros({2}).copy_(ones({3})); }, "ShapeError", {"copy_"}},
      {"DataWrongType", [] { ones({2}).data<int32_t>(); }, "Unsupported", {"Tensor::data"}},
      {"StrideDimMax", [] { ones({2}).stride(kMax); }, "ShapeError", {"Tensor::stride", "dim"}},
  };
}

// ---- ops/ -------------------------------------------------------------------------------------

std::vector<ApiCase> ops_cases() {
  return {
      {"AddBroadcast",
       [] {
         ones({2, 3}) + ones({4});
       },
       "ShapeError",
       {"add", "[2, 3]", "[4]"}},
      {"MatmulMismatch",
       [] {
         matmul(ones({2, 3}), ones({4, 2}));
       },
       "ShapeError",
       {"matmul", "[2, 3]", "[4, 2]"}},
      {"MatmulZeroDim", [] { matmul(ones({}), ones({2})); }, "ShapeError", {"matmul"}},
      {"MatmulHugeResult",
       [] {
         matmul(ones({1 << 20, 1}), ones({1, 1 << 30}));
       },
       "OutOfMemoryError",
       {"matmul", "1048576, 1073741824]", "bytes"}},
      {"BmmMismatch",
       [] {
         bmm(ones({2, 2, 3}), ones({3, 3, 2}));
       },
       "ShapeError",
       {"bmm"}},
      {"AddmmMismatch",
       [] {
         addmm(ones({3}), ones({2, 2}), ones({2, 2}));
       },
       "ShapeError",
       {"addmm"}},
      {"SumDimOutOfRange", [] { sum(ones({2}), {5}); }, "ShapeError", {"sum", "5"}},
      {"SumDimMin", [] { sum(ones({2}), {kMin}); }, "ShapeError", {"sum"}},
      {"SumDimRepeated",
       [] {
         sum(ones({2, 2}), {0, 0});
       },
       "ShapeError",
       {"sum", "0"}},
      {"MeanOfInt", [] { mean(ones({2}, DType::I32)); }, "Unsupported", {"mean", "i32"}},
      {"AmaxOfEmpty", [] { amax(zeros({0})); }, "ShapeError", {"amax", "[0]"}},
      {"AminDimMax", [] { amin(ones({2}), {kMax}); }, "ShapeError", {"amin"}},
      {"SoftmaxBool",
       [] { softmax(ones({2}, DType::Bool), 0); },
       "Unsupported",
       {"softmax", "bool"}},
      {"LogSoftmaxBool",
       [] { log_softmax(ones({2}, DType::Bool), 0); },
       "Unsupported",
       {"log_softmax", "bool"}},
      {"SoftmaxDimMax", [] { softmax(ones({2}), kMax); }, "ShapeError", {"softmax", "dim"}},
      {"CatEmptyList", [] { cat(std::vector<Tensor>{}); }, "ShapeError", {"cat"}},
      {"CatMismatch",
       [] {
         cat({ones({2, 2}), ones({2, 3})}, 0);
       },
       "ShapeError",
       {"cat", "[2, 3]"}},
      {"CatDimOverflow",
       [] {
         cat({ones({1}).expand({kMax / 8}), ones({1}).expand({kMax / 8})}, 0);
       },
       "ShapeError",
       {"cat"}},
      {"CatUndefined",
       [] {
         cat({ones({2}), Tensor()});
       },
       "Error",
       {"cat", "undefined"}},
      {"StackMismatch",
       [] {
         stack({ones({2}), ones({3})});
       },
       "ShapeError",
       {"stack", "[3]"}},
      {"StackDimMin", [] { stack({ones({2})}, kMin); }, "ShapeError", {"stack", "dim"}},
      {"PadNegative", [] { pad(ones({2}), 0, -1, 0); }, "ShapeError", {"pad", "-1"}},
      {"PadOverflow", [] { pad(ones({2}), 0, kMax, kMax); }, "ShapeError", {"pad", "overflow"}},
      {"PadTooMany",
       [] {
         pad(ones({2, 2}), 0, kMax / 4, 0);
       },
       "ShapeError",
       {"pad"}},
      {"AddScalarHugeIntoInt",
       [] { ones({2}, DType::I32) + 1e30; },
       "Unsupported",
       {"add", "1e+30", "i32"}},
      {"MulScalarInfIsFloat",
       [] { (ones({2}, DType::I64) * kInf).to_vector<int64_t>(); },
       "Unsupported",
       {"to_vector", "inf", "i64"}},
      {"PadNaNIntoInt",
       [] { pad(ones({2}, DType::I32), 0, 1, 1, kNaN); },
       "Unsupported",
       {"pad", "nan", "i32"}},
      {"UnpadOverflow", [] { unpad(ones({4}), 0, kMax, kMax); }, "ShapeError", {"unpad"}},
      {"NarrowOpOverflow", [] { narrow(ones({4}), 0, kMax, kMax); }, "ShapeError", {"narrow"}},
      {"SelectOpMin", [] { select(ones({4}), 0, kMin); }, "ShapeError", {"select"}},
      {"ReshapeOpOverflow",
       [] {
         reshape(ones({4}), {kMax, 4});
       },
       "ShapeError",
       {"reshape"}},
      {"ExpandOpOverflow",
       [] {
         expand(ones({1, 1}), {kMax, kMax});
       },
       "ShapeError",
       {"expand"}},
      {"PermuteOpDuplicate",
       [] {
         permute(ones({2, 2}), {0, 0});
       },
       "ShapeError",
       {"permute"}},
      {"AllcloseNaNTolerance",
       [] { allclose(ones({2}), ones({2}), kNaN, 0.0); },
       "Unsupported",
       {"allclose", "nan"}},
      {"AllcloseNegativeTolerance",
       [] { allclose(ones({2}), ones({2}), 0.0, -1.0); },
       "Unsupported",
       {"allclose", "-1"}},
      {"ToBadDType", [] { ones({2}).to(static_cast<DType>(42)); }, "Unsupported", {"to", "42"}},
      {"ZerosBadDType", [] { zeros({2}, static_cast<DType>(99)); }, "Unsupported", {"zeros", "99"}},
      {"RequiresGradInt",
       [] { ones({2}, DType::I32).requires_grad_(); },
       "Unsupported",
       {"requires_grad_", "i32"}},
      {"BackwardNonScalar",
       [] {
         Tensor x = ones({2}).requires_grad_();
         backward(x * 2.0);
       },
       "ShapeError",
       {"backward"}},
      {"BackwardUndefined", [] { backward(Tensor()); }, "ShapeError", {"backward", "undefined"}},
      {"LayerNormNegativeEps",
       [] {
         layer_norm(ones({2, 3}), ones({3}), zeros({3}), -1e-5);
       },
       "ConfigError",
       {"layer_norm", "eps", "-1e-05"}},
      {"LayerNormInfEps",
       [] {
         layer_norm(ones({2, 3}), ones({3}), zeros({3}), kInf);
       },
       "ConfigError",
       {"layer_norm", "eps", "inf"}},
      {"RmsNormNaNEps",
       [] {
         rms_norm(ones({2, 3}), ones({3}), kNaN);
       },
       "ConfigError",
       {"rms_norm", "eps", "nan"}},
      {"DropoutNaN", [] { dropout(ones({4}), kNaN, 0); }, "ConfigError", {"dropout", "nan"}},
      {"DropoutAboveOne", [] { dropout(ones({4}), 1.5, 0); }, "ConfigError", {"dropout", "1.5"}},
      {"DropoutRowsPastTheEnd",
       [] {
         dropout(ones({4, 2}), 0.5, 0, DropoutRows{6, 8});
       },
       "ShapeError",
       {"dropout", "[4, 2]", "rows [6, 10)", "of 8 rows"}},
      {"AttentionNaNScale",
       [] {
         scaled_dot_product_attention(ones({2, 4}), ones({2, 4}), ones({2, 4}), false, kNaN);
       },
       "ConfigError",
       {"scaled_dot_product_attention", "scale", "nan"}},
      {"AttentionInfScale",
       [] {
         scaled_dot_product_attention(ones({2, 4}), ones({2, 4}), ones({2, 4}), true, kInf);
       },
       "ConfigError",
       {"scaled_dot_product_attention", "scale", "inf"}},
      {"CrossEntropyTargetTooLarge",
       [] {
         cross_entropy(ones({4, 5}), from_vector<int64_t>({0, 1, 7, 2}));
       },
       "ShapeError",
       {"cross_entropy", "target 7", "index 2", "[0, 5)", "5 classes"}},
      {"CrossEntropyTargetNegative",
       [] {
         cross_entropy(ones({2, 3}), from_vector<int32_t>({-1, 1}));
       },
       "ShapeError",
       {"cross_entropy", "target -1", "index 0", "3 classes", "ignore_index -100"}},
      {"GatherIndexOutOfRange",
       [] {
         gather(ones({2, 3}), 1, from_vector<int64_t>({0, 1, 2, 3}, {2, 2}));
       },
       "ShapeError",
       {"gather", "index 3 at [1, 1]", "[0, 3)"}},
      {"IndexSelectOutOfRange",
       [] {
         index_select(ones({4, 2}), 0, from_vector<int64_t>({1, 9}));
       },
       "ShapeError",
       {"index_select", "index 9", "[0, 4)"}},
      {"EmbeddingOutOfRange",
       [] {
         embedding(from_vector<int64_t>({-1}), ones({4, 2}));
       },
       "ShapeError",
       {"embedding", "index -1", "[0, 4)"}},

  };
}

// ---- sim/ -------------------------------------------------------------------------------------

std::vector<ApiCase> sim_cases() {
  return {
      {"WorldSimZero", [] { World::sim(0); }, "ConfigError", {"World::sim", "0"}},
      {"WorldSimNegative", [] { World::sim(-5); }, "ConfigError", {"World::sim", "-5"}},
      {"WorldSimHuge", [] { World::sim(kIntMax); }, "ConfigError", {"World::sim", "2147483647"}},
      {"WorldUndefinedSize", [] { World().size(); }, "Error", {"World::size", "undefined"}},
      {"LocalTensorNoRanks",
       [] { LocalTensor(std::vector<int>{}, {}); },
       "Error",
       {"LocalTensor", "rank"}},
      {"LocalTensorMiscount",
       [] {
         LocalTensor({0, 1}, {ones({2})});
       },
       "Error",
       {"LocalTensor", "2 ranks"}},
      {"LocalTensorNegativeRank",
       [] { LocalTensor({-1}, {ones({2})}); },
       "Error",
       {"LocalTensor", "-1"}},
      {"LocalTensorUnsorted",
       [] {
         LocalTensor({1, 0}, {ones({2}), ones({2})});
       },
       "Error",
       {"LocalTensor", "ascending"}},
      {"LocalTensorUndefinedShard",
       [] { LocalTensor({0}, {Tensor()}); },
       "Error",
       {"LocalTensor", "undefined"}},
      {"LocalTensorMixedDtypes",
       [] {
         LocalTensor({0, 1}, {ones({2}), ones({2}, DType::I32)});
       },
       "Error",
       {"LocalTensor", "dtype"}},
      {"LocalTensorMixedDims",
       [] {
         LocalTensor({0, 1}, {ones({2}), ones({2, 1})});
       },
       "ShapeError",
       {"LocalTensor"}},
      {"LocalTensorShardNotHeld", [] { lt4().shard(7); }, "Error", {"LocalTensor", "7"}},
      {"LocalTensorUndefinedShape",
       [] { LocalTensor().shape(); },
       "Error",
       {"LocalTensor::shape", "undefined"}},
      {"LocalTensorUndefinedShard2",
       [] { LocalTensor().shard(0); },
       "Error",
       {"LocalTensor::shard", "undefined"}},
      {"LocalTensorUndefinedDtype",
       [] { LocalTensor().dtype(); },
       "Error",
       {"LocalTensor::dtype", "undefined"}},
      {"LocalTensorReplicateUndefined",
       [] { LocalTensor::replicate(w4(), Tensor()); },
       "Error",
       {"LocalTensor::replicate", "undefined"}},
      {"LocalTensorReplicateUndefinedWorld",
       [] { LocalTensor::replicate(World(), ones({1})); },
       "Error",
       {"World", "undefined"}},
      {"LocalTensorFromFnUndefined",
       [] { LocalTensor::from_fn(w4(), [](int) { return Tensor(); }); },
       "Error",
       {"LocalTensor", "undefined"}},
      {"LocalTensorSetShardDims",
       [] { lt4().set_shard(0, ones({2})); },
       "ShapeError",
       {"LocalTensor::set_shard"}},
      {"LocalTensorNarrowOverflow", [] { lt4().narrow(0, kMax, kMax); }, "ShapeError", {"narrow"}},
      {"LocalTensorReshapeOverflow",
       [] {
         lt4().reshape({kMax, kMax});
       },
       "ShapeError",
       {"reshape"}},
      {"LocalTensorAddBroadcast", [] { lt4() + lt4({3}); }, "ShapeError", {"add"}},
      {"LocalTensorAddOtherRanks",
       [] {
         lt4() + LocalTensor::replicate(std::vector<int>{0, 1}, ones({4, 4}));
       },
       "Error",
       {"add", "ranks"}},
      {"LocalTensorReconcileDiffer",
       [] { LocalTensor::from_fn(w4(), [](int r) { return full({1}, r); }).reconcile(); },
       "DivergenceError",
       {"LocalTensor::reconcile", "rank 1"}},
      {"LocalTensorReplicateNegativeRank",
       [] { LocalTensor::replicate(std::vector<int>{-1}, ones({2})); },
       "Error",
       {"LocalTensor", "-1"}},
      {"LocalTensorFromFnUnsorted",
       [] {
         LocalTensor::from_fn(std::vector<int>{3, 1}, [](int) { return ones({1}); });
       },
       "Error",
       {"LocalTensor", "ascending"}},
      {"LocalTensorToBadDType",
       [] { lt4().to(static_cast<DType>(42)); },
       "Unsupported",
       {"to", "DType(42)"}},
      {"LocalTensorSumDim", [] { sum(lt4(), {7}); }, "ShapeError", {"sum", "7"}},
      {"PerRankMiscount",
       [] {
         PerRank<int>({0, 1}, {1});
       },
       "Error",
       {"PerRank", "2 ranks"}},
      {"PerRankUnsorted",
       [] {
         PerRank<int>({1, 0}, {1, 2});
       },
       "Error",
       {"PerRank", "ascending"}},
      {"PerRankAtNotHeld",
       [] {
         PerRank<int>({0, 1}, {1, 2}).at(5);
       },
       "Error",
       {"PerRank::at", "rank 5"}},
      {"PerRankDiverges",
       [] {
         (void)(PerRank<int>({0, 1}, {1, 2}) < 2);
       },
       "DivergenceError",
       {"PerRank"}},
      // SPMD types name mesh axes of the LocalTensor's world; values of two Worlds never meet.
      {"AssertTypeUnknownAxis",
       [] {
         (void)mesh22();
         assert_type(LocalTensor::from_fn(w4(), [](int) { return ones({2}); }),
                     {{"pp", SpmdType::V}});
       },
       "TypeError",
       {"assert_type", "'pp' is no mesh axis", "'dp', 'tp'"}},
      {"AssertTypeMisspeltAxis",
       [] {
         (void)mesh22();
         assert_type(lt4(), {{"tq", SpmdType::R}});
       },
       "TypeError",
       {"assert_type", "'tq'", "did you mean 'tp'?"}},
      {"ReinterpretUnknownAxis",
       [] {
         (void)mesh22();
         (void)reinterpret(LocalTensor::from_fn(w4(), [](int) { return ones({2}); }),
                           {{"ep", SpmdType::P}});
       },
       "TypeError",
       {"reinterpret", "'ep' is no mesh axis"}},
      {"ConvertEmptyAxis",
       [] {
         (void)convert(lt4(), {{"", SpmdType::I}});
       },
       "TypeError",
       {"convert", "an axis name is empty"}},
      {"LocalTensorsOfTwoWorlds",
       [] {
         const World other = World::sim(4);
         (void)(lt4() + LocalTensor::replicate(other, ones({4, 4})));
       },
       "TypeError",
       {"add", "different Worlds", "world #"}},
      {"CollectiveOnAnotherWorldsMesh",
       [] {
         const World other = World::sim(4);
         const DeviceMesh there = init_device_mesh(other, {4}, {"x"});
         (void)all_gather(LocalTensor::from_fn(w4(), [](int) { return ones({2}); }), there, "x");
       },
       "TypeError",
       {"all_gather", "comes from world #", "a collective runs on the values of its own world"}},
  };
}

// ---- mesh/ ------------------------------------------------------------------------------------

std::vector<ApiCase> mesh_cases() {
  return {
      {"InitMeshEmptyShape",
       [] { init_device_mesh(w4(), {}); },
       "MeshError",
       {"init_device_mesh", "at least one dim"}},
      {"InitMeshZeroDim",
       [] {
         init_device_mesh(w4(), {2, 0});
       },
       "MeshError",
       {"init_device_mesh", "size 0"}},
      {"InitMeshNegative",
       [] { init_device_mesh(w4(), {-4}); },
       "MeshError",
       {"init_device_mesh", "-4"}},
      {"InitMeshTooBig",
       [] { init_device_mesh(w4(), {8}); },
       "MeshError",
       {"init_device_mesh", "8 ranks", "only 4"}},
      {"InitMeshOverflow",
       [] {
         init_device_mesh(w4(), {kMax, kMax});
       },
       "MeshError",
       {"init_device_mesh"}},
      {"InitMeshOverflowWrapsToZero",
       [] {
         init_device_mesh(w4(), {int64_t{1} << 62, 4});
       },
       "MeshError",
       {"init_device_mesh", "(4611686018427387904, 4)", "more ranks than an int64 holds",
        "only 4"}},
      {"InitMeshOverflowWrapsToCount",
       [] {
         init_device_mesh(w4(), {int64_t{1} << 62, 2, 2, 3});
       },
       "MeshError",
       {"init_device_mesh", "more ranks than an int64 holds"}},
      {"InitMeshDuplicateNames",
       [] {
         init_device_mesh(w4(), {2, 2}, {"a", "a"});
       },
       "MeshError",
       {"init_device_mesh", "repeat 'a'"}},
      {"InitMeshEmptyName",
       [] {
         init_device_mesh(w4(), {2, 2}, {"a", ""});
       },
       "MeshError",
       {"init_device_mesh", "empty name"}},
      {"InitMeshNameMiscount",
       [] {
         init_device_mesh(w4(), {2, 2}, {"a"});
       },
       "MeshError",
       {"init_device_mesh", "1 dim names"}},
      {"InitMeshUndefinedWorld",
       [] { init_device_mesh(World(), {2}); },
       "Error",
       {"World", "undefined"}},
      {"FromRanksOverflow",
       [] {
         DeviceMesh::from_ranks(w4(), {kMax, 4}, {0, 1, 2, 3});
       },
       "MeshError",
       {"DeviceMesh::from_ranks", "overflow"}},
      {"FromRanksOverflowWrapsToCount",
       [] {
         DeviceMesh::from_ranks(w4(), {int64_t{1} << 62, 4}, {});
       },
       "MeshError",
       {"DeviceMesh::from_ranks"}},
      {"FromRanksDuplicate",
       [] {
         DeviceMesh::from_ranks(w4(), {2}, {1, 1});
       },
       "MeshError",
       {"DeviceMesh::from_ranks", "1"}},
      {"FromRanksOutOfWorld",
       [] {
         DeviceMesh::from_ranks(w4(), {2}, {0, 9});
       },
       "MeshError",
       {"DeviceMesh::from_ranks", "9"}},
      {"FromRanksNegative",
       [] {
         DeviceMesh::from_ranks(w4(), {2}, {0, -1});
       },
       "MeshError",
       {"DeviceMesh::from_ranks", "-1"}},
      {"FromRanksHugeRank",
       [] { DeviceMesh::from_ranks(w4(), {1}, {kMax}); },
       "MeshError",
       {"DeviceMesh::from_ranks", "9223372036854775807"}},
      {"FromRanksTensorFloat",
       [] { DeviceMesh::from_ranks(w4(), ones({2})); },
       "MeshError",
       {"DeviceMesh::from_ranks", "f32"}},
      {"FromRanksTensorUndefined",
       [] { DeviceMesh::from_ranks(w4(), Tensor()); },
       "MeshError",
       {"DeviceMesh::from_ranks", "undefined"}},
      {"FromRanksTensorScalar",
       [] { DeviceMesh::from_ranks(w4(), zeros({}, DType::I64)); },
       "MeshError",
       {"DeviceMesh::from_ranks", "dim"}},
      {"ResolveUnknownName", [] { mesh22().resolve("pp"); }, "MeshError", {"DeviceMesh", "'pp'"}},
      {"ResolveIndexMin",
       [] { mesh22().resolve(std::numeric_limits<int>::min()); },
       "MeshError",
       {"DeviceMesh", "out of range"}},
      {"SliceUnknown", [] { mesh22()["pp"]; }, "MeshError", {"DeviceMesh", "'pp'"}},
      {"SliceTwice",
       [] {
         mesh22()[{"dp", "dp"}];
       },
       "MeshError",
       {"DeviceMesh", "twice"}},
      {"SliceEmpty", [] { mesh22().slice({}); }, "MeshError", {"DeviceMesh", "at least one"}},
      {"SliceUnnamed", [] { init_device_mesh(w4(), {4})["x"]; }, "MeshError", {"DeviceMesh"}},
      {"MeshDimNameOutOfRange",
       [] { mesh22().dim_name(99); },
       "MeshError",
       {"DeviceMesh", "dim 99"}},
      {"MeshSizeDimOutOfRange", [] { mesh22().size(7); }, "MeshError", {"DeviceMesh", "7"}},
      {"MeshLocalRankUnknown",
       [] { mesh22().local_rank("pp"); },
       "MeshError",
       {"DeviceMesh", "'pp'"}},
      {"MeshUnflattenUnnamedWithNames",
       [] {
         init_device_mesh(w4(), {4}).unflatten(0, {2, 2}, {"a", "b"});
       },
       "MeshError",
       {"unflatten", "unnamed"}},
      {"CodomainHuge",
       [] { codomain(Layout(int64_t{1} << 40, 1)); },
       "OutOfMemoryError",
       {"codomain", "1099511627776", "8796093022208 bytes"}},
      {"GlobalRanksHugeWorld",
       [] { global_ranks(Layout(2, 1), int64_t{1} << 40); },
       "OutOfMemoryError",
       {"global_ranks", "1099511627776"}},
      {"UndefinedMeshSize",
       [] { DeviceMesh().size(); },
       "MeshError",
       {"DeviceMesh::size", "undefined"}},
      {"UndefinedMeshGroups",
       [] { DeviceMesh().groups(0); },
       "MeshError",
       {"DeviceMesh::groups", "undefined"}},
      {"UnflattenOverflow",
       [] {
         mesh4().unflatten("x", {kMax, kMax, 4}, {"a", "b", "c"});
       },
       "MeshError",
       {"unflatten", "'x'"}},
      {"UnflattenOverflowWraps",
       [] {
         mesh4().unflatten("x", {int64_t{1} << 62, 4, 4}, {"a", "b", "c"});
       },
       "MeshError",
       {"unflatten", "'x'"}},
      {"UnflattenZero",
       [] {
         mesh4().unflatten("x", {0, 4}, {"a", "b"});
       },
       "MeshError",
       {"unflatten", "0"}},
      {"UnflattenMismatch",
       [] { mesh4().unflatten("x", {3}, {"a"}); },
       "MeshError",
       {"unflatten", "3"}},
      {"UnflattenEmptyName",
       [] {
         mesh4().unflatten("x", {2, 2}, {"a", ""});
       },
       "MeshError",
       {"unflatten", "empty"}},
      {"UnflattenNameClash",
       [] {
         mesh22().unflatten("tp", {2, 1}, {"dp", "z"});
       },
       "MeshError",
       {"unflatten", "'dp'"}},
      {"FlattenRootName", [] { mesh22()["tp"].flatten("dp"); }, "MeshError", {"flatten", "'dp'"}},
      {"ConcatenateNone", [] { concatenate({}); }, "MeshError", {"concatenate"}},
      {"ConcatenateUniverses",
       [] {
         concatenate({mesh22()["dp"], mesh22()["tp"]});
       },
       "MeshError",
       {"concatenate", "different root"}},
      {"ConcatenateWorlds",
       [] {
         const World other = World::sim(4);
         concatenate({mesh22()["dp"], init_device_mesh(other, {2, 2}, {"dp", "tp"})["tp"]});
       },
       "MeshError",
       {"concatenate", "different root", "different Worlds", "(sim, 4 ranks)"}},
      {"ConcatenateUndefined",
       [] { concatenate({DeviceMesh()}); },
       "MeshError",
       {"DeviceMesh::concatenate", "undefined"}},
      {"LayoutNegativeSize", [] { Layout(-2, 1); }, "MeshError", {"Layout", "-2"}},
      {"LayoutNegativeStride", [] { Layout(2, -1); }, "MeshError", {"Layout", "-1"}},
      {"LayoutOverflow",
       [] {
         Layout({kMax, kMax}, {1, 1});
       },
       "MeshError",
       {"Layout", "overflows"}},
      {"LayoutMiscount",
       [] {
         Layout(std::vector<int64_t>{2, 2}, std::vector<int64_t>{1});
       },
       "MeshError",
       {"Layout", "2 sizes but 1 strides"}},
      {"LayoutRowMajorOverflow",
       [] {
         Layout::row_major({kMax, kMax, 2});
       },
       "MeshError",
       {"Layout::row_major", "overflows"}},
      {"LayoutParseEmpty", [] { Layout::parse(""); }, "MeshError", {"Layout::parse"}},
      {"LayoutParseGarbage", [] { Layout::parse("(2,4:(4,1)"); }, "MeshError", {"Layout::parse"}},
      {"LayoutParseHugeInt",
       [] { Layout::parse("99999999999999999999:1"); },
       "MeshError",
       {"Layout::parse", "out of range"}},
      {"LayoutParseDeep",
       [] { Layout::parse(nested_layout(100000)); },
       "MeshError",
       {"Layout::parse", "nested"}},
      {"LayoutParseDeepUnbalanced",
       [] { Layout::parse(std::string(100000, '(')); },
       "MeshError",
       {"Layout::parse"}},
      {"LayoutParseNonUtf8", [] { Layout::parse("\xff\xfe:1"); }, "MeshError", {"Layout::parse"}},
      {"LayoutParseNul",
       [] { Layout::parse(std::string("2:1\0", 4)); },
       "MeshError",
       {"Layout::parse", "trailing"}},
      {"LayoutParseHugeText",
       [] { Layout::parse(std::string(1 << 20, '7') + ":1"); },
       "MeshError",
       {"Layout::parse", "out of range"}},
      {"LayoutModeOutOfRange",
       [] {
         Layout({2, 2}, {2, 1}).mode(5);
       },
       "MeshError",
       {"Layout::mode", "5"}},
      {"LayoutCallOutOfRange", [] { Layout(4, 1)(kMax); }, "MeshError", {"Layout", "index"}},
      {"ComplementZeroWorld", [] { complement(Layout(2, 1), 0); }, "MeshError", {"complement"}},
      {"ComplementOverlap",
       [] {
         complement(Layout({2, 2}, {1, 1}), 4);
       },
       "MeshError",
       {"complement", "overlaps"}},
      {"CompositionOutOfDomain",
       [] { composition(Layout(4, 1), Layout(8, 1)); },
       "MeshError",
       {"composition", "8:1"}},
      {"ComplementStrideOverflow",
       [] { complement(Layout(2, int64_t{1} << 62), 4); },
       "MeshError",
       {"complement"}},
      {"FromJsonNotJson",
       [] { DeviceMesh::from_json(w4(), "{not json"); },
       "MeshError",
       {"DeviceMesh::from_json", "invalid"}},
      {"FromJsonArray",
       [] { DeviceMesh::from_json(w4(), "[1, 2]"); },
       "MeshError",
       {"DeviceMesh::from_json"}},
      {"FromJsonDeepLayout",
       [] { DeviceMesh::from_json(w4(), mesh_json_with_dim(nested_layout(100000))); },
       "MeshError",
       {"DeviceMesh::from_json", "nested"}},
      {"FromJsonDeepJson",
       [] { DeviceMesh::from_json(w4(), std::string(200000, '[') + std::string(200000, ']')); },
       "MeshError",
       {"DeviceMesh::from_json"}},
      {"FromJsonWrongTypes",
       [] {
         DeviceMesh::from_json(
             w4(), R"({"format": "spmdsim.DeviceMesh", "version": 1, "rank_map": "x"})");
       },
       "MeshError",
       {"DeviceMesh::from_json"}},
      {"FromJsonRankOverflow",
       [] {
         DeviceMesh::from_json(
             w4(), R"({"format": "spmdsim.DeviceMesh", "version": 1, "device_type": "cpu",
                    "rank_map": [0, 1, 2, 99999999999], "root": {"shape": [4], "dim_names": ["x"]},
                    "flattened": {}, "dims": ["4:1"], "dim_names": ["x"]})");
       },
       "MeshError",
       {"DeviceMesh::from_json", "99999999999"}},
      {"FromJsonRootOverflow",
       [] {
         DeviceMesh::from_json(
             w4(), R"({"format": "spmdsim.DeviceMesh", "version": 1, "device_type": "cpu",
                    "rank_map": [0, 1, 2, 3], "root": {"shape": [9223372036854775807, 4],
                    "dim_names": []}, "flattened": {}, "dims": ["4:1"], "dim_names": []})");
       },
       "MeshError",
       {"DeviceMesh::from_json"}},
      {"FromJsonEmptyFlattenedName",
       [] {
         DeviceMesh::from_json(
             w4(), R"({"format": "spmdsim.DeviceMesh", "version": 1, "device_type": "cpu",
                    "rank_map": [0, 1, 2, 3], "root": {"shape": [4], "dim_names": ["x"]},
                    "flattened": {"": "4:1"}, "dims": ["4:1"], "dim_names": ["x"]})");
       },
       "MeshError",
       {"DeviceMesh::from_json", "empty"}},
      {"FromJsonNestedArray",
       [] { DeviceMesh::from_json(w4(), "[[1]]"); },
       "MeshError",
       {"DeviceMesh::from_json", "expected a JSON object", "array"}},
      {"FromJsonWrongVersion",
       [] { DeviceMesh::from_json(w4(), R"({"format": "spmdsim.DeviceMesh", "version": 7})"); },
       "MeshError",
       {"DeviceMesh::from_json", "version 7"}},
      {"FromJsonFractionalRank",
       [] {
         DeviceMesh::from_json(
             w4(), R"({"format": "spmdsim.DeviceMesh", "version": 1, "device_type": "cpu",
                    "rank_map": [0, 1.5, 2, 3], "root": {"shape": [4], "dim_names": ["x"]},
                    "flattened": {}, "dims": ["4:1"], "dim_names": ["x"]})");
       },
       "MeshError",
       {"DeviceMesh::from_json", "rank_map", "1.5"}},
      {"FromJsonFractionalShape",
       [] {
         DeviceMesh::from_json(
             w4(), R"({"format": "spmdsim.DeviceMesh", "version": 1, "device_type": "cpu",
                    "rank_map": [0, 1, 2, 3], "root": {"shape": [4.2], "dim_names": ["x"]},
                    "flattened": {}, "dims": ["4:1"], "dim_names": ["x"]})");
       },
       "MeshError",
       {"DeviceMesh::from_json", "root.shape", "4.2"}},
      {"FromJsonUnknownDeviceType",
       [] {
         DeviceMesh::from_json(
             w4(), R"({"format": "spmdsim.DeviceMesh", "version": 1, "device_type": "tpu",
                    "rank_map": [0, 1, 2, 3], "root": {"shape": [4], "dim_names": ["x"]},
                    "flattened": {}, "dims": ["4:1"], "dim_names": ["x"]})");
       },
       "MeshError",
       {"DeviceMesh::from_json", "device_type", "tpu"}},
      {"FromJsonDimOutsideRankMap",
       [] { DeviceMesh::from_json(w4(), mesh_json_with_dim("8:1")); },
       "MeshError",
       {"DeviceMesh::from_json"}},
  };
}

// ---- collectives/ -----------------------------------------------------------------------------

std::vector<ApiCase> collective_cases() {
  return {
      {"AllReduceUndefined",
       [] { all_reduce(LocalTensor(), mesh22(), "tp"); },
       "CommError",
       {"all_reduce", "undefined"}},
      {"AllReduceUndefinedMesh",
       [] { all_reduce(lt4(), DeviceMesh(), 0); },
       "MeshError",
       {"DeviceMesh", "undefined"}},
      {"AllReduceBadOp",
       [] { all_reduce(lt4(), mesh22(), "tp", static_cast<ReduceOp>(42)); },
       "Unsupported",
       {"all_reduce", "ReduceOp(42)"}},
      {"AllReduceNegativeOp",
       [] { all_reduce(lt4(), mesh22(), "tp", static_cast<ReduceOp>(-1)); },
       "Unsupported",
       {"all_reduce", "ReduceOp(-1)"}},
      {"ReduceScatterBadOp",
       [] { reduce_scatter(lt4(), mesh22(), "tp", static_cast<ReduceOp>(42)); },
       "Unsupported",
       {"reduce_scatter", "ReduceOp(42)"}},
      {"ReduceBadOp",
       [] { reduce(lt4(), mesh22(), "tp", static_cast<ReduceOp>(8)); },
       "Unsupported",
       {"reduce", "ReduceOp(8)"}},
      {"AllReduceBitwiseFloat",
       [] { all_reduce(lt4(), mesh22(), "tp", ReduceOp::BAnd); },
       "CommError",
       {"all_reduce", "band"}},
      {"AllReduceAvgBool",
       [] {
         all_reduce(LocalTensor::replicate(w4(), ones({2}, DType::Bool)), mesh22(), "tp",
                    ReduceOp::Avg);
       },
       "CommError",
       {"all_reduce", "avg"}},
      {"AllReduceUnknownDim",
       [] { all_reduce(lt4(), mesh22(), "pp"); },
       "MeshError",
       {"DeviceMesh", "'pp'"}},
      {"AllReduceDimIndex",
       [] { all_reduce(lt4(), mesh22(), 7); },
       "MeshError",
       {"DeviceMesh", "7"}},
      {"AllReduceLargerWorld",
       [] { all_reduce(LocalTensor::replicate(World::sim(8), ones({2})), mesh4(), "x"); },
       "CommError",
       {"all_reduce", "rank 4", "4 ranks"}},
      {"AllReduceLargerWorldOnSubmesh",
       [] { all_reduce(LocalTensor::replicate(World::sim(16), ones({2})), mesh22(), "tp"); },
       "CommError",
       {"all_reduce", "rank 4"}},
      {"AllGatherDim",
       [] { all_gather(lt4(), mesh22(), "tp", 5); },
       "CommError",
       {"all_gather", "gather_dim=5"}},
      {"AllGatherDimMin",
       [] { all_gather(lt4(), mesh22(), "tp", kMin); },
       "CommError",
       {"all_gather", "gather_dim"}},
      {"AllGatherZeroD",
       [] { all_gather(lt4({}), mesh22(), "tp", 0); },
       "CommError",
       {"all_gather", "0-d"}},
      {"ReduceScatterIndivisible",
       [] { reduce_scatter(lt4({3}), mesh22(), "tp"); },
       "CommError",
       {"reduce_scatter", "divisible"}},
      {"AllToAllDimMax",
       [] { all_to_all(lt4(), mesh22(), "tp", kMax, 0); },
       "CommError",
       {"all_to_all", "split_dim"}},
      {"AllToAllConcatMin",
       [] { all_to_all(lt4(), mesh22(), "tp", 0, kMin); },
       "CommError",
       {"all_to_all", "concat_dim"}},
      {"AllToAllSingleOverflow",
       [] {
         all_to_all_single(lt4(), mesh22(), "tp", splits({2, 2}), splits({kMax, kMax}));
       },
       "CommError",
       {"all_to_all_single", "in_splits"}},
      {"AllToAllSingleOverflowWraps",
       [] {
         all_to_all_single(lt4(), mesh22(), "tp", splits({2, 2}), splits({kMax, kMin + 5}));
       },
       "CommError",
       {"all_to_all_single", "in_splits"}},
      {"AllToAllSingleOutOverflow",
       [] {
         all_to_all_single(lt4(), mesh22(), "tp", splits({kMax, kMax}), splits({2, 2}));
       },
       "CommError",
       {"all_to_all_single", "out_splits"}},
      {"AllToAllSingleNegative",
       [] {
         all_to_all_single(lt4(), mesh22(), "tp", splits({2, 2}), splits({6, -2}));
       },
       "CommError",
       {"all_to_all_single", "negative"}},
      {"AllToAllSingleMiscount",
       [] { all_to_all_single(lt4(), mesh22(), "tp", splits({4}), splits({4})); },
       "CommError",
       {"all_to_all_single", "entries"}},
      {"AllToAllSingleMismatch",
       [] {
         all_to_all_single(lt4(), mesh22(), "tp", splits({1, 3}), splits({2, 2}));
       },
       "CommError",
       {"all_to_all_single", "do not match"}},
      {"AllToAllSingleSplitsNotHeld",
       [] {
         all_to_all_single(lt4(), mesh22(), "tp",
                           PerRank<std::vector<int64_t>>({0, 1}, {{2, 2}, {1, 3}}), splits({2, 2}));
       },
       "CommError",
       {"all_to_all_single", "rank 2"}},
      {"AllToAllSingleZeroD",
       [] { all_to_all_single(lt4({}), mesh22(), "tp", {}, {}); },
       "CommError",
       {"all_to_all_single", "dim"}},
      {"BroadcastSrc",
       [] { broadcast(lt4(), mesh22(), "tp", 2); },
       "CommError",
       {"broadcast", "src=2"}},
      {"BroadcastSrcMin",
       [] { broadcast(lt4(), mesh22(), "tp", std::numeric_limits<int>::min()); },
       "CommError",
       {"broadcast", "src"}},
      {"ScatterSrc",
       [] { scatter(lt4(), mesh22(), "tp", -1); },
       "CommError",
       {"scatter", "src=-1"}},
      {"GatherDst", [] { gather(lt4(), mesh22(), "tp", 9); }, "CommError", {"gather", "dst=9"}},
      {"ReduceDst",
       [] { reduce(lt4(), mesh22(), "tp", ReduceOp::Sum, 2); },
       "CommError",
       {"reduce", "dst=2"}},
      {"PermuteMiscount",
       [] { permute(lt4(), mesh22(), "tp", std::vector<int>{0}); },
       "CommError",
       {"permute", "entries"}},
      {"PermuteDuplicate",
       [] {
         permute(lt4(), mesh22(), "tp", std::vector<int>{1, 1});
       },
       "CommError",
       {"permute", "two shards"}},
      {"PermuteOutOfGroup",
       [] {
         permute(lt4(), mesh22(), "tp", std::vector<int>{0, 5});
       },
       "CommError",
       {"permute", "5"}},
      {"ShapesDifferInGroup",
       [] {
         all_reduce(LocalTensor::from_fn(w4(), [](int r) { return ones({r + 1}); }), mesh22(),
                    "tp");
       },
       "CommError",
       {"all_reduce", "differ"}},
      {"DtypesDifferInGroup",
       [] {
         all_gather(LocalTensor::from_fn(w4(), [](int r) { return ones({2}); }).to(DType::I32) +
                        LocalTensor::from_fn(w4(), [](int r) { return ones({2}); }),
                    mesh22(), "tp", 7);
       },
       "CommError",
       {"all_gather", "gather_dim=7"}},
      {"AsyncBadOp",
       [] { all_reduce_async(lt4(), mesh22(), "tp", static_cast<ReduceOp>(42)).wait(); },
       "Unsupported",
       {"all_reduce", "ReduceOp(42)"}},
      {"BarrierUndefinedMesh",
       [] { barrier(DeviceMesh()); },
       "MeshError",
       {"DeviceMesh", "undefined"}},
  };
}

// ---- dtensor/ ---------------------------------------------------------------------------------

std::vector<ApiCase> dtensor_cases() {
  return {
      {"SpecNumelOverflow",
       [] {
         DTensorSpec(mesh22(), {Replicate{}, Replicate{}}, {kMax, kMax}, DType::F32);
       },
       "ShapeError",
       {"DTensorSpec", "too many", "R,R"}},
      {"SpecBytesOverflow",
       [] {
         DTensorSpec(mesh22(), {Replicate{}, Replicate{}}, {kMax / 2}, DType::F64);
       },
       "ShapeError",
       {"DTensorSpec", "too many"}},
      {"SpecNegative",
       [] {
         DTensorSpec(mesh22(), {Replicate{}, Replicate{}}, {-1}, DType::F32);
       },
       "ShapeError",
       {"DTensorSpec", "-1"}},
      {"SpecUndefinedMesh",
       [] { DTensorSpec(DeviceMesh(), {Replicate{}}, {2}, DType::F32); },
       "PlacementError",
       {"DTensorSpec", "undefined"}},
      {"SpecPlacementCount",
       [] { DTensorSpec(mesh22(), {Replicate{}}, {2}, DType::F32); },
       "PlacementError",
       {"DTensorSpec", "1 placements"}},
      {"SpecShardDimOut",
       [] {
         DTensorSpec(mesh22(), {Shard{3}, Replicate{}}, {2}, DType::F32);
       },
       "PlacementError",
       {"DTensorSpec", "S(3)"}},
      {"SpecShardDimMin",
       [] {
         DTensorSpec(mesh22(), {Shard{std::numeric_limits<int>::min()}, Replicate{}}, {2},
                     DType::F32);
       },
       "PlacementError",
       {"DTensorSpec"}},
      {"SpecBadPartial",
       [] {
         DTensorSpec(mesh22(), {Partial{static_cast<ReduceOp>(42)}, Replicate{}}, {2}, DType::F32);
       },
       "PlacementError",
       {"DTensorSpec", "ReduceOp(42)"}},
      {"SpecBitwisePartial",
       [] {
         DTensorSpec(mesh22(), {Partial{ReduceOp::BXor}, Replicate{}}, {2}, DType::I32);
       },
       "PlacementError",
       {"DTensorSpec", "bxor"}},
      {"SpecBadDType",
       [] {
         DTensorSpec(mesh22(), {Replicate{}, Replicate{}}, {2}, static_cast<DType>(42));
       },
       "Unsupported",
       {"DTensorSpec", "42"}},
      {"PlanBytesOverflow",
       [] {
         const DeviceMesh m = mesh22();
         plan_redistribute(DTensorSpec(m, {Shard{0}, Replicate{}}, {kMax / 8}, DType::F64),
                           DTensorSpec(m, {Replicate{}, Replicate{}}, {kMax / 8}, DType::F64));
       },
       "ShapeError",
       {"plan_redistribute"}},
      {"PlanDifferentShapes",
       [] {
         const DeviceMesh m = mesh22();
         plan_redistribute(DTensorSpec(m, {Shard{0}, Replicate{}}, {4}, DType::F32),
                           DTensorSpec(m, {Replicate{}, Replicate{}}, {5}, DType::F32));
       },
       "PlacementError",
       {"redistribute", "[4]", "[5]"}},
      {"PlanDifferentMeshes",
       [] {
         plan_redistribute(DTensorSpec(mesh22(), {Shard{0}, Replicate{}}, {4}, DType::F32),
                           DTensorSpec(mesh4(), {Replicate{}}, {4}, DType::F32));
       },
       "PlacementError",
       {"redistribute", "mesh"}},
      {"DistributeUndefined",
       [] {
         distribute_tensor(Tensor(), mesh22(), {Replicate{}, Replicate{}});
       },
       "PlacementError",
       {"distribute_tensor", "undefined"}},
      {"DistributeUndefinedMesh",
       [] { distribute_tensor(ones({2}), DeviceMesh(), {}); },
       "PlacementError",
       {"distribute_tensor", "undefined"}},
      {"DistributeShardOut",
       [] {
         distribute_tensor(ones({2}), mesh22(), {Shard{1}, Replicate{}});
       },
       "PlacementError",
       {"distribute_tensor", "S(1)"}},
      {"DistributeBadPartial",
       [] {
         distribute_tensor(ones({2}), mesh22(), {Partial{static_cast<ReduceOp>(9)}, Replicate{}});
       },
       "PlacementError",
       {"distribute_tensor", "ReduceOp(9)"}},
      {"DistributePlacementCount",
       [] { distribute_tensor(ones({2}), mesh22(), {Replicate{}}); },
       "PlacementError",
       {"distribute_tensor", "placements"}},
      {"FromLocalUndefined",
       [] {
         DTensor::from_local(LocalTensor(), mesh22(), {Replicate{}, Replicate{}});
       },
       "PlacementError",
       {"DTensor::from_local", "undefined"}},
      {"FromLocalLargerWorld",
       [] {
         DTensor::from_local(LocalTensor::replicate(World::sim(8), ones({2})), mesh4(),
                             {Replicate{}});
       },
       "PlacementError",
       {"DTensor::from_local", "holds ranks [0, 1, 2, 3, 4, 5, 6, 7]"}},
      {"FromLocalMissingRank",
       [] {
         DTensor::from_local(LocalTensor::replicate(std::vector<int>{0, 1}, ones({2})), mesh4(),
                             {Replicate{}});
       },
       "PlacementError",
       {"DTensor::from_local", "holds ranks [0, 1]"}},
      {"FromLocalGlobalShapeNegative",
       [] { DTensor::from_local(lt4({2}), mesh4(), {Shard{0}}, Shape{-8}); },
       "ShapeError",
       {"DTensor::from_local", "-8"}},
      {"FromLocalGlobalShapeMismatch",
       [] { DTensor::from_local(lt4({2}), mesh4(), {Shard{0}}, Shape{9}); },
       "PlacementError",
       {"DTensor::from_local", "[9]"}},
      {"FromLocalGlobalShapeOverflow",
       [] { DTensor::from_local(lt4({2}), mesh4(), {Shard{0}}, Shape{kMax}); },
       "ShapeError",
       {"DTensor::from_local"}},
      {"FromLocalShardsTooManyRows",
       [] { DTensor::from_local(lt4({kMax / 8}), mesh4(), {Replicate{}}); },
       "OutOfMemoryError",
       {"ones"}},
      {"UndefinedDTensorShape",
       [] { DTensor().shape(); },
       "PlacementError",
       {"DTensor::shape", "undefined"}},
      {"UndefinedDTensorFull",
       [] { DTensor().full_tensor(); },
       "PlacementError",
       {"DTensor::full_tensor", "undefined"}},
      {"UndefinedDTensorRedistribute",
       [] { DTensor().redistribute({Replicate{}}); },
       "PlacementError",
       {"DTensor::redistribute", "undefined"}},
      {"RedistributeCount",
       [] { dt22().redistribute({Replicate{}}); },
       "PlacementError",
       {"DTensor::redistribute", "1 placements"}},
      {"RedistributeShardOut",
       [] {
         dt22().redistribute({Shard{5}, Replicate{}});
       },
       "PlacementError",
       {"DTensor::redistribute", "S(5)"}},
      {"RedistributeShardMin",
       [] {
         dt22().redistribute({Shard{std::numeric_limits<int>::min()}, Replicate{}});
       },
       "PlacementError",
       {"DTensor::redistribute", "S(-2147483648)"}},
      {"RedistributeBadOp",
       [] {
         dt22().redistribute({Partial{static_cast<ReduceOp>(42)}, Replicate{}});
       },
       "PlacementError",
       {"DTensor::redistribute", "ReduceOp(42)"}},
      {"DTensorNullSpec", [] { DTensor(lt4(), nullptr); }, "PlacementError", {"DTensor", "null"}},
      {"DTensorUndefinedLocal",
       [] {
         DTensor(LocalTensor(), std::make_shared<const DTensorSpec>(
                                    mesh4(), Placements{Replicate{}}, Shape{2}, DType::F32));
       },
       "PlacementError",
       {"DTensor", "undefined"}},
      {"PlannerInvalid",
       [] {
         dt22().redistribute({Replicate{}, Replicate{}}, static_cast<RedistributePlanner>(7));
       },
       "Unsupported",
       {"plan_redistribute", "RedistributePlanner(7)"}},
      {"DefaultPlannerInvalid",
       [] { set_default_redistribute_planner(static_cast<RedistributePlanner>(-1)); },
       "Unsupported",
       {"set_default_redistribute_planner", "RedistributePlanner(-1)"}},
      {"DTensorAddBroadcast",
       [] {
         dt22() + dt22({4, 3});
       },
       "ShapeError",
       {"add"}},
      {"DTensorAddOtherMesh",
       [] {
         dt22() + distribute_tensor(ones({4, 4}), mesh4(), {Replicate{}});
       },
       "PlacementError",
       {"add", "mesh"}},
      {"DTensorAddOtherWorld",
       [] {
         const World other = World::sim(4);
         dt22() + distribute_tensor(ones({4, 4}), init_device_mesh(other, {2, 2}, {"dp", "tp"}),
                                    {Shard{0}, Replicate{}});
       },
       "PlacementError",
       {"add", "different Worlds", "world #", "(sim, 4 ranks)"}},
      {"DTensorAddPermutedRanks",
       [] {
         dt22() +
             distribute_tensor(ones({4, 4}),
                               DeviceMesh::from_ranks(w4(), {2, 2}, {3, 2, 1, 0}, {"dp", "tp"}),
                               {Shard{0}, Replicate{}});
       },
       "PlacementError",
       {"add", "different ranks", "[0, 1, 2, 3]", "[3, 2, 1, 0]"}},
      {"PlanOtherWorld",
       [] {
         const World other = World::sim(4);
         plan_redistribute(
             DTensorSpec(mesh4(), {Shard{0}}, {4}, DType::F32),
             DTensorSpec(init_device_mesh(other, {4}, {"x"}), {Replicate{}}, {4}, DType::F32));
       },
       "PlacementError",
       {"redistribute", "different Worlds"}},
      {"DTensorMatmulMismatch",
       [] {
         matmul(dt22({4, 3}), dt22({4, 3}));
       },
       "ShapeError",
       {"matmul"}},
      {"DTensorSoftmaxBool",
       [] { softmax(distribute_tensor(ones({4}, DType::Bool), mesh4(), {Shard{0}}), 0); },
       "Unsupported",
       {"softmax", "bool"}},
      {"DTensorNarrowOverflow", [] { narrow(dt22(), 0, kMax, kMax); }, "ShapeError", {"narrow"}},
      {"DTensorReshapeOverflow",
       [] {
         reshape(dt22(), {kMax, kMax});
       },
       "ShapeError",
       {"reshape"}},
      {"DTensorPadOverflow", [] { pad(dt22(), 1, kMax, 1); }, "ShapeError", {"pad"}},
      {"DTensorSumDim", [] { sum(dt22(), {9}); }, "ShapeError", {"sum", "9"}},
      {"DTensorSizeDim", [] { dt22().size(kMax); }, "ShapeError", {"DTensor::size", "dim"}},
      {"DTensorRandnOverflow",
       [] {
         randn({kMax, kMax}, mesh22(), {Shard{0}, Replicate{}}, 0);
       },
       "ShapeError",
       {"randn", "too many"}},
      {"DTensorRandnNegative",
       [] {
         rand({-3}, mesh22(), {Replicate{}, Replicate{}}, 0);
       },
       "ShapeError",
       {"rand", "-3"}},
      {"ParsePlacementsGarbage",
       [] { parse_placements("S(0),X"); },
       "PlacementError",
       {"parse_placements", "'X'"}},
      {"ParsePlacementsHugeDim",
       [] { parse_placements("S(99999999999)"); },
       "PlacementError",
       {"parse_placements", "not an int"}},
      {"ParsePlacementsEmptyItem",
       [] { parse_placements("S(0),,R"); },
       "PlacementError",
       {"parse_placements", "empty"}},
      {"ParsePlacementsBitwise",
       [] { parse_placements("P(band)"); },
       "PlacementError",
       {"parse_placements", "band"}},
      {"ParsePlacementsUnbalanced",
       [] { parse_placements("S(0"); },
       "PlacementError",
       {"parse_placements"}},
      {"VisualizeUndefined",
       [] { visualize_sharding(DTensor()); },
       "PlacementError",
       {"visualize_sharding", "undefined"}},
      {"BackwardNonScalarDTensor",
       [] {
         DTensor x = dt22();
         x.requires_grad_();
         backward(x * 2.0);
       },
       "ShapeError",
       {"backward"}},
      {"DTensorCrossEntropyRowsSharded",
       [] {
         cross_entropy(distribute_tensor(ones({4, 5}), mesh4(), {Shard{0}}),
                       distribute_tensor(from_vector<int64_t>({0, 1, 2, 9}), mesh4(), {Shard{0}}));
       },
       "ShapeError",
       {"cross_entropy", "target 9 at index 3", "[0, 5)", "5 classes"}},
      {"DTensorCrossEntropyClassesSharded",
       [] {
         cross_entropy(distribute_tensor(ones({2, 8}), mesh4(), {Shard{1}}),
                       distribute_tensor(from_vector<int64_t>({3, 8}), mesh4(), {Replicate{}}));
       },
       "ShapeError",
       {"cross_entropy", "8 classes", "index 8 at [1, 0]"}},
      {"RequiresGradIntDTensor",
       [] { distribute_tensor(ones({4}, DType::I32), mesh4(), {Shard{0}}).requires_grad_(); },
       "Unsupported",
       {"DTensor::requires_grad_", "i32"}},
  };
}

// ---- nn/ --------------------------------------------------------------------------------------

// One parameter with a gradient, as a Tensor or a DTensor (both optimizer styles take the same
// checks).
Tensor* tensor_param() {
  static Tensor w = [] {
    Tensor t = ones({2, 2}).requires_grad_();
    backward(sum(t * t));
    return t;
  }();
  return &w;
}
DTensor* dtensor_param() {
  static DTensor w = [] {
    DTensor d = dt22();
    d.requires_grad_();
    backward(sum(d * d));
    return d;
  }();
  return &w;
}

std::vector<ApiCase> nn_cases() {
  std::vector<ApiCase> cases = {
      {"SGDEmptyParams",
       [] { SGD(std::vector<Tensor*>{}); },
       "ConfigError",
       {"SGD", "empty parameter list"}},
      {"AdamWEmptyParams",
       [] { AdamW(std::vector<DTensor*>{}); },
       "ConfigError",
       {"AdamW", "empty parameter list"}},
      {"SGDNullParam", [] { SGD(std::vector<Tensor*>{nullptr}); }, "Error", {"SGD", "parameter 0"}},
      {"ClipNegativeMaxNorm",
       [] { clip_grad_norm({tensor_param()}, -1.0); },
       "ConfigError",
       {"clip_grad_norm", "max_norm", "-1"}},
      {"ClipNaNMaxNorm",
       [] { clip_grad_norm({tensor_param()}, kNaN); },
       "ConfigError",
       {"clip_grad_norm", "max_norm", "nan"}},
      {"ClipNegativeMaxNormDTensor",
       [] { clip_grad_norm({dtensor_param()}, -0.5); },
       "ConfigError",
       {"clip_grad_norm", "max_norm", "-0.5"}},
      {"ClipNegativeInfMaxNorm",
       [] { clip_grad_norm(std::vector<DTensor*>{}, -kInf); },
       "ConfigError",
       {"clip_grad_norm", "max_norm", "-inf"}},
  };
  // Every hyperparameter of every optimizer, for both styles (Tensor and DTensor parameters):
  // NaN, an infinity and a value outside torch.optim's range.
  struct Bad {
    std::string name;  // of the row
    std::string field;
    double value;
    std::string shown;
  };
  const std::vector<Bad> bad_values = {
      {"NaN", "", kNaN, "nan"}, {"Inf", "", kInf, "inf"}, {"Negative", "", -1.0, "-1"}};
  auto add = [&](const std::string& optimizer, const std::string& field, double value,
                 const std::string& shown, const std::string& row) {
    for (const bool dtensor : {false, true}) {
      std::function<void()> body;
      if (optimizer == "SGD") {
        SGDOptions o;
        if (field == "lr") o.lr = value;
        if (field == "momentum") o.momentum = value;
        if (field == "weight_decay") o.weight_decay = value;
        body = dtensor ? std::function<void()>([o] { SGD(std::vector{dtensor_param()}, o); })
                       : std::function<void()>([o] { SGD(std::vector{tensor_param()}, o); });
      } else {
        AdamWOptions o;
        if (field == "lr") o.lr = value;
        if (field == "beta1") o.beta1 = value;
        if (field == "beta2") o.beta2 = value;
        if (field == "eps") o.eps = value;
        if (field == "weight_decay") o.weight_decay = value;
        body = dtensor ? std::function<void()>([o] { AdamW(std::vector{dtensor_param()}, o); })
                       : std::function<void()>([o] { AdamW(std::vector{tensor_param()}, o); });
      }
      cases.push_back({optimizer + (dtensor ? "DTensor" : "Tensor") + field_name(field) + row,
                       std::move(body),
                       "ConfigError",
                       {optimizer, field, shown}});
    }
  };
  for (const std::string field : {"lr", "momentum", "weight_decay"}) {
    for (const Bad& b : bad_values) add("SGD", field, b.value, b.shown, b.name);
  }
  for (const std::string field : {"lr", "beta1", "beta2", "eps", "weight_decay"}) {
    for (const Bad& b : bad_values) add("AdamW", field, b.value, b.shown, b.name);
  }
  // torch.optim.AdamW: 0 <= beta < 1 (beta = 1 divides by zero in the bias correction).
  add("AdamW", "beta1", 1.0, "[0, 1)", "One");
  add("AdamW", "beta2", 1.0, "[0, 1)", "One");
  add("SGD", "momentum", -5.0, "-5", "MinusFive");
  return cases;
}

// ---- debug/ and runtime/ ----------------------------------------------------------------------

std::vector<ApiCase> debug_runtime_cases() {
  auto parse_trace = [](std::string text) { return [text] { parse_trace_json(text, "t.json"); }; };
  return {
      {"TraceNotJson", parse_trace("{"), "ConfigError", {"trace file 't.json'", "not JSON"}},
      {"TraceNoEvents", parse_trace("{}"), "ConfigError", {"trace file 't.json'", "traceEvents"}},
      {"TraceScalar", parse_trace("42"), "ConfigError", {"trace file 't.json'"}},
      {"TraceEventNotObject",
       parse_trace(trace_json("1")),
       "ConfigError",
       {"trace file 't.json'", "event 0", "object"}},
      {"TraceEventNoName",
       parse_trace(trace_json(R"({"ph": "X", "tid": 0, "ts": 1, "dur": 1})")),
       "ConfigError",
       {"trace file 't.json'", "event 0", "name"}},
      {"TraceEventNameNotString",
       parse_trace(trace_json(R"({"name": 7, "ph": "X", "tid": 0, "ts": 1, "dur": 1})")),
       "ConfigError",
       {"trace file 't.json'", "event 0", "name"}},
      {"TraceEventNegativeTid",
       parse_trace(
           trace_json(R"({"name": "all_reduce", "ph": "X", "tid": -3, "ts": 1, "dur": 1})")),
       "ConfigError",
       {"trace file 't.json'", "event 0", "tid"}},
      {"TraceEventHugeTid",
       parse_trace(trace_json(
           R"({"name": "all_reduce", "ph": "X", "tid": 99999999999, "ts": 1, "dur": 1})")),
       "ConfigError",
       {"trace file 't.json'", "event 0", "tid"}},
      {"TraceEventFloatTid",
       parse_trace(
           trace_json(R"({"name": "all_reduce", "ph": "X", "tid": 1.5, "ts": 1, "dur": 1})")),
       "ConfigError",
       {"trace file 't.json'", "event 0", "tid"}},
      {"TraceEventStringTs",
       parse_trace(
           trace_json(R"({"name": "all_reduce", "ph": "X", "tid": 0, "ts": "x", "dur": 1})")),
       "ConfigError",
       {"trace file 't.json'", "event 0", "ts"}},
      {"TraceEventNegativeDur",
       parse_trace(
           trace_json(R"({"name": "all_reduce", "ph": "X", "tid": 0, "ts": 1, "dur": -1})")),
       "ConfigError",
       {"trace file 't.json'", "event 0", "dur"}},
      {"TraceEventHugeDur",
       parse_trace(
           trace_json(R"({"name": "all_reduce", "ph": "X", "tid": 0, "ts": 1, "dur": 1e400})")),
       "ConfigError",
       {"trace file 't.json'"}},
      {"TraceEventArgsNotObject",
       parse_trace(trace_json(event(R"("args": [1])"))),
       "ConfigError",
       {"trace file 't.json'", "event 0", "args"}},
      {"TraceEventNegativeBytes",
       parse_trace(trace_json(event(R"("args": {"bytes": -4})"))),
       "ConfigError",
       {"trace file 't.json'", "event 0", "bytes"}},
      {"TraceEventFloatBytes",
       parse_trace(trace_json(event(R"("args": {"bytes": 1e30})"))),
       "ConfigError",
       {"trace file 't.json'", "event 0", "bytes"}},
      {"TraceEventNegativeSeq",
       parse_trace(trace_json(event(R"("args": {"seq": -1})"))),
       "ConfigError",
       {"trace file 't.json'", "event 0", "seq"}},
      {"TraceEventGroupNotList",
       parse_trace(trace_json(event(R"("args": {"group": "0,1"})"))),
       "ConfigError",
       {"trace file 't.json'", "event 0", "group"}},
      {"TraceEventGroupNegative",
       parse_trace(trace_json(event(R"("args": {"group": [0, -1]})"))),
       "ConfigError",
       {"trace file 't.json'", "event 0", "group"}},
      {"TraceEventShapeNegative",
       parse_trace(trace_json(event(R"("args": {"shape": [2, -2]})"))),
       "ConfigError",
       {"trace file 't.json'", "event 0", "shape"}},
      {"TraceEventLineNegative",
       parse_trace(trace_json(event(R"("args": {"line": -2})"))),
       "ConfigError",
       {"trace file 't.json'", "event 0", "line"}},
      {"TraceEventNaNEstimate",
       parse_trace(trace_json(event(R"("args": {"estimate_us": "nan"})"))),
       "ConfigError",
       {"trace file 't.json'", "event 0", "estimate_us"}},
      {"TraceOtherDataBadRanks",
       parse_trace(R"({"traceEvents": [], "otherData": {"ranks": "all"}})"),
       "ConfigError",
       {"trace file 't.json'", "otherData", "ranks"}},
      {"TraceOtherDataNegativeWorld",
       parse_trace(R"({"traceEvents": [], "otherData": {"world_size": -1}})"),
       "ConfigError",
       {"trace file 't.json'", "otherData", "world_size"}},
      {"TraceDeepJson",
       parse_trace(std::string(100000, '[') + std::string(100000, ']')),
       "ConfigError",
       {"trace file 't.json'"}},
      {"TraceNestedArray",
       parse_trace("[[1, 2]]"),
       "ConfigError",
       {"trace file 't.json'", "event 0 is an array of 2 items", "bare JSON array"}},
      {"TraceEventsNestedArray",
       parse_trace(trace_json("[]")),
       "ConfigError",
       {"trace file 't.json'", "event 0 is an array of 0 items", "\"traceEvents\" array"}},
      {"TracePerRankFileMissing",
       [] {
         const std::string dir =
             ::testing::TempDir() + "/spmd_bad_input_per_rank_" + std::to_string(::getpid());
         std::filesystem::create_directories(dir);
         std::ofstream(dir + "/a.rank0.json")
             << R"({"traceEvents": [], "otherData": {"ranks": [0], "world_size": 3}})";
         std::ofstream(dir + "/a.rank2.json")
             << R"({"traceEvents": [], "otherData": {"ranks": [2], "world_size": 3}})";
         read_trace_file(dir + "/a.json");
       },
       "ConfigError",
       {"trace file '", "a.json'", "ranks 0,2 of a world of 3", "rank 1 is missing",
        "a.rank1.json"}},
      {"TracePerRankFileRepeated",
       [] {
         const std::string dir =
             ::testing::TempDir() + "/spmd_bad_input_per_rank_twice_" + std::to_string(::getpid());
         std::filesystem::create_directories(dir);
         std::ofstream(dir + "/b.rank0.json") << R"({"traceEvents": []})";
         std::ofstream(dir + "/b.rank0.20250101T000000.json") << R"({"traceEvents": []})";
         read_trace_file(dir + "/b.json");
       },
       "ConfigError",
       {"trace file '", "b.json'", "rank 0 is in two", "b.rank0.json"}},
      {"TracePerRankLastFileMissing",
       [] {
         const std::string dir =
             ::testing::TempDir() + "/spmd_bad_input_per_rank_last_" + std::to_string(::getpid());
         std::filesystem::create_directories(dir);
         std::ofstream(dir + "/c.rank0.json")
             << R"({"traceEvents": [], "otherData": {"ranks": [0], "world_size": 2}})";
         read_trace_file(dir + "/c.json");
       },
       "ConfigError",
       {"trace file '", "c.json'", "ranks 0 of a world of 2", "c.rank1.json"}},
      {"TraceMissingFile",
       [] { read_trace_file("/nonexistent/spmd_trace.json"); },
       "ConfigError",
       {"no trace file", "/nonexistent/spmd_trace.json"}},
      {"SummaryBytesOverflow",
       [] {
         TraceRecord r;
         r.op = "all_reduce";
         r.bytes = kMax;
         std::vector<TraceRecord> records = {r, r};
         summary_table(records);
       },
       "ConfigError",
       {"summary_table", "bytes"}},
      {"DebugOptionsUnknown",
       [] { parse_debug_options("check,bogus"); },
       "ConfigError",
       {"--spmd-debug", "'bogus'"}},
      {"LaunchWorldSizeZero",
       [] {
         std::vector<std::string> args = {"prog", "--spmd-world-size=0"};
         std::vector<char*> argv;
         for (std::string& a : args) argv.push_back(a.data());
         argv.push_back(nullptr);
         int argc = 2;
         parse_launch_options(argc, argv.data());
       },
       "ConfigError",
       {"--spmd-world-size=0", "positive"}},
      {"LaunchWorldSizeHuge",
       [] {
         std::vector<std::string> args = {"prog", "--spmd-world-size=99999999999"};
         std::vector<char*> argv;
         for (std::string& a : args) argv.push_back(a.data());
         argv.push_back(nullptr);
         int argc = 2;
         parse_launch_options(argc, argv.data());
       },
       "ConfigError",
       {"--spmd-world-size=99999999999"}},
      {"LaunchNcclTimeoutInf",
       [] {
         std::vector<std::string> args = {"prog", "--spmd-nccl-timeout=inf"};
         std::vector<char*> argv;
         for (std::string& a : args) argv.push_back(a.data());
         argv.push_back(nullptr);
         int argc = 2;
         parse_launch_options(argc, argv.data());
       },
       "ConfigError",
       {"--spmd-nccl-timeout=inf", "seconds"}},
      {"LaunchUnknownFlag",
       [] {
         std::vector<std::string> args = {"prog", "--spmd-bogus=1"};
         std::vector<char*> argv;
         for (std::string& a : args) argv.push_back(a.data());
         argv.push_back(nullptr);
         int argc = 2;
         parse_launch_options(argc, argv.data());
       },
       "ConfigError",
       {"unknown flag '--spmd-bogus=1'"}},
      {"MakeWorldThreadsHuge",
       [] {
         LaunchOptions o;
         o.backend = "threads";
         o.world_size = 100000;
         o.world_size_source = "--spmd-world-size=100000";
         run_rank_threads(o, [](World&) { return 0; });
       },
       "ConfigError",
       {"--spmd-world-size=100000", "4096"}},
      {"MakeWorldSimHuge",
       [] {
         LaunchOptions o;
         o.world_size = kIntMax;
         o.world_size_source = "SPMD_WORLD_SIZE=2147483647";
         make_world(o);
       },
       "ConfigError",
       {"SPMD_WORLD_SIZE=2147483647", "16777216"}},
      {"SetTopologyZeroDevices",
       [] {
         World w = World::sim(2);
         Topology t;
         t.devices_per_host = 0;
         w.set_topology(std::make_shared<const Topology>(t));
       },
       "ConfigError",
       {"World::set_topology", "devices_per_host"}},
      {"TopologyNegativeBaseLatency",
       [] { Topology::from_json(R"({"base_latency_us": -1})"); },
       "ConfigError",
       {"Topology", "base_latency_us", "-1"}},
      {"TopologyLinkNotObject",
       [] { Topology::from_json(R"({"inter_host": [1, 2]})"); },
       "ConfigError",
       {"Topology", "inter_host", "array"}},
      {"TopologyUnknownKey",
       [] { Topology::from_json(R"({"devices": 8})"); },
       "ConfigError",
       {"Topology", "'devices'"}},
      {"TopologyFractionalDevices",
       [] { Topology::from_json(R"({"devices_per_host": 2.5})"); },
       "ConfigError",
       {"Topology", "devices_per_host", "2.5"}},
      {"TopologyLoadMissing",
       [] { Topology::load("/nonexistent/topo.json"); },
       "ConfigError",
       {"Topology::load", "/nonexistent/topo.json"}},
      {"DeviceSpecNotJson", [] { DeviceSpec::from_json("{"); }, "ConfigError", {"DeviceSpec"}},
      {"DeviceSpecDeepJson",
       [] { DeviceSpec::from_json(std::string(100000, '[') + std::string(100000, ']')); },
       "ConfigError",
       {"DeviceSpec", "array"}},
      {"DeviceSpecNotObject",
       [] { DeviceSpec::from_json("[1, 2]"); },
       "ConfigError",
       {"DeviceSpec", "expected a JSON object", "an array of 2 items"}},
      {"DeviceSpecUnknownKey",
       [] { DeviceSpec::from_json(R"({"memory_gb": 80})"); },
       "ConfigError",
       {"DeviceSpec", "'memory_gb'"}},
      {"DeviceSpecNegativeMemory",
       [] { DeviceSpec::from_json(R"({"memory_gib": -80})"); },
       "ConfigError",
       {"DeviceSpec", "memory_gib", "-80"}},
      {"DeviceSpecZeroBandwidth",
       [] { DeviceSpec::from_json(R"({"memory_bandwidth_gbps": 0})"); },
       "ConfigError",
       {"DeviceSpec", "memory_bandwidth_gbps", "0"}},
      {"DeviceSpecEfficiencyAboveOne",
       [] { DeviceSpec::from_json(R"({"efficiency": 1.5})"); },
       "ConfigError",
       {"DeviceSpec", "efficiency", "1.5"}},
      {"DeviceSpecTflopsNotNumber",
       [] { DeviceSpec::from_json(R"({"tflops": {"bf16": "fast"}})"); },
       "ConfigError",
       {"DeviceSpec", "'tflops.bf16'", "\"fast\""}},
      {"DeviceSpecTflopsUnknownDtype",
       [] { DeviceSpec::from_json(R"({"tflops": {"fp8": 2000}})"); },
       "ConfigError",
       {"DeviceSpec", "tflops.fp8"}},
      {"DeviceSpecNameNotString",
       [] { DeviceSpec::from_json(R"({"name": {"a": 1}})"); },
       "ConfigError",
       {"DeviceSpec", "'name'", "an object of 1 items"}},
      {"DeviceSpecLoadMissing",
       [] { DeviceSpec::load("/nonexistent/gpu.device.json"); },
       "ConfigError",
       {"DeviceSpec", "/nonexistent/gpu.device.json"}},
      {"NumThreadsNotInt",
       [] {
         const ScopedEnv env("SPMD_NUM_THREADS", "four");
         env_num_threads();
       },
       "ConfigError",
       {"SPMD_NUM_THREADS=four", "[1, 4096]"}},
      {"NumThreadsZero",
       [] {
         const ScopedEnv env("SPMD_NUM_THREADS", "0");
         env_num_threads();
       },
       "ConfigError",
       {"SPMD_NUM_THREADS=0"}},
      {"NumThreadsHuge",
       [] {
         const ScopedEnv env("SPMD_NUM_THREADS", "1000000");
         env_num_threads();
       },
       "ConfigError",
       {"SPMD_NUM_THREADS=1000000"}},
      {"NumThreadsTrailing",
       [] {
         const ScopedEnv env("SPMD_NUM_THREADS", "4x");
         env_num_threads();
       },
       "ConfigError",
       {"SPMD_NUM_THREADS=4x"}},
      {"LaunchChecksNumThreads",
       [] {
         const ScopedEnv env("SPMD_NUM_THREADS", "-2");
         std::vector<std::string> args = {"prog"};
         std::vector<char*> argv;
         for (std::string& a : args) argv.push_back(a.data());
         argv.push_back(nullptr);
         int argc = 1;
         parse_launch_options(argc, argv.data());
       },
       "ConfigError",
       {"SPMD_NUM_THREADS=-2"}},
      {"FlightRecorderSizeNegative",
       [] {
         const ScopedEnv env("SPMD_FLIGHT_RECORDER_SIZE", "-5");
         flight_recorder_size();
       },
       "ConfigError",
       {"SPMD_FLIGHT_RECORDER_SIZE=-5"}},
      {"FlightRecorderSizeHuge",
       [] {
         const ScopedEnv env("SPMD_FLIGHT_RECORDER_SIZE", "99999999999999999999999");
         flight_recorder_size();
       },
       "ConfigError",
       {"SPMD_FLIGHT_RECORDER_SIZE=99999999999999999999999"}},
      {"LaunchGpusPerProcessZero",
       [] {
         std::vector<std::string> args = {"prog", "--spmd-gpus-per-process=0"};
         std::vector<char*> argv;
         for (std::string& a : args) argv.push_back(a.data());
         argv.push_back(nullptr);
         int argc = 2;
         parse_launch_options(argc, argv.data());
       },
       "ConfigError",
       {"--spmd-gpus-per-process=0", "positive"}},
      {"LaunchTimeoutNaN",
       [] {
         std::vector<std::string> args = {"prog", "--spmd-timeout=nan"};
         std::vector<char*> argv;
         for (std::string& a : args) argv.push_back(a.data());
         argv.push_back(nullptr);
         int argc = 2;
         parse_launch_options(argc, argv.data());
       },
       "ConfigError",
       {"--spmd-timeout=nan", "seconds"}},
      {"LaunchTimeoutNegative",
       [] {
         std::vector<std::string> args = {"prog", "--spmd-timeout=-3"};
         std::vector<char*> argv;
         for (std::string& a : args) argv.push_back(a.data());
         argv.push_back(nullptr);
         int argc = 2;
         parse_launch_options(argc, argv.data());
       },
       "ConfigError",
       {"--spmd-timeout=-3", "seconds"}},
      {"LaunchTensorsUnknown",
       [] {
         std::vector<std::string> args = {"prog", "--spmd-tensors=fake"};
         std::vector<char*> argv;
         for (std::string& a : args) argv.push_back(a.data());
         argv.push_back(nullptr);
         int argc = 2;
         parse_launch_options(argc, argv.data());
       },
       "ConfigError",
       {"--spmd-tensors=fake", "'meta'"}},
      {"TopologyDeepJson",
       [] { Topology::from_json(std::string(100000, '[') + std::string(100000, ']')); },
       "ConfigError",
       {"Topology", "array"}},
      {"TopologyNotJson", [] { Topology::from_json("{"); }, "ConfigError", {"Topology"}},
      {"TopologyNegativeDevices",
       [] { Topology::from_json(R"({"devices_per_host": -1})"); },
       "ConfigError",
       {"Topology", "devices_per_host"}},
      {"TopologyHugeDevices",
       [] { Topology::from_json(R"({"devices_per_host": 99999999999})"); },
       "ConfigError",
       {"Topology", "devices_per_host"}},
      {"TopologyNaNBandwidth",
       [] { Topology::from_json(R"({"intra_host": {"bandwidth_gbps": -1}})"); },
       "ConfigError",
       {"Topology", "bandwidth_gbps"}},
  };
}

std::vector<ApiCase> all_api_cases() {
  std::vector<ApiCase> all;
  for (auto make : {tensor_cases, ops_cases, sim_cases, mesh_cases, collective_cases, dtensor_cases,
                    nn_cases, debug_runtime_cases}) {
    for (ApiCase& c : make()) all.push_back(std::move(c));
  }
  return all;
}

// ---- the tools --------------------------------------------------------------------------------

// Every process of this test writes the files when it lists the cases (CTest runs one process per
// case, several at once), so each is written beside its path and renamed into place: a reader
// never sees a file another process is still writing.
std::string temp_file(const std::string& name, const std::string& content) {
  const std::string path = ::testing::TempDir() + "/spmd_bad_input_" + name;
  const std::string partial = path + "." + std::to_string(::getpid());
  std::ofstream(partial) << content;
  std::filesystem::rename(partial, path);
  return path;
}

std::vector<CliCase> all_cli_cases() {
  // Deeper than kMaxLayoutDepth, short enough for one command-line argument.
  const std::string deep = nested_layout(2000);
  return {
      {"MeshShapeNegative", "mesh --shape 2,-2", {"--shape", "-2"}},
      {"MeshShapeOverflow", "mesh --shape 9223372036854775807,9223372036854775807", {"--shape"}},
      {"MeshShapeNotInt", "mesh --shape 2,x", {"--shape", "'x'"}},
      {"MeshShapeEmpty", "mesh --shape ''", {"--shape"}},
      {"MeshShapeIntOverflow", "mesh --shape 99999999999999999999", {"--shape"}},
      {"MeshNamesDuplicate", "mesh --shape 2,2 --names a,a", {"repeat 'a'"}},
      {"MeshNamesEmpty", "mesh --shape 2,2 --names a,", {"--names"}},
      {"MeshNamesMiscount", "mesh --shape 2,2 --names a", {"--names"}},
      {"MeshRanksDuplicate", "mesh --shape 2 --ranks 1,1", {"from_ranks"}},
      {"MeshRanksNegative", "mesh --shape 2 --ranks 0,-1", {"--ranks", "-1"}},
      {"MeshRanksHuge", "mesh --shape 1 --ranks 9223372036854775807", {"9223372036854775807"}},
      {"MeshSliceUnknown", "mesh --shape 2,2 --names a,b --slice c", {"'c'"}},
      {"MeshSliceIndexHuge", "mesh --shape 2,2 --names a,b --slice 99999999999", {"99999999999"}},
      {"MeshUnflattenOverflow",
       "mesh --shape 4 --names x --unflatten 'x:9223372036854775807,9223372036854775807,4:a,b,c'",
       {"unflatten"}},
      {"MeshUnflattenWraps",
       "mesh --shape 4 --names x --unflatten 'x:4611686018427387904,4,4:a,b,c'",
       {"unflatten"}},
      {"MeshUnflattenMalformed", "mesh --shape 4 --unflatten 'x'", {"--unflatten"}},
      {"MeshUnflattenZero", "mesh --shape 4 --unflatten '0:0,4'", {"--unflatten", "0"}},
      {"MeshFlattenClash",
       "mesh --shape 2,2 --names a,b --slice b --flatten a",
       {"flatten", "'a'"}},
      {"MeshNonUtf8Name",
       "mesh --shape 2 --names \"$(printf '\\377')\" --slice \"$(printf '\\376')\"",
       {"unknown dim"}},
      {"MeshUnknownOption", "mesh --shape 2 --bogus", {"--bogus"}},
      {"LayoutCoalesceGarbage", "layout coalesce 'abc'", {"layout 'abc'"}},
      {"LayoutCoalesceDeep", "layout coalesce '" + deep + "'", {"nested"}},
      {"LayoutComposeDeep", "layout compose '2:1' '" + deep + "'", {"nested"}},
      {"LayoutUnbalanced", "layout coalesce '" + std::string(100000, '(') + "'", {"layout"}},
      {"LayoutHugeInt", "layout coalesce '99999999999999999999:1'", {"out of range"}},
      {"LayoutOverflow", "layout coalesce '(9223372036854775807,2):(1,1)'", {"overflows"}},
      {"LayoutNegative", "layout coalesce '-2:1'", {"-2"}},
      {"LayoutComplementZero", "layout complement '2:1' 0", {"complement", "0"}},
      {"LayoutComplementNegative", "layout complement '2:1' -5", {"complement"}},
      {"LayoutComplementHuge", "layout complement '2:1' 99999999999999999999", {"world"}},
      {"LayoutComplementNotInt", "layout complement '2:1' 1e3", {"world", "1e3"}},
      {"LayoutComplementOverlap", "layout complement '(2,2):(1,1)' 4", {"complement", "overlaps"}},
      {"LayoutComposeBad", "layout compose '4:1' '8:1'", {"composition"}},
      {"LayoutNoSubcommand", "layout", {"subcommand"}},
      {"LayoutUnknownSubcommand", "layout frobnicate '2:1'", {"frobnicate"}},
      {"RedistMeshNegative", "redistribute --mesh -2 --shape 4 --from R --to R", {"--mesh"}},
      {"RedistShapeOverflow",
       "redistribute --mesh 2 --shape 9223372036854775807,9223372036854775807 --from R --to R",
       {"--shape"}},
      {"RedistShapeNegative", "redistribute --mesh 2 --shape -4 --from R --to R", {"--shape"}},
      {"RedistBadPlacement",
       "redistribute --mesh 2 --shape 4 --from 'Q(0)' --to R",
       {"parse_placements", "'Q(0)'"}},
      {"RedistPlacementCount",
       "redistribute --mesh 2,2 --shape 4 --from R --to R,R",
       {"placements"}},
      {"RedistShardOut", "redistribute --mesh 2 --shape 4 --from 'S(3)' --to R", {"S(3)"}},
      {"RedistShardHuge",
       "redistribute --mesh 2 --shape 4 --from 'S(99999999999)' --to R",
       {"parse_placements"}},
      {"RedistBadDtype",
       "redistribute --mesh 2 --shape 4 --from R --to R --dtype f128",
       {"--dtype", "f128"}},
      {"RedistBadPlanner",
       "redistribute --mesh 2 --shape 4 --from R --to R --planner x",
       {"--planner"}},
      {"RedistPlanOverflow",
       "redistribute --mesh 2 --shape 1152921504606846975 --from 'S(0)' --to R --dtype f64",
       {"--shape"}},
      {"RedistNamesDuplicate",
       "redistribute --mesh 2,2 --names a,a --shape 4 --from R,R --to R,R",
       {"'a'"}},
      {"RedistTopologyMissing",
       "redistribute --mesh 2 --shape 4 --from R --to R --topology /nonexistent/topo.json",
       {"/nonexistent/topo.json"}},
      {"RedistTopologyDeep",
       "redistribute --mesh 2 --shape 4 --from R --to R --topology " +
           temp_file("deep_topology.json", std::string(100000, '[') + std::string(100000, ']')),
       {"Topology"}},
      {"RedistTopologyHugeDevices",
       "redistribute --mesh 2 --shape 4 --from R --to R --topology " +
           temp_file("huge_topology.json", R"({"devices_per_host": 99999999999})"),
       {"devices_per_host"}},
      {"VersionBogus", "version --bogus", {"--bogus"}},
      {"TraceMissing", "trace summary /nonexistent/spmd.json", {"no trace file"}},
      {"TraceNotJson", "trace summary " + temp_file("notjson.json", "{"), {"not JSON"}},
      {"TraceNoEvents", "trace summary " + temp_file("noevents.json", "{}"), {"traceEvents"}},
      {"TraceEventNotObject",
       "trace summary " + temp_file("notobject.json", trace_json("[1]")),
       {"event 0"}},
      {"TraceEventNegativeTid",
       "trace summary " +
           temp_file(
               "negtid.json",
               trace_json(R"({"name": "all_reduce", "ph": "X", "tid": -1, "ts": 1, "dur": 1})")),
       {"event 0", "tid"}},
      {"TraceEventNegativeDur",
       "trace summary " +
           temp_file(
               "negdur.json",
               trace_json(R"({"name": "all_reduce", "ph": "X", "tid": 0, "ts": 1, "dur": -1})")),
       {"event 0", "dur"}},
      {"TraceEventBadArgs",
       "trace summary " + temp_file("badargs.json", trace_json(event(R"("args": 3)"))),
       {"event 0", "args"}},
      {"TraceEventHugeBytes",
       "trace summary " +
           temp_file("hugebytes.json",
                     trace_json(event(R"("args": {"bytes": 9223372036854775807})") + "," +
                                event(R"("args": {"bytes": 9223372036854775807})"))),
       {"bytes"}},
      {"TraceEventNoName",
       "trace summary " +
           temp_file("noname.json", trace_json(R"({"ph": "X", "tid": 0, "ts": 1, "dur": 1})")),
       {"event 0", "name"}},
      {"TraceDeepJson",
       "trace summary " +
           temp_file("deep.json", std::string(100000, '[') + std::string(100000, ']')),
       {"trace file"}},
      {"TraceBinary",
       "trace summary " + temp_file("binary.json", std::string("\xff\xfe\x00\x01", 4)),
       {"not JSON"}},
      {"TraceDiffOneFile", "trace diff " + temp_file("one.json", trace_json("")), {"files"}},
      {"TraceDiffPerRankFileMissing",
       [] {
         temp_file("diffmissing.rank0.json",
                   R"({"traceEvents": [], "otherData": {"ranks": [0], "world_size": 2}})");
         const std::string path = ::testing::TempDir() + "/spmd_bad_input_diffmissing.json";
         return "trace diff " + path + " " + path;
       }(),
       {"diffmissing.json'", "rank 1 is missing", "spmd_bad_input_diffmissing.rank1.json"}},
      {"TraceNestedArray",
       "trace summary " + temp_file("nested.json", "[[{}]]"),
       {"event 0 is an array of 1 items", "bare JSON array"}},
      {"TraceConvertBadInput",
       "trace convert " + temp_file("conv.json", trace_json("1")) + " " + ::testing::TempDir() +
           "/spmd_bad_input_out.json",
       {"event 0"}},
      {"TraceConvertUnwritable",
       "trace convert " + temp_file("conv_ok.json", trace_json("")) + " /nonexistent/dir/out.json",
       {"/nonexistent/dir/out.json"}},
      {"UnknownSubcommand", "frobnicate", {"unknown subcommand 'frobnicate'"}},
      {"NoSubcommand", "", {"subcommand"}},
      {"SpmdrunNoCount", "-- true", {"-n N is required"}, true},
      {"SpmdrunCountZero", "-n 0 true", {"-n", "'0'"}, true},
      {"SpmdrunCountHuge", "-n 99999999999999999999 true", {"-n", "99999999999999999999"}, true},
      {"SpmdrunCountNegative", "-n -3 true", {"-n", "'-3'"}, true},
      {"SpmdrunCountNotInt", "-n 2x true", {"-n", "'2x'"}, true},
      {"SpmdrunTimeoutNaN", "-n 1 --timeout nan true", {"--timeout", "'nan'"}, true},
      {"SpmdrunTimeoutInf", "-n 1 --timeout inf true", {"--timeout", "'inf'"}, true},
      {"SpmdrunTimeoutEmpty", "-n 1 --timeout= true", {"--timeout"}, true},
      {"SpmdrunTimeoutNegative", "-n 1 --timeout -1 true", {"--timeout", "'-1'"}, true},
      {"SpmdrunUnknownOption", "-n 1 --frob true", {"unknown option '--frob'"}, true},
      {"SpmdrunNoProgram", "-n 2", {"no program"}, true},
      {"SpmdrunMissingValue", "-n", {"-n needs a value"}, true},
  };
}

// ---- the test ---------------------------------------------------------------------------------

std::string case_name(const std::string& name) {
  return name;
}

class Api : public ::testing::TestWithParam<ApiCase> {};

TEST_P(Api, ThrowsTheTypedErrorNamingTheOperation) {
  const ApiCase& c = GetParam();
  try {
    c.body();
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(e.type_name(), c.type) << "message: " << message;
    ASSERT_FALSE(c.fragments.empty());
    EXPECT_TRUE(message.starts_with(c.fragments[0]))
        << "the message does not start with the operation '" << c.fragments[0] << "': " << message;
    for (const std::string& f : c.fragments) {
      EXPECT_NE(message.find(f), std::string::npos)
          << "the message lacks '" << f << "': " << message;
    }
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw " << typeid(e).name() << ", not an spmd::Error: " << e.what();
    return;
  }
  ADD_FAILURE() << "did not throw (expected " << c.type << ")";
}

INSTANTIATE_TEST_SUITE_P(BadInput, Api, ::testing::ValuesIn(all_api_cases()),
                         [](const ::testing::TestParamInfo<ApiCase>& info) {
                           return case_name(info.param.name);
                         });

#if defined(SPMD_CLI) && defined(SPMD_SPMDRUN)
class Cli : public ::testing::TestWithParam<CliCase> {};

TEST_P(Cli, ExitsWithCode2AndAMessageNamingTheBadValue) {
  const CliCase& c = GetParam();
  const std::string tool = c.spmdrun ? SPMD_SPMDRUN : SPMD_CLI;
  const testing::CommandResult r = testing::run_command(tool + " " + c.command);
  EXPECT_EQ(r.exit_code, 2) << (c.spmdrun ? "spmdrun " : "spmd ") << c.command << "\n"
                            << r.output.substr(0, 4000);
  for (const std::string& f : c.fragments) {
    EXPECT_NE(r.output.find(f), std::string::npos)
        << "the message lacks '" << f << "': " << r.output.substr(0, 4000);
  }
}

INSTANTIATE_TEST_SUITE_P(BadInput, Cli, ::testing::ValuesIn(all_cli_cases()),
                         [](const ::testing::TestParamInfo<CliCase>& info) {
                           return case_name(info.param.name);
                         });
#endif

}  // namespace
}  // namespace spmd
