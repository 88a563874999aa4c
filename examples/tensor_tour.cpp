// examples/tensor_tour.cpp: a short walk through spmdsim's dense Tensor: factories, views that
// share storage, broadcasting arithmetic, reductions, matmul and counter-based random numbers.
#include <fmt/core.h>

#include <spmd/ops/ops.h>
#include <spmd/runtime/digest.h>
#include <spmd/tensor/random.h>

using namespace spmd;

int main() {
  Tensor a = arange(6).reshape({2, 3});  // [[0, 1, 2], [3, 4, 5]], f32
  fmt::print("a =\n{}\n\n", a);

  // Views share storage: writing through the transposed column changes `a`.
  Tensor at = a.transpose(0, 1);
  at.select(1, 0).fill_(-1.0);
  fmt::print("after a.T[:, 0] = -1, a =\n{}\n\n", a);

  // Broadcasting: [2, 3] + [3] and a Python-style scalar.
  Tensor bias = from_vector<float>({10, 20, 30});
  fmt::print("a + bias =\n{}\n\n", a + bias);
  fmt::print("sum over dim 1 (keepdim) =\n{}\n\n", sum(a, {1}, /*keepdim=*/true));

  // matmul on Eigen; BF16 accumulates in F32 and rounds once.
  Tensor w = randn({3, 4}, /*seed=*/0);
  Tensor y = matmul(a, w);
  fmt::print("y = a @ w =\n{}\n", y);
  fmt::print("bf16 matmul max |diff| vs f32: {:.4f}\n\n",
             max_abs_diff(matmul(a.to(DType::BF16), w.to(DType::BF16)).to(DType::F32), y));

  // Counter-based RNG: any block of a random tensor is computable alone.
  Tensor full = randn({4, 4}, /*seed=*/7);
  Tensor block = randn_block({4, 4}, 7, /*start=*/{2, 1}, /*sizes=*/{2, 2});
  fmt::print("block of randn == slice of the full tensor: {}\n",
             equal(block, full.narrow(0, 2, 2).narrow(1, 1, 2)));
  fmt::print("softmax rows sum to 1: {}\n\n",
             allclose(sum(softmax(full, 1), {1}), ones({4}), 1e-6, 1e-6));

  // Large tensors print summarized, like torch.
  Tensor big = rand({1000, 1000}, 3);
  fmt::print("{}\n", big);
  fmt::print("digest: {}\n", digest_hex(combined_digest({a, y, full, big})));
  return 0;
}
