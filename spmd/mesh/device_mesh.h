// spmd/mesh/device_mesh.h: DeviceMesh, an N-D arrangement of ranks, as a cheap handle on layouts.
//
// A DeviceMesh is (universe, one layout per dim, dim names). The MeshUniverse is shared by a root
// mesh and every mesh derived from it: the World, the device type, the 1-D rank map, the root's
// dims, the registry of flattened dims, and the communicator cache. A dim layout is one
// top-level mode over the rank map's positions (nested for a flattened non-contiguous dim), so
// slicing, flatten, unflatten, concatenate and one rank's coordinate only build small layouts:
// O(ndim) whatever the world size. Nothing copies the rank map; only groups(), coordinate() over
// all held ranks and rank_table() list ranks. This follows PyTorch's late-2025 DeviceMesh
// (_MeshLayout over a shared _rank_map) plus the per-universe communicator cache proposed in
// pytorch/pytorch#166010.
//
//   World world = World::sim(8);       // or any World holding some of ranks 0..7
//   DeviceMesh mesh = init_device_mesh(world, {2, 2, 2}, {"dp", "cp", "tp"});
//   mesh["tp"].groups("tp");           // [[0,1],[2,3],[4,5],[6,7]]
//   mesh[{"dp", "cp"}].flatten();      // 1-D "dp_cp" over 4:2: groups [[0,2,4,6],[1,3,5,7]]
//   mesh.unflatten("tp", {2, 1}, {"tp0", "tp1"});
//   mesh.local_rank("cp");             // PerRank {0: 0, 1: 0, 2: 1, 3: 1, 4: 0, ...}
//   fmt::print("{}", mesh);            // DeviceMesh((dp=2, cp=2, tp=2), stride=(4, 2, 1))
//   fmt::print("{}", mesh.to_grid());  // the ranks as one 2-D grid per dp coordinate
//
// Note [Sub-meshes and siblings]
// A sliced or unflattened mesh is, as in PyTorch, the same on every rank as a layout, but each
// rank sees "its" copy: mesh["tp"] on rank 5 is the tp group holding 5. The copies are the
// siblings: one per offset of complement(mesh layout, rank map size). Every rank of the rank map
// belongs to exactly one sibling, so contains(rank) is rank-map membership, coordinate() is each
// rank's coordinate in its own sibling, and rank_table() lists all siblings. Every mesh is kept
// tractable so that its siblings tile the rank map (the operations that could break this, such
// as concatenating dims split at incompatible radices, throw MeshError).
//
// Note [Mesh equality]
// Two meshes are equal when they have the same World, device type, rank map contents, dim names
// and dim layouts as functions (coalesced), as PyTorch compares (rank map, layout, names,
// device type). So two init_device_mesh calls with the same arguments give equal meshes, and a
// mesh loaded with from_json into the same World equals the saved one, although each has its
// own universe (its own flatten registry and communicator cache).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include <spmd/core/format.h>

#include <spmd/mesh/comm_cache.h>
#include <spmd/mesh/group_family.h>
#include <spmd/mesh/layout.h>
#include <spmd/tensor/tensor.h>
#include <spmd/world/per_rank.h>
#include <spmd/world/world.h>

namespace spmd {

// A mesh dim given by index (negative counts from the end) or by name.
class MeshDim {
 public:
  MeshDim(int index) : value_(index) {}                     // NOLINT: implicit by design
  MeshDim(std::string name) : value_(std::move(name)) {}    // NOLINT
  MeshDim(const char* name) : value_(std::string(name)) {}  // NOLINT

  bool is_index() const { return std::holds_alternative<int>(value_); }
  int index() const { return std::get<int>(value_); }
  const std::string& name() const { return std::get<std::string>(value_); }
  // "1" or "'tp'".
  std::string to_string() const;

 private:
  std::variant<int, std::string> value_;
};

class DeviceMesh;

// The state shared by a root mesh and every mesh derived from it (Note [Sub-meshes and
// siblings]). Thread-safe.
class MeshUniverse {
 public:
  MeshUniverse(World world, std::string device_type, std::shared_ptr<const RankMap> rank_map,
               std::vector<int64_t> root_shape, std::vector<std::string> root_names);

  const World& world() const { return world_; }
  const std::string& device_type() const { return device_type_; }
  const std::shared_ptr<const RankMap>& rank_map() const { return rank_map_; }
  // Positions in the rank map: the "world" every layout of this universe tiles.
  int64_t num_positions() const { return rank_map_->size(); }
  const std::vector<Layout>& root_dims() const { return root_dims_; }
  const std::vector<std::string>& root_names() const { return root_names_; }
  CommCache& comm_cache() const { return comm_cache_; }

  // The flattened dim registered under `name` (by DeviceMesh::flatten), if any.
  std::optional<Layout> flattened(const std::string& name) const;
  // Every registered flattened dim, by name.
  std::map<std::string, Layout> flattened_dims() const;
  // Registers `layout` (coalesced) under `name`, or returns the layout already registered there.
  Layout register_flattened(const std::string& name, const Layout& layout);

  // The family of groups of a dim layout, shared by every mesh of this universe (so the groups
  // are listed once per layout, not once per call).
  GroupFamily group_family(const Layout& dim_layout, const std::string& dim_name) const;

 private:
  World world_;
  std::string device_type_;
  std::shared_ptr<const RankMap> rank_map_;
  std::vector<Layout> root_dims_;
  std::vector<std::string> root_names_;
  mutable CommCache comm_cache_;
  mutable std::mutex mutex_;
  std::map<std::string, Layout> flattened_;
  mutable std::unordered_map<Layout, std::shared_ptr<const GroupFamily>> families_;
};

class DeviceMesh {
 public:
  // An undefined mesh; everything but defined() and assignment throws.
  DeviceMesh() = default;

  // A root mesh whose positions hold `ranks` (row-major over `shape`). Ranks must be distinct,
  // non-negative and below world.size(); names empty or one per dim, distinct, non-empty.
  static DeviceMesh from_ranks(const World& world, const std::vector<int64_t>& shape,
                               std::vector<int64_t> ranks, std::vector<std::string> dim_names = {});
  // The same from a tensor of rank ids (I64 or I32, any shape with at least one dim).
  static DeviceMesh from_ranks(const World& world, const Tensor& rank_ids,
                               std::vector<std::string> dim_names = {});

  bool defined() const { return universe_ != nullptr; }
  int ndim() const { return static_cast<int>(dims_.size()); }
  // Size of each dim.
  std::vector<int64_t> shape() const;
  // Number of ranks in the mesh (in one sibling).
  int64_t size() const;
  // Size of one dim (on the root mesh, a flattened dim's name works too).
  int64_t size(MeshDim dim) const;
  // Empty for an unnamed mesh.
  const std::vector<std::string>& dim_names() const { return names_; }
  bool has_dim_names() const { return !names_.empty(); }
  // "tp", or "dim 1" when the mesh is unnamed.
  std::string dim_name(int dim) const;
  // The index of `dim` among this mesh's dims (flattened dims of the root have none); MeshError
  // naming the mesh and the dim when it is out of range, unknown, or a name on an unnamed mesh.
  int resolve(MeshDim dim) const;
  const std::string& device_type() const;

  // ---- deriving meshes ----------------------------------------------------------------------
  // The sub-mesh of the named dims, which must be in ascending mesh order (dims may be skipped).
  // On the root mesh, dims flattened with flatten() are reachable by name too. MeshError for an
  // unnamed mesh, an unknown name, names out of order, or dims that overlap.
  DeviceMesh operator[](const std::string& name) const;
  DeviceMesh operator[](std::initializer_list<std::string> names) const;
  DeviceMesh operator[](const std::vector<std::string>& names) const;
  // The same by index or name.
  DeviceMesh slice(const std::vector<MeshDim>& dims) const;
  // All dims as one (layout: coalesce of the mesh layout), named `name` or the dim names joined
  // with '_'. Registered in the universe: the same name for the same layout returns an equal
  // mesh, for another layout is a MeshError, as is a name of a root dim or of another dim of
  // this mesh. A 1-D mesh flattened under its own name is itself.
  DeviceMesh flatten(const std::string& name = "") const;
  // `dim` split into dims of `sizes` (row-major), named `names` (one per size; empty for an
  // unnamed mesh). The new dims are not reachable by name from the root. MeshError when the
  // sizes do not multiply to size(dim), names clash or miscount, or the dim's layout cannot be
  // split that way (a flattened non-contiguous dim whose pieces are not layouts).
  DeviceMesh unflatten(MeshDim dim, const std::vector<int64_t>& sizes,
                       std::vector<std::string> names = {}) const;

  // ---- groups and coordinates ---------------------------------------------------------------
  // Every group along `dim`, ranks by coordinate, groups in PyTorch's global_ranks order. On the
  // root mesh `dim` may also name a flattened dim.
  std::vector<std::vector<int>> groups(MeshDim dim) const;
  // The same as a GroupFamily (cheap; shares the rank map and the universe's listed groups).
  GroupFamily group_family(MeshDim dim) const;
  // Whether the rank map holds `rank` (Note [Sub-meshes and siblings]).
  bool contains(int rank) const;
  // The coordinate of `rank` in its sibling mesh, or nullopt when not contained. O(ndim).
  std::optional<std::vector<int64_t>> coordinate_of(int rank) const;
  // Coordinates of the world's held ranks that the mesh contains.
  PerRank<std::vector<int64_t>> coordinate() const;
  // Each held, contained rank's coordinate along `dim` (its rank within its group).
  PerRank<int64_t> local_rank(MeshDim dim) const;

  // ---- layouts and tables -------------------------------------------------------------------
  // One top-level mode per dim: (2,4):(4,1); a flattened non-contiguous dim nests: ((2,2)):((4,1)).
  Layout layout() const;
  // The layout of one dim (on the root mesh, a flattened dim's name works too).
  Layout dim_layout(MeshDim dim) const;
  // The mesh tensor(s) as values: shape [num siblings, *shape()] (remap of layout()).
  RankTable rank_table_values() const;
  // The same as an I64 tensor: shape() when the mesh has one sibling (it covers the rank map),
  // else [num siblings, *shape()] with the siblings in PyTorch's global_ranks order.
  Tensor rank_table() const;
  // Number of sibling meshes (1 unless sliced or unflattened into a sub-mesh).
  int64_t num_siblings() const;

  const World& world() const;
  const std::shared_ptr<MeshUniverse>& universe() const { return universe_; }
  // A slot per dim for the communicator with default options: a fast path in front of
  // comm_cache() used by the functional collectives. Copies of this handle share the slots; the
  // communicators themselves are owned by the universe's cache, which outlives every handle.
  Communicator* cached_communicator(int dim) const;
  void cache_communicator(int dim, Communicator* comm) const;
  CommCache& comm_cache() const;
  // The root mesh of this universe.
  DeviceMesh root() const;
  bool is_root() const;

  // ---- save, load, print --------------------------------------------------------------------
  // JSON with the device type, rank map, root dims, flattened dims, and this mesh's dims and
  // names. No backend state: communicators are rebuilt on demand after loading.
  std::string to_json() const;
  // A mesh from to_json() text, in a new universe over `world` (its ranks must exist there; the
  // saved world size is informational). It equals the saved mesh (Note [Mesh equality]) and
  // gets the saved flatten registry, but shares no universe, registry or communicators with it.
  static DeviceMesh from_json(const World& world, std::string_view text);

  // Note [Mesh equality].
  bool operator==(const DeviceMesh& other) const;
  // Why this mesh and `other` are not equal, for messages: "they come from different Worlds
  // (world #1 (sim, 4 ranks) and world #2 (sim, 4 ranks)): ...", "they hold different ranks
  // (... over ranks [0, 1] vs ... over ranks [1, 0])", "their dims differ (A vs B)"; empty when
  // they are equal. Two meshes may print alike and still differ in their World or rank map.
  std::string difference(const DeviceMesh& other) const;
  std::size_t hash() const;
  // DeviceMesh((dp=2, tp=4), stride=(4, 1)); unnamed: DeviceMesh((2, 4), stride=(4, 1)); a
  // nested dim prints its strides as a tuple: DeviceMesh((dp_tp=4), stride=((4, 1),)).
  std::string to_string() const;
  // The ranks drawn as a grid: rows are the second-to-last dim, columns the last; higher dims
  // give one grid per leading coordinate; each sibling mesh is drawn in turn.
  std::string to_grid() const;

 private:
  friend DeviceMesh init_device_mesh(const World&, std::vector<int64_t>, std::vector<std::string>);
  friend DeviceMesh concatenate(const std::vector<DeviceMesh>&);
  // A mesh of `universe` over dims after checking they form a mesh whose siblings tile the rank
  // map (`op` and `source` name the operation and its input in errors).
  static DeviceMesh make(std::shared_ptr<MeshUniverse> universe, std::vector<Layout> dims,
                         std::vector<std::string> names, std::string_view op,
                         const std::function<std::string()>& source);
  const MeshUniverse& checked(const char* op) const;
  // Layout and display name of a dim, including the root's flattened dims by name.
  std::pair<Layout, std::string> find_dim(MeshDim dim, const char* op) const;

  std::shared_ptr<MeshUniverse> universe_;
  std::vector<Layout> dims_;
  std::vector<std::string> names_;
  std::shared_ptr<std::vector<std::atomic<Communicator*>>> comm_slots_;
};

// A root mesh of `shape` over ranks 0..product(shape)-1 (which must not exceed world.size()),
// named `dim_names` (empty, or one distinct non-empty name per dim).
DeviceMesh init_device_mesh(const World& world, std::vector<int64_t> shape,
                            std::vector<std::string> dim_names = {});

// The dims of `meshes`, in order, as one mesh. All must come from one universe, be all named or
// all unnamed, and not overlap; MeshError naming the meshes otherwise.
DeviceMesh concatenate(const std::vector<DeviceMesh>& meshes);

std::ostream& operator<<(std::ostream& os, const DeviceMesh& mesh);

}  // namespace spmd

template <>
struct std::hash<spmd::DeviceMesh> {
  std::size_t operator()(const spmd::DeviceMesh& mesh) const noexcept { return mesh.hash(); }
};

SPMD_FORMAT_AS_TEXT(spmd::DeviceMesh, value.to_string())
