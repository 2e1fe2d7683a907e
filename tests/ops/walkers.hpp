// tests/ops/walkers.hpp: what the row-op tests share: every row walker a case runs on (the
// scalar walker on float and double, the CPU's vector walker with a static and a run-time
// length) and the unit roundoff of the type a walker computes in.
#pragma once

#include <cstddef>
#include <type_traits>

#include <catch2/catch.hpp>

#include "ops/scalar_row.hpp"
#include "solder/assign.hpp"

namespace solder::test {

/// Unit roundoff of the value type a walker computes in.
template <class T>
constexpr double unit = std::is_same_v<T, float> ? 0x1p-24 : 0x1p-53;

/// f(walker, T{}) for the scalar walker on float and double and the vector walker with a static
/// and a dynamic length.
template <std::size_t N, class F>
void on_every_walker(const F& f) {
  using exec = executor<cpu>;
  {
    INFO("scalar walker, float");
    f(scalar_row<float>{N}, float{});
  }
  {
    INFO("scalar walker, double");
    f(scalar_row<double>{N}, double{});
  }
  {
    INFO("vector walker, row<N>");
    f(exec::row<N>{}, float{});
  }
  {
    INFO("vector walker, row<dyn>");
    f(exec::row<dyn>(N), float{});
  }
}

}  // namespace solder::test
