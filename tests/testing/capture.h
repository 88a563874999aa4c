// tests/testing/capture.h: the failures an assertion reports, captured instead of failing the test,
// for the tests of spmd::testing's own assertions.
#pragma once

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>

namespace spmd::testing {

// The non-fatal failures `statement` reports on this thread, their messages one after another.
inline std::string failures_of(const std::function<void()>& statement) {
  ::testing::TestPartResultArray results;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    statement();
  }
  std::string messages;
  for (int i = 0; i < results.size(); ++i) messages += results.GetTestPartResult(i).message();
  return messages;
}

}  // namespace spmd::testing
