// spmd/mesh/comm_cache.cpp: CommCache and CommOptions.
#include <spmd/mesh/comm_cache.h>

#include <spmd/core/error.h>
#include <spmd/core/hash.h>

namespace spmd {

std::size_t CommOptions::hash() const {
  std::size_t seed = std::hash<std::string>{}(backend);
  for (const auto& [key, value] : params) {
    hash_combine(seed, key);
    hash_combine(seed, value);
  }
  return seed;
}

std::string CommOptions::to_string() const {
  std::string out = backend.empty() ? "default" : backend;
  if (params.empty()) return out;
  out += '{';
  for (size_t k = 0; k < params.size(); ++k) {
    out += fmt::format("{}{}={}", k ? ", " : "", params[k].first, params[k].second);
  }
  return out + '}';
}

std::size_t CommCache::KeyHash::operator()(const Key& key) const {
  std::size_t seed = key.layout.hash();
  hash_combine(seed, key.options.hash());
  return seed;
}

std::shared_ptr<Communicator> CommCache::get_or_create(
    const Layout& layout, const CommOptions& options,
    const std::function<std::shared_ptr<Communicator>()>& make) {
  std::shared_ptr<Entry> entry;
  {
    std::lock_guard lock(mutex_);
    auto& slot = entries_[Key{coalesce(layout), options}];
    if (!slot) slot = std::make_shared<Entry>();
    entry = slot;
  }
  // Built under the entry's own lock, so `make` may use the cache for other keys.
  std::lock_guard build_lock(entry->mutex);
  if (!entry->comm) {
    std::shared_ptr<Communicator> comm = make();
    if (!comm) {
      throw_error<Error>("CommCache: the factory for layout {} with options {} returned null",
                         layout, options.to_string());
    }
    entry->comm = std::move(comm);
    std::lock_guard lock(mutex_);
    ++built_;
  }
  return entry->comm;
}

std::shared_ptr<Communicator> CommCache::find(const Layout& layout,
                                              const CommOptions& options) const {
  std::shared_ptr<Entry> entry;
  {
    std::lock_guard lock(mutex_);
    auto it = entries_.find(Key{coalesce(layout), options});
    if (it == entries_.end()) return nullptr;
    entry = it->second;
  }
  std::lock_guard build_lock(entry->mutex);
  return entry->comm;
}

std::size_t CommCache::size() const {
  std::lock_guard lock(mutex_);
  return built_;
}

}  // namespace spmd
