// spmd/core/call_site.h: where in the user's program a call came from.
//
// Note [User call sites]
// Every report names the user's file and line, never only spmdsim's. The public API captures the
// caller's std::source_location (a defaulted last parameter, or, for operators, which take no
// extra parameter, the implicit conversion of an operand to At<T>, whose constructor's defaulted
// location is the operator's call site) and opens a UserCallSite for the time the call runs. Code
// deeper down (a DTensor op's redistributions and their collectives, the debug checks, backward)
// reports current_call_site() instead of its own lines. The outermost site wins: a public call
// made by another public call (redistribute inside an op) keeps the user's line. Per thread.
//
//   DTensor add(const DTensor& a, const DTensor& b, SourceLocation loc =
//   SourceLocation::current()); DTensor operator+(At<DTensor> a, const DTensor& b);   // a.loc is
//   the line of `x + y`
#pragma once

#include <cstdint>
#include <source_location>
#include <string>
#include <string_view>

namespace spmd {

using SourceLocation = std::source_location;

// An operand with the location of the expression it appears in (operators cannot take a defaulted
// location parameter). Holds a reference: valid for the call it is an argument of.
template <class T>
struct At {
  At(const T& v, SourceLocation where = SourceLocation::current())  // NOLINT: implicit
      : value(v), loc(where) {}
  const T& value;
  SourceLocation loc;
};

// The user's call site of the public call running on this thread, or null outside one.
const SourceLocation* current_call_site();

// Makes `loc` the current user call site for its lifetime, unless one is already current.
// `phase` and `op` (strings that outlive the scope) say what runs there when it is not the call
// itself: a backward pass runs each node's derivative at the line of the op that recorded it
// (phase "backward", op "matmul").
class UserCallSite {
 public:
  explicit UserCallSite(const SourceLocation& loc, std::string_view phase = {},
                        std::string_view op = {});
  ~UserCallSite();
  UserCallSite(const UserCallSite&) = delete;
  UserCallSite& operator=(const UserCallSite&) = delete;

 private:
  bool outermost_;
};

// Runs with no current user call site (a backward pass names each node's own site).
class CallSiteReset {
 public:
  CallSiteReset();
  ~CallSiteReset();
  CallSiteReset(const CallSiteReset&) = delete;
  CallSiteReset& operator=(const CallSiteReset&) = delete;

 private:
  const SourceLocation* saved_;
  std::string_view saved_phase_;
  std::string_view saved_op_;
};

// Whether a call at `loc` runs inside another public call: a user call site is current and is
// not `loc` (an op inside nn::moe, a derivative in backward). Debug tools that compare what the
// user's lines produce (Note [Parity run]) skip such calls.
bool nested_call(const SourceLocation& loc);

// The current user call site if there is one, else `loc`.
inline const SourceLocation& user_site_or(const SourceLocation& loc) {
  const SourceLocation* site = current_call_site();
  return site != nullptr ? *site : loc;
}

// "train.cpp:42": a call site as every report, fingerprint and trace text prints it (the file's
// base name and the line). The one call-site formatter; the second form takes a site kept as
// (file, line), as trace records and fingerprints keep it.
std::string site_text(const SourceLocation& loc);
std::string site_text(std::string_view file, uint32_t line);

// " (at train.cpp:42)" or " (in the backward of 'matmul' recorded at train.cpp:42)" for the
// current user call site, "" outside one or when `message` already names it. spmd::Error appends
// it to every message (core/error.h).
std::string call_site_suffix(std::string_view message);

}  // namespace spmd
