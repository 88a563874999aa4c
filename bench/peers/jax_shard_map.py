"""bench/peers/jax_shard_map.py: spmdsim's sim collectives in JAX on 8 host CPU devices.

Run by `scripts/bench --peers` in the venv under build/bench/peers; prints one JSON object.
What is measured (mirrors collectives_bench BM_sweep_*): XLA_FLAGS=
--xla_force_host_platform_device_count=8 gives 8 CPU devices in this process, on a 1-D mesh
("x"). Each device holds S bytes of float32 (device r's values are r + 1): a global array of
8 * S / 4 elements sharded P("x"). One call of a jitted shard_map whose body is one collective
over "x", timed with block_until_ready:
  all_reduce      psum(b, "x")
  all_gather      all_gather(b, "x", tiled=True)            (each device gets all 8 blocks)
  reduce_scatter  psum_scatter(b, "x", scatter_dimension=0, tiled=True)
  all_to_all      all_to_all(b, "x", split_axis=0, concat_axis=0, tiled=True)
out_specs is P("x") throughout, so every device keeps its own result, as each simulated rank
does. Compilation happens in the warm-up calls, outside the timing. Each figure is the median of
5 runs; a run is the mean time per call over at least 0.2 s of calls.
  python jax_shard_map.py [--sizes 4096,262144,16777216]
"""

import os

# The device count must be fixed before JAX initializes its CPU backend.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

try:
    shard_map = jax.shard_map
except AttributeError:  # JAX before shard_map left jax.experimental
    from jax.experimental.shard_map import shard_map

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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="4096,262144,16777216",
                        help="bytes per device, comma-separated")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    devices = jax.devices("cpu")
    assert len(devices) == RANKS, devices
    mesh = Mesh(devices, ("x",))
    bodies = {
        "all_reduce": lambda b: jax.lax.psum(b, "x"),
        "all_gather": lambda b: jax.lax.all_gather(b, "x", tiled=True),
        "reduce_scatter": lambda b: jax.lax.psum_scatter(b, "x", scatter_dimension=0,
                                                         tiled=True),
        "all_to_all": lambda b: jax.lax.all_to_all(b, "x", 0, 0, tiled=True),
    }
    fns = {name: jax.jit(shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
           for name, body in bodies.items()}
    out = {"peer": "jax", "version": jax.__version__, "devices": len(devices),
           "collectives": []}
    for size in sizes:
        n = size // 4
        x = jax.device_put(jnp.repeat(jnp.arange(1, RANKS + 1, dtype=jnp.float32), n),
                           NamedSharding(mesh, P("x")))
        # A check that the collective ran: device 0's sum is 1 + ... + 8.
        total = float(fns["all_reduce"](x)[0])
        assert total == RANKS * (RANKS + 1) / 2, total
        for name, fn in fns.items():
            us = per_call_us(lambda: fn(x).block_until_ready())
            out["collectives"].append({"op": name, "bytes_per_rank": size, "us": us})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
