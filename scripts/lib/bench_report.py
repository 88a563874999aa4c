"""scripts/lib/bench_report.py RESULTS DOCS [BASELINE]: writes DOCS/performance.md and
DOCS/perf_collectives.png from the raw results scripts/bench left in RESULTS (Google Benchmark JSON,
sim_vs_mpi output, nccl_bench output, peer JSON, meta.env), then compares every headline figure
with the same figure in BASELINE (default: DOCS/performance.md as it was before this run;
scripts/bench passes the committed one). It prints a REGRESSION line for each figure that got
worse beyond the thresholds below and exits 1 when there is one. Standard library only; the plot
is drawn by gnuplot.

Regression thresholds: a time (ns, us, ms, ms/step) or memory figure more than 25% above the
baseline, a bandwidth (GB/s) more than 25% below it (SPMD_BENCH_TOLERANCE=0.25 changes both).
The medians of one run on this 2-core shared machine move by 5-15% between quiet runs, so a
tighter bound cries wolf; a lost fast path (a copy, an allocation per rank, a pool wake-up per
call) costs 30% or more. Every figure is wall time, and load moves it far more than 25%: two
busy processes on 2 cores made the 4-byte all_reduce 2.5 us instead of 0.8 us, and one compile
beside the benchmarks halves the 64 MiB bandwidths (their copies are split over 2 threads). So the
check prints both runs' load, and a REGRESSION on a busy machine wants a re-run on a quiet one."""

import datetime
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys

RANKS = 8
SWEEP_OPS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
DEFAULT_TOLERANCE = 0.25


# ---- the regression check ---------------------------------------------------------------------

def parse_figure(text):
    """(value, unit) of a headline "ours" cell: "1.27 us" -> (1.27, "us"), "32.3 GB/s" ->
    (32.3, "GB/s"), "sim: 38.7 ms/step" -> (38.7, "ms/step"), "64.0 MiB held" -> (64.0, "MiB");
    None when the cell holds no figure ("skipped: ...")."""
    m = re.search(r"(-?[0-9]+(?:\.[0-9]+)?)\s*(ns|us|ms/step|ms|s|GB/s|MiB)\b", text)
    if not m:
        return None
    return float(m.group(1)), m.group(2)


def higher_is_better(unit):
    return unit == "GB/s"


def parse_headline(markdown):
    """{figure: "ours" cell} from a performance.md's headline table; {} when it has none."""
    rows = {}
    section = markdown.split("## Headline figures", 1)
    if len(section) < 2:
        return rows
    for line in section[1].split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or cells[0] in ("figure", "") or set(cells[0]) <= set("- "):
            continue
        rows[cells[0]] = cells[1]
    return rows


def parse_load(markdown):
    """The 1-minute load average before the benchmarks, as the page recorded it, or None."""
    m = re.search(r"Load average \(1, 5, 15 min\): ([0-9.]+)", markdown)
    return float(m.group(1)) if m else None


def compare_headlines(baseline, current, tolerance=DEFAULT_TOLERANCE):
    """One entry per figure in both tables with a number in both and the same unit:
    (figure, old (value, unit), new (value, unit), change, regression). `change` is new/old - 1;
    a regression is a time or memory above old * (1 + tolerance) or a bandwidth below
    old * (1 - tolerance)."""
    out = []
    for figure, new_text in current.items():
        if figure not in baseline:
            continue
        old, new = parse_figure(baseline[figure]), parse_figure(new_text)
        if old is None or new is None or old[1] != new[1] or old[0] <= 0:
            continue
        change = new[0] / old[0] - 1.0
        if higher_is_better(new[1]):
            regression = new[0] < old[0] * (1.0 - tolerance)
        else:
            regression = new[0] > old[0] * (1.0 + tolerance)
        out.append((figure, old, new, change, regression))
    return out


def regression_report(comparison, tolerance, load_then, load_now, cores):
    """The lines scripts/bench prints; REGRESSION lines first."""
    lines = []
    for figure, old, new, change, regression in comparison:
        if regression:
            worse = "lower" if higher_is_better(new[1]) else "higher"
            lines.append(f"REGRESSION: {figure}: {fmt(new[0])} {new[1]}, was {fmt(old[0])} "
                         f"{old[1]} ({change:+.0%}; more than {tolerance:.0%} {worse} fails)")
    regressions = len(lines)
    for figure, old, new, change, regression in comparison:
        if not regression:
            lines.append(f"ok: {figure}: {fmt(new[0])} {new[1]}, was {fmt(old[0])} {old[1]} "
                         f"({change:+.0%})")
    loads = (f"load average {load_now if load_now is not None else '?'} now, "
             f"{load_then if load_then is not None else '?'} when the baseline was measured, "
             f"on {cores} cores")
    if regressions and load_now is not None and load_now > 0.5 * cores:
        lines.append(f"note: {loads}: on a busy machine wall times grow and the bandwidths of "
                     "copies split over the thread pool drop (a competing process takes a core); "
                     "re-run scripts/bench on a quiet one before believing a REGRESSION")
    else:
        lines.append(f"note: {loads}")
    return lines, regressions


def read_meta(results):
    meta = {}
    with open(os.path.join(results, "meta.env")) as f:
        for line in f:
            key, _, value = line.rstrip("\n").partition("=")
            meta[key] = value
    return meta


def base_name(run_name):
    """The name without Google Benchmark's option segments: BM_Matmul512/min_time:2.000/
    manual_time -> BM_Matmul512; BM_sweep_all_reduce/4096/manual_time -> .../4096."""
    parts = [p for p in run_name.split("/")
             if p not in ("real_time", "manual_time") and ":" not in p]
    return "/".join(parts)


def load_bench(results, program):
    """{name (args included, time suffix dropped): the median entry}, and the JSON context."""
    path = os.path.join(results, program + ".json")
    if not os.path.exists(path):
        return {}, {}
    with open(path) as f:
        data = json.load(f)
    medians, singles = {}, {}
    for b in data["benchmarks"]:
        name = base_name(b.get("run_name", b["name"]))
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                medians[name] = b
        else:
            singles.setdefault(name, b)
    for name, b in singles.items():  # a single repetition has no aggregates
        medians.setdefault(name, b)
    return medians, data.get("context", {})


def bench_label(results, program, name):
    """The label a benchmark set (state.SetLabel) on any of its entries, or None."""
    path = os.path.join(results, program + ".json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        data = json.load(f)
    for b in data["benchmarks"]:
        if base_name(b.get("run_name", b["name"])) == name and b.get("label"):
            return b["label"]
    return None


def unit_us(b):
    """The entry's real time in microseconds."""
    scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[b.get("time_unit", "ns")]
    return b["real_time"] * scale


def fmt(x, digits=3):
    if x is None:
        return "n/a"
    if x == 0:
        return "0"
    magnitude = abs(x)
    if magnitude >= 100:
        return f"{x:.0f}"
    if magnitude >= 10:
        return f"{x:.1f}"
    if magnitude >= 1:
        return f"{x:.2f}"
    decimals = digits - 1 - math.floor(math.log10(magnitude))
    return f"{x:.{decimals}f}"


def ratio_text(ours, theirs):
    """ours / theirs, with the inverse spelled out when we are more than 10x faster."""
    if not ours or not theirs:
        return "n/a"
    r = ours / theirs
    return f"{fmt(r)} (1/{theirs / ours:.0f})" if r < 0.1 else fmt(r)


def verdict(ok):
    return "**pass**" if ok else "**FAIL**"


def size_text(n):
    if n >= 1 << 20:
        return f"{n >> 20} MiB"
    if n >= 1 << 10:
        return f"{n >> 10} KiB"
    return f"{n} B"


def machine(results, meta, context):
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal"):
                mem_kib = int(line.split()[1])
    compiler = "unknown"
    cache = os.path.join(results, "..", "CMakeCache.txt")
    if os.path.exists(cache):
        with open(cache) as f:
            m = re.search(r"^CMAKE_CXX_COMPILER:\w+=(.*)$", f.read(), re.M)
        if m:
            out = subprocess.run([m.group(1), "--version"], capture_output=True, text=True)
            compiler = out.stdout.splitlines()[0] if out.stdout else m.group(1)
    caches = ", ".join(f"L{c['level']} {c['type'][0].lower()} {c['size'] >> 10} KiB"
                       for c in context.get("caches", []) if c["type"] != "Instruction")
    return {
        "cpu": cpu, "cores": os.cpu_count(), "mem_gib": mem_kib / (1 << 20),
        "compiler": compiler, "kernel": platform.release(), "caches": caches,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def sim_vs_mpi(results, runs):
    sim, mpi, sim_wall, mpi_wall = [], [], [], []
    for i in range(1, runs + 1):
        path = os.path.join(results, f"sim_vs_mpi.{i}.txt")
        if not os.path.exists(path):
            continue
        text = open(path).read()
        for label, steps, walls in (("sim", sim, sim_wall), ("mpi", mpi, mpi_wall)):
            m = re.search(rf"^{label} per_step_ms: ([0-9.]+)", text, re.M)
            w = re.search(rf"^{label} wall_s: ([0-9.]+)", text, re.M)
            if m:
                steps.append(float(m.group(1)))
            if w:
                walls.append(float(w.group(1)))
    if not sim or not mpi:
        return None
    return {
        "sim_ms": statistics.median(sim), "mpi_ms": statistics.median(mpi),
        "sim_wall": statistics.median(sim_wall), "mpi_wall": statistics.median(mpi_wall),
        "ratios": [m / s for s, m in zip(sim, mpi)], "runs": len(sim),
    }


def load_peer(results, meta, name):
    path = os.path.join(results, f"peer_{name}.json")
    error = meta.get(f"peer_{name}_error")
    if error or not os.path.exists(path):
        return None, error or "not run"
    with open(path) as f:
        return json.load(f), None


def plot(sweep, machine_info, docs, results):
    data = os.path.join(results, "sweep.dat")
    sizes = sorted({s for (_, s) in sweep})
    with open(data, "w") as f:
        f.write("# bytes_per_rank " + " ".join(SWEEP_OPS) + " memcpy (GB/s)\n")
        for s in sizes:
            row = [sweep.get((op, s)) for op in SWEEP_OPS]
            memcpy = statistics.median(r["memcpy_GBps"] for r in row if r)
            f.write(f"{s} " + " ".join(f"{r['effective_GBps']:.4f}" if r else "NaN" for r in row)
                    + f" {memcpy:.4f}\n")
    png = os.path.join(docs, "perf_collectives.png")
    lines = [f"'{data}' using 1:{i + 2} with linespoints lw 2 pt 7 title '{op}'"
             for i, op in enumerate(SWEEP_OPS)]
    lines.append(f"'{data}' using 1:6 with lines lw 3 dt 2 lc rgb 'black' "
                 "title 'memcpy of the same 2RS bytes'")
    tics = ", ".join(f"'{size_text(s)}' {s}" for s in sizes)
    script = f"""
set terminal pngcairo size 960,640 font 'DejaVu Sans,11'
set output '{png}'
set title "spmdsim sim collectives, {RANKS} ranks in one process: effective bandwidth 2RS/t\\n{machine_info['cpu']}, {machine_info['date']}"
set xlabel 'bytes per rank (S)'
set ylabel 'GB/s (2 x ranks x S / time)'
set logscale x 2
set logscale y 10
set termoption noenhanced
set xrange [3000:90000000]
set xtics ({tics})
set grid
set key outside bottom center horizontal maxrows 2
set ytics (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500)
plot {', '.join(lines)}
"""
    subprocess.run(["gnuplot"], input=script, text=True, check=True)


def main():
    results, docs = sys.argv[1], sys.argv[2]
    baseline_path = sys.argv[3] if len(sys.argv) > 3 else os.path.join(docs, "performance.md")
    baseline = open(baseline_path).read() if os.path.exists(baseline_path) else ""
    tolerance = float(os.environ.get("SPMD_BENCH_TOLERANCE", DEFAULT_TOLERANCE))
    meta = read_meta(results)
    reps = meta.get("repetitions", "1")
    build = meta.get("build_dir", "build/bench")
    tensor, context = load_bench(results, "tensor_bench")
    mesh, _ = load_bench(results, "mesh_bench")
    coll, _ = load_bench(results, "collectives_bench")
    dt, _ = load_bench(results, "dtensor_bench")
    gpt, _ = load_bench(results, "gpt_bench")
    dry, _ = load_bench(results, "dryrun_scale")
    info = machine(results, meta, context)
    mpi = sim_vs_mpi(results, int(meta.get("mpi_runs", "3")))
    gb = f"--benchmark_repetitions={reps}"

    sweep = {}
    for name, b in coll.items():
        m = re.match(r"BM_sweep_(\w+)/(\d+)$", name)
        if m:
            sweep[(m.group(1), int(m.group(2)))] = b

    md = []
    w = md.append
    w("# Performance")
    w("")
    w("Written by `scripts/bench` from one run (do not edit by hand). Each figure sits beside "
      "its reference, measured in the same run on the same machine. Google Benchmark figures "
      f"are the median of {reps} repetitions, sim_vs_mpi's the median of "
      f"{meta.get('mpi_runs', '?')} runs. Raw Google Benchmark JSON and program output stay in "
      f"`{build}/results/` (not committed).")
    w("")
    w("## Machine")
    w("")
    w(f"- CPU: {info['cpu']}, {info['cores']} cores visible"
      + (f" ({info['caches']})" if info["caches"] else ""))
    w(f"- Memory: {info['mem_gib']:.1f} GiB; kernel {info['kernel']}")
    w(f"- Compiler: {info['compiler']}; CMake Release (-O3 -DNDEBUG), assertions off, "
      f"no -march=native; commit {meta.get('commit', '?')}")
    gemm = bench_label(results, "tensor_bench", "BM_Matmul512Blas")
    if gemm:
        coretype = os.environ.get("OPENBLAS_CORETYPE")
        w(f"- F32/F64 products ran on {gemm} (Note [OpenBLAS core type]: "
          + (f"OPENBLAS_CORETYPE={coretype} was set in the environment, and is kept)"
             if coretype is not None else "OPENBLAS_CORETYPE was not set)"))
    if context.get("library_build_type") == "debug":
        w("- Google Benchmark from Debian (libbenchmark-dev) prints \"Library was built as "
          "DEBUG\": that is the benchmark library's own build; the code measured is spmdsim's "
          "Release build.")
    w(f"- Date: {info['date']}")
    w(f"- Load average (1, 5, 15 min): {meta.get('load_before', '?')} before the benchmarks, "
      f"{meta.get('load_after', '?')} after. This machine is shared: any load above 0 means other "
      "work ran beside the benchmarks, and numbers from a quiet machine will be better and "
      "steadier.")
    loads = [(k[len("load_at_"):], v) for k, v in meta.items() if k.startswith("load_at_")]
    if loads:
        w("- Load average when each program started: "
          + "; ".join(f"{name} {value}" for name, value in loads) + ".")
    w(f"- Time: {meta.get('total_s', '?')} s for the whole of `scripts/bench"
      f"{' --peers' if meta.get('peers') == '1' else ''}`, of which {meta.get('build_s', '?')} s "
      "installing and building.")
    w("")

    # ---- headline table --------------------------------------------------------------------
    rows = []

    def get(table, name):
        return table.get(name)

    mm, add = get(tensor, "BM_Matmul512"), get(tensor, "BM_Add16M")
    blas = get(tensor, "BM_Matmul512Blas")
    if mm:
        rows.append(("tensor: matmul 512x512x512 F32", f"{fmt(mm['ms_ours'])} ms",
                     f"raw Eigen `C.noalias() = A * B`: {fmt(mm['ms_ref'])} ms",
                     f"vs_eigen {fmt(mm['vs_eigen'])}x", ">= 0.8x", verdict(mm["vs_eigen"] >= 0.8)))
    if blas:
        rows.append(("tensor: matmul 512x512x512 F32 against the best BLAS here",
                     f"{fmt(blas['ms_ours'])} ms",
                     f"raw OpenBLAS sgemm, its threads on every core: {fmt(blas['ms_ref'])} ms",
                     f"vs_blas {fmt(blas['vs_blas'])}x", ">= 0.7x",
                     verdict(blas["vs_blas"] >= 0.7)))
    if add:
        rows.append(("tensor: add of 16M F32", f"{fmt(add['ms_ours'])} ms",
                     f"plain loop: {fmt(add['ms_ref'])} ms", f"vs_loop {fmt(add['vs_loop'])}x",
                     ">= 0.7x", verdict(add["vs_loop"] >= 0.7)))
    for op in SWEEP_OPS:
        b = get(coll, f"BM_{op}_64MiB")
        if b:
            rows.append((f"sim {op}, 8 ranks x 64 MiB", f"{fmt(b['effective_GBps'])} GB/s",
                         f"memcpy: {fmt(b['memcpy_GBps'])} GB/s",
                         f"vs_memcpy {fmt(b['vs_memcpy'])}x", ">= 0.8x",
                         verdict(b["vs_memcpy"] >= 0.8)))
    lat = get(coll, "BM_all_reduce_4B")
    if lat:
        rows.append(("sim all_reduce, 8 ranks x 4 B", f"{fmt(lat['latency_us'])} us", "-",
                     "-", "<= 2 us", verdict(lat["latency_us"] <= 2.0)))
    rep = get(coll, "BM_replicated_memory_64MiB")
    if rep:
        rows.append(("replicated 64 MiB LocalTensor, 8 ranks",
                     f"{fmt(rep['replicated_x'] * 64)} MiB held", "one shard: 64 MiB",
                     f"replicated_x {fmt(rep['replicated_x'])}x", "1x",
                     verdict(rep["replicated_x"] <= 1.0)))
    for op, names in (("slice", ["BM_mesh_slice", "BM_mesh_slice_one_dim"]),
                      ("flatten", ["BM_mesh_flatten", "BM_mesh_flatten_whole_mesh"]),
                      ("unflatten", ["BM_mesh_unflatten"]),
                      ("concatenate", ["BM_mesh_concatenate"]),
                      ("coordinate of one rank", ["BM_mesh_coordinate_of_one_rank",
                                                  "BM_mesh_coordinate_of_one_rank_in_submesh"])):
        found = [unit_us(mesh[n]) for n in names if n in mesh]
        if found:
            worst = max(found)
            rows.append((f"mesh {op}, 131072 ranks (slowest of {len(found)})",
                         f"{fmt(worst * 1e3)} ns", "- (must not grow with the world size)", "-",
                         "< 10 us", verdict(worst < 10.0)))
    for label, name in (("add", "BM_DTensorAddWarm"), ("matmul", "BM_DTensorMatmulWarm")):
        b = get(dt, name)
        if b:
            rows.append((f"DTensor {label}, tiny, 8 ranks, warm", f"{fmt(b['us_per_op'])} us",
                         f"8 plain Tensor {label}s: {fmt(b['plain_us'])} us",
                         f"overhead_us {fmt(b['overhead_us'])} (ratio {fmt(b['ratio'])}x)",
                         "overhead <= 5 us", verdict(b["overhead_us"] <= 5.0)))
    for label, name in (("add", "BM_DTensorAddBackwardWarm"),
                        ("matmul", "BM_DTensorMatmulBackwardWarm")):
        b = get(dt, name)
        if b:
            rows.append((f"DTensor {label} backward, tiny, 8 ranks, warm",
                         f"{fmt(b['backward_us'])} us",
                         f"its shard math on 8 plain Tensors: {fmt(b['backward_plain_us'])} us",
                         f"backward_overhead_us {fmt(b['backward_overhead_us'])}",
                         "overhead <= 2 us", verdict(b["backward_overhead_us"] <= 2.0)))
    for label, name in (("add", "BM_DTensorAddTypes"), ("matmul", "BM_DTensorMatmulTypes")):
        b = get(dt, name)
        if b:
            rows.append((f"DTensor {label} with SPMD types on, 8 ranks, warm",
                         f"{fmt(b['types_on_us'])} us",
                         f"types off: {fmt(b['types_off_us'])} us",
                         f"types_cost_us {fmt(b['types_cost_us'])}", "cost <= 0.3 us",
                         verdict(b["types_cost_us"] <= 0.3)))
    b = get(dt, "BM_train_step")
    if b:
        rows.append(("TP MLP train step with autograd, 8 ranks (dtensor_bench BM_train_step)",
                     f"{fmt(b['sim_ms'])} ms",
                     f"the step on full tensors: {fmt(b['single_ms'])} ms",
                     f"sim_over_single {fmt(b['sim_over_single'])}x", "<= 1.3x",
                     verdict(b["sim_over_single"] <= 1.3)))
    b = get(dt, "BM_PlanLookupWarm")
    if b:
        rows.append(("redistribute plan lookup, warm", f"{fmt(b['lookup_us'])} us", "-", "-",
                     "<= 0.5 us", verdict(b["lookup_us"] <= 0.5)))
    # The goal is BM_gpt_step's; the example's toy shape is quoted beside it.
    for name, shape, goal in (("BM_gpt_step", "d_model 256", True),
                              ("BM_gpt_step_toy", "d_model 64", False)):
        b = get(gpt, name)
        if b:
            rows.append((f"GPT training step, 8 ranks, TP + SP, {shape} (gpt_bench)",
                         f"{fmt(b['sim_ms'])} ms",
                         f"the step on full tensors: {fmt(b['single_ms'])} ms",
                         f"sim_over_single {fmt(b['sim_over_single'])}x",
                         "<= 1.5x" if goal else "-",
                         verdict(b["sim_over_single"] <= 1.5) if goal else "quoted"))
    # Note [CPU caching allocator]: tensor buffers in steady state come from the cache.
    fresh = [get(gpt, n)["fresh_blocks"] for n in ("BM_gpt_step", "BM_gpt_step_toy")
             if get(gpt, n) and "fresh_blocks" in get(gpt, n)]
    if fresh:
        rows.append(("GPT training steps in steady state: buffers taken fresh from the C "
                     "allocator, not the cache (gpt_bench fresh_blocks, d_model 256 and 64)",
                     " and ".join(fmt(f) for f in fresh), "-", "-", "0",
                     verdict(max(fresh) == 0)))
    b = get(dry, "BM_DryRun/16384")
    if b:
        secs = unit_us(b) / 1e6
        rows.append(("dry run, 7B-class GPT step, 16384 ranks: wall time (dryrun_scale)",
                     f"{fmt(secs)} s", "-", "-", "<= 10 s", verdict(secs <= 10.0)))
        rows.append(("dry run, 7B-class GPT step, 16384 ranks: peak resident set (dryrun_scale)",
                     f"{fmt(b['peak_rss_mib'])} MiB", "-", "-", "<= 2048 MiB",
                     verdict(b["peak_rss_mib"] <= 2048.0)))
    if mpi:
        rows.append(("TP MLP step, 8 ranks (sim_vs_mpi)", f"sim: {fmt(mpi['sim_ms'])} ms/step",
                     f"mpirun -n 8: {fmt(mpi['mpi_ms'])} ms/step",
                     f"mpi_over_sim {fmt(mpi['mpi_ms'] / mpi['sim_ms'])}", "none (quoted)", "-"))
    nccl_rc = meta.get("nccl_rc", "absent")
    nccl_text = {"absent": "not built in this run (no nccl_bench target in this build)",
                 "77": "skipped: no usable GPU on this machine",
                 "0": "ran: see [NCCL](#nccl)"}.get(nccl_rc, f"failed (exit {nccl_rc})")
    rows.append(("NCCL backend, world size 1 (nccl_bench)", nccl_text, "-", "-", "-", "-"))

    w("## Headline figures")
    w("")
    w("| figure | ours | reference (same run) | ratio | target | result |")
    w("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        w("| " + " | ".join(r) + " |")
    w("")
    w("Targets are the issues' acceptance figures (tensor: issue 2; mesh: 3; collectives: 4; "
      "DTensor: 5; sim vs MPI: 6, quoted without a target; NCCL: 7; backward and train step: "
      "14; SPMD types: 15; GPT step: 16; dry run: 17).")
    w("")

    # ---- against the baseline --------------------------------------------------------------
    comparison = compare_headlines(parse_headline(baseline), {r[0]: r[1] for r in rows},
                                   tolerance)
    load_then = parse_load(baseline)
    load_now = float(meta["load_before"].split()[0]) if meta.get("load_before") else None
    if comparison:
        w("## Against the previous page")
        w("")
        w(f"Each headline figure beside the one this page replaced (measured with load average "
          f"{load_then if load_then is not None else '?'} then, "
          f"{load_now if load_now is not None else '?'} now). `scripts/bench` prints REGRESSION "
          f"and fails when a time or memory figure rose by more than {tolerance:.0%} or a "
          f"bandwidth fell by more than {tolerance:.0%} (`SPMD_BENCH_TOLERANCE`; why 25%: "
          "`scripts/lib/bench_report.py`).")
        w("")
        w("| figure | before | now | change | check |")
        w("| --- | --- | --- | --- | --- |")
        for figure, old_fig, new_fig, change, regression in comparison:
            w(f"| {figure} | {fmt(old_fig[0])} {old_fig[1]} | {fmt(new_fig[0])} {new_fig[1]} | "
              f"{change:+.0%} | {'**REGRESSION**' if regression else 'ok'} |")
        w("")

    # ---- what the ratios mean --------------------------------------------------------------
    w("## What each ratio means")
    w("")
    w("- `vs_eigen`, `vs_blas`, `vs_loop`: the reference's time over ours on the same data, run "
      "alternately iteration by iteration (above 1 = we are faster). The references for matmul "
      "are Eigen's own product (one thread) and OpenBLAS's sgemm with its own threads on every "
      "core, each into a preallocated matrix; for add, a plain loop into a preallocated "
      "buffer. Ours allocates its result each time.")
    w("- `vs_composed`: causal attention's forward and backward composed of matmul, softmax "
      "and matmul with autograd (the [S, S] scores held) over the same through the blocked "
      "kernel (Note [Blocked attention]), run alternately on the same data (above 1 = the "
      "blocked kernel is faster). Both allocate their results.")
    w("- `vs_composed` of the AdamW update: the eleven elementwise ops AdamW ran per parameter "
      "before adamw_step over the one op (Note [Fused AdamW]), alternately on the same 1M "
      "F32 elements; both give the same bits and allocate their results.")
    w("- `fresh_blocks`: tensor buffers of a cached size that gpt_bench's timed rounds took from "
      "the C allocator instead of the CPU caching allocator (Note [CPU caching allocator]), "
      "after three warm-up steps of each model: 0 means steady-state steps allocate nothing "
      "new.")
    w("- `vs_memcpy`: a collective's effective bandwidth over memcpy's. Effective bandwidth "
      "counts 2 x R x S bytes per call (R = 8 ranks, S = bytes per rank: every input read once "
      "and every output written once, as separate ranks would have to). memcpy bandwidth is "
      "2 x S / time for one S-byte memcpy, best of 8, in the same process. The sim backend "
      "computes a replicated result once and stores it once for all ranks (copy-on-write): "
      "all_reduce reads R x S bytes but writes only S, reduce_scatter reads R x S and writes "
      "S in all, so their effective bandwidth can exceed memcpy's. all_gather writes its "
      "R x S result once (shared by the ranks) and all_to_all writes R x S; these two do "
      "memcpy's work and cannot beat it by much. Copies above 4 MiB in all are split over "
      f"the thread pool ({info['cores']} threads here); the memcpy reference is one thread.")
    w("- `latency_us`: wall time per call of a 4-byte collective over 8 ranks in one process: "
      "the fixed cost of the call (validation, trace record, group lookup, result).")
    w("- `replicated_x`: bytes a replicated LocalTensor holds over one shard's bytes: 1x "
      "means 8 ranks share one buffer.")
    w("- Mesh times are per call on a (64,16,8,16) mesh of 131072 ranks; there is no reference "
      "run because the point is that they do not depend on the world size.")
    w("- `overhead_us`: a DTensor op's time minus the time of the same 8 plain Tensor ops (the "
      "shard math) in the same run; both are the best of 7 interleaved rounds of 20 ms. "
      "`ratio` = DTensor op / 8 plain ops.")
    w("- `backward_overhead_us`: a DTensor op's backward (forward + backward minus the "
      "forward, with autograd) minus the shard math of that backward on 8 plain Tensors, best "
      "of 7 interleaved rounds; the bookkeeping autograd adds per op.")
    w("- `types_cost_us`: the same DTensor op with SPMD types and their data check on "
      "(`TypesScope`) minus with them off, best of 7 interleaved rounds each.")
    w("- `sim_over_single`: a training step (forward, backward, optimizer) under sim on 8 "
      "ranks over the same step on full tensors in one process, both with autograd, "
      "best of 3 (train step), or for gpt_bench the median of 3 interleaved rounds, each "
      "timing a model's second step in a row (as PyTorch's steps are timed: the median of 3 "
      "in a row).")
    w("- Dry run: one 7B-class GPT training step (32 layers, d 4096, 32 heads, sequence 4096, "
      "vocabulary 32000, bf16, AdamW) with shape-only tensors under sim on (dp, tp=8); wall "
      "time of one run and the process's peak resident set during it (VmHWM, reset before).")
    w("- `mpi_over_sim`: per-step time of the same tensor-parallel MLP program under "
      "`mpirun -n 8 --spmd-backend=mpi` (8 processes, shared memory transport) over its "
      "per-step time under sim (8 ranks in one process). On a machine with fewer cores than "
      "ranks the MPI processes time-share the cores.")
    w("- Sweep `sweep_vs_memcpy`: as vs_memcpy, but the reference is 8 memcpys of S bytes (the "
      "same 2 x R x S bytes, R sources into R destinations), timed right after each call; at "
      "small sizes both run from cache and the collective's fixed cost dominates.")
    w("- Peers: our time over theirs (below 1 = we are faster).")
    w("")

    # ---- sweep -----------------------------------------------------------------------------
    w("## Collective bandwidth against message size")
    w("")
    if sweep:
        plot(sweep, info, docs, results)
        w("![sim collective bandwidth against message size](perf_collectives.png)")
        w("")
        sizes = sorted({s for (_, s) in sweep})
        w("Effective bandwidth 2RS/t in GB/s (R = 8), the memcpy of the same bytes measured "
          "call by call in the same benchmark, and their ratio (`sweep_vs_memcpy`):")
        w("")
        w("| S per rank | " + " | ".join(SWEEP_OPS) + " |")
        w("| --- |" + " --- |" * len(SWEEP_OPS))
        for s in sizes:
            cells = []
            for op in SWEEP_OPS:
                b = sweep.get((op, s))
                cells.append(f"{fmt(b['effective_GBps'])} / {fmt(b['memcpy_GBps'])} = "
                             f"{fmt(b['sweep_vs_memcpy'])}x" if b else "n/a")
            w(f"| {size_text(s)} | " + " | ".join(cells) + " |")
        w("")
        w("Time per call in microseconds (the collective alone):")
        w("")
        w("| S per rank | " + " | ".join(SWEEP_OPS) + " |")
        w("| --- |" + " --- |" * len(SWEEP_OPS))
        for s in sizes:
            w(f"| {size_text(s)} | " + " | ".join(
                fmt(unit_us(sweep[(op, s)])) if (op, s) in sweep else "n/a"
                for op in SWEEP_OPS) + " |")
        w("")
    w("Reproduce:")
    w("")
    w("```")
    w(f"{build}/bench/collectives_bench --benchmark_filter='BM_sweep' {gb} "
      "--benchmark_format=json")
    w(f"{build}/bench/collectives_bench --benchmark_filter='_(64MiB|4B)' {gb} "
      "--benchmark_format=json")
    w("```")
    w("")
    w("The 4-byte latencies of the other collectives, for reference:")
    w("")
    w("| collective, 8 ranks x 4 B | latency_us |")
    w("| --- | --- |")
    for name in ("BM_all_reduce_4B", "BM_all_gather_4B", "BM_broadcast_4B",
                 "BM_all_to_all_single_4B"):
        if name in coll:
            w(f"| {name[3:-3]} | {fmt(coll[name]['latency_us'])} |")
    w("")

    # ---- tensor ----------------------------------------------------------------------------
    w("## Tensor")
    w("")
    w("| benchmark | ours | reference | ratio |")
    w("| --- | --- | --- | --- |")
    if mm:
        w(f"| matmul 512^3 F32 | {fmt(mm['ms_ours'])} ms ({fmt(mm['GFLOPS'])} GFLOP/s) | "
          f"raw Eigen {fmt(mm['ms_ref'])} ms | vs_eigen {fmt(mm['vs_eigen'])}x |")
    if blas:
        w(f"| matmul 512^3 F32 | {fmt(blas['ms_ours'])} ms ({fmt(blas['GFLOPS'])} GFLOP/s) | "
          f"raw OpenBLAS (its threads) {fmt(blas['ms_ref'])} ms ({fmt(blas['GFLOPS_ref'])} "
          f"GFLOP/s) | vs_blas {fmt(blas['vs_blas'])}x |")
    if add:
        w(f"| add 16M F32 | {fmt(add['ms_ours'])} ms ({fmt(add['GBps'])} GB/s) | "
          f"plain loop {fmt(add['ms_ref'])} ms | vs_loop {fmt(add['vs_loop'])}x |")
    for s_len, shape in (("128", "batch 8, 8 heads, S 128, D 32"),
                         ("1024", "batch 1, 8 heads, S 1024, D 64")):
        att = get(tensor, f"BM_Attention/{s_len}")
        if att:
            w(f"| causal attention forward + backward, F32, {shape} (blocked, Note [Blocked "
              f"attention]) | {fmt(att['ms_ours'])} ms | matmul + softmax + matmul with autograd "
              f"(the [S, S] scores) {fmt(att['ms_ref'])} ms | vs_composed "
              f"{fmt(att['vs_composed'])}x |")
    adamw = get(tensor, "BM_AdamWStep")
    if adamw:
        w(f"| AdamW update of 1M F32 elements (adamw_step, Note [Fused AdamW]) | "
          f"{fmt(adamw['ms_ours'])} ms | the eleven elementwise ops it replaced "
          f"{fmt(adamw['ms_ref'])} ms | vs_composed {fmt(adamw['vs_composed'])}x |")
    w("")
    w("```")
    w(f"{build}/bench/tensor_bench "
      f"--benchmark_filter='BM_(Matmul512|Matmul512Blas|Add16M|Attention|AdamWStep)' {gb} "
      "--benchmark_format=json")
    w("```")
    w("")

    # ---- mesh ------------------------------------------------------------------------------
    w("## DeviceMesh on 131072 ranks")
    w("")
    w("| benchmark | time per call | ranks per second |")
    w("| --- | --- | --- |")
    for name in sorted(mesh):
        b = mesh[name]
        rate = b.get("ranks_per_s")
        w(f"| {name} | {fmt(unit_us(b))} us | {fmt(rate / 1e6) + ' M' if rate else '-'} |")
    w("")
    w("```")
    w(f"{build}/bench/mesh_bench {gb} --benchmark_format=json")
    w("```")
    w("")

    # ---- dtensor ---------------------------------------------------------------------------
    w("## DTensor")
    w("")
    w("| benchmark | DTensor op | 8 plain Tensor ops | overhead_us | ratio |")
    w("| --- | --- | --- | --- | --- |")
    for label, name in (("add [32,4] S(0) + S(0)", "BM_DTensorAddWarm"),
                        ("matmul [32,4] S(0) @ [4,4] R", "BM_DTensorMatmulWarm")):
        if name in dt:
            b = dt[name]
            w(f"| {label} | {fmt(b['us_per_op'])} us | {fmt(b['plain_us'])} us | "
              f"{fmt(b['overhead_us'])} | {fmt(b['ratio'])}x |")
    w("")
    backward_rows = [(label, dt[name]) for label, name in
                     (("add [32,4] S(0) + S(0), both require grad", "BM_DTensorAddBackwardWarm"),
                      ("matmul [32,4] S(0) @ [4,4] R, the S(0) input requires grad",
                       "BM_DTensorMatmulBackwardWarm")) if name in dt]
    if backward_rows:
        w("Autograd (issue 14): the backward of one op, warm.")
        w("")
        w("| benchmark | backward | its shard math | backward_overhead_us | "
          "forward_overhead_us |")
        w("| --- | --- | --- | --- | --- |")
        for label, b in backward_rows:
            w(f"| {label} | {fmt(b['backward_us'])} us | {fmt(b['backward_plain_us'])} us | "
              f"{fmt(b['backward_overhead_us'])} | {fmt(b['forward_overhead_us'])} |")
        w("")
    types_rows = [(label, dt[name]) for label, name in
                  (("add [32,4] S(0) + S(0)", "BM_DTensorAddTypes"),
                   ("matmul [32,4] S(0) @ [4,4] R", "BM_DTensorMatmulTypes")) if name in dt]
    if types_rows:
        w("SPMD types (issue 15): the same op with types off and on.")
        w("")
        w("| benchmark | types off | types on | types_cost_us |")
        w("| --- | --- | --- | --- |")
        for label, b in types_rows:
            w(f"| {label} | {fmt(b['types_off_us'])} us | {fmt(b['types_on_us'])} us | "
              f"{fmt(b['types_cost_us'])} |")
        w("")
    if "BM_train_step" in dt:
        b = dt["BM_train_step"]
        w(f"Training step (`BM_train_step`: tp_mlp's y = tanh(x W1) W2, batch 256, hidden 256, "
          f"ffn 1024, mean squared error, backward, SGD on (dp=2, tp=4)): sim "
          f"{fmt(b['sim_ms'])} ms, the same step on full tensors {fmt(b['single_ms'])} ms, "
          f"sim_over_single {fmt(b['sim_over_single'])}x.")
        w("")
    if "BM_PlanLookupWarm" in dt:
        w(f"Plan lookup: warm {fmt(dt['BM_PlanLookupWarm']['lookup_us'])} us (`lookup_us`); "
          "cold (the planner itself) " + ", ".join(
              f"{dt[n].get('label', n)} {fmt(unit_us(dt[n]))} us" for n in sorted(dt)
              if n.startswith("BM_PlanLookupCold")) + ".")
        w("")
    w("```")
    w(f"{build}/bench/dtensor_bench {gb} --benchmark_format=json")
    w("```")
    w("")

    # ---- dry run ---------------------------------------------------------------------------
    dry_rows = sorted(((int(b.get("ranks", 0)), b) for n, b in dry.items()
                       if n.startswith("BM_DryRun/")), key=lambda rb: rb[0])
    if dry_rows:
        w("## Dry run at scale")
        w("")
        w("One training step of examples/gpt's model at a 7B-class shape (32 layers, d 4096, 32 "
          "heads, sequence 4096, vocabulary 32000, bf16, AdamW), shape-only tensors "
          "(`--spmd-tensors=meta`) under sim, on (dp, tp=8) meshes: wall time of one dry run and "
          "the peak resident set while it ran (issue 17's goal at 16384 ranks: <= 10 s and "
          "<= 2 GiB on 2 cores).")
        w("")
        w("| ranks | mesh (dp x tp) | wall time | peak RSS |")
        w("| --- | --- | --- | --- |")
        for ranks, b in dry_rows:
            w(f"| {ranks} | {ranks // 8} x 8 | {fmt(unit_us(b) / 1e3)} ms | "
              f"{fmt(b['peak_rss_mib'])} MiB |")
        w("")
        w("```")
        w(f"{build}/bench/dryrun_scale {gb} --benchmark_format=json")
        w("```")
        w("")

    # ---- sim vs mpi ------------------------------------------------------------------------
    w("## sim against MPI processes")
    w("")
    if mpi:
        w("One tensor-parallel MLP training step (hidden 512, batch 64, (dp=2, tp=4) mesh, four "
          f"all_reduces per step), median of {mpi['runs']} runs of each:")
        w("")
        w("| backend | per step | whole process (wall) |")
        w("| --- | --- | --- |")
        w(f"| sim, 8 ranks in one process | {fmt(mpi['sim_ms'])} ms | {fmt(mpi['sim_wall'])} s |")
        w(f"| mpi, mpirun -n 8 | {fmt(mpi['mpi_ms'])} ms | {fmt(mpi['mpi_wall'])} s |")
        w("")
        w(f"mpi_over_sim = {fmt(mpi['mpi_ms'] / mpi['sim_ms'])} (ratio of the medians; each "
          "run's: " + ", ".join(fmt(r) for r in mpi["ratios"]) + ").")
    else:
        w("Not measured: sim_vs_mpi produced no per-step times (see the results folder).")
    w("")
    w("```")
    w(f"bench/run_sim_vs_mpi.sh {build}/bench/sim_vs_mpi mpirun   "
      "# with scripts/lib/common.sh's export_mpi_env")
    w("```")
    w("")

    # ---- nccl ------------------------------------------------------------------------------
    w("## NCCL")
    w("")
    if nccl_rc == "0":
        w("nccl_bench output (host overhead per call; algbw/busbw in nccl-tests conventions):")
        w("")
        w("```")
        w(open(os.path.join(results, "nccl_bench.txt")).read().rstrip())
        w("```")
    elif nccl_rc == "77":
        w("nccl_bench was built and skipped itself: this machine has no usable GPU. Its line:")
        w("")
        w("```")
        w(open(os.path.join(results, "nccl_bench.txt")).read().rstrip())
        w("```")
    elif nccl_rc == "absent":
        w("No nccl_bench in this build: the NCCL backend's benchmark is not part of this tree "
          "yet, or NCCL was not found at configure time. No NCCL figures are reported.")
    else:
        w(f"nccl_bench failed with exit code {nccl_rc}; no figures are reported.")
    w("")
    w("```")
    w(f"{build}/bench/nccl_bench")
    w("```")
    w("")

    # ---- peers -----------------------------------------------------------------------------
    w("## Peers: PyTorch LocalTensor and JAX")
    w("")
    if meta.get("peers") != "1":
        w("Not run: `scripts/bench --peers` installs PyTorch and JAX from PyPI into "
          f"`{build}/peers/venv` and runs the workloads in `bench/peers/`.")
        w("")
    else:
        torch, torch_err = load_peer(results, meta, "torch")
        jax, jax_err = load_peer(results, meta, "jax")
        w("The same workloads, defined in `bench/peers/torch_local_tensor.py` and "
          "`bench/peers/jax_shard_map.py`: each figure is the median of 5 runs of at least "
          "0.2 s of calls, after warm-up. Ours are the medians above (sweep and dtensor_bench). "
          "Ratios are our time over theirs: below 1 we are faster.")
        w("")
        for label, peer, err, key in (("PyTorch", torch, torch_err, "torch"),
                                      ("JAX", jax, jax_err, "jax")):
            install_s = meta.get(f"peer_{key}_install_s", "?")
            if peer:
                extra = (f", {peer['threads']} intra-op threads" if "threads" in peer else
                         f", {peer.get('devices')} host devices")
                w(f"- {label} {peer['version']}{extra}; pip install took {install_s} s.")
            else:
                w(f"- {label}: no figures: {err}.")
        w(f"- The venv takes {meta.get('peers_disk', '?')} on disk. PyPI's torch wheel for "
          "Linux x86_64 is the CUDA build: `pip install --no-deps torch` with its pure-Python "
          "dependencies does not import on a machine without CUDA (libtorch.so needs "
          "libcufile.so.0, libcusparseLt.so.0 and libnvshmem_host.so.3, and the CUDA runtime "
          "libraries, from the nvidia-* and cuda-* wheels), and the CPU-only wheel is published "
          "only on PyTorch's own index, which is out of reach here. So `--peers` installs the "
          "full wheel and its CUDA dependencies (torch 2.15.0: about 4 GB to download, about 5 "
          "minutes on a first install here); they are loaded, never used: every figure is CPU. "
          "pip install times above are for this run (seconds when the venv already has them).")
        w("- Python overhead dominates both peers at small sizes: these are eager-mode "
          "simulators written for debugging, not for speed; the comparison says what a "
          "debugging session costs, not that either is slow at what it is built for.")
        w("")
        if torch or jax:
            w("| collective, 8 ranks | S per rank | ours (sim) | PyTorch LocalTensor | "
              "ours / PyTorch | JAX shard_map | ours / JAX |")
            w("| --- | --- | --- | --- | --- | --- | --- |")
            keyed = {}
            for name, peer in (("torch", torch), ("jax", jax)):
                for r in (peer or {}).get("collectives", []):
                    keyed[(name, r["op"], r["bytes_per_rank"])] = r["us"]
            pairs = sorted({(op, s) for (_, op, s) in keyed},
                           key=lambda k: (SWEEP_OPS.index(k[0]), k[1]))
            for op, s in pairs:
                ours = unit_us(sweep[(op, s)]) if (op, s) in sweep else None
                cells = []
                for name in ("torch", "jax"):
                    theirs = keyed.get((name, op, s))
                    cells.append(f"{fmt(theirs)} us" if theirs else "n/a")
                    cells.append(ratio_text(ours, theirs))
                w(f"| {op} | {size_text(s)} | {fmt(ours)} us | " + " | ".join(cells) + " |")
            w("")
        if torch and torch.get("dtensor"):
            w("| DTensor op, tiny, 8 ranks, warm | ours | PyTorch DTensor under LocalTensorMode "
              "| ours / PyTorch |")
            w("| --- | --- | --- | --- |")
            for r in torch["dtensor"]:
                name = {"add": "BM_DTensorAddWarm", "matmul": "BM_DTensorMatmulWarm"}[r["op"]]
                ours = dt[name]["us_per_op"] if name in dt else None
                w(f"| {r['op']} | {fmt(ours)} us | {fmt(r['us'])} us | "
                  f"{ratio_text(ours, r['us'])} |")
            w("")
        torch_gpt, torch_gpt_err = load_peer(results, meta, "torch_gpt")
        # The arithmetic floor (gpt_bench's step_gflop at the best BLAS rate of this run) bounds
        # what any implementation's step can take here, so PyTorch's time over it bounds the ratio.
        peak = max(blas["GFLOPS"], blas["GFLOPS_ref"]) if blas else None
        w("| GPT training step, 8 ranks, TP + SP (bench/peers/torch_gpt.py) | ours (sim) | "
          "PyTorch DTensor under LocalTensorMode | PyTorch / ours | ceiling here | goal |")
        w("| --- | --- | --- | --- | --- | --- |")
        for bench, key, shape in (("BM_gpt_step", "gpt", "d_model 256, sequence 128"),
                                  ("BM_gpt_step_toy", "gpt_toy", "d_model 64, sequence 32")):
            g = get(gpt, bench)
            peer = (torch_gpt or {}).get(key, {})
            theirs = peer.get("local_tensor_ms")
            what = f"forward, backward, clip_grad_norm, AdamW ({shape})"
            floor_ms = (g["step_gflop"] / peak * 1e3 if g and peak and g.get("step_gflop")
                        else None)
            if g and theirs:
                ceiling = theirs / floor_ms if floor_ms else None
                result = verdict(theirs / g["sim_ms"] >= 20)
                if ceiling is not None and ceiling < 20:
                    result += " (above the ceiling)"
                w(f"| {what} | {fmt(g['sim_ms'])} ms | {fmt(theirs)} ms | "
                  f"{fmt(theirs / g['sim_ms'])}x | "
                  f"{fmt(ceiling) + 'x' if ceiling else 'n/a'} | >= 20x {result} |")
                w(f"| the same step on full tensors (one device) | {fmt(g['single_ms'])} ms | "
                  f"{fmt(peer['single_ms'])} ms (eager PyTorch) | "
                  f"{fmt(peer['single_ms'] / g['single_ms'])}x | - | - |")
            else:
                why = torch_gpt_err or peer.get("error", "no figure")
                w(f"| {what} | {fmt(g['sim_ms']) + ' ms' if g else 'n/a'} | not measured: {why} "
                  f"| - | - | >= 20x |")
            if floor_ms:
                w(f"| its arithmetic floor here: {fmt(g['step_gflop'])} GFLOP of products at "
                  f"{fmt(peak)} GFLOP/s | {fmt(floor_ms)} ms | - | - | - | - |")
        w("")
        w("`ceiling here` is PyTorch's time over the step's arithmetic floor on this machine: the "
          "step's matmul and attention flops on full tensors, as the op table counts them "
          "(gpt_bench `step_gflop`: OpDef::flops summed by a dry run of the same step on one "
          "rank, a causal attention counting the half the mask leaves), done at the best BLAS "
          "rate measured in this run (tensor_bench BM_Matmul512Blas, ours or raw OpenBLAS, on "
          "every core, with the kernel set named under Machine). Elementwise work, memory traffic "
          "and the simulation are left out, so an implementation of the step, simulated or not, "
          "whose products run no faster than the best rate measured here cannot beat the floor, "
          "nor be more than `ceiling` times faster than PyTorch's: a goal above the ceiling "
          "needs faster products than any measured on this machine, not less overhead.")
        w("")
        w("```")
        w(f"{build}/peers/venv/bin/python bench/peers/torch_gpt.py")
        w(f"{build}/peers/venv/bin/python bench/peers/torch_local_tensor.py")
        w(f"{build}/peers/venv/bin/python bench/peers/jax_shard_map.py")
        w("```")
        w("")

    w("## Reproduce everything")
    w("")
    w("```")
    w("scripts/bench            # this page and the plot")
    w("scripts/bench --peers    # and the PyTorch / JAX comparison")
    w("```")
    w("")
    w(f"`scripts/bench` builds `{build}` with `-DCMAKE_BUILD_TYPE=Release -DSPMD_ASSERTIONS=OFF "
      "-DSPMD_WITH_MPI=ON -DSPMD_BUILD_BENCH=ON` (tests, examples and tools off); "
      "`SPMD_BENCH_REPETITIONS` and `SPMD_BENCH_MPI_RUNS` change the repetitions.")
    with open(os.path.join(docs, "performance.md"), "w") as f:
        f.write("\n".join(md) + "\n")

    if not baseline:
        print(f"== no baseline page at {baseline_path}: nothing to compare against")
        return 0
    lines, regressions = regression_report(comparison, tolerance, load_then, load_now,
                                           info["cores"])
    print(f"== headline figures against {baseline_path}:")
    for line in lines:
        print(line)
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
