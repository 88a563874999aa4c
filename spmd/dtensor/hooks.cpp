// spmd/dtensor/hooks.cpp: the observer registry of dtensor/hooks.h.
#include <spmd/dtensor/hooks.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <utility>

namespace spmd {
namespace {

struct Registry {
  std::mutex mutex;
  // Replaced, never mutated, so notify can iterate a snapshot without holding the lock.
  std::shared_ptr<const std::vector<std::pair<int, OpObserver>>> observers =
      std::make_shared<const std::vector<std::pair<int, OpObserver>>>();
  int next_id = 1;
  std::atomic<int> count{0};
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: ops may run in static destructors
  return *r;
}

thread_local bool t_notifying = false;

}  // namespace

int add_op_observer(OpObserver observer) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto next = std::make_shared<std::vector<std::pair<int, OpObserver>>>(*r.observers);
  const int id = r.next_id++;
  next->emplace_back(id, std::move(observer));
  r.observers = std::move(next);
  r.count.store(static_cast<int>(r.observers->size()), std::memory_order_release);
  return id;
}

void remove_op_observer(int id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto next = std::make_shared<std::vector<std::pair<int, OpObserver>>>();
  for (const auto& entry : *r.observers) {
    if (entry.first != id) next->push_back(entry);
  }
  r.observers = std::move(next);
  r.count.store(static_cast<int>(r.observers->size()), std::memory_order_release);
}

bool has_op_observers() {
  return registry().count.load(std::memory_order_relaxed) > 0 && !t_notifying;
}

void notify_op_observers(const OpEvent& event) {
  if (t_notifying) return;
  Registry& r = registry();
  std::shared_ptr<const std::vector<std::pair<int, OpObserver>>> snapshot;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    snapshot = r.observers;
  }
  struct Reset {
    ~Reset() { t_notifying = false; }
  } reset;
  t_notifying = true;
  for (const auto& entry : *snapshot) entry.second(event);
}

const OpDef& value_event_def() {
  static const OpDef kValueEventOp{
      .name = "value", .meta = nullptr, .compute = nullptr, .strategies = nullptr};
  return kValueEventOp;
}

void notify_value(std::string_view what, const DTensor& value, const SourceLocation& loc) {
  if (!has_op_observers() || !value.defined() || !value.participates()) return;
  static const OpArgs kNoArgs;
  notify_op_observers(
      OpEvent{what, &value_event_def(), kNoArgs, {}, value, user_site_or(loc), nested_call(loc)});
}

}  // namespace spmd
