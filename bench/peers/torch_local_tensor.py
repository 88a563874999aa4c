"""bench/peers/torch_local_tensor.py: spmdsim's sim workloads in PyTorch's LocalTensor.

Run by `scripts/bench --peers` in the venv under build/bench/peers (PyTorch >= 2.10, CPU only);
prints one JSON object. What is measured, per the spmdsim benchmark it mirrors:

  collectives (collectives_bench BM_sweep_*): 8 ranks simulated in one process under
    LocalTensorMode(8) with the fake process group; each rank holds S bytes of float32 (rank r's
    values are r + 1); one call of a functional collective over the 8-rank group on that
    LocalTensor, waited: all_reduce(sum), all_gather_tensor(dim 0), reduce_scatter_tensor(sum,
    dim 0), all_to_all_single (even splits); all_gather_single and reduce_scatter_single where
    this release has those names.
  dtensor (dtensor_bench BM_DTensor*Warm us_per_op): a DTensor op on tiny tensors over a 1-D mesh
    of 8 ranks, warm: a + b with a, b [32, 4] Shard(0); a @ b with a [32, 4] Shard(0) and
    b [4, 4] Replicate (no communication).

Each figure is the median of 5 runs; a run is the mean time per call over at least 0.2 s of
calls, after warm-up calls. Record functions are off, as in PyTorch's own LocalTensor tests.
  python torch_local_tensor.py [--sizes 4096,262144,16777216]
"""

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

RANKS = 8


def per_call_us(fn, min_s=0.2, runs=5):
    """Median over `runs` of the mean microseconds per call of fn()."""
    for _ in range(3):
        fn()
    results = []
    for _ in range(runs):
        calls = 0
        start = time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_s:
                break
        results.append(elapsed / calls * 1e6)
    return statistics.median(results)


def waited(t):
    """The functional collectives may return an AsyncCollectiveTensor: wait for it."""
    return t.wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="4096,262144,16777216",
                        help="bytes per rank, comma-separated")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    torch.autograd._enable_record_function(False)
    dist.init_process_group("fake", rank=0, world_size=RANKS)
    group = dist.group.WORLD
    out = {"peer": "pytorch", "version": torch.__version__,
           "threads": torch.get_num_threads(), "collectives": [], "dtensor": []}

    # The mesh is built outside the mode, as PyTorch's LocalTensor test base does.
    mesh = init_device_mesh("cpu", (RANKS,))
    with LocalTensorMode(RANKS):
        # all_gather_single / reduce_scatter_single replace the *_tensor names in newer releases.
        all_gather = getattr(funcol, "all_gather_single", funcol.all_gather_tensor)
        reduce_scatter = getattr(funcol, "reduce_scatter_single", funcol.reduce_scatter_tensor)
        ops = {
            "all_reduce": lambda x: funcol.all_reduce(x, "sum", group),
            "all_gather": lambda x: all_gather(x, 0, group),
            "reduce_scatter": lambda x: reduce_scatter(x, "sum", 0, group),
            "all_to_all": lambda x: funcol.all_to_all_single(x, None, None, group),
        }
        for size in sizes:
            n = size // 4
            x = LocalTensor({r: torch.full((n,), float(r + 1)) for r in range(RANKS)})
            # A check that the simulated collective ran: rank 0's sum is 1 + ... + 8.
            total = waited(ops["all_reduce"](x))._local_tensors[0][0].item()
            assert total == RANKS * (RANKS + 1) / 2, total
            for name, op in ops.items():
                us = per_call_us(lambda: waited(op(x)))
                out["collectives"].append({"op": name, "bytes_per_rank": size, "us": us})

        torch.manual_seed(0)
        a = distribute_tensor(torch.randn(32, 4), mesh, [Shard(0)])
        b = distribute_tensor(torch.randn(32, 4), mesh, [Shard(0)])
        w = distribute_tensor(torch.randn(4, 4), mesh, [Replicate()])
        out["dtensor"].append({"op": "add", "us": per_call_us(lambda: a + b)})
        out["dtensor"].append({"op": "matmul", "us": per_call_us(lambda: a @ w)})
    dist.destroy_process_group()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
