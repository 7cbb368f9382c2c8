// Catching the weightcast::Error a call must throw, to assert on its code and message.
#pragma once

#include "weightcast/core/error.hpp"

#include <catch2/catch.hpp>

#include <stdexcept>

namespace weightcast::test {

/// Runs @p fn, which must throw weightcast::Error. FAILs the test when it returns instead
/// (any other exception passes through and fails the test too).
/// @return the Error @p fn threw.
template <typename Fn>
Error expect_error(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e;
  }
  FAIL("expected weightcast::Error, nothing was thrown");
  throw std::logic_error("unreachable");
}

}  // namespace weightcast::test
