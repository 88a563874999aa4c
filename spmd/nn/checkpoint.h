// spmd/nn/checkpoint.h: distributed checkpoints that reshard. save() writes each DTensor's pieces
// once (replicas deduplicated) with an index of global shapes, dtypes and chunk offsets; load()
// reads them back onto any mesh and placements.
//
//   checkpoint::StateDict state = {{"wte", &model.wte}, {"step", &step_tensor}};
//   checkpoint::save(world, state, "ckpt/step100");       // on (dp=2, tp=4)
//   ...
//   checkpoint::load(state2, "ckpt/step100");             // onto (dp=4, tp=2), or Tensors
//
// Note [Checkpoint format]
// A checkpoint is a folder:
//   index.json                 {"format": "spmdsim-checkpoint", "version": 1, "entries": {key:
//                               {"shape": [...], "dtype": "f32", "placements": "S(0),R",
//                               "chunks": [{"file": "rank3.safetensors", "name": "key@4,0",
//                               "offset": [4, 0], "size": [4, 16]}, ...]}}}
//   rank<R>.safetensors        the chunks rank R owns, in the safetensors layout (an 8-byte
//                              little-endian header length, a JSON header naming each tensor's
//                              dtype, shape and byte range, the raw little-endian bytes): any
//                              safetensors reader (Python's, Rust's) opens each file, and the index
//                              says where each chunk sits in the global tensor.
// A chunk is one piece of the tensor at its offset; along a Replicate mesh dim only coordinate 0
// writes (replicas once); a Partial DTensor is refused (its pieces are not the value: redistribute
// it first). A plain Tensor entry is written whole by the coordinator. safetensors because it is
// the format the other tools of 2026 read and write (Hugging Face, torch.distributed.checkpoint's
// HF storage, JAX loaders), holds nothing but tensors (no pickled code) and needs no library.
// Crash safety: every file is written into DIR.tmp, and when every process has written its files
// (a barrier) the coordinator writes index.json there and renames DIR.tmp to DIR, replacing the
// previous checkpoint only then (it moves to DIR.old first, removed after): a save that dies part
// way leaves DIR as it was, or, killed between the two renames, DIR.old, which load and inspect
// read when DIR has no index.json (load reads only a folder with an index.json). Under sim,
// threads, mpi and nccl: each process writes the ranks it holds. save_async() copies the pieces at
// once and writes them from a background thread; its wait() does the rest. load() fills each entry
// of `state` in place: a DTensor keeps its mesh and placements and gets the values of its pieces,
// read from every chunk that overlaps each held rank's block (only those files); a Tensor gets the
// whole value. Errors (ConfigError naming the folder, the key or the file): no index (not a
// checkpoint, or an unfinished save), a key the checkpoint lacks, another global shape or dtype (a
// checkpoint of another model), a missing or truncated file, chunks that do not cover a piece.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <variant>

#include <spmd/core/call_site.h>
#include <spmd/dtensor/dtensor.h>

namespace spmd::checkpoint {

using Entry = std::variant<DTensor*, Tensor*>;
using StateDict = std::map<std::string, Entry>;

// Writes `state` to folder `dir` (Note [Checkpoint format]); every process of `world` calls it with
// the same keys, shapes and placements. Replaces a previous checkpoint at `dir` once the new one is
// complete. ConfigError for a null or undefined entry, a Partial DTensor, a folder that cannot be
// written.
void save(const World& world, const StateDict& state, const std::string& dir,
          SourceLocation loc = SourceLocation::current());
// The same with the world of the state's DTensors (the API contract's form); ConfigError when the
// state has no defined DTensor to take it from.
void save(const StateDict& state, const std::string& dir,
          SourceLocation loc = SourceLocation::current());

// A save running in the background (save_async): the pieces were copied when it started, so
// training may change the state at once. wait() finishes it (the barrier, the index, the rename:
// every process calls it) and rethrows what the writing thread threw; the destructor waits.
class AsyncSave {
 public:
  AsyncSave() = default;
  AsyncSave(AsyncSave&&) noexcept;
  AsyncSave& operator=(AsyncSave&&) noexcept;
  ~AsyncSave();
  void wait();
  bool pending() const { return state_ != nullptr; }

  struct State;  // checkpoint.cpp

 private:
  friend AsyncSave save_async(const World&, const StateDict&, const std::string&, SourceLocation);
  std::unique_ptr<State> state_;
};

// save() with the files written by a background thread: returns once every piece is copied
// (on the device's stream order: the copies are taken now). The checkpoint exists after wait().
AsyncSave save_async(const World& world, const StateDict& state, const std::string& dir,
                     SourceLocation loc = SourceLocation::current());
// PyTorch's name (dcp.async_save), the one the API contract gives: save_async; without a world,
// the world of the state's DTensors (as save(state, dir)).
inline AsyncSave async_save(const World& world, const StateDict& state, const std::string& dir,
                            SourceLocation loc = SourceLocation::current()) {
  return save_async(world, state, dir, loc);
}
AsyncSave async_save(const StateDict& state, const std::string& dir,
                     SourceLocation loc = SourceLocation::current());

// Reads every entry of `state` from the checkpoint at `dir`, onto the entry's own mesh and
// placements. An entry that required grad stays a leaf that does. ConfigError as in the banner.
void load(const StateDict& state, const std::string& dir,
          SourceLocation loc = SourceLocation::current());

// What a checkpoint holds, from its index: key -> (shape, dtype, chunk count); for `spmd checkpoint
// inspect`. ConfigError for a folder without an index.
struct EntryInfo {
  Shape shape;
  DType dtype = DType::F32;
  std::string placements;
  size_t chunks = 0;
  uint64_t bytes = 0;
};
std::map<std::string, EntryInfo> inspect(const std::string& dir);

}  // namespace spmd::checkpoint
