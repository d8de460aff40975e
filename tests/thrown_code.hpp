#pragma once
// The cgx::errc that a callable throws; a test failure if it throws nothing.
#include <doctest/doctest.h>

#include <cgx/error.hpp>

namespace cgx_test {

template <class F>
cgx::errc thrown_code(F&& f) {
  try {
    f();
  } catch (const cgx::error& e) {
    return e.code();
  }
  FAIL("no cgx::error was thrown");
  return cgx::errc::transport;
}

}  // namespace cgx_test
