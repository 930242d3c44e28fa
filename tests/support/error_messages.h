#pragma once
// Checking errors by their message: the exception a call throws, and
// whether its message names what it should.
#include <gtest/gtest.h>

#include <exception>
#include <initializer_list>
#include <string>

namespace troupe::test {

// The message of the E that `f` throws; a test failure (and "") when it
// throws nothing or something else.
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected another exception type, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected an exception, nothing was thrown";
  return "";
}

// Success when `msg` contains every one of `parts`.
inline ::testing::AssertionResult mentions(const std::string& msg,
                                           std::initializer_list<std::string> parts) {
  for (const auto& p : parts)
    if (msg.find(p) == std::string::npos)
      return ::testing::AssertionFailure() << "message \"" << msg << "\" lacks \"" << p << "\"";
  return ::testing::AssertionSuccess();
}

}  // namespace troupe::test
