"""bench/peers/eager_kernels.py: the bytes PyTorch eager's kernels move for RMSNorm and RoPE.

The reference for Note [Eager kernels] (spmd/debug/dry_run.h): a dry run with SPMD_EAGER_OPS
costs rms_norm and rotary_embedding as the separate kernels eager PyTorch runs for them, by the
closed forms in spmd/ops/nn.cpp and spmd/ops/rope.cpp. This script runs the same decompositions in
PyTorch (>= 2.10, CPU) under a TorchDispatchMode, forward and autograd's backward, and prints every
kernel that reaches the dispatcher with the bytes it reads and writes per element of the input
(views, which move nothing, left out; a broadcast input counts its storage once). The
decompositions:
  - at::rms_norm as it was before PyTorch 2.8 fused it (a CompositeImplicitAutograd function):
    the input cast to float, pow(2), mean over the last dim, + eps, rsqrt, times the input, cast
    back, times the weight;
  - Meta's reference apply_rotary_emb, which torchtitan runs: the input cast to float, viewed as
    complex pairs, times the complex64 table, viewed back and cast to the input's dtype.

  python eager_kernels.py      (prints the kernels, then one JSON object of totals per case)
Not run by scripts/test or scripts/bench: its figures are quoted in the Note and in the test
DryRunReport.EagerKernelsCostPyTorchsDecomposition (tests/debug/dry_run_test.cpp).
"""

import json

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# Ops that only make a new view of the same storage: no kernel runs.
VIEW_OPS = {
    "view", "_unsafe_view", "expand", "view_as_complex", "view_as_real", "reshape", "t",
    "transpose", "unsqueeze", "squeeze", "permute", "alias", "detach", "slice", "select",
    "as_strided", "_reshape_alias", "_conj", "_neg_view", "flatten", "unflatten",
}


def touched_bytes(t):
    """The bytes a kernel addresses in `t`: a broadcast (zero-stride) tensor reads its storage."""
    if t.dim() > 0 and 0 in t.stride():
        return t.untyped_storage().nbytes()
    return t.numel() * t.element_size()


class KernelLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.kernels = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ not in VIEW_OPS:
            ins = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
            outs = [o for o in tree_flatten(result)[0] if isinstance(o, torch.Tensor)]
            self.kernels.append((str(func), sum(map(touched_bytes, ins)),
                                 sum(map(touched_bytes, outs))))
        return result


def rms_norm_before_2_8(x, weight, eps):
    upcast = x.to(torch.float32)
    rstd = torch.rsqrt(torch.pow(upcast, 2).mean(-1, keepdim=True).add_(eps))
    return upcast.mul(rstd).type_as(x).mul(weight)


def rope_reference(x, table):
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    rotated = pairs * table.view(1, x.shape[1], 1, pairs.shape[-1])
    return torch.view_as_real(rotated).flatten(3).type_as(x)


def count(name, fn, inputs):
    x = inputs[0]
    n = x.numel()
    forward = KernelLog()
    with forward:
        y = fn(*inputs)
    grad = torch.randn_like(y)
    backward = KernelLog()
    with backward:
        y.backward(grad)
    totals = {}
    for phase, log in (("forward", forward), ("backward", backward)):
        print(f"== {name}, {phase} ({n} elements; bytes per element)")
        total = 0
        for kernel, read, written in log.kernels:
            print(f"   {kernel:40s} read {read / n:6.2f}  write {written / n:6.2f}")
            total += read + written
        print(f"   total {total / n:.2f}")
        totals[phase] = round(total / n, 4)
    return totals


def main():
    torch.manual_seed(0)
    batch, seq, dim, heads, head_dim = 2, 64, 256, 8, 128
    table = torch.polar(torch.ones(seq, head_dim // 2), torch.randn(seq, head_dim // 2))
    results = {}
    for dtype in (torch.bfloat16, torch.float32):
        tag = str(dtype).replace("torch.", "")
        x = torch.randn(batch, seq, dim, dtype=dtype, requires_grad=True)
        w = torch.randn(dim, dtype=dtype, requires_grad=True)
        results[f"rms_norm_{tag}"] = count(f"rms_norm {tag}",
                                           lambda a, b: rms_norm_before_2_8(a, b, 1e-5), (x, w))
        q = torch.randn(batch, seq, heads, head_dim, dtype=dtype, requires_grad=True)
        results[f"rope_{tag}"] = count(f"rope {tag}", lambda a: rope_reference(a, table), (q,))
    results["rope_table_bytes_per_element"] = table.numel() * 8 / (batch * seq * heads * head_dim)
    results["torch"] = torch.__version__
    print(json.dumps(results))


if __name__ == "__main__":
    main()
