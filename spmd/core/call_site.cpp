// spmd/core/call_site.cpp: the current user call site of each thread (Note [User call sites]).
#include <spmd/core/call_site.h>

#include <cstring>

#include <fmt/format.h>

namespace spmd {
namespace {
thread_local const SourceLocation* t_site = nullptr;
thread_local std::string_view t_phase;
thread_local std::string_view t_op;
}  // namespace

const SourceLocation* current_call_site() {
  return t_site;
}

bool nested_call(const SourceLocation& loc) {
  if (t_site == nullptr || !t_phase.empty()) return t_site != nullptr;
  return t_site->line() != loc.line() || t_site->column() != loc.column() ||
         std::strcmp(t_site->file_name(), loc.file_name()) != 0;
}

UserCallSite::UserCallSite(const SourceLocation& loc, std::string_view phase, std::string_view op)
    : outermost_(t_site == nullptr) {
  if (outermost_) {
    t_site = &loc;
    t_phase = phase;
    t_op = op;
  }
}

UserCallSite::~UserCallSite() {
  if (outermost_) {
    t_site = nullptr;
    t_phase = {};
    t_op = {};
  }
}

CallSiteReset::CallSiteReset() : saved_(t_site), saved_phase_(t_phase), saved_op_(t_op) {
  t_site = nullptr;
  t_phase = {};
  t_op = {};
}

CallSiteReset::~CallSiteReset() {
  t_site = saved_;
  t_phase = saved_phase_;
  t_op = saved_op_;
}

std::string site_text(const SourceLocation& loc) {
  return site_text(loc.file_name(), loc.line());
}

std::string site_text(std::string_view file, uint32_t line) {
  const size_t slash = file.find_last_of('/');
  if (slash != std::string_view::npos) file.remove_prefix(slash + 1);
  return fmt::format("{}:{}", file, line);
}

}  // namespace spmd

namespace spmd {

std::string call_site_suffix(std::string_view message) {
  if (t_site == nullptr) return {};
  const std::string site = site_text(*t_site);
  if (t_phase.empty()) {
    if (message.find(site) != std::string_view::npos) return {};
    return fmt::format(" (at {})", site);
  }
  // A report from a derivative says so even where it names the line ("op 'sqrt_backward' at
  // train.cpp:42"): that line is the forward op's.
  const std::string where = fmt::format("in the {} of '{}' recorded at {}", t_phase, t_op, site);
  if (message.find(where) != std::string_view::npos) return {};
  return fmt::format(" ({})", where);
}

}  // namespace spmd
