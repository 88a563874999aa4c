// The consumer project's own core/error.h, which only the consumer's code may include: it defines
// CONSUMER_OWN_HEADERS around its include. Reached from a header of spmdsim (one that included
// "core/error.h" or <core/error.h> rather than <spmd/core/error.h>), it stops the build.
#pragma once

#ifndef CONSUMER_OWN_HEADERS
#error "spmdsim included the consumer's core/error.h: its headers must be included as <spmd/...>"
#endif

#include <string>
#include <utility>

namespace consumer {

// A class named like spmd::Error.
class Error {
 public:
  explicit Error(std::string what) : what_(std::move(what)) {}
  const std::string& what() const { return what_; }

 private:
  std::string what_;
};

}  // namespace consumer
