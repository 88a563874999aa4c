// tests/debug/dry_run_test.cpp: shape-only tensors (tensor/meta.h), shard classes
// (world/local_tensor.h) and the dry-run report (debug/dry_run.h); the fidelity of examples/gpt's
// dry run against its sim run at 8 ranks: the same collectives, record for record, and the same
// bytes per rank for every parameter, gradient and optimizer moment.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include <spmd/spmd.h>

#include "gpt_model.h"
#include "tests/support/test_support.h"

namespace spmd {
namespace {

using testing::expect_throws;

TEST(MetaTensor, FactoriesAndOpsMakeShapesOnly) {
  const MetaTensorsScope meta(true);
  const Tensor a = randn({4, 6}, 1);
  const Tensor b = ones({6, 3}, DType::F32);
  EXPECT_TRUE(a.is_meta());
  EXPECT_EQ(a.device(), meta_device());
  const Tensor c = matmul(a, b) + 1.0;
  EXPECT_TRUE(c.is_meta());
  EXPECT_EQ(c.shape(), (Shape{4, 3}));
  EXPECT_TRUE(c.transpose(0, 1).contiguous().is_meta());
  EXPECT_EQ(softmax(c, 1).to(DType::BF16).dtype(), DType::BF16);
  EXPECT_TRUE(from_vector(std::vector<int64_t>{1, 2, 3}).is_meta());
  // Shapes are still checked exactly as in a real run.
  expect_throws<ShapeError>([&] { matmul(a, a); }, {"matmul", "[4, 6]"});
  // Printing shows the shape; reading a value is a clear error naming the call.
  EXPECT_NE(c.to_string().find("device=meta"), std::string::npos);
  expect_throws<ShapeOnlyError>([&] { sum(c).item<float>(); }, {"item", "--spmd-tensors=meta"});
  expect_throws<ShapeOnlyError>([&] { c.to_vector<float>(); }, {"to_vector", "[4, 3]"});
  expect_throws<ShapeOnlyError>([&] { equal(c, c); }, {"equal"});
  Tensor d = zeros({2, 2});
  d.fill_(3.0);  // writes check shapes and do nothing
  EXPECT_TRUE(d.is_meta());
  const MetaTensorsScope real(false);
  expect_throws<ShapeOnlyError>(
      [&] {
        zeros({2, 2}).copy_(c.narrow(0, 0, 2).narrow(1, 0, 2));
      },
      {"copy_"});
}

TEST(MetaTensor, LaunchFlag) {
  int argc = 3;
  char arg0[] = "prog";
  char arg1[] = "--spmd-tensors=meta";
  char arg2[] = "--spmd-world-size=4";
  char* argv[] = {arg0, arg1, arg2, nullptr};
  EXPECT_TRUE(parse_launch_options(argc, argv).meta_tensors);
  EXPECT_EQ(argc, 1);
  int argc2 = 2;
  char bad[] = "--spmd-tensors=fake";
  char* argv2[] = {arg0, bad, nullptr};
  expect_throws<ConfigError>([&] { parse_launch_options(argc2, argv2); },
                             {"--spmd-tensors=fake", "'meta'"});
}

// launch() runs a program as a dry run, and refuses what a dry run cannot do.
int launch_with(std::vector<std::string> args, const std::function<int(World&)>& program) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int argc = static_cast<int>(args.size());
  return launch(argc, argv.data(), program);
}

TEST(MetaTensor, LaunchRunsTheProgramOnShapes) {
  bool meta = false;
  const int code = launch_with({"prog", "--spmd-tensors=meta"}, [&](World& world) {
    const DeviceMesh mesh = init_device_mesh(world, {2, 4}, {"dp", "tp"});
    const DTensor x = randn({8, 16}, mesh, {Shard{0}, Shard{1}}, 3);
    meta = x.local().shard(0).is_meta() && x.full_tensor().is_meta();
    return 0;
  });
  EXPECT_EQ(code, 0);
  EXPECT_FALSE(meta_tensors());
  EXPECT_TRUE(meta);
  auto ok = [](World&) { return 0; };
  EXPECT_NE(launch_with({"prog", "--spmd-tensors=meta", "--spmd-backend=mpi"}, ok), 0);
  EXPECT_NE(launch_with({"prog", "--spmd-tensors=meta", "--spmd-debug=check"}, ok), 0);
  EXPECT_FALSE(meta_tensors());
}

TEST(ShardClasses, RanksWithEqualShardsComputeOnce) {
  const MetaTensorsScope meta(true);
  World world = World::sim(4096);
  const DeviceMesh mesh = init_device_mesh(world, {512, 8}, {"dp", "tp"});
  // Uneven over dp: 1000 rows over 512 ranks is 2 rows each for 500 ranks, nothing for 12.
  const DTensor x = randn({1000, 64}, mesh, {Shard{0}, Shard{1}}, 7);
  EXPECT_TRUE(x.local().has_classes());
  EXPECT_EQ(x.local().num_classes(), 2u);
  EXPECT_EQ(x.local().num_shards(), 4096u);
  EXPECT_EQ(x.local().shard(0).shape(), (Shape{2, 8}));
  EXPECT_EQ(x.local().shard(4095).shape(), (Shape{0, 8}));
  const DTensor y = relu(x) * 2.0;
  EXPECT_EQ(y.local().num_classes(), 2u);
  const DTensor full = y.redistribute({Replicate{}, Replicate{}});
  EXPECT_EQ(full.local().num_classes(), 1u);
  EXPECT_EQ(full.local().shard(17).shape(), (Shape{1000, 64}));
  // The per-rank view is still there for code that wants it.
  EXPECT_EQ(y.local().shards().size(), 4096u);
  EXPECT_EQ(y.local().shards()[4095].shape(), (Shape{0, 8}));
  expect_throws<ShapeOnlyError>([&] { full.full_tensor().to_vector<float>(); }, {"to_vector"});
}

// ---- examples/gpt at 8 ranks: real (sim) against shape-only ----------------------------------

struct GptRun {
  std::vector<TraceRecord> records;
  // Sum over the parameters of numel x the ranks that hold a copy of each element (the product
  // of the mesh dims the parameter is replicated on).
  int64_t replicated_numel = 0;
  std::vector<std::vector<Shape>> piece_shapes;  // per tensor, per rank
  DryRunReport report;
};

GptRun run_gpt(bool meta, bool fsdp) {
  const MetaTensorsScope tensors(meta);
  gpt_model::Config c;
  c.layers = 2;
  c.d_model = 32;
  c.heads = 4;
  c.seq = 16;
  c.vocab = 50;  // uneven over tp = 4: shard classes of two shapes
  c.batch = 4;
  c.dtype = DType::F32;
  World world = World::sim(8);
  trace().clear();
  const DeviceMesh mesh = init_device_mesh(world, {2, 4}, {"dp", "tp"});
  const gpt_model::ModelLayout layout{mesh, fsdp};
  DryRun dry(world);
  gpt_model::Model<DTensor> model = gpt_model::init_model<DTensor>(c, &layout);
  std::vector<DTensor*> params = model.params();
  AdamW<DTensor> opt(params, gpt_model::adamw_options(c));
  const std::string text(200, 'a');
  std::vector<DTensor> grads;
  for (int64_t step = 0; step < 2; ++step) {
    // gpt_model::train_step's calls, with the gradients kept.
    const DTensor tokens =
        gpt_model::place_tokens<DTensor>(gpt_model::batch_tokens(c, text, step), &layout);
    const gpt_model::Parallel par{fsdp};
    const DTensor loss = gpt_model::forward(c, par, model, tokens, step);
    gpt_model::scalar(loss);
    backward(loss);
    grads.clear();
    for (DTensor* p : params) grads.push_back(p->grad());
    clip_grad_norm(params, c.clip);
    opt.step();
  }
  GptRun run;
  run.records = trace().records();
  for (const DTensor* p : params) {
    int64_t copies = 1;
    for (size_t d = 0; d < p->placements().size(); ++d) {
      if (is_replicate(p->placements()[d])) copies *= mesh.shape()[d];
    }
    run.replicated_numel += shape_numel(p->shape()) * copies;
  }
  MemoryParts parts;
  for (size_t i = 0; i < params.size(); ++i) {
    parts.parameters.push_back(params[i]);
    parts.gradients.push_back(&grads[i]);
    parts.optimizer_state.push_back(&opt.exp_avg(i));
    parts.optimizer_state.push_back(&opt.exp_avg_sq(i));
  }
  for (const auto* group : {&parts.parameters, &parts.gradients, &parts.optimizer_state}) {
    for (const DTensor* t : *group) {
      std::vector<Shape> shapes;
      for (int r = 0; r < 8; ++r) shapes.push_back(t->local().shard(r).shape());
      run.piece_shapes.push_back(shapes);
    }
  }
  run.report = dry.report(parts);
  return run;
}

void expect_same_collectives(const GptRun& real, const GptRun& meta) {
  ASSERT_EQ(real.records.size(), meta.records.size());
  ASSERT_FALSE(real.records.empty());
  for (size_t i = 0; i < real.records.size(); ++i) {
    const TraceRecord& a = real.records[i];
    const TraceRecord& b = meta.records[i];
    SCOPED_TRACE(fmt::format("record {}: {} vs {}", i, format_record(a), format_record(b)));
    EXPECT_EQ(a.rank, b.rank);
    EXPECT_EQ(a.sequence, b.sequence);
    EXPECT_EQ(a.op, b.op);
    EXPECT_EQ(a.dim_name, b.dim_name);
    EXPECT_EQ(a.detail, b.detail);
    EXPECT_EQ(a.group_ranks, b.group_ranks);
    EXPECT_EQ(a.shape, b.shape);
    EXPECT_EQ(a.dtype, b.dtype);
    EXPECT_EQ(a.bytes, b.bytes);
    EXPECT_EQ(a.file, b.file);
    EXPECT_EQ(a.line, b.line);
  }
}

void expect_same_bytes(const GptRun& real, const GptRun& meta) {
  EXPECT_EQ(real.piece_shapes, meta.piece_shapes);
  ASSERT_EQ(real.report.memory.size(), meta.report.memory.size());
  for (size_t i = 0; i < real.report.memory.size(); ++i) {
    const DryRunReport::RankClass& a = real.report.memory[i];
    const DryRunReport::RankClass& b = meta.report.memory[i];
    EXPECT_EQ(a.ranks, b.ranks);
    EXPECT_EQ(a.example_ranks, b.example_ranks);
    EXPECT_EQ(a.parameters, b.parameters);
    EXPECT_EQ(a.gradients, b.gradients);
    EXPECT_EQ(a.optimizer_state, b.optimizer_state);
    EXPECT_GT(a.parameters, 0);
    EXPECT_GT(a.gradients, 0);
    EXPECT_GT(a.optimizer_state, 0);
  }
  EXPECT_EQ(real.report.comm_us, meta.report.comm_us);
  EXPECT_EQ(real.report.flops, meta.report.flops);
}

TEST(DryRunFidelity, GptTensorSequenceParallel) {
  const GptRun real = run_gpt(false, false);
  const GptRun meta = run_gpt(true, false);
  expect_same_collectives(real, meta);
  expect_same_bytes(real, meta);
  EXPECT_TRUE(meta.report.shape_only);
  EXPECT_GT(meta.report.memory.front().peak, meta.report.memory.front().parameters);
}

TEST(DryRunFidelity, GptFsdpTimesTensorParallel) {
  const GptRun real = run_gpt(false, true);
  const GptRun meta = run_gpt(true, true);
  expect_same_collectives(real, meta);
  expect_same_bytes(real, meta);
}

// ---- the report -------------------------------------------------------------------------------

// One step of examples/gpt's model on a (dp, tp) mesh of `world` ranks (shape-only tensors): the
// report of a DryRun on `device` over it.
DryRunReport gpt_step_report(const gpt_model::Config& c, int world_size, DeviceSpec device) {
  const MetaTensorsScope meta(true);
  World world = World::sim(world_size);
  const int64_t dp = world_size == 1 ? 1 : 2;
  const gpt_model::ModelLayout layout{init_device_mesh(world, {dp, world_size / dp}, {"dp", "tp"}),
                                      false};
  gpt_model::Model<DTensor> model = gpt_model::init_model<DTensor>(c, &layout);
  std::vector<DTensor*> params = model.params();
  AdamW<DTensor> opt(params, gpt_model::adamw_options(c));
  DryRun dry(world, device);
  gpt_model::train_step(c, gpt_model::Parallel{}, model, opt, params,
                        gpt_model::batch_tokens(c, std::string(400, 'a'), 0), &layout, 0);
  return dry.report({});
}

// gpt_bench's arithmetic floor (step_gflop, quoted by docs/performance.md) is a DryRun's flop
// count of one step on one rank. It must be the closed form of the model's products, with N =
// batch x seq tokens: per layer the four weight products (d x 3d, d x d, d x 4d, 4d x d) do
// 2*N*12d^2 forward and twice that backward (the input's and the weight's gradients); the
// vocabulary projection 6*N*d*V; attention 4*B*H*S^2*Dh forward and 10*B*H*S^2*Dh backward
// (attention_grad's two calls: 6 for dq, 4 for dk and dv), half of each where a fused causal
// kernel skips what the mask hides. The same step on (dp 2, tp 4) splits that work evenly.
TEST(DryRunReport, GptStepFlopsAreTheClosedForm) {
  gpt_model::Config c;
  c.layers = 3;
  c.d_model = 48;
  c.heads = 4;
  c.seq = 16;
  c.vocab = 64;
  c.batch = 4;
  c.dtype = DType::F32;
  const double n = static_cast<double>(c.batch * c.seq), d = static_cast<double>(c.d_model);
  const double weights = c.layers * 72.0 * n * d * d + 6.0 * n * d * static_cast<double>(c.vocab);
  const double attention = c.layers * 14.0 * static_cast<double>(c.batch * c.heads) *
                           static_cast<double>(c.seq * c.seq) * (d / static_cast<double>(c.heads));
  DeviceSpec fused;
  fused.flash_attention = true;
  EXPECT_DOUBLE_EQ(gpt_step_report(c, 1, DeviceSpec{}).flops, weights + attention);
  EXPECT_DOUBLE_EQ(gpt_step_report(c, 1, fused).flops, weights + attention / 2);
  EXPECT_DOUBLE_EQ(gpt_step_report(c, 8, fused).flops * 8, weights + attention / 2);
}

TEST(DryRunReport, TableJsonAndTimeline) {
  const MetaTensorsScope meta(true);
  World world = World::sim(1024);
  const DeviceMesh mesh = init_device_mesh(world, {128, 8}, {"dp", "tp"});
  DryRun dry(world);
  DTensor w = randn({512, 1024}, mesh, {Replicate{}, Shard{1}}, 1);
  w.requires_grad_();
  const DTensor x = randn({1024, 512}, mesh, {Shard{0}, Replicate{}}, 2);
  backward(sum(matmul(x, w)));
  const DTensor g = w.grad();
  const DryRunReport r = dry.report({.parameters = {&w}, .gradients = {&g}});
  ASSERT_EQ(r.memory.size(), 1u);
  EXPECT_EQ(r.memory[0].ranks, 1024);
  EXPECT_EQ(r.memory[0].parameters, 512 * 128 * 4);
  EXPECT_EQ(r.memory[0].gradients, 512 * 128 * 4);
  EXPECT_TRUE(r.peak_exact);
  // matmul [8, 512] x [512, 128] per rank, forward and the weight's gradient at least.
  EXPECT_GE(r.flops, 2.0 * 2 * 8 * 512 * 128);
  EXPECT_GT(r.compute_us, 0.0);
  EXPECT_GT(r.comm_us, 0.0);
  EXPECT_DOUBLE_EQ(r.serial_us, r.compute_us + r.comm_us);
  EXPECT_LE(r.step_us, r.serial_us);
  EXPECT_GE(r.step_us, std::max(r.compute_us, r.comm_us) - 1e-9);
  EXPECT_GT(r.hfu, 0.0);
  EXPECT_LE(r.hfu, 1.0);
  // Shape-only, one class: the device memory beyond the tensors.
  ASSERT_TRUE(r.device_memory.has_value());
  EXPECT_EQ(r.device_memory->tensors_peak, r.memory[0].peak);
  EXPECT_GE(r.device_memory->allocated, r.device_memory->tensors_peak);
  EXPECT_GE(r.device_memory->reserved, r.device_memory->allocated);
  const std::string table = r.table();
  EXPECT_NE(table.find("1024"), std::string::npos) << table;
  EXPECT_NE(table.find("estimated step time"), std::string::npos) << table;
  const std::string json = r.json();
  EXPECT_NE(json.find("\"step_us\""), std::string::npos);
  const std::string path = ::testing::TempDir() + "dry_run_timeline.json";
  dry.write_timeline(path);
  const TraceFile file = read_trace_file(path);
  EXPECT_FALSE(file.records.empty());
  std::remove(path.c_str());
}

TEST(DryRunReport, DeviceFile) {
  const DeviceSpec d = DeviceSpec::from_json(R"({"name": "x", "tflops": {"bf16": 100}})");
  EXPECT_EQ(d.name, "x");
  EXPECT_DOUBLE_EQ(d.peak_flops(DType::BF16), 100e12);
  EXPECT_DOUBLE_EQ(d.peak_flops(DType::F32), 67e12);
  const DeviceSpec h100 = DeviceSpec::load(SPMD_MACHINES_DIR "/h100_sxm.device.json");
  EXPECT_DOUBLE_EQ(h100.memory_bandwidth_gbps, 3350.0);
  Topology::load(SPMD_MACHINES_DIR "/h100_dgx.topology.json");
  expect_throws<ConfigError>([] { DeviceSpec::from_json(R"({"tflops": {"fp8": 1}})"); }, {"fp8"});
  const DeviceSpec f8 = DeviceSpec::from_json(R"({"tflops": {"f8": 300}})");
  EXPECT_DOUBLE_EQ(f8.peak_flops(DType::F8E4M3FN), 300e12);
  EXPECT_DOUBLE_EQ(f8.peak_flops(DType::F8E5M2), 300e12);
  EXPECT_DOUBLE_EQ(DeviceSpec::from_json(f8.to_json()).tflops_f8, 300.0);
  expect_throws<ConfigError>([] { DeviceSpec::from_json(R"({"efficiency": 2})"); }, {"efficiency"});
  expect_throws<ConfigError>([] { DeviceSpec::from_json(R"({"achievable": {"gemm": 0.5}})"); },
                             {"achievable.gemm", "matmul, attention, memory"});
  expect_throws<ConfigError>([] { DeviceSpec::from_json(R"({"achievable": {"matmul": 1.5}})"); },
                             {"achievable.matmul", "(0, 1]"});
  expect_throws<ConfigError>([] { DeviceSpec::from_json(R"({"flash_attention": 1})"); },
                             {"flash_attention", "true or false"});
  expect_throws<ConfigError>([] { DeviceSpec::from_json(R"({"cuda_context_mib": -1})"); },
                             {"cuda_context_mib"});
  // Unset classes take the efficiency.
  const DeviceSpec plain = DeviceSpec::from_json(R"({"efficiency": 0.5})");
  EXPECT_DOUBLE_EQ(plain.matmul_fraction(), 0.5);
  EXPECT_DOUBLE_EQ(plain.memory_fraction(), 0.5);
  // Every machine file of the tree loads, and round-trips through to_json.
  for (const char* name : {"h100_sxm", "h100_96gb_500w", "a100_80gb", "h200", "b200"}) {
    const DeviceSpec d =
        DeviceSpec::load(fmt::format("{}/{}.device.json", SPMD_MACHINES_DIR, name));
    EXPECT_TRUE(d.flash_attention) << name;
    EXPECT_GT(d.cuda_context_mib, 0.0) << name;
    const DeviceSpec again = DeviceSpec::from_json(d.to_json());
    EXPECT_DOUBLE_EQ(again.matmul_fraction(), d.matmul_fraction()) << name;
    EXPECT_DOUBLE_EQ(again.nccl_mib_per_communicator, d.nccl_mib_per_communicator) << name;
  }
  for (const char* name : {"h100_dgx", "grand_teton_h100_roce", "dgx_a100", "dgx_b200"}) {
    const Topology t = Topology::load(fmt::format("{}/{}.topology.json", SPMD_MACHINES_DIR, name));
    EXPECT_EQ(t.devices_per_host, 8) << name;
  }
}

// Note [Dry-run estimates]: collectives on the overlap dims run beside the compute; with none,
// the step is the serial sum.
TEST(DryRunReport, DataParallelCommunicationOverlapsCompute) {
  const MetaTensorsScope meta(true);
  World world = World::sim(64);
  const DeviceMesh mesh = init_device_mesh(world, {8, 8}, {"dp", "tp"});
  auto run = [&](std::vector<std::string> overlap) {
    DryRunOptions options;
    options.overlap_dims = std::move(overlap);
    DryRun dry(world, DeviceSpec{}, options);
    std::vector<DTensor> ws;
    for (int i = 0; i < 4; ++i) {
      ws.push_back(randn({1024, 1024}, mesh, {Shard{0}, Replicate{}}, 1 + i));
      ws.back().requires_grad_();
    }
    DTensor x = randn({4096, 1024}, mesh, {Shard{0}, Replicate{}}, 9);
    for (const DTensor& w : ws) x = relu(matmul(x, w.redistribute({Replicate{}, Replicate{}})));
    backward(sum(x));
    return dry.report({});
  };
  const DryRunReport serial = run({});
  const DryRunReport overlapped = run({"dp"});
  EXPECT_DOUBLE_EQ(serial.step_us, serial.serial_us);
  EXPECT_DOUBLE_EQ(overlapped.serial_us, serial.serial_us);
  EXPECT_LT(overlapped.step_us, serial.step_us);
  EXPECT_GE(overlapped.step_us, overlapped.compute_us);
  EXPECT_LT(overlapped.exposed_comm_us, serial.exposed_comm_us);
}

// begin_step forgets what came before: a report after it covers one step of two.
TEST(DryRunReport, BeginStepReportsTheLastStep) {
  const MetaTensorsScope meta(true);
  World world = World::sim(8);
  const DeviceMesh mesh = init_device_mesh(world, {8}, {"dp"});
  DTensor w = randn({256, 256}, mesh, {Replicate{}}, 1);
  w.requires_grad_();
  auto step = [&] {
    const DTensor x = randn({64, 256}, mesh, {Shard{0}}, 2);
    backward(sum(matmul(x, w)));
  };
  DryRun dry(world);
  step();
  const DryRunReport one = dry.report({});
  step();
  const DryRunReport two = dry.report({});
  dry.begin_step();
  step();
  const DryRunReport last = dry.report({});
  // The second and third steps are alike (their backward adds into w's gradient).
  EXPECT_GT(two.ops, one.ops);
  EXPECT_EQ(last.ops, two.ops - one.ops);
  EXPECT_NEAR(last.compute_us, two.compute_us - one.compute_us, 1e-9 * two.compute_us);
  EXPECT_DOUBLE_EQ(last.comm_us, one.comm_us);
}

// MFU counts the model's flops: a checkpointed matmul's second forward, in backward, is work the
// hardware does (hfu) and the model does not (mfu). The same matmul with and without the
// checkpoint: the checkpointed step does one forward matmul more (2MNK / 4 per rank), and its
// model flops are the plain step's.
TEST(DryRunReport, MfuLeavesOutRecomputation) {
  const MetaTensorsScope meta(true);
  World world = World::sim(4);
  const DeviceMesh mesh = init_device_mesh(world, {4}, {"dp"});
  auto run = [&](bool checkpointed) {
    DTensor w = randn({256, 512}, mesh, {Replicate{}}, 1);
    DTensor x = randn({1024, 256}, mesh, {Shard{0}}, 2);
    w.requires_grad_();
    x.requires_grad_();
    DryRun dry(world);
    const std::function<DTensor(const std::vector<DTensor>&)> fn =
        [&](const std::vector<DTensor>& in) { return matmul(in[0], w); };
    const DTensor y = checkpointed ? checkpoint_activations(fn, {x}) : fn({x});
    backward(sum(y));
    EXPECT_FALSE(recomputing());
    return dry.report({});
  };
  const DryRunReport plain = run(false);
  const DryRunReport again = run(true);
  const double forward = 2.0 * 1024 / 4 * 512 * 256;  // the forward matmul's flops per rank
  EXPECT_DOUBLE_EQ(plain.model_flops, plain.flops);
  EXPECT_DOUBLE_EQ(plain.mfu, plain.hfu);
  EXPECT_DOUBLE_EQ(again.flops, plain.flops + forward);
  EXPECT_DOUBLE_EQ(again.model_flops, plain.flops);
  ASSERT_GT(again.hfu, 0.0);
  EXPECT_NEAR(again.mfu / again.hfu, plain.flops / again.flops, 1e-12);
  EXPECT_NE(again.table().find(fmt::format("MFU {:.1f}%", 100.0 * again.mfu)), std::string::npos);
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(again.json())["step"]["mfu"].get<double>(), again.mfu);
}

// FP8 GEMMs (float8_matmul's float8_mm) run at the device file's float8 rate, and utilisation
// counts them against the BF16 peak, as torchtitan's MFU does for Float8 runs.
TEST(DryRunReport, Float8GemmsRunAtTheFloat8RateAndCountAgainstTheBf16Peak) {
  const MetaTensorsScope meta(true);
  World world = World::sim(4);
  const DeviceMesh mesh = init_device_mesh(world, {4}, {"dp"});
  const DeviceSpec device = DeviceSpec::from_json(
      R"({"tflops": {"bf16": 100, "f8": 400}, "memory_bandwidth_gbps": 1e9,
          "achievable": {"matmul": 1, "memory": 1}})");
  auto run = [&](bool float8) {
    const DTensor w = randn({512, 1024}, mesh, {Replicate{}}, 1, DType::BF16);
    const DTensor x = randn({4096, 512}, mesh, {Shard{0}}, 2, DType::BF16);
    DryRun dry(world, device);
    const DTensor y = float8 ? float8_matmul(x, w) : matmul(x, w);
    EXPECT_EQ(y.dtype(), DType::BF16);
    return dry.report({});
  };
  const DryRunReport plain = run(false);
  const DryRunReport f8 = run(true);
  const double flops = 2.0 * 4096 / 4 * 1024 * 512;  // per rank
  EXPECT_NEAR(plain.matmul_us, flops / 100e12 * 1e6, 1e-9);
  EXPECT_NEAR(f8.matmul_us, flops / 400e12 * 1e6, 1e-9);
  ASSERT_GT(f8.step_us, 0.0);
  EXPECT_NEAR(f8.hfu, f8.flops / (f8.step_us * 1e-6 * 100e12), 1e-12);
}

// The bytes of every compute op in a dry run's timeline, per op name, in order.
std::map<std::string, std::vector<double>> timeline_bytes(const DryRun& dry) {
  const std::string path = ::testing::TempDir() + "dry_run_eager_timeline.json";
  dry.write_timeline(path);
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  std::map<std::string, std::vector<double>> bytes;
  for (const nlohmann::json& e : j.at("traceEvents")) {
    if (e.value("cat", "") == "compute") {
      bytes[e.at("name").get<std::string>()].push_back(e.at("args").at("bytes").get<double>());
    }
  }
  std::remove(path.c_str());
  return bytes;
}

// Note [Eager kernels]: rms_norm and rotary_embedding named in eager_ops cost the bytes of
// PyTorch eager's kernels for their decompositions, forward and backward, and nothing else
// changes. The closed forms per BF16 element (n of them per rank) are the kernels
// bench/peers/eager_kernels.py counts in PyTorch 2.15 for the same code: rms_norm 36 forward,
// 84 for the input's gradient and 6 for g * y (the weight's, before its sum over rows); RoPE
// 20 each way plus its [S, D/2] complex64 table, read once forward and three times backward
// (copied as its conjugate first). Fused, each op reads its inputs and writes its output once.
TEST(DryRunReport, EagerKernelsCostPyTorchsDecomposition) {
  const MetaTensorsScope meta(true);
  World world = World::sim(8);
  const DeviceMesh mesh = init_device_mesh(world, {8}, {"dp"});
  const int64_t B = 16, S = 64, H = 4, D = 32;
  const double n = static_cast<double>(B / 8 * S * H * D), w_bytes = 2.0 * H * D;
  const double table = static_cast<double>(S * D) * 4.0;
  auto run = [&](std::vector<std::string> eager) {
    DryRunOptions options;
    options.eager_ops = std::move(eager);
    DryRun dry(world, DeviceSpec{}, options);
    DTensor x = randn({B, S, H * D}, mesh, {Shard{0}}, 1, DType::BF16);
    x.requires_grad_();
    DTensor w = randn({H * D}, mesh, {Replicate{}}, 2, DType::BF16);
    w.requires_grad_();
    const DTensor q = reshape(rms_norm(x, w, 1e-5), {B, S, H, D});
    // A gradient sharded as the output, so that every op of the backward runs on rank pieces.
    backward(rotary_embedding(q), randn({B, S, H, D}, mesh, {Shard{0}}, 3, DType::BF16));
    return std::pair(dry.report({}), timeline_bytes(dry));
  };
  const auto [fused, fused_bytes] = run({});
  const auto [eager, eager_bytes] = run({"rms_norm", "rotary_embedding"});
  using Bytes = std::vector<double>;
  EXPECT_EQ(fused_bytes.at("rms_norm"), Bytes({2 * n + w_bytes + 2 * n}));
  EXPECT_EQ(fused_bytes.at("rms_norm_backward"), Bytes({6 * n + w_bytes, 6 * n + w_bytes}));
  EXPECT_EQ(fused_bytes.at("rotary_embedding"), Bytes({4 * n, 4 * n}));
  EXPECT_EQ(eager_bytes.at("rms_norm"), Bytes({36 * n}));
  EXPECT_EQ(eager_bytes.at("rms_norm_backward"), Bytes({84 * n, 6 * n}));
  EXPECT_EQ(eager_bytes.at("rotary_embedding"), Bytes({20 * n + table, 20 * n + 3 * table}));
  for (const auto& [op, bytes] : fused_bytes) {
    if (op != "rms_norm" && op != "rms_norm_backward" && op != "rotary_embedding") {
      EXPECT_EQ(eager_bytes.at(op), bytes) << op;
    }
  }
  EXPECT_EQ(eager.ops, fused.ops);
  EXPECT_GT(eager.compute_us, fused.compute_us);
  EXPECT_TRUE(fused.eager_ops.empty());
  EXPECT_EQ(eager.eager_ops, (std::vector<std::string>{"rms_norm", "rotary_embedding"}));
  for (const char* line : {"as PyTorch eager's separate kernels", "rms_norm           at::rms_norm",
                           "rotary_embedding   Meta's reference"}) {
    EXPECT_NE(eager.table().find(line), std::string::npos) << line << "\n" << eager.table();
  }
  EXPECT_EQ(fused.table().find("eager"), std::string::npos) << fused.table();
  EXPECT_NE(eager.json().find("\"eager_ops\""), std::string::npos);
  // Only ops whose entries describe their eager kernels can be named.
  EXPECT_EQ(eager_op_names(), (std::vector<std::string>{"rms_norm", "rotary_embedding"}));
  expect_throws<ConfigError>(
      [&] { DryRun(world, DeviceSpec{}, DryRunOptions{.eager_ops = {"layer_norm"}}); },
      {"DryRunOptions::eager_ops", "'layer_norm'", "rms_norm, rotary_embedding"});
  ::setenv("SPMD_EAGER_OPS", "rotary_embedding,,rms_norm", 1);
  EXPECT_EQ(DryRunOptions::from_env().eager_ops,
            (std::vector<std::string>{"rotary_embedding", "rms_norm"}));
  ::setenv("SPMD_EAGER_OPS", "rms_norm,gelu", 1);
  expect_throws<ConfigError>([] { DryRunOptions::from_env(); }, {"SPMD_EAGER_OPS", "'gelu'"});
  ::unsetenv("SPMD_EAGER_OPS");
}

// Note [Fused attention accounting]: with a flash kernel the backward's S^2 temporaries count no
// bytes and a causal kernel does half the work; without, they are the peak.
TEST(DryRunMemory, FlashAttentionKeepsNoSquareBuffer) {
  const MetaTensorsScope meta(true);
  World world = World::sim(2);
  const DeviceMesh mesh = init_device_mesh(world, {2}, {"dp"});
  const int64_t b = 2, h = 4, s = 512, d = 16;
  const int64_t square = b / 2 * h * s * s * 4;  // one rank's [B/2, H, S, S] in f32
  auto run = [&](bool flash) {
    DeviceSpec device;
    device.flash_attention = flash;
    DryRun dry(world, device);
    DTensor q = randn({b, h, s, d}, mesh, {Shard{0}}, 1);
    DTensor k = randn({b, h, s, d}, mesh, {Shard{0}}, 2);
    DTensor v = randn({b, h, s, d}, mesh, {Shard{0}}, 3);
    for (DTensor* t : {&q, &k, &v}) t->requires_grad_();
    backward(sum(scaled_dot_product_attention(q, k, v, true)));
    EXPECT_EQ(q.grad().shape(), q.shape());
    return dry.report({.parameters = {&q, &k, &v}});
  };
  const DryRunReport plain = run(false);
  const DryRunReport flash = run(true);
  EXPECT_GE(plain.memory[0].activations, 2 * square);
  EXPECT_LT(flash.memory[0].activations, square / 4);
  EXPECT_FALSE(fused_attention_accounting());  // the DryRun restored it
  // Causal: the fused kernel does half the attention's work.
  EXPECT_NEAR(flash.flops, plain.flops / 2, plain.flops * 1e-9);
  EXPECT_LT(flash.attention_us, plain.attention_us);
}

// PyTorch's cross_entropy is log_softmax then nll_loss. Over rows split across ranks (a Mean:
// the composite, Note [Mean over the elements not ignored]) the loss keeps what PyTorch's keeps:
// log_softmax's output for backward, and in backward that, nll_loss's gradient and log_softmax's,
// three tensors of the logits' size beside the logits themselves (torchtitan's loss on float32
// logits: rows T1 and T3 of docs/dry-run.md).
TEST(DryRunMemory, CrossEntropyKeepsWhatPyTorchKeeps) {
  const MetaTensorsScope meta(true);
  World world = World::sim(8);
  const DeviceMesh mesh = init_device_mesh(world, {8}, {"dp"});
  const int64_t rows = 8 * 512, classes = 4096;
  const int64_t logits_bytes = rows / 8 * classes * 4;  // per rank, f32
  const int64_t slack = 1 << 20;                        // the targets, the per-row values
  DTensor logits = randn({rows, classes}, mesh, {Shard{0}}, 1);
  logits.requires_grad_();
  const DTensor target = distribute_tensor(zeros({rows}, DType::I64), mesh, {Shard{0}});
  DryRun dry(world);  // from here: what the loss allocates
  backward(cross_entropy(logits, target));
  const DTensor grad = logits.grad();
  const DryRunReport r = dry.report({.parameters = {&logits}, .gradients = {&grad}});
  ASSERT_EQ(r.memory.size(), 1u);
  EXPECT_GE(r.memory[0].saved_by_forward, logits_bytes);
  EXPECT_LT(r.memory[0].saved_by_forward, logits_bytes + slack);
  // At the peak: the logits, the saved output and the two gradients (the second is the logits'
  // gradient, counted as such).
  EXPECT_GE(r.memory[0].activations, 2 * logits_bytes);
  EXPECT_LT(r.memory[0].activations, 2 * logits_bytes + slack);
}

// Note [Allocation streams]: FSDP2 makes each reduced gradient on its reduce-scatter stream, so the
// gradients, freed by zero_grad, stay reserved in that stream's pool, and the next step's
// activations grow the compute stream's pool beside it. Three f32 weights sharded over dp = 8
// have 2 MiB gradient shards: 6 MiB in that pool (one expandable segment), whether the leaf
// reduces the gradient (fsdp_unshard) or a mixed-precision policy's cast does. Under DDP the
// all_reduce'd gradients come from the compute stream.
TEST(DryRunMemory, FsdpGradientsKeepTheReduceScatterStreamsPool) {
  const MetaTensorsScope meta(true);
  World world = World::sim(8);
  const DeviceMesh mesh = init_device_mesh(world, {8}, {"dp"});
  const int64_t d = 2048, shard_bytes = d * d / 8 * 4;
  enum class Kind { Fsdp, FsdpMixed, Ddp };
  for (Kind kind : {Kind::Fsdp, Kind::FsdpMixed, Kind::Ddp}) {
    SCOPED_TRACE(static_cast<int>(kind));
    const Placements placed = kind == Kind::Ddp ? Placements{Replicate{}} : Placements{Shard{0}};
    std::vector<DTensor> weights;
    for (int i = 0; i < 3; ++i) weights.push_back(randn({d, d}, mesh, placed, 10 + i));
    std::vector<DTensor*> params;
    for (DTensor& w : weights) params.push_back(&w.requires_grad_());
    const MixedPrecisionPolicy mixed{DType::BF16, DType::F32, std::nullopt};
    auto step = [&] {
      DTensor x = randn({64, d}, mesh, {Shard{0}}, 1);
      if (kind == Kind::FsdpMixed) x = to(x, DType::BF16);
      for (const DTensor& w : weights) {
        x = kind == Kind::Ddp    ? matmul(x, w)
            : kind == Kind::Fsdp ? matmul(x, fsdp_unshard(w, "dp"))
                                 : matmul(x, fsdp_unshard(w, "dp", mixed));
      }
      backward(sum(to(x, DType::F32)));
      EXPECT_EQ(weights[0].grad().dtype(), DType::F32);
      zero_grad(params);
    };
    DryRun dry(world, DeviceSpec{}, DryRunOptions{.expandable_segments = true});
    step();
    dry.begin_step();
    step();
    const DryRunReport r = dry.report({.parameters = {params.begin(), params.end()}});
    ASSERT_TRUE(r.device_memory.has_value());
    EXPECT_EQ(r.device_memory->reduce_scatter_stream, kind == Kind::Ddp ? 0 : 3 * shard_bytes);
  }
}

// Note [Regathered parameters]: FSDP2 frees a unit's gathered parameters after its forward and
// gathers them again in backward (reshard_after_forward), so the matmuls that saved them keep
// nothing from the forward to the backward; the root module keeps its own
// (reshard_after_forward = false). Three FSDP weights of 2048 x 2048 (a 16 MiB gathered F32 copy
// each) in a chain, no checkpointing: the forward saves the activations alone, and the backward
// gathers each weight once more; kept, the forward saves the three gathered copies too.
TEST(DryRunMemory, FsdpGathersAgainInBackwardInsteadOfKeeping) {
  const MetaTensorsScope meta(true);
  World world = World::sim(8);
  const DeviceMesh mesh = init_device_mesh(world, {8}, {"dp"});
  const int64_t d = 2048, gathered = d * d * 4;
  auto run = [&](bool reshard) {
    std::vector<DTensor> weights;
    for (int i = 0; i < 3; ++i) weights.push_back(randn({d, d}, mesh, {Shard{0}}, 10 + i));
    std::vector<const DTensor*> params;
    for (DTensor& w : weights) params.push_back(&w.requires_grad_());
    const DTensor x = randn({64, d}, mesh, {Shard{0}}, 1);
    trace().clear();
    DryRun dry(world);
    DTensor h = x;
    for (const DTensor& w : weights) h = matmul(h, fsdp_unshard(w, "dp", reshard));
    size_t gathers = 0;
    for (const TraceRecord& r : trace().records()) gathers += r.op == "all_gather" && r.rank == 0;
    EXPECT_EQ(gathers, 3u);
    backward(sum(h));
    size_t all = 0;
    for (const TraceRecord& r : trace().records()) all += r.op == "all_gather" && r.rank == 0;
    EXPECT_EQ(all - gathers, reshard ? 3u : 0u) << "all_gathers in backward";
    return dry.report({.parameters = params}).memory[0].saved_by_forward;
  };
  const int64_t resharded = run(true);
  const int64_t kept = run(false);
  EXPECT_EQ(kept - resharded, 3 * gathered);
  EXPECT_LT(resharded, gathered);  // the activations: 64 / 8 rows of 2048, three of them, and h
}

// ZeRO's accounting (Rajbhandari et al.): parameters, gradients and the two AdamW moments in f32
// are 16 bytes per parameter on every rank that holds it: the ranks together hold 16 bytes times
// each parameter's numel times its copies (replicated over dp without FSDP, over neither with it
// for the sharded ones).
TEST(DryRunMemory, ModelStatesAreZeroSixteenBytesPerParameter) {
  for (bool fsdp : {false, true}) {
    const GptRun run = run_gpt(true, fsdp);
    int64_t held = 0;
    for (const DryRunReport::RankClass& c : run.report.memory) {
      held += c.ranks * (c.parameters + c.gradients + c.optimizer_state);
    }
    EXPECT_EQ(held, 16 * run.replicated_numel) << (fsdp ? "fsdp" : "tp + sp");
  }
}

}  // namespace
}  // namespace spmd

namespace spmd {
namespace {

// Note [Dry-run estimates], pipelines: two stages of tanh(x W) on their own (dp) meshes, run by
// run_pipeline on shapes only. The in-flight counts are the schedules' (GPipe holds every
// microbatch, 1F1B rank r at most p - r), the activations held are those counts times one
// microbatch's, and the pipelined step is GPipe's closed form with the estimated action costs.
pipeline::PipelineStep run_two_stages(const World& world, const DeviceMesh& mesh,
                                      const pipeline::Schedule& schedule,
                                      std::vector<DTensor>& weights) {
  pipeline::PipelineModel model;
  for (int s = 0; s < 2; ++s) {
    const std::vector<int> ranks = pipeline::stage_ranks(mesh, "pp", s);
    const DeviceMesh stage = DeviceMesh::from_ranks(
        world, {2}, std::vector<int64_t>(ranks.begin(), ranks.end()), {"dp"});
    weights[static_cast<size_t>(s)] = randn({64, 64}, stage, {Replicate{}}, 10 + s);
    weights[static_cast<size_t>(s)].requires_grad_();
    DTensor* w = &weights[static_cast<size_t>(s)];
    model.stages.push_back({[stage, w](const LocalTensor& x) {
                              const DTensor h = DTensor::from_local(x, stage, {Shard{0}});
                              return tanh(matmul(h, *w)).to_local();
                            },
                            {},
                            {8, 64}});
  }
  model.input = [](int m, const std::vector<int>& ranks) {
    return LocalTensor::from_fn(ranks, [&](int) { return randn({8, 64}, 100 + m); });
  };
  model.loss = [](const LocalTensor& y, int) { return sum(y * y); };
  return pipeline::run_pipeline(model, schedule, mesh, "pp");
}

TEST(DryRunPipeline, InFlightActivationsAndTheBubble) {
  const MetaTensorsScope meta(true);
  World world = World::sim(4);
  const DeviceMesh mesh = init_device_mesh(world, {2, 2}, {"dp", "pp"});
  constexpr int kMicrobatches = 4;
  for (const char* name : {"gpipe", "1f1b"}) {
    SCOPED_TRACE(name);
    DryRun dry(world);
    std::vector<DTensor> w(2);
    const pipeline::Schedule schedule = pipeline::make_schedule(name, 2, kMicrobatches);
    const pipeline::PipelineStep step = run_two_stages(world, mesh, schedule, w);
    const DryRunReport r = dry.report({.pipeline = &step});
    ASSERT_TRUE(r.pipeline.has_value());
    const DryRunReport::Pipeline& p = *r.pipeline;
    const std::vector<int> expected_in_flight =
        std::string(name) == "gpipe" ? std::vector<int>{4, 4} : std::vector<int>{2, 1};
    EXPECT_EQ(p.peak_in_flight, expected_in_flight);
    ASSERT_EQ(p.activation_bytes.size(), 2u);
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_GT(p.activation_bytes[static_cast<size_t>(rank)], 0);
      // Each microbatch's share, up to the few bytes of scalars (the running loss) that differ.
      const double held = static_cast<double>(p.peak_activation_bytes[static_cast<size_t>(rank)]);
      const double each = static_cast<double>(p.activation_bytes[static_cast<size_t>(rank)]);
      EXPECT_LE(held, p.peak_in_flight[static_cast<size_t>(rank)] * each);
      EXPECT_GE(held, p.peak_in_flight[static_cast<size_t>(rank)] * each * 0.99);
    }
    EXPECT_GT(p.forward_us, 0.0);
    EXPECT_GT(p.backward_us, 0.0);
    EXPECT_GT(p.transfer_us, 0.0);
    if (std::string(name) == "gpipe") {
      // (m + p - 1)(F + B) plus 2 (p - 1) transfers (Note [Pipeline schedules]).
      EXPECT_NEAR(p.makespan_us,
                  (kMicrobatches + 1) * (p.forward_us + p.backward_us) + 2 * p.transfer_us, 1e-9);
    }
    EXPECT_GT(p.bubble_fraction, 0.0);
    EXPECT_DOUBLE_EQ(r.step_us, p.makespan_us + p.outside_us);
    const std::string table = r.table();
    EXPECT_NE(table.find(fmt::format("pipeline: {}, 2 pp ranks x 4 microbatches", name)),
              std::string::npos)
        << table;
    EXPECT_NE(r.json().find("\"peak_activation_bytes\""), std::string::npos);
  }
}

// What runs outside the pipeline's actions (an optimizer step) runs on every stage's mesh at the
// same time: the step counts the busiest stage, not the sum.
TEST(DryRunPipeline, WorkOutsideTheActionsRunsPerStageInParallel) {
  const MetaTensorsScope meta(true);
  World world = World::sim(4);
  const DeviceMesh mesh = init_device_mesh(world, {2, 2}, {"dp", "pp"});
  auto run = [&](int stages_stepped) {
    DryRun dry(world);
    std::vector<DTensor> w(2);
    const pipeline::PipelineStep step =
        run_two_stages(world, mesh, pipeline::make_schedule("1f1b", 2, 4), w);
    for (int s = 0; s < stages_stepped; ++s) {
      const DTensor updated = w[static_cast<size_t>(s)].detach() * 0.5;  // an optimizer's work
    }
    return dry.report({.pipeline = &step}).pipeline->outside_us;
  };
  const double none = run(0);
  const double one = run(1);
  const double both = run(2);
  EXPECT_GT(one, none);
  EXPECT_DOUBLE_EQ(both, one);
}

}  // namespace
}  // namespace spmd
