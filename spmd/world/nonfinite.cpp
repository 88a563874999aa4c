// spmd/world/nonfinite.cpp: Note [Expected overflow].
#include <spmd/world/nonfinite.h>

#include <atomic>

namespace spmd {
namespace {
std::atomic<int> g_holds{0};
}  // namespace

void open_expected_overflow() {
  g_holds.fetch_add(1, std::memory_order_relaxed);
}

void close_expected_overflow() {
  g_holds.fetch_sub(1, std::memory_order_relaxed);
}

bool expected_overflow() {
  return g_holds.load(std::memory_order_relaxed) > 0;
}

}  // namespace spmd
