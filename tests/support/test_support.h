// tests/support/test_support.h: helpers shared by the test folders.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <type_traits>

#include <spmd/core/error.h>

namespace spmd::testing {

// Runs `body`, which must throw exactly E (or a subclass) whose message contains every one of
// `fragments`. Returns the message so tests can check more.
template <class E, class Body>
std::string expect_throws(Body&& body, std::initializer_list<std::string> fragments = {}) {
  try {
    body();
  } catch (const E& e) {
    std::string message = e.what();
    for (const auto& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "error message lacks '" << fragment << "': " << message;
    }
    return message;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw the wrong type: " << e.what();
    return {};
  }
  ADD_FAILURE() << "did not throw";
  return {};
}

}  // namespace spmd::testing
