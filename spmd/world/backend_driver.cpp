// spmd/world/backend_driver.cpp: the registry of backend drivers and the catalog of backends
// (Note [Backend drivers]).
#include <spmd/world/backend_driver.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <mutex>

#include <spmd/config.h>
#include <spmd/core/error.h>

namespace spmd {
namespace {

struct Registry {
  std::mutex mutex;
  std::vector<std::unique_ptr<const BackendDriver>> drivers;
};

// A function-local static: drivers register during static initialization, in any order.
Registry& registry() {
  static Registry instance;
  return instance;
}

const KnownBackend* known_backend(std::string_view name) {
  const auto& known = known_backends();
  auto it = std::find_if(known.begin(), known.end(),
                         [&](const KnownBackend& k) { return k.name == name; });
  return it == known.end() ? nullptr : &*it;
}

std::string upper(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

void BackendSession::rank_finished(int, const std::string&) {}

void BackendSession::finish() {}

std::string BackendSession::describe_state() {
  return "";
}

bool BackendSession::abandon_running_ranks() {
  return false;
}

const std::vector<KnownBackend>& known_backends() {
#define SPMD_KNOWN_BACKEND(name, target, option, built) KnownBackend{name, target, option, built},
  static const std::vector<KnownBackend> known = {SPMD_BACKEND_CATALOG(SPMD_KNOWN_BACKEND)};
#undef SPMD_KNOWN_BACKEND
  return known;
}

std::string known_backend_list() {
  std::string out;
  for (const KnownBackend& k : known_backends()) {
    out += fmt::format("{}{}", out.empty() ? "" : ", ", k.name);
  }
  return out;
}

void register_backend_driver(BackendDriver driver) {
  if (!known_backend(driver.name)) {
    throw_error<InternalError>(
        "register_backend_driver: '{}' is not a backend of the catalog ({}); add it to "
        "cmake/SpmdModules.cmake",
        driver.name, known_backend_list());
  }
  if (!driver.start) {
    throw_error<InternalError>("register_backend_driver: the '{}' driver has no start()",
                               driver.name);
  }
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  for (const auto& d : r.drivers) {
    if (d->name == driver.name) {
      throw_error<InternalError>("register_backend_driver: '{}' is registered twice", driver.name);
    }
  }
  r.drivers.push_back(std::make_unique<const BackendDriver>(std::move(driver)));
}

const BackendDriver* find_backend_driver(std::string_view name) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  for (const auto& d : r.drivers) {
    if (d->name == name) return d.get();
  }
  return nullptr;
}

std::vector<const BackendDriver*> backend_drivers() {
  std::vector<const BackendDriver*> out;
  for (const KnownBackend& k : known_backends()) {
    if (const BackendDriver* d = find_backend_driver(k.name)) out.push_back(d);
  }
  return out;
}

const BackendDriver& backend_driver(std::string_view name, std::string_view source) {
  if (const BackendDriver* d = find_backend_driver(name)) return *d;
  const std::string where = source.empty() ? std::string() : fmt::format(" ({})", source);
  const KnownBackend* known = known_backend(name);
  if (!known) {
    throw_error<ConfigError>("unknown backend '{}'{}; valid backends: {}", name, where,
                             known_backend_list());
  }
  if (!known->built) {
    throw_error<Unsupported>("this build has no {} backend; configure with -D{}=ON", upper(name),
                             known->option);
  }
  throw_error<ConfigError>(
      "the {} backend{} is not linked into this program: link it with {} "
      "(target_link_libraries(<program> PRIVATE {}))",
      name, where, known->target, known->target);
}

}  // namespace spmd
