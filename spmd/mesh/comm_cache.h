// spmd/mesh/comm_cache.h: the communicators of one mesh universe, one per (dim layout, options).
//
// Every mesh derived from one root shares one CommCache (through its MeshUniverse). A
// communicator serves the groups of a dim, and those groups depend only on the dim's layout
// over the shared rank map, so the cache is keyed by the layout in canonical (coalesced) form
// plus the backend options. Two unflattens that produce the same dim layout (the
// expert-parallel case: world -> (dp, cp, tp) and world -> (dp, ep, ep_tp) make cp and ep the
// same 2:2) therefore get one communicator, not two (PyTorch proposed this in #166010 and
// still creates one process group per unflatten).
//
//   CommCache& cache = mesh.comm_cache();
//   auto comm = cache.get_or_create(mesh.dim_layout("tp"), {.backend = "nccl"},
//                                   [&] { return backend.make_communicator(...); });
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <spmd/mesh/layout.h>

namespace spmd {

class Communicator;  // collectives/backend.h; the cache only stores pointers

// The backend and its parameters a communicator is built with. Part of the cache key.
struct CommOptions {
  std::string backend;  // empty: the world's default backend
  std::vector<std::pair<std::string, std::string>> params;

  bool operator==(const CommOptions&) const = default;
  std::size_t hash() const;
  // "default", "nccl", or "nccl{blocking=0, algo=ring}".
  std::string to_string() const;
};

// Thread-safe.
class CommCache {
 public:
  CommCache() = default;
  CommCache(const CommCache&) = delete;
  CommCache& operator=(const CommCache&) = delete;

  // The communicator for (layout, options), built by `make` on first use; later calls return the
  // same object. Only one caller builds a given key; others for that key wait for it. `make` may
  // call get_or_create for other keys (a split from the world communicator, say). When `make`
  // throws, nothing is cached and the exception propagates. A null result is an error.
  std::shared_ptr<Communicator> get_or_create(
      const Layout& layout, const CommOptions& options,
      const std::function<std::shared_ptr<Communicator>()>& make);
  // The communicator for (layout, options) if one was built, else null.
  std::shared_ptr<Communicator> find(const Layout& layout, const CommOptions& options) const;
  // Number of communicators built.
  std::size_t size() const;

 private:
  struct Key {
    Layout layout;  // coalesced
    CommOptions options;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& key) const;
  };
  struct Entry {
    std::mutex mutex;  // held while building
    std::shared_ptr<Communicator> comm;
  };

  mutable std::mutex mutex_;
  std::unordered_map<Key, std::shared_ptr<Entry>, KeyHash> entries_;
  std::size_t built_ = 0;  // guarded by mutex_
};

}  // namespace spmd
