// Distributed checkpoints (Note [Checkpoint format] in spmd/nn/checkpoint.h): saved on one mesh and
// placements, loaded onto others and onto plain Tensors with the same global values; the files as
// any safetensors reader sees them; a save killed part way leaves the previous checkpoint; every
// bad input a ConfigError naming what is wrong.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include <spmd/dtensor/ops.h>
#include <spmd/nn/checkpoint.h>
#include <spmd/runtime/launch.h>
#include <spmd/tensor/random.h>
#include "examples/gpt_model.h"
#include "tests/support/test_support.h"

namespace spmd {
namespace {

namespace fs = std::filesystem;
using testing::expect_throws;

std::string ckpt_dir(const World& world, const std::string& name) {
  return fmt::format("{}spmd_ckpt_{}_{}_{}", ::testing::TempDir(), name, world.backend_name(),
                     world.size());
}

// Saved on (dp=2, tp=4), loaded onto (dp=4, tp=2) with other placements and onto plain Tensors:
// every value is the global tensor it was, bit for bit.
SPMD_TEST(Checkpoint, ReshardsOntoAnotherMeshAndOntoTensors) {
  if (world.size() != 8) GTEST_SKIP() << "8 ranks";
  const std::string dir = ckpt_dir(world, "reshard");
  const DeviceMesh a = init_device_mesh(world, {2, 4}, {"dp", "tp"});
  const Tensor gw = randn({10, 12}, 1, DType::F32);
  const Tensor gb = randn({7}, 2, DType::F64);
  const Tensor gs = from_vector(std::vector<int64_t>{42}, {1});
  DTensor w = distribute_tensor(gw, a, {Shard{0}, Shard{1}});     // uneven rows over dp
  DTensor b = distribute_tensor(gb, a, {Replicate{}, Shard{0}});  // 7 over 4: uneven
  w.requires_grad_();
  Tensor step = gs;
  checkpoint::save(world, {{"w", &w}, {"b", &b}, {"step", &step}}, dir);

  const DeviceMesh m = init_device_mesh(world, {4, 2}, {"dp", "tp"});
  DTensor w2 = distribute_tensor(zeros({10, 12}), m, {Shard{1}, Replicate{}});
  DTensor b2 = distribute_tensor(zeros({7}, DType::F64), m, {Replicate{}, Replicate{}});
  w2.requires_grad_();
  Tensor step2 = zeros({1}, DType::I64);
  checkpoint::load({{"w", &w2}, {"b", &b2}, {"step", &step2}}, dir);
  EXPECT_TRUE(allclose(w2.full_tensor(), gw, 0.0, 0.0));
  EXPECT_TRUE(allclose(b2.full_tensor(), gb, 0.0, 0.0));
  EXPECT_EQ(step2.to_vector<int64_t>(), std::vector<int64_t>{42});
  EXPECT_TRUE(w2.requires_grad());
  EXPECT_EQ(w2.placements(), (Placements{Shard{1}, Replicate{}}));

  Tensor whole = zeros({10, 12});
  checkpoint::load({{"w", &whole}}, dir);
  EXPECT_TRUE(allclose(whole, gw, 0.0, 0.0));

  // Replicas are written once: w has 8 chunks, b 4 (one per tp coordinate), step 1.
  const auto info = checkpoint::inspect(dir);
  EXPECT_EQ(info.at("w").chunks, 8u);
  EXPECT_EQ(info.at("b").chunks, 4u);
  EXPECT_EQ(info.at("b").bytes, 7u * 8u);
  EXPECT_EQ(info.at("step").chunks, 1u);
  EXPECT_EQ(info.at("w").placements, "S(0),S(1)");
}

// save_async copies the pieces when it starts: the state may change before wait(), and until
// wait() the previous checkpoint is the one that loads.
SPMD_TEST(Checkpoint, AsyncSaveWritesTheStateAsItWasWhenItStarted) {
  const std::string dir = ckpt_dir(world, "async");
  const DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"dp"});
  DTensor w = distribute_tensor(full({16, 4}, 1.0), mesh, {Shard{0}});
  checkpoint::save(world, {{"w", &w}}, dir);
  w = distribute_tensor(full({16, 4}, 2.0), mesh, {Shard{0}});
  checkpoint::AsyncSave pending = checkpoint::async_save({{"w", &w}}, dir);  // w's world
  EXPECT_TRUE(pending.pending());
  w = distribute_tensor(full({16, 4}, 3.0), mesh, {Shard{0}});  // training goes on
  pending.wait();
  EXPECT_FALSE(pending.pending());
  DTensor got = distribute_tensor(zeros({16, 4}), mesh, {Replicate{}});
  checkpoint::load({{"w", &got}}, dir);
  EXPECT_TRUE(allclose(got.full_tensor(), full({16, 4}, 2.0), 0.0, 0.0));
}

std::string gpt_text() {
  std::string text;
  for (int i = 0; i < 4000; ++i) text.push_back(static_cast<char>('a' + (i * 7 + i / 13) % 26));
  return text;
}

// Two steps of GPT training (tensor + sequence parallel, F64, dropout on) saved on (dp=2, tp=4),
// then two more after loading onto (dp=4, tp=2) and onto one device: the losses are those of four
// uninterrupted steps, and so are the weights.
SPMD_TEST(Checkpoint, TrainingResumesOnAnotherMeshWithTheSameLosses) {
  if (world.size() != 8) GTEST_SKIP() << "8 ranks";
  const std::string dir = ckpt_dir(world, "resume");
  gpt_model::Config c;
  c.dtype = DType::F64;
  const std::string text = gpt_text();
  const gpt_model::Parallel sp{false};
  auto run = [&](gpt_model::Model<DTensor>& model, AdamW<DTensor>& opt,
                 const gpt_model::ModelLayout& layout, int64_t from, int64_t to) {
    std::vector<DTensor*> params = model.params();
    std::vector<double> losses;
    for (int64_t step = from; step < to; ++step) {
      losses.push_back(gpt_model::train_step(
          c, sp, model, opt, params, gpt_model::batch_tokens(c, text, step), &layout, step));
    }
    return losses;
  };
  const gpt_model::ModelLayout a{init_device_mesh(world, {2, 4}, {"dp", "tp"}), false};
  gpt_model::Model<DTensor> whole = gpt_model::init_model<DTensor>(c, &a);
  std::vector<DTensor*> whole_params = whole.params();
  AdamW<DTensor> whole_opt(whole_params, gpt_model::adamw_options(c));
  const std::vector<double> expected = run(whole, whole_opt, a, 0, 4);

  gpt_model::Model<DTensor> first = gpt_model::init_model<DTensor>(c, &a);
  std::vector<DTensor*> first_params = first.params();
  AdamW<DTensor> first_opt(first_params, gpt_model::adamw_options(c));
  (void)run(first, first_opt, a, 0, 2);
  checkpoint::save(world, gpt_model::training_state(first, first_opt), dir);

  // (dp=4, tp=2): another init (other seeds would do too), overwritten by the load.
  const gpt_model::ModelLayout b{init_device_mesh(world, {4, 2}, {"dp", "tp"}), false};
  gpt_model::Model<DTensor> second = gpt_model::init_model<DTensor>(c, &b);
  std::vector<DTensor*> second_params = second.params();
  AdamW<DTensor> second_opt(second_params, gpt_model::adamw_options(c));
  checkpoint::load(gpt_model::training_state(second, second_opt), dir);
  EXPECT_EQ(second_opt.steps(), 2);
  const std::vector<double> resumed = run(second, second_opt, b, 2, 4);
  ASSERT_EQ(resumed.size(), 2u);
  EXPECT_NEAR(resumed[0], expected[2], 1e-12);
  EXPECT_NEAR(resumed[1], expected[3], 1e-12);
  for (size_t i = 0; i < whole_params.size(); ++i) {
    EXPECT_TRUE(
        allclose(second_params[i]->full_tensor(), whole_params[i]->full_tensor(), 1e-12, 1e-12))
        << "parameter " << i;
  }

  // One device: plain Tensors from the same checkpoint.
  gpt_model::Model<Tensor> single = gpt_model::init_model<Tensor>(c, nullptr);
  std::vector<Tensor*> single_params = single.params();
  AdamW<Tensor> single_opt(single_params, gpt_model::adamw_options(c));
  checkpoint::load(gpt_model::training_state(single, single_opt), dir);
  for (int64_t step = 2; step < 4; ++step) {
    const double loss =
        gpt_model::train_step(c, gpt_model::Single{}, single, single_opt, single_params,
                              gpt_model::batch_tokens(c, text, step), nullptr, step);
    EXPECT_NEAR(loss, expected[static_cast<size_t>(step)], 1e-12) << "step " << step;
  }
}

// The files are plain safetensors: the header names each chunk's dtype, shape and byte range.
TEST(Checkpoint, FilesAreSafetensorsThatOtherToolsRead) {
  World world = World::sim(4);
  const std::string dir = ckpt_dir(world, "format");
  const DeviceMesh mesh = init_device_mesh(world, {4}, {"dp"});
  DTensor w = distribute_tensor(arange(8, DType::F32), mesh, {Shard{0}});
  checkpoint::save(world, {{"w", &w}}, dir);
  std::ifstream in(dir + "/rank2.safetensors", std::ios::binary);
  ASSERT_TRUE(in);
  unsigned char le[8];
  in.read(reinterpret_cast<char*>(le), 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(le[i]) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  const nlohmann::json h = nlohmann::json::parse(header);
  EXPECT_EQ(h.at("w@4").at("dtype"), "F32");
  EXPECT_EQ(h.at("w@4").at("shape"), nlohmann::json({2}));
  EXPECT_EQ(h.at("w@4").at("data_offsets"), nlohmann::json({0, 8}));
  float values[2] = {};
  in.read(reinterpret_cast<char*>(values), 8);
  EXPECT_EQ(values[0], 4.0f);
  EXPECT_EQ(values[1], 5.0f);
  nlohmann::json index;
  std::ifstream(dir + "/index.json") >> index;
  EXPECT_EQ(index.at("format"), "spmdsim-checkpoint");
  EXPECT_EQ(index.at("entries").at("w").at("chunks").size(), 4u);
}

TEST(Checkpoint, BadInputsAreErrorsNamingWhatIsWrong) {
  World world = World::sim(2);
  const std::string dir = ckpt_dir(world, "errors");
  const DeviceMesh mesh = init_device_mesh(world, {2}, {"dp"});
  DTensor w = distribute_tensor(randn({4, 3}, 1), mesh, {Shard{0}});
  checkpoint::save({{"w", &w}}, dir);  // the world of w (the contract's form)
  Tensor plain = zeros({2});
  expect_throws<ConfigError>(
      [&] {
        checkpoint::save({{"t", &plain}}, dir);
      },
      {"checkpoint::save: the state has no defined DTensor to take the world from (1 entries)"});

  DTensor other = distribute_tensor(zeros({4, 5}), mesh, {Shard{0}});
  expect_throws<ConfigError>(
      [&] {
        checkpoint::load({{"w", &other}}, dir);
      },
      {"'w' is f32 [4, 3] in the checkpoint", "but f32 [4, 5] here"});
  DTensor f64 = distribute_tensor(zeros({4, 3}, DType::F64), mesh, {Shard{0}});
  expect_throws<ConfigError>([&] { checkpoint::load({{"w", &f64}}, dir); }, {"f64 [4, 3] here"});
  expect_throws<ConfigError>([&] { checkpoint::load({{"v", &w}}, dir); }, {"has no 'v'"});
  expect_throws<ConfigError>(
      [&] {
        checkpoint::load({{"w", &w}}, dir + "/nowhere");
      },
      {"has no index.json"});
  DTensor partial = DTensor::from_local(w.to_local(), mesh, {Partial{}});
  expect_throws<PlacementError>(
      [&] {
        checkpoint::save(world, {{"p", &partial}}, dir + "_p");
      },
      {"'p' is Partial on mesh dim 0", "redistribute it"});
  DTensor* null = nullptr;
  expect_throws<ConfigError>(
      [&] {
        checkpoint::save(world, {{"n", null}}, dir + "_n");
      },
      {"'n' is a null or undefined DTensor"});
  // A truncated file, then a missing one.
  const fs::path file = fs::path(dir) / "rank1.safetensors";
  fs::resize_file(file, fs::file_size(file) - 4);
  expect_throws<ConfigError>(
      [&] {
        checkpoint::load({{"w", &w}}, dir);
      },
      {"rank1.safetensors is truncated", "'w@2,0'"});
  fs::remove(file);
  expect_throws<ConfigError>(
      [&] {
        checkpoint::load({{"w", &w}}, dir);
      },
      {"rank1.safetensors is missing"});
}

// What a killed save left at `dir` (the old checkpoint holds 1s, the new one 2s, of `shape`),
// loaded under sim on 8 ranks: 1 for the old one, 2 for the new one, 0 for neither.
int killed_save_left(const std::string& dir, const Shape& shape) {
  World world = World::sim(8);
  const DeviceMesh mesh = init_device_mesh(world, {8}, {"dp"});
  DTensor got = distribute_tensor(zeros(shape), mesh, {Shard{0}});
  checkpoint::load({{"w", &got}}, dir);
  const Tensor value = got.full_tensor();
  if (allclose(value, full(shape, 1.0), 0.0, 0.0)) return 1;
  if (allclose(value, full(shape, 2.0), 0.0, 0.0)) return 2;
  return 0;
}

// A save killed part way (kill -9 at a random moment) leaves a checkpoint that loads: the previous
// one, or the new one if the kill came after its rename.
TEST(Checkpoint, KilledSaveLeavesTheCheckpointThatWasThere) {
  World world = World::sim(8);
  const std::string dir = ckpt_dir(world, "killed");
  const DeviceMesh mesh = init_device_mesh(world, {8}, {"dp"});
  DTensor old_value = distribute_tensor(full({4096, 64}, 1.0), mesh, {Shard{0}});
  checkpoint::save(world, {{"w", &old_value}}, dir);
  for (int delay_ms : {0, 2, 5, 20}) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      DTensor next = distribute_tensor(full({4096, 64}, 2.0), mesh, {Shard{0}});
      for (;;) checkpoint::save(world, {{"w", &next}}, dir);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
    const int left = killed_save_left(dir, {4096, 64});
    EXPECT_NE(left, 0) << "killed after " << delay_ms << " ms";
    // The next save still works (the leftover DIR.tmp is replaced).
    checkpoint::save(world, {{"w", &old_value}}, dir);
  }
}

// A save killed between its two renames (DIR moved aside to DIR.old, DIR.tmp not yet moved in)
// leaves no DIR: load reads DIR.old, and the next save replaces it.
TEST(Checkpoint, KilledBetweenTheRenamesLoadsThePreviousOne) {
  World world = World::sim(8);
  const std::string dir = ckpt_dir(world, "between_renames");
  const DeviceMesh mesh = init_device_mesh(world, {8}, {"dp"});
  std::filesystem::remove_all(dir + ".old");
  DTensor old_value = distribute_tensor(full({64, 8}, 1.0), mesh, {Shard{0}});
  checkpoint::save(world, {{"w", &old_value}}, dir);
  std::filesystem::rename(dir, dir + ".old");  // where the kill came
  EXPECT_EQ(killed_save_left(dir, {64, 8}), 1);
  EXPECT_EQ(checkpoint::inspect(dir).count("w"), 1u);
  DTensor next = distribute_tensor(full({64, 8}, 2.0), mesh, {Shard{0}});
  checkpoint::save(world, {{"w", &next}}, dir);
  EXPECT_EQ(killed_save_left(dir, {64, 8}), 2);
  EXPECT_FALSE(std::filesystem::exists(dir + ".old"));
}

// The same with the save made by 8 rank threads (the threads backend, in a child process killed
// with every thread at a random point of its own save): the checkpoint that loads is the previous
// one or the new one, read back under sim.
TEST(Checkpoint, KilledThreadsSaveLeavesTheCheckpointThatWasThere) {
  World world = World::sim(8);
  const std::string dir = ckpt_dir(world, "killed_threads");
  const DeviceMesh mesh = init_device_mesh(world, {8}, {"dp"});
  DTensor old_value = distribute_tensor(full({4096, 64}, 1.0), mesh, {Shard{0}});
  checkpoint::save(world, {{"w", &old_value}}, dir);
  int reached = 0;  // kills that came while a save was under way or after one finished
  for (int delay_ms : {0, 20, 80, 200}) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      std::vector<std::string> args = {"killed", "--spmd-backend=threads", "--spmd-world-size=8"};
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      int argc = static_cast<int>(args.size());
      const int code = launch(argc, argv.data(), [&](World& w) {
        const DeviceMesh m = init_device_mesh(w, {8}, {"dp"});
        DTensor next = distribute_tensor(full({4096, 64}, 2.0), m, {Shard{0}});
        for (;;) checkpoint::save(w, {{"w", &next}}, dir);
      });
      _exit(code);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
    EXPECT_TRUE(WIFSIGNALED(status)) << "the saving process ended by itself: " << status;
    const int left = killed_save_left(dir, {4096, 64});
    EXPECT_NE(left, 0) << "killed after " << delay_ms << " ms";
    reached += left == 2 || std::filesystem::exists(dir + ".tmp") ? 1 : 0;
    checkpoint::save(world, {{"w", &old_value}}, dir);
  }
  EXPECT_GT(reached, 0) << "no kill came during or after a threads save";
}

// The mpi kill -9 test (tests/nn/killed_mpi_save.sh) drives these three: the sim save of the old
// checkpoint, 8 mpirun processes saving a new one forever (killed with -9 at a random moment), and
// the check that what loads is one of the two. The folder is SPMD_KILLED_CKPT_DIR.
// 64 MB in all (8 MB a rank): a save long enough for a kill to land inside it.
const Shape kKilledShape = {int64_t{1} << 20, 8};

std::string killed_dir() {
  const char* dir = std::getenv("SPMD_KILLED_CKPT_DIR");
  return dir != nullptr ? dir : "";
}

TEST(Checkpoint, DISABLED_KillDriverSavesTheOld) {
  if (killed_dir().empty()) GTEST_SKIP() << "SPMD_KILLED_CKPT_DIR is not set";
  World world = World::sim(8);
  const DeviceMesh mesh = init_device_mesh(world, {8}, {"dp"});
  DTensor old_value = distribute_tensor(full(kKilledShape, 1.0), mesh, {Shard{0}});
  checkpoint::save(world, {{"w", &old_value}}, killed_dir());
}

SPMD_TEST(Checkpoint, DISABLED_KillDriverSavesForever) {
  if (killed_dir().empty()) GTEST_SKIP() << "SPMD_KILLED_CKPT_DIR is not set";
  const DeviceMesh mesh = init_device_mesh(world, {world.size()}, {"dp"});
  DTensor next = distribute_tensor(full(kKilledShape, 2.0), mesh, {Shard{0}});
  for (;;) checkpoint::save(world, {{"w", &next}}, killed_dir());
}

TEST(Checkpoint, DISABLED_KillDriverLoadsOneOfThem) {
  if (killed_dir().empty()) GTEST_SKIP() << "SPMD_KILLED_CKPT_DIR is not set";
  const int left = killed_save_left(killed_dir(), kKilledShape);
  EXPECT_NE(left, 0);
  std::printf("loaded the %s checkpoint\n", left == 2 ? "new" : "old");
}

}  // namespace
}  // namespace spmd
