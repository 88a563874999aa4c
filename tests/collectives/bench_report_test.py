"""tests/collectives/bench_report_test.py: the regression check of scripts/bench
(scripts/lib/bench_report.py) on made-up figures: which changes of a headline figure against the
committed docs/performance.md are a REGRESSION, and that the report exits 1 for one. No timing is
measured here.

Run: python3 tests/collectives/bench_report_test.py [REPO_ROOT]"""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "lib", "bench_report.py")
_spec = importlib.util.spec_from_file_location("bench_report", SCRIPT)
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)


def page(rows, load="0.10 0.20 0.30"):
    """A performance.md with the given headline rows {figure: ours}."""
    lines = ["# Performance", "", "## Machine", "",
             f"- Load average (1, 5, 15 min): {load} before the benchmarks, 0.1 0.1 0.1 after.",
             "", "## Headline figures", "",
             "| figure | ours | reference (same run) | ratio | target | result |",
             "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {figure} | {ours} | - | - | - | - |" for figure, ours in rows.items()]
    lines += ["", "Targets are ...", "", "## What each ratio means", "", "| a | b |"]
    return "\n".join(lines) + "\n"


def single(name, real_time=1000.0, time_unit="ns", **counters):
    """One Google Benchmark run (no repetitions) with its counters."""
    return dict(name=name, run_name=name, run_type="iteration", real_time=real_time,
                time_unit=time_unit, **counters)


def render(programs, repetitions=1, peers=None, baseline_rows=None):
    """bench_report.py as scripts/bench runs it, on a results folder holding `programs`
    ({program: [benchmark runs]}) and, when given, `peers` ({peer name: its JSON}); with
    `baseline_rows`, a baseline page of those headline rows. Returns the finished process and the
    page it wrote."""
    with tempfile.TemporaryDirectory() as tmp:
        results, docs = os.path.join(tmp, "results"), os.path.join(tmp, "docs")
        os.makedirs(results)
        os.makedirs(docs)
        with open(os.path.join(results, "meta.env"), "w") as f:
            f.write(f"load_before=0.50 0.40 0.30\nrepetitions={repetitions}\nmpi_runs=3\n"
                    "build_dir=build/bench\ncommit=abc1234\n" + ("peers=1\n" if peers else ""))
        for program, rows in programs.items():
            with open(os.path.join(results, program + ".json"), "w") as f:
                json.dump({"context": {}, "benchmarks": rows}, f)
        for name, data in (peers or {}).items():
            with open(os.path.join(results, f"peer_{name}.json"), "w") as f:
                json.dump(data, f)
        command = [sys.executable, SCRIPT, results, docs]
        if baseline_rows is not None:
            command.append(os.path.join(tmp, "baseline.md"))
            with open(command[-1], "w") as f:
                f.write(page(baseline_rows))
        done = subprocess.run(command, capture_output=True, text=True)
        with open(os.path.join(docs, "performance.md")) as f:
            return done, f.read()


class ParseTest(unittest.TestCase):
    def test_figures(self):
        self.assertEqual(report.parse_figure("1.27 us"), (1.27, "us"))
        self.assertEqual(report.parse_figure("32.3 GB/s"), (32.3, "GB/s"))
        self.assertEqual(report.parse_figure("973 ns"), (973.0, "ns"))
        self.assertEqual(report.parse_figure("8.54 ms"), (8.54, "ms"))
        self.assertEqual(report.parse_figure("sim: 38.7 ms/step"), (38.7, "ms/step"))
        self.assertEqual(report.parse_figure("64.0 MiB held"), (64.0, "MiB"))
        self.assertIsNone(report.parse_figure("skipped: no usable GPU on this machine"))
        self.assertIsNone(report.parse_figure("ran: see [NCCL](#nccl)"))

    def test_headline_table_and_load(self):
        text = page({"sim all_reduce, 8 ranks x 4 B": "1.27 us",
                     "sim all_gather, 8 ranks x 64 MiB": "26.5 GB/s"}, load="1.90 1.03 1.22")
        self.assertEqual(report.parse_headline(text),
                         {"sim all_reduce, 8 ranks x 4 B": "1.27 us",
                          "sim all_gather, 8 ranks x 64 MiB": "26.5 GB/s"})
        self.assertEqual(report.parse_load(text), 1.90)
        self.assertEqual(report.parse_headline("# no table here"), {})

    def test_the_committed_page_parses(self):
        with open(os.path.join(ROOT, "docs", "performance.md")) as f:
            rows = report.parse_headline(f.read())
        figures = [report.parse_figure(v) for v in rows.values()]
        self.assertIn("sim all_reduce, 8 ranks x 4 B", rows)
        self.assertGreaterEqual(sum(f is not None for f in figures), 10)


class CompareTest(unittest.TestCase):
    def verdicts(self, old, new, tolerance=0.25):
        return {figure: regression for figure, _, _, _, regression
                in report.compare_headlines(old, new, tolerance)}

    def test_latency_up_by_more_than_a_quarter_is_a_regression(self):
        v = self.verdicts({"lat": "1.00 us", "small": "1.00 us", "faster": "1.00 us"},
                          {"lat": "1.30 us", "small": "1.20 us", "faster": "0.50 us"})
        self.assertEqual(v, {"lat": True, "small": False, "faster": False})

    def test_bandwidth_down_by_more_than_a_quarter_is_a_regression(self):
        v = self.verdicts({"bw": "30.0 GB/s", "small": "30.0 GB/s", "faster": "30.0 GB/s"},
                          {"bw": "21.0 GB/s", "small": "24.0 GB/s", "faster": "45.0 GB/s"})
        self.assertEqual(v, {"bw": True, "small": False, "faster": False})

    def test_the_issue_figures(self):
        # 1.27 us when the collectives issue closed, 2.26 us measured later.
        v = self.verdicts({"sim all_reduce, 8 ranks x 4 B": "1.27 us"},
                          {"sim all_reduce, 8 ranks x 4 B": "2.26 us"})
        self.assertEqual(v, {"sim all_reduce, 8 ranks x 4 B": True})

    def test_memory_and_per_step_times_are_lower_is_better(self):
        v = self.verdicts({"mem": "64.0 MiB held", "step": "sim: 38.7 ms/step"},
                          {"mem": "512 MiB held", "step": "sim: 20.0 ms/step"})
        self.assertEqual(v, {"mem": True, "step": False})

    def test_figures_that_cannot_be_compared_are_skipped(self):
        v = self.verdicts({"unit changed": "1.00 us", "text": "skipped: no GPU", "gone": "1 us"},
                          {"unit changed": "900 ns", "text": "ran: see below", "new": "9 us"})
        self.assertEqual(v, {})

    def test_tolerance(self):
        self.assertEqual(self.verdicts({"lat": "1.00 us"}, {"lat": "1.15 us"}, 0.10),
                         {"lat": True})
        self.assertEqual(self.verdicts({"lat": "1.00 us"}, {"lat": "1.45 us"}, 0.50),
                         {"lat": False})

    def test_report_lines(self):
        comparison = report.compare_headlines({"lat": "1.00 us", "bw": "30.0 GB/s"},
                                              {"lat": "2.00 us", "bw": "31.0 GB/s"})
        lines, regressions = report.regression_report(comparison, 0.25, 0.1, 3.5, 2)
        self.assertEqual(regressions, 1)
        self.assertTrue(lines[0].startswith("REGRESSION: lat: 2.00 us, was 1.00 us (+100%"))
        self.assertIn("ok: bw: 31.0 GB/s, was 30.0 GB/s (+3%)", lines)
        self.assertIn("re-run", lines[-1])  # load 3.5 on 2 cores


class EndToEndTest(unittest.TestCase):
    """bench_report.py as scripts/bench runs it, on a results folder with one benchmark program."""

    def run_report(self, latency_us, gbps, baseline_rows):
        def median(name, **counters):
            return dict(name=f"{name}/real_time_median", run_name=f"{name}/real_time",
                        run_type="aggregate", aggregate_name="median", real_time=1000.0,
                        time_unit="ns", **counters)

        benchmarks = [median("BM_all_reduce_4B", latency_us=latency_us),
                      median("BM_all_reduce_64MiB", effective_GBps=gbps, memcpy_GBps=17.0,
                             vs_memcpy=gbps / 17.0)]
        return render({"collectives_bench": benchmarks}, repetitions=5,
                      baseline_rows=baseline_rows)

    BASELINE = {"sim all_reduce, 8 ranks x 4 B": "1.27 us",
                "sim all_reduce, 8 ranks x 64 MiB": "32.3 GB/s"}

    def test_a_slower_latency_fails(self):
        done, written = self.run_report(2.26, 33.0, self.BASELINE)
        self.assertEqual(done.returncode, 1, done.stdout + done.stderr)
        self.assertIn("REGRESSION: sim all_reduce, 8 ranks x 4 B: 2.26 us, was 1.27 us (+78%",
                      done.stdout)
        self.assertIn("ok: sim all_reduce, 8 ranks x 64 MiB: 33.0 GB/s, was 32.3 GB/s",
                      done.stdout)
        self.assertIn("| sim all_reduce, 8 ranks x 4 B | 1.27 us | 2.26 us | +78% | "
                      "**REGRESSION** |", written)

    def test_a_lower_bandwidth_fails(self):
        done, _ = self.run_report(1.0, 20.0, self.BASELINE)
        self.assertEqual(done.returncode, 1, done.stdout + done.stderr)
        self.assertIn("REGRESSION: sim all_reduce, 8 ranks x 64 MiB: 20.0 GB/s, was 32.3 GB/s",
                      done.stdout)

    def test_figures_within_the_threshold_pass(self):
        done, _ = self.run_report(1.5, 26.0, self.BASELINE)
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertNotIn("REGRESSION", done.stdout)

    def test_no_baseline_passes(self):
        done, _ = self.run_report(9.0, 1.0, {})
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)


class IssueFiguresTest(unittest.TestCase):
    """The autograd, SPMD types, train step and dry run figures reach the headline table with
    their goals, and the dry run gets its own table."""

    def test_rows_and_verdicts(self):
        dt = [single("BM_DTensorAddBackwardWarm", backward_us=1.5, backward_plain_us=0.2,
                     backward_overhead_us=1.3, forward_overhead_us=0.4),
              single("BM_DTensorMatmulBackwardWarm", backward_us=4.0, backward_plain_us=1.0,
                     backward_overhead_us=3.0, forward_overhead_us=0.4),
              single("BM_DTensorAddTypes", types_off_us=4.0, types_on_us=4.1, types_cost_us=0.1),
              single("BM_train_step", sim_ms=12.0, single_ms=10.0, sim_over_single=1.2)]
        dry = [single(f"BM_DryRun/{n}/iterations:1/real_time", real_time=ms, time_unit="ms",
                      ranks=n, peak_rss_mib=mib)
               for n, ms, mib in ((8, 90.0, 60.0), (16384, 12500.0, 400.0))]
        done, text = render({"dtensor_bench": dt, "dryrun_scale": dry})
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        headline = report.parse_headline(text)
        self.assertEqual(headline["DTensor add backward, tiny, 8 ranks, warm"], "1.50 us")
        self.assertIn("backward_overhead_us 1.30 | overhead <= 2 us | **pass**", text)
        self.assertIn("backward_overhead_us 3.00 | overhead <= 2 us | **FAIL**", text)
        self.assertIn("types_cost_us 0.100 | cost <= 0.3 us | **pass**", text)
        self.assertIn("sim_over_single 1.20x | <= 1.3x | **pass**", text)
        # 12.5 s at 16384 ranks misses the 10 s goal; 400 MiB meets the 2 GiB one.
        self.assertEqual(report.parse_figure(headline[
            "dry run, 7B-class GPT step, 16384 ranks: wall time (dryrun_scale)"]), (12.5, "s"))
        self.assertIn("| - | - | <= 10 s | **FAIL** |", text)
        self.assertIn("| - | - | <= 2048 MiB | **pass** |", text)
        self.assertIn("| 8 | 1 x 8 | 90.0 ms | 60.0 MiB |", text)
        self.assertIn("| 16384 | 2048 x 8 | 12500 ms | 400 MiB |", text)


class CeilingTest(unittest.TestCase):
    """The GPT step against LocalTensorMode: its arithmetic floor (gpt_bench step_gflop at the
    best BLAS rate of the run) and the ceiling it puts on the ratio, beside the 20x goal."""

    def test_floor_and_ceiling(self):
        # Raw OpenBLAS at 250 GFLOP/s beats ours at 200: the floor uses 250.
        tensor = [single("BM_Matmul512Blas", ms_ours=1.0, ms_ref=0.8, vs_blas=0.8, GFLOPS=200.0,
                         GFLOPS_ref=250.0)]
        # d_model 256: 10 GFLOP, floor 40 ms; d_model 64: 0.5 GFLOP, floor 2 ms.
        gpt = [single("BM_gpt_step", sim_ms=50.0, single_ms=45.0, sim_over_single=1.11,
                      fresh_blocks=0, step_gflop=10.0),
               single("BM_gpt_step_toy", sim_ms=5.0, single_ms=3.0, sim_over_single=1.67,
                      fresh_blocks=0, step_gflop=0.5)]
        torch_gpt = {"gpt": {"single_ms": 60.0, "local_tensor_ms": 500.0},
                     "gpt_toy": {"single_ms": 3.5, "local_tensor_ms": 400.0}}
        done, text = render({"tensor_bench": tensor, "gpt_bench": gpt},
                            peers={"torch_gpt": torch_gpt})
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        # 500 / 50 = 10x against a ceiling of 500 / 40 = 12.5x: the goal is above the ceiling.
        self.assertIn("| 50.0 ms | 500 ms | 10.0x | 12.5x | >= 20x **FAIL** (above the ceiling) |",
                      text)
        self.assertIn("| its arithmetic floor here: 10.0 GFLOP of products at 250 GFLOP/s | "
                      "40.0 ms |", text)
        # 400 / 5 = 80x, ceiling 400 / 2 = 200x.
        self.assertIn("| 5.00 ms | 400 ms | 80.0x | 200x | >= 20x **pass** |", text)
        self.assertIn("| its arithmetic floor here: 0.500 GFLOP of products at 250 GFLOP/s | "
                      "2.00 ms |", text)


if __name__ == "__main__":
    unittest.main()
