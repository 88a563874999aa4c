// spmd/mesh/device_mesh.cpp: DeviceMesh over a shared MeshUniverse (Note [Sub-meshes and
// siblings]).
#include <spmd/mesh/device_mesh.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <ostream>
#include <set>
#include <type_traits>
#include <utility>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <spmd/core/error.h>
#include <spmd/core/hash.h>
#include <spmd/ops/ops.h>

namespace spmd {
namespace {

std::string join(const std::vector<std::string>& names, std::string_view sep) {
  std::string out;
  for (size_t k = 0; k < names.size(); ++k) {
    if (k) out += sep;
    out += names[k];
  }
  return out;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return fmt::format("({},)", shape[0]);
  return fmt::format("({})", fmt::join(shape, ", "));
}

// `op` for messages: a string, or a callable that formats one (only when an error is thrown, so
// the success path formats nothing).
template <class Op>
std::string op_text(const Op& op) {
  if constexpr (std::is_invocable_v<Op>) {
    return op();
  } else {
    return std::string(op);
  }
}

// Names are empty (unnamed) or one distinct, non-empty name per dim.
template <class Op>
void validate_names(const std::vector<std::string>& names, size_t ndim, const Op& op_name) {
  if (names.empty()) return;
  auto op = [&] { return op_text(op_name); };
  if (names.size() != ndim) {
    throw_error<MeshError>("{}: {} dim names [{}] for {} dims", op(), names.size(),
                           quoted_list(names), ndim);
  }
  std::set<std::string> seen;
  for (const std::string& n : names) {
    if (n.empty())
      throw_error<MeshError>("{}: dim names [{}] include an empty name", op(), quoted_list(names));
    if (!seen.insert(n).second) {
      throw_error<MeshError>("{}: dim names [{}] repeat '{}'", op(), quoted_list(names), n);
    }
  }
}

void validate_shape(const std::vector<int64_t>& shape, std::string_view op) {
  if (shape.empty()) throw_error<MeshError>("{}: a mesh needs at least one dim", op);
  for (int64_t s : shape) {
    if (s < 1)
      throw_error<MeshError>("{}: mesh shape {} has a dim of size {}", op, shape_text(shape), s);
  }
}

// The smallest and largest stride of the modes of size > 1, if any.
std::optional<std::pair<int64_t, int64_t>> stride_range(const Layout& layout) {
  std::optional<std::pair<int64_t, int64_t>> out;
  for (int k = 0; k < layout.num_leaves(); ++k) {
    if (layout.leaf_sizes()[k] == 1) continue;
    int64_t d = layout.leaf_strides()[k];
    if (!out) {
      out = std::pair{d, d};
    } else {
      out->first = std::min(out->first, d);
      out->second = std::max(out->second, d);
    }
  }
  return out;
}

// Python-tuple text of a dim's strides: 4, or (4, 1) for a nested dim.
std::string stride_text(const Layout& layout) {
  if (layout.is_scalar()) return std::to_string(layout.leaf_strides()[0]);
  std::vector<std::string> parts;
  for (int i = 0; i < layout.num_modes(); ++i) parts.push_back(stride_text(layout.mode(i)));
  return fmt::format("({}{})", join(parts, ", "), parts.size() == 1 ? "," : "");
}

}  // namespace

std::string MeshDim::to_string() const {
  return is_index() ? std::to_string(index()) : fmt::format("'{}'", name());
}

// ---- MeshUniverse -----------------------------------------------------------------------------

namespace {

// Records a new mesh's dim names (dim_name's "dim 0", ... when unnamed) as axes of its world.
void note_axis_names(const World& world, const std::vector<std::string>& names, size_t ndim) {
  if (!world.defined() || world.axis_names() == nullptr) return;
  if (!names.empty()) {
    world.axis_names()->add(names);
    return;
  }
  std::vector<std::string> unnamed;
  for (size_t i = 0; i < ndim; ++i) unnamed.push_back(fmt::format("dim {}", i));
  world.axis_names()->add(unnamed);
}

}  // namespace

MeshUniverse::MeshUniverse(World world, std::string device_type,
                           std::shared_ptr<const RankMap> rank_map, std::vector<int64_t> root_shape,
                           std::vector<std::string> root_names)
    : world_(std::move(world)),
      device_type_(std::move(device_type)),
      rank_map_(std::move(rank_map)),
      root_names_(std::move(root_names)) {
  Layout root = Layout::row_major(root_shape);
  for (int i = 0; i < root.num_modes(); ++i) root_dims_.push_back(root.mode(i));
  note_axis_names(world_, root_names_, root_dims_.size());
}

std::optional<Layout> MeshUniverse::flattened(const std::string& name) const {
  std::lock_guard lock(mutex_);
  auto it = flattened_.find(name);
  if (it == flattened_.end()) return std::nullopt;
  return it->second;
}

std::map<std::string, Layout> MeshUniverse::flattened_dims() const {
  std::lock_guard lock(mutex_);
  return flattened_;
}

Layout MeshUniverse::register_flattened(const std::string& name, const Layout& layout) {
  std::lock_guard lock(mutex_);
  return flattened_.emplace(name, layout).first->second;
}

GroupFamily MeshUniverse::group_family(const Layout& dim_layout,
                                       const std::string& dim_name) const {
  std::shared_ptr<const GroupFamily> family;
  {
    std::lock_guard lock(mutex_);
    auto it = families_.find(dim_layout);
    if (it != families_.end()) family = it->second;
  }
  if (!family) {
    auto built = std::make_shared<const GroupFamily>(dim_layout, rank_map_, dim_name);
    std::lock_guard lock(mutex_);
    family = families_.emplace(dim_layout, std::move(built)).first->second;
  }
  return family->with_dim_name(dim_name);
}

// ---- construction -----------------------------------------------------------------------------

DeviceMesh DeviceMesh::make(std::shared_ptr<MeshUniverse> universe, std::vector<Layout> dims,
                            std::vector<std::string> names, std::string_view op,
                            const std::function<std::string()>& source) {
  Layout layout = Layout::from_modes(dims);
  if (!is_tractable(layout)) {
    if (!check_non_overlap(layout)) {
      throw_error<MeshError>(
          "{}: {}: the selected dims overlap (layout {} reaches some rank twice); overlapping "
          "dims cannot form a mesh",
          op, source(), layout);
    }
    throw_error<MeshError>(
        "{}: {}: the result, layout {}, is not tractable (its modes sorted by stride do not nest), "
        "so its sibling meshes would not tile the {} ranks of the root",
        op, source(), layout, universe->num_positions());
  }
  int64_t n = universe->num_positions();
  if (n % spmd::size(layout) != 0 || spmd::size(complement(layout, n)) * spmd::size(layout) != n) {
    throw_error<MeshError>("{}: {}: the result, layout {}, does not tile the {} ranks of the root",
                           op, source(), layout, n);
  }
  DeviceMesh mesh;
  // A slice keeps names its world knows; unflatten, concatenate and saved meshes may bring new
  // ones.
  if (op != "slice") note_axis_names(universe->world(), names, dims.size());
  mesh.universe_ = std::move(universe);
  mesh.dims_ = std::move(dims);
  mesh.names_ = std::move(names);
  mesh.comm_slots_ = std::make_shared<std::vector<std::atomic<Communicator*>>>(mesh.dims_.size());
  return mesh;
}

DeviceMesh DeviceMesh::from_ranks(const World& world, const std::vector<int64_t>& shape,
                                  std::vector<int64_t> ranks, std::vector<std::string> dim_names) {
  constexpr std::string_view op = "DeviceMesh::from_ranks";
  validate_shape(shape, op);
  validate_names(dim_names, shape.size(), op);
  int64_t numel = 1;
  for (int64_t s : shape) {
    if (__builtin_mul_overflow(numel, s, &numel)) {
      throw_error<MeshError>("{}: the size of mesh shape {} overflows int64 ({} ranks given)", op,
                             shape_text(shape), ranks.size());
    }
  }
  if (numel != static_cast<int64_t>(ranks.size())) {
    throw_error<MeshError>("{}: shape {} needs {} ranks, got {}", op, shape_text(shape), numel,
                           ranks.size());
  }
  // The reference world of a parity run: the same dim names, every dim of size 1 but the kept
  // ones (pp, and those local code needs), whose coordinates are ranks 0, 1, ... (Note [Parity
  // run] in debug/parity.h). A mesh without kept dims is its first rank when the reference holds
  // it (a stage mesh made from a pp mesh's rank table there), else rank 0.
  std::vector<int64_t> sizes = shape;
  if (world.state().parity_reference) {
    const std::vector<std::string>& keep = world.state().parity_kept_dims;
    int64_t kept = 1;
    for (size_t d = 0; d < sizes.size(); ++d) {
      if (std::find(keep.begin(), keep.end(), dim_names[d]) != keep.end()) {
        kept *= sizes[d];
      } else {
        sizes[d] = 1;
      }
    }
    const auto& held = world.held_ranks();
    if (kept > static_cast<int64_t>(held.size())) throw ParityRestart{kept, {}, {}};
    const int64_t first = ranks.empty() ? 0 : ranks.front();
    if (kept == 1) {
      ranks = {std::find(held.begin(), held.end(), first) != held.end() ? first : 0};
    } else {
      ranks.resize(static_cast<size_t>(kept));
      std::iota(ranks.begin(), ranks.end(), 0);
    }
  }
  auto rank_map = RankMap::make(std::move(ranks), world.size(), op);
  auto universe = std::make_shared<MeshUniverse>(world, world.device_type(), std::move(rank_map),
                                                 sizes, dim_names);
  DeviceMesh mesh;
  mesh.dims_ = universe->root_dims();
  mesh.names_ = std::move(dim_names);
  mesh.universe_ = std::move(universe);
  mesh.comm_slots_ = std::make_shared<std::vector<std::atomic<Communicator*>>>(mesh.dims_.size());
  return mesh;
}

DeviceMesh DeviceMesh::from_ranks(const World& world, const Tensor& rank_ids,
                                  std::vector<std::string> dim_names) {
  if (!rank_ids.defined()) {
    throw_error<MeshError>("DeviceMesh::from_ranks: the rank tensor is undefined");
  }
  if (rank_ids.dtype() != DType::I64 && rank_ids.dtype() != DType::I32) {
    throw_error<MeshError>("DeviceMesh::from_ranks: rank ids must be I64 (or I32), got {}",
                           dtype_name(rank_ids.dtype()));
  }
  if (rank_ids.dim() == 0) {
    throw_error<MeshError>("DeviceMesh::from_ranks: rank ids must have at least one dim");
  }
  return from_ranks(world, rank_ids.shape(), rank_ids.to_vector<int64_t>(), std::move(dim_names));
}

DeviceMesh init_device_mesh(const World& world, std::vector<int64_t> shape,
                            std::vector<std::string> dim_names) {
  constexpr std::string_view op = "init_device_mesh";
  validate_shape(shape, op);
  validate_names(dim_names, shape.size(), op);
  int64_t numel = 1;
  for (int64_t s : shape) {
    if (__builtin_mul_overflow(numel, s, &numel)) {
      throw_error<MeshError>(
          "{}: mesh shape {} has more ranks than an int64 holds (the product overflows) but the "
          "world has only {}",
          op, shape_text(shape), world.size());
    }
  }
  if (numel > world.size() && !world.state().parity_reference) {
    throw_error<MeshError>("{}: mesh shape {} has {} ranks but the world has only {}", op,
                           shape_text(shape), numel, world.size());
  }
  std::vector<int64_t> ranks(static_cast<size_t>(numel));
  std::iota(ranks.begin(), ranks.end(), 0);
  return DeviceMesh::from_ranks(world, shape, std::move(ranks), std::move(dim_names));
}

// ---- accessors --------------------------------------------------------------------------------

const MeshUniverse& DeviceMesh::checked(const char* op) const {
  if (!universe_) throw_error<MeshError>("DeviceMesh::{}: the mesh is undefined", op);
  return *universe_;
}

std::vector<int64_t> DeviceMesh::shape() const {
  checked("shape");
  std::vector<int64_t> out;
  out.reserve(dims_.size());
  for (const Layout& d : dims_) out.push_back(spmd::size(d));
  return out;
}

int64_t DeviceMesh::size() const {
  checked("size");
  int64_t n = 1;
  for (const Layout& d : dims_) n *= spmd::size(d);
  return n;
}

int64_t DeviceMesh::size(MeshDim dim) const {
  return spmd::size(find_dim(std::move(dim), "size").first);
}

std::string DeviceMesh::dim_name(int dim) const {
  checked("dim_name");
  if (dim < 0 || dim >= ndim()) {
    throw_error<MeshError>("{}: dim {} is out of range for a {}-D mesh", to_string(), dim, ndim());
  }
  return names_.empty() ? fmt::format("dim {}", dim) : names_[dim];
}

int DeviceMesh::resolve(MeshDim dim) const {
  checked("resolve");
  if (dim.is_index()) {
    int i = dim.index();
    if (i < -ndim() || i >= ndim()) {
      throw_error<MeshError>("{}: dim {} is out of range for a {}-D mesh (expected [{}, {}))",
                             to_string(), i, ndim(), -ndim(), ndim());
    }
    return i < 0 ? i + ndim() : i;
  }
  const std::string& name = dim.name();
  if (names_.empty()) {
    throw_error<MeshError>(
        "{}: the mesh has no dim names, so dim '{}' cannot be found; use an index", to_string(),
        name);
  }
  auto it = std::find(names_.begin(), names_.end(), name);
  if (it == names_.end()) {
    throw_error<MeshError>("{}: unknown dim '{}' (the dims are {})", to_string(), name,
                           quoted_list(names_));
  }
  return static_cast<int>(it - names_.begin());
}

const std::string& DeviceMesh::device_type() const {
  return checked("device_type").device_type();
}

const World& DeviceMesh::world() const {
  return checked("world").world();
}

CommCache& DeviceMesh::comm_cache() const {
  return checked("comm_cache").comm_cache();
}

DeviceMesh DeviceMesh::root() const {
  const MeshUniverse& u = checked("root");
  DeviceMesh mesh;
  mesh.universe_ = universe_;
  mesh.dims_ = u.root_dims();
  mesh.names_ = u.root_names();
  mesh.comm_slots_ = std::make_shared<std::vector<std::atomic<Communicator*>>>(mesh.dims_.size());
  return mesh;
}

bool DeviceMesh::is_root() const {
  const MeshUniverse& u = checked("is_root");
  return dims_ == u.root_dims() && names_ == u.root_names();
}

Layout DeviceMesh::layout() const {
  checked("layout");
  return Layout::from_modes(dims_);
}

Layout DeviceMesh::dim_layout(MeshDim dim) const {
  return find_dim(std::move(dim), "dim_layout").first;
}

std::pair<Layout, std::string> DeviceMesh::find_dim(MeshDim dim, const char* op) const {
  const MeshUniverse& u = checked(op);
  if (!dim.is_index()) {
    auto it = std::find(names_.begin(), names_.end(), dim.name());
    if (it == names_.end() && is_root()) {
      if (auto flat = u.flattened(dim.name())) return {*flat, dim.name()};
    }
  }
  int i = resolve(dim);
  return {dims_[i], dim_name(i)};
}

// ---- deriving meshes --------------------------------------------------------------------------

DeviceMesh DeviceMesh::operator[](const std::string& name) const {
  return (*this)[std::vector<std::string>{name}];
}

DeviceMesh DeviceMesh::operator[](std::initializer_list<std::string> names) const {
  return (*this)[std::vector<std::string>(names)];
}

DeviceMesh DeviceMesh::operator[](const std::vector<std::string>& names) const {
  checked("operator[]");
  if (names_.empty()) {
    throw_error<MeshError>("{}[{}]: cannot slice a mesh without dim names by name", to_string(),
                           quoted_list(names));
  }
  return slice(std::vector<MeshDim>(names.begin(), names.end()));
}

DeviceMesh DeviceMesh::slice(const std::vector<MeshDim>& dims) const {
  const MeshUniverse& u = checked("slice");
  auto source = [&] {
    std::vector<std::string> requested;
    for (const MeshDim& d : dims) requested.push_back(d.is_index() ? d.to_string() : d.name());
    return fmt::format("{}[{}]", to_string(), quoted_list(requested));
  };
  if (dims.empty()) throw_error<MeshError>("{}: select at least one dim", source());

  struct Pick {
    Layout layout;
    std::string name;
    int index;  // -1 for a flattened dim of the root
  };
  std::vector<Pick> picks;
  picks.reserve(dims.size());
  const bool root = is_root();
  for (const MeshDim& d : dims) {
    if (!d.is_index() && root &&
        std::find(names_.begin(), names_.end(), d.name()) == names_.end()) {
      if (auto flat = u.flattened(d.name())) {
        picks.push_back({*flat, d.name(), -1});
        continue;
      }
    }
    if (!d.is_index() && !names_.empty() &&
        std::find(names_.begin(), names_.end(), d.name()) == names_.end()) {
      std::string hint;
      if (!root && u.flattened(d.name())) {
        hint = fmt::format("; '{}' is a flattened dim, reachable by name only from the root mesh",
                           d.name());
      }
      throw_error<MeshError>("{}: unknown dim '{}' (the dims are {}){}", source(), d.name(),
                             quoted_list(names_), hint);
    }
    int i = resolve(d);
    picks.push_back({dims_[i], names_.empty() ? "" : names_[i], i});
  }

  for (size_t a = 0; a < picks.size(); ++a) {
    for (size_t b = a + 1; b < picks.size(); ++b) {
      bool same =
          picks[a].index >= 0 ? picks[a].index == picks[b].index : picks[a].name == picks[b].name;
      if (same) {
        throw_error<MeshError>("{}: dim '{}' is selected twice (overlapping dims)", source(),
                               picks[a].index >= 0 ? dim_name(picks[a].index) : picks[a].name);
      }
    }
  }
  // Mesh dims must keep their order; a flattened dim of the root is placed by its strides.
  int last_index = -1;
  std::string last_name;
  for (const Pick& p : picks) {
    if (p.index < 0) continue;
    if (p.index < last_index) {
      throw_error<MeshError>(
          "{}: dims must be selected in ascending mesh order, but '{}' comes after '{}'", source(),
          dim_name(p.index), last_name);
    }
    last_index = p.index;
    last_name = dim_name(p.index);
  }
  bool any_flattened =
      std::any_of(picks.begin(), picks.end(), [](const Pick& p) { return p.index < 0; });
  if (any_flattened && picks.size() > 1) {
    for (const Pick& p : picks) {
      if (p.index < 0 && coalesce(p.layout).num_leaves() > 1) {
        throw_error<MeshError>(
            "{}: the flattened dim '{}' (layout {}) is not contiguous; it can only be sliced on "
            "its "
            "own",
            source(), p.name, p.layout);
      }
    }
    for (size_t k = 0; k + 1 < picks.size(); ++k) {
      auto outer = stride_range(picks[k].layout);
      auto inner = stride_range(picks[k + 1].layout);
      if (outer && inner && outer->first <= inner->second) {
        throw_error<MeshError>(
            "{}: dims must be selected in ascending mesh order, but '{}' (layout {}) lies inside "
            "or after '{}' (layout {})",
            source(), picks[k].name, picks[k].layout, picks[k + 1].name, picks[k + 1].layout);
      }
    }
  }

  if (picks.size() == dims_.size() && !any_flattened) {
    bool identity = true;
    for (size_t k = 0; k < picks.size(); ++k) identity &= picks[k].index == static_cast<int>(k);
    if (identity) return *this;
  }
  std::vector<Layout> layouts;
  std::vector<std::string> names;
  layouts.reserve(picks.size());
  for (Pick& p : picks) {
    layouts.push_back(std::move(p.layout));
    if (!names_.empty() || p.index < 0) names.push_back(std::move(p.name));
  }
  if (!names.empty() && names.size() != layouts.size()) {
    throw_error<MeshError>(
        "{}: an unnamed mesh cannot mix flattened dims (which have names) with its own dims",
        source());
  }
  return make(universe_, std::move(layouts), std::move(names), "slice", source);
}

DeviceMesh DeviceMesh::flatten(const std::string& name) const {
  checked("flatten");
  MeshUniverse& u = *universe_;
  std::string flat_name = name;
  if (flat_name.empty()) {
    if (names_.empty()) {
      throw_error<MeshError>("flatten: {} has no dim names, so the flattened dim needs a name",
                             to_string());
    }
    flat_name = join(names_, "_");
  }
  if (ndim() == 1 && !names_.empty() && names_[0] == flat_name) return *this;
  const auto& root_names = u.root_names();
  if (std::find(root_names.begin(), root_names.end(), flat_name) != root_names.end()) {
    throw_error<MeshError>("flatten: {}: '{}' already exists as a dim of the root mesh {}",
                           to_string(), flat_name, root().to_string());
  }
  if (std::find(names_.begin(), names_.end(), flat_name) != names_.end()) {
    throw_error<MeshError>("flatten: {}: '{}' is already a dim of this mesh", to_string(),
                           flat_name);
  }
  Layout flat = coalesce(layout());
  Layout registered = u.register_flattened(flat_name, flat);
  if (registered != flat) {
    throw_error<MeshError>(
        "flatten: {}: a dim named '{}' was already flattened with layout {}; this mesh flattens to "
        "{}",
        to_string(), flat_name, registered, flat);
  }
  note_axis_names(u.world(), {flat_name}, 1);
  DeviceMesh mesh;
  mesh.universe_ = universe_;
  mesh.dims_ = {std::move(flat)};
  mesh.names_ = {std::move(flat_name)};
  mesh.comm_slots_ = std::make_shared<std::vector<std::atomic<Communicator*>>>(1);
  return mesh;
}

DeviceMesh DeviceMesh::unflatten(MeshDim dim, const std::vector<int64_t>& requested,
                                 std::vector<std::string> names) const {
  checked("unflatten");
  int d = resolve(dim);
  // The one-rank world of a parity run: the new dims have size 1 as every other (Note [Parity
  // run] in debug/parity.h); the sizes asked for are still checked.
  std::vector<int64_t> sizes = requested;
  if (world().state().parity_reference && spmd::size(dims_[d]) == 1 &&
      std::all_of(requested.begin(), requested.end(), [](int64_t s) { return s >= 1; })) {
    std::fill(sizes.begin(), sizes.end(), 1);
  }
  auto source = [&] { return fmt::format("unflatten: {}: dim '{}'", to_string(), dim_name(d)); };
  if (sizes.empty()) throw_error<MeshError>("{}: give at least one size", source());
  int64_t product = 1;
  for (int64_t s : sizes) {
    if (s < 1) throw_error<MeshError>("{}: sizes {} include {}", source(), shape_text(sizes), s);
    if (__builtin_mul_overflow(product, s, &product)) {
      throw_error<MeshError>(
          "{}: sizes {} multiply to more than an int64 holds, but the dim has {} "
          "ranks",
          source(), shape_text(sizes), spmd::size(dims_[d]));
    }
  }
  if (product != spmd::size(dims_[d])) {
    throw_error<MeshError>("{}: sizes {} multiply to {} but the dim has {} ranks", source(),
                           shape_text(sizes), product, spmd::size(dims_[d]));
  }
  if (names_.empty()) {
    if (!names.empty()) {
      throw_error<MeshError>("{}: the mesh is unnamed, so its new dims cannot be named [{}]",
                             source(), quoted_list(names));
    }
  } else {
    if (names.size() != sizes.size()) {
      throw_error<MeshError>("{}: {} names [{}] for {} sizes {}", source(), names.size(),
                             quoted_list(names), sizes.size(), shape_text(sizes));
    }
    validate_names(names, sizes.size(), source);
    for (int k = 0; k < ndim(); ++k) {
      if (k == d) continue;
      if (std::find(names.begin(), names.end(), names_[k]) != names.end()) {
        throw_error<MeshError>("{}: new name '{}' clashes with another dim of the mesh", source(),
                               names_[k]);
      }
    }
  }
  Layout split;
  try {
    split = composition(dims_[d], Layout::row_major(sizes));
  } catch (const MeshError& e) {
    throw_error<MeshError>("{}: its layout {} cannot be split into {}: {}", source(), dims_[d],
                           shape_text(sizes), e.what());
  }
  std::vector<Layout> dims(dims_.begin(), dims_.begin() + d);
  for (int i = 0; i < split.num_modes(); ++i) dims.push_back(split.mode(i));
  dims.insert(dims.end(), dims_.begin() + d + 1, dims_.end());
  std::vector<std::string> new_names;
  if (!names_.empty()) {
    new_names.assign(names_.begin(), names_.begin() + d);
    new_names.insert(new_names.end(), names.begin(), names.end());
    new_names.insert(new_names.end(), names_.begin() + d + 1, names_.end());
  }
  return make(universe_, std::move(dims), std::move(new_names), "unflatten", source);
}

DeviceMesh concatenate(const std::vector<DeviceMesh>& meshes) {
  if (meshes.empty()) throw_error<MeshError>("concatenate: no meshes given");
  for (const DeviceMesh& m : meshes) m.checked("concatenate");
  auto source = [&] {
    std::vector<std::string> described;
    for (const DeviceMesh& m : meshes) described.push_back(m.to_string());
    return fmt::format("[{}]", join(described, ", "));
  };
  const auto& universe = meshes[0].universe();
  std::vector<Layout> dims;
  std::vector<std::string> names;
  for (const DeviceMesh& m : meshes) {
    if (m.universe() != universe) {
      const World& a = universe->world();
      const World& b = m.universe()->world();
      throw_error<MeshError>(
          "concatenate: {}: {} and {} come from different root meshes{}; only meshes derived from "
          "one root can be concatenated",
          source(), meshes[0].to_string(), m.to_string(),
          a == b ? std::string()
                 : fmt::format(" of different Worlds ({} and {})", a.to_string(), b.to_string()));
    }
    if (m.has_dim_names() != meshes[0].has_dim_names()) {
      throw_error<MeshError>("concatenate: {}: the meshes must be all named or all unnamed",
                             source());
    }
    dims.insert(dims.end(), m.dims_.begin(), m.dims_.end());
    names.insert(names.end(), m.names_.begin(), m.names_.end());
  }
  std::set<std::string> seen;
  for (const std::string& n : names) {
    if (!seen.insert(n).second) {
      throw_error<MeshError>("concatenate: {}: dim name '{}' appears twice", source(), n);
    }
  }
  return DeviceMesh::make(universe, std::move(dims), std::move(names), "concatenate", source);
}

// ---- groups and coordinates -------------------------------------------------------------------

std::vector<std::vector<int>> DeviceMesh::groups(MeshDim dim) const {
  auto [l, name] = find_dim(std::move(dim), "groups");
  const std::vector<int64_t>& ranks = universe_->rank_map()->ranks;
  std::vector<int64_t> inner = codomain(l);
  std::vector<int64_t> outer = codomain(complement(l, universe_->num_positions()));
  std::vector<std::vector<int>> out(outer.size());
  for (size_t g = 0; g < outer.size(); ++g) {
    out[g].reserve(inner.size());
    for (int64_t i : inner) out[g].push_back(static_cast<int>(ranks[outer[g] + i]));
  }
  return out;
}

GroupFamily DeviceMesh::group_family(MeshDim dim) const {
  auto [l, name] = find_dim(std::move(dim), "group_family");
  return universe_->group_family(l, name);
}

bool DeviceMesh::contains(int rank) const {
  return checked("contains").rank_map()->position(rank) >= 0;
}

std::optional<std::vector<int64_t>> DeviceMesh::coordinate_of(int rank) const {
  int64_t p = checked("coordinate_of").rank_map()->position(rank);
  if (p < 0) return std::nullopt;
  std::vector<int64_t> coord(dims_.size());
  for (size_t d = 0; d < dims_.size(); ++d) coord[d] = radix_index(dims_[d], p);
  return coord;
}

PerRank<std::vector<int64_t>> DeviceMesh::coordinate() const {
  const MeshUniverse& u = checked("coordinate");
  std::vector<int> ranks;
  std::vector<std::vector<int64_t>> coords;
  for (int r : u.world().held_ranks()) {
    int64_t p = u.rank_map()->position(r);
    if (p < 0) continue;
    std::vector<int64_t>& c = coords.emplace_back(dims_.size());
    for (size_t d = 0; d < dims_.size(); ++d) c[d] = radix_index(dims_[d], p);
    ranks.push_back(r);
  }
  return PerRank<std::vector<int64_t>>(std::move(ranks), std::move(coords));
}

PerRank<int64_t> DeviceMesh::local_rank(MeshDim dim) const {
  auto [l, name] = find_dim(std::move(dim), "local_rank");
  const MeshUniverse& u = *universe_;
  std::vector<int> ranks;
  std::vector<int64_t> values;
  for (int r : u.world().held_ranks()) {
    int64_t p = u.rank_map()->position(r);
    if (p < 0) continue;
    ranks.push_back(r);
    values.push_back(radix_index(l, p));
  }
  return PerRank<int64_t>(std::move(ranks), std::move(values));
}

// ---- tables -----------------------------------------------------------------------------------

int64_t DeviceMesh::num_siblings() const {
  return checked("num_siblings").num_positions() / size();
}

RankTable DeviceMesh::rank_table_values() const {
  const MeshUniverse& u = checked("rank_table");
  return remap(layout(), u.rank_map()->ranks);
}

Tensor DeviceMesh::rank_table() const {
  RankTable table = rank_table_values();
  Shape shape = table.shape;
  if (shape[0] == 1) shape.erase(shape.begin());
  return from_vector<int64_t>(table.values, shape);
}

// ---- save and load ----------------------------------------------------------------------------

std::string DeviceMesh::to_json() const {
  const MeshUniverse& u = checked("to_json");
  nlohmann::json j;
  j["format"] = "spmdsim.DeviceMesh";
  j["version"] = 1;
  j["device_type"] = u.device_type();
  j["world_size"] = u.world().size();
  j["rank_map"] = u.rank_map()->ranks;
  std::vector<int64_t> root_shape;
  for (const Layout& d : u.root_dims()) root_shape.push_back(spmd::size(d));
  j["root"] = {{"shape", root_shape}, {"dim_names", u.root_names()}};
  nlohmann::json flattened = nlohmann::json::object();
  for (const auto& [name, l] : u.flattened_dims()) flattened[name] = l.to_string();
  j["flattened"] = flattened;
  std::vector<std::string> dims;
  for (const Layout& d : dims_) dims.push_back(d.to_string());
  j["dims"] = dims;
  j["dim_names"] = names_;
  return j.dump();
}

DeviceMesh DeviceMesh::from_json(const World& world, std::string_view text) {
  constexpr std::string_view op = "DeviceMesh::from_json";
  auto parse_saved = [&](const std::string& layout, const std::string& what) {
    try {
      return Layout::parse(layout);
    } catch (const MeshError& e) {
      throw_error<MeshError>("{}: {}: {}", op, what, e.what());
    }
  };
  // A list of integers, strictly: nlohmann would truncate 1.5 to 1.
  auto integers = [&](const nlohmann::json& v, std::string_view what) {
    std::vector<int64_t> out;
    if (v.is_array()) {
      for (const nlohmann::json& item : v) {
        if (!item.is_number_integer()) break;
        if (item.is_number_unsigned() &&
            item.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          break;
        }
        out.push_back(item.get<int64_t>());
      }
      if (out.size() == v.size()) return out;
    }
    throw_error<MeshError>(
        "{}: \"{}\" must be a list of integers, got {}", op, what,
        v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).substr(0, 80));
  };
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    if (!j.is_object()) {
      throw_error<MeshError>("{}: expected a JSON object, got a JSON {}", op, j.type_name());
    }
    if (j.value("format", "") != "spmdsim.DeviceMesh" || j.value("version", 0) != 1) {
      throw_error<MeshError>(
          "{}: not a version-1 spmdsim.DeviceMesh document (format {}, version {})", op,
          j.contains("format") ? j.at("format").dump() : "missing",
          j.contains("version") ? j.at("version").dump() : "missing");
    }
    const std::string device_type = j.at("device_type").get<std::string>();
    if (device_type != "cpu" && device_type != "cuda") {
      throw_error<MeshError>("{}: \"device_type\" must be \"cpu\" or \"cuda\", got \"{}\"", op,
                             device_type);
    }
    auto ranks = integers(j.at("rank_map"), "rank_map");
    auto root_shape = integers(j.at("root").at("shape"), "root.shape");
    auto root_names = j.at("root").at("dim_names").get<std::vector<std::string>>();
    validate_shape(root_shape, op);
    validate_names(root_names, root_shape.size(), op);
    if (spmd::size(Layout::row_major(root_shape)) != static_cast<int64_t>(ranks.size())) {
      throw_error<MeshError>("{}: root shape {} does not match the {} ranks of the rank map", op,
                             shape_text(root_shape), ranks.size());
    }
    auto universe = std::make_shared<MeshUniverse>(
        world, device_type, RankMap::make(std::move(ranks), world.size(), op), root_shape,
        root_names);
    for (const auto& [name, value] : j.at("flattened").items()) {
      if (name.empty()) throw_error<MeshError>("{}: a flattened dim has an empty name", op);
      Layout l = parse_saved(value.get<std::string>(), fmt::format("flattened dim '{}'", name));
      make(universe, {l}, {name}, op, [&] { return fmt::format("flattened dim '{}'", name); });
      universe->register_flattened(name, l);
    }
    std::vector<Layout> dims;
    for (const auto& d : j.at("dims")) {
      dims.push_back(parse_saved(d.get<std::string>(), fmt::format("dim {}", dims.size())));
    }
    auto names = j.at("dim_names").get<std::vector<std::string>>();
    validate_names(names, dims.size(), op);
    if (dims.empty()) throw_error<MeshError>("{}: the mesh has no dims", op);
    return make(std::move(universe), std::move(dims), std::move(names), op,
                [] { return std::string("the saved mesh"); });
  } catch (const nlohmann::json::exception& e) {
    throw_error<MeshError>("{}: invalid document: {}", op, e.what());
  } catch (const MeshError& e) {
    // Errors of the layouts and rank maps built from the document name the document's operation.
    if (std::string_view(e.what()).starts_with(op)) throw;
    throw_error<MeshError>("{}: {}", op, e.what());
  }
}

// ---- equality and printing --------------------------------------------------------------------

bool DeviceMesh::operator==(const DeviceMesh& other) const {
  if (!universe_ || !other.universe_) return universe_ == other.universe_;
  if (names_ != other.names_ || dims_.size() != other.dims_.size()) return false;
  if (universe_ != other.universe_) {
    const MeshUniverse& a = *universe_;
    const MeshUniverse& b = *other.universe_;
    if (!(a.world() == b.world()) || a.device_type() != b.device_type()) return false;
    const RankMap& ra = *a.rank_map();
    const RankMap& rb = *b.rank_map();
    if (&ra != &rb && (ra.content_hash != rb.content_hash || !(ra == rb))) return false;
  }
  for (size_t d = 0; d < dims_.size(); ++d) {
    if (dims_[d] != other.dims_[d] && coalesce(dims_[d]) != coalesce(other.dims_[d])) {
      return false;
    }
  }
  return true;
}

namespace {

// "[0, 1, 2, 3]", or the first ranks and the count for a long map.
std::string rank_map_text(const RankMap& map) {
  constexpr size_t kShown = 16;
  if (map.ranks.size() <= kShown) return fmt::format("[{}]", fmt::join(map.ranks, ", "));
  return fmt::format("[{}, ...] ({} ranks)",
                     fmt::join(map.ranks.begin(), map.ranks.begin() + kShown, ", "),
                     map.ranks.size());
}

}  // namespace

std::string DeviceMesh::difference(const DeviceMesh& other) const {
  if (*this == other) return "";
  if (!universe_ || !other.universe_) {
    return fmt::format("{} vs {}", to_string(), other.to_string());
  }
  const MeshUniverse& a = *universe_;
  const MeshUniverse& b = *other.universe_;
  if (!(a.world() == b.world())) {
    return fmt::format(
        "they come from different Worlds ({} and {}): a mesh, and every DTensor on it, belongs to "
        "the World it was built on",
        a.world().to_string(), b.world().to_string());
  }
  if (a.device_type() != b.device_type()) {
    return fmt::format("their device types differ ({} on {} vs {} on {})", to_string(),
                       a.device_type(), other.to_string(), b.device_type());
  }
  if (!(*a.rank_map() == *b.rank_map())) {
    return fmt::format("they hold different ranks ({} over ranks {} vs {} over ranks {})",
                       to_string(), rank_map_text(*a.rank_map()), other.to_string(),
                       rank_map_text(*b.rank_map()));
  }
  return fmt::format("their dims differ ({} vs {})", to_string(), other.to_string());
}

std::size_t DeviceMesh::hash() const {
  if (!universe_) return 0;
  std::size_t seed = std::hash<const void*>{}(&universe_->world().state());
  hash_combine(seed, universe_->device_type());
  hash_combine(seed, universe_->rank_map()->content_hash);
  for (const Layout& d : dims_) hash_combine(seed, coalesce(d));
  for (const std::string& n : names_) hash_combine(seed, n);
  return seed;
}

std::string DeviceMesh::to_string() const {
  if (!universe_) return "DeviceMesh(undefined)";
  std::vector<std::string> sizes, strides;
  for (size_t d = 0; d < dims_.size(); ++d) {
    int64_t s = spmd::size(dims_[d]);
    sizes.push_back(names_.empty() ? std::to_string(s) : fmt::format("{}={}", names_[d], s));
    strides.push_back(stride_text(dims_[d]));
  }
  return fmt::format("DeviceMesh(({}{}), stride=({}{}))", join(sizes, ", "),
                     names_.empty() && sizes.size() == 1 ? "," : "", join(strides, ", "),
                     strides.size() == 1 ? "," : "");
}

std::ostream& operator<<(std::ostream& os, const DeviceMesh& mesh) {
  return os << mesh.to_string();
}

std::string DeviceMesh::to_grid() const {
  checked("to_grid");
  RankTable table = rank_table_values();
  std::vector<int64_t> sh = shape();
  const int n = ndim();
  auto label = [&](int d, int64_t i) {
    return fmt::format("{}={}", names_.empty() ? fmt::format("d{}", d) : names_[d], i);
  };
  size_t cell = 1;
  for (int64_t v : table.values) cell = std::max(cell, std::to_string(v).size());
  for (int64_t i = 0; i < sh[n - 1]; ++i) cell = std::max(cell, label(n - 1, i).size());
  size_t row_label = 0;
  if (n >= 2) {
    for (int64_t i = 0; i < sh[n - 2]; ++i) row_label = std::max(row_label, label(n - 2, i).size());
  }
  const int64_t cols = sh[n - 1];
  const int64_t rows = n >= 2 ? sh[n - 2] : 1;
  const int64_t per_grid = rows * cols;
  const int64_t mesh_size = size();
  const int64_t siblings = table.shape[0];

  std::string out = to_string() + "\n";
  for (int64_t s = 0; s < siblings; ++s) {
    if (siblings > 1) out += fmt::format("sibling mesh {} of {}:\n", s, siblings);
    for (int64_t grid = 0; grid < mesh_size / per_grid; ++grid) {
      if (n > 2) {
        std::vector<int64_t> lead = idx2crd(grid, std::span(sh).first(n - 2));
        std::vector<std::string> parts;
        for (int d = 0; d < n - 2; ++d) parts.push_back(label(d, lead[d]));
        out += fmt::format("[{}]\n", join(parts, ", "));
      }
      out += std::string(row_label, ' ');
      for (int64_t c = 0; c < cols; ++c) out += fmt::format("  {:>{}}", label(n - 1, c), cell);
      out += '\n';
      for (int64_t r = 0; r < rows; ++r) {
        out += fmt::format("{:<{}}", n >= 2 ? label(n - 2, r) : "", row_label);
        for (int64_t c = 0; c < cols; ++c) {
          int64_t v = table.values[s * mesh_size + grid * per_grid + r * cols + c];
          out += fmt::format("  {:>{}}", v, cell);
        }
        out += '\n';
      }
    }
  }
  return out;
}

Communicator* DeviceMesh::cached_communicator(int dim) const {
  if (!comm_slots_ || dim < 0 || static_cast<size_t>(dim) >= comm_slots_->size()) return nullptr;
  return (*comm_slots_)[static_cast<size_t>(dim)].load(std::memory_order_acquire);
}

void DeviceMesh::cache_communicator(int dim, Communicator* comm) const {
  if (!comm_slots_ || dim < 0 || static_cast<size_t>(dim) >= comm_slots_->size()) return;
  (*comm_slots_)[static_cast<size_t>(dim)].store(comm, std::memory_order_release);
}

}  // namespace spmd
