// support/op_check.hpp: the checking helpers the op tests share (tests/ops/*.test.cpp).
// They are noinline: inlined into every TEST_CASE they double the compile time (more under
// the sanitizers) and gain nothing at run time.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/eval/cpu/batch.hpp"

namespace solder::test {

/// How close a float result must be to its reference: within `ulps` of the correctly rounded
/// value, or within `abs` of it (near a zero of the function, where ulps mean nothing).
struct tolerance {
  std::uint64_t ulps;
  double abs;
};

/// Bitwise-meaningful equality: NaN matches NaN, and the sign of zero counts.
inline bool same(float got, float want) {
  if (std::isnan(want)) return std::isnan(got);
  return got == want && std::signbit(got) == std::signbit(want);
}

[[gnu::noinline]] inline void check_near(float got, double want, tolerance t) {
  const float w = static_cast<float>(want);
  if (std::isnan(w))
    CHECK(std::isnan(got));
  else if (std::isinf(w) || t.ulps == 0)
    CHECK(same(got, w));
  else
    CHECK_THAT(got, Catch::Matchers::WithinULP(w, t.ulps) || Catch::Matchers::WithinAbs(want, t.abs));
}

/// f on batches loaded from the inputs, lane by lane; the last batch is a tail padded with 1.
template <class F, class... In>
[[gnu::noinline]] std::vector<float> on_lanes(F f, const In&... in) {
  using vecf = eval::cpu::vec<float>;
  const std::size_t n = std::get<0>(std::tie(in...)).size();
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; i += vecf::size) {
    const std::size_t m = std::min<std::size_t>(vecf::size, n - i);
    const auto load = [&](const std::vector<float>& v) {
      alignas(solder::alignment) float buf[vecf::size];
      std::fill_n(buf, vecf::size, 1.0f);
      std::copy_n(v.begin() + i, m, buf);
      return vecf::load_aligned(buf);
    };
    alignas(solder::alignment) float res[vecf::size];
    f(load(in)...).store_aligned(res);
    std::copy_n(res, m, out.begin() + i);
  }
  return out;
}

/// True when x lies within `gap` of one of `points` (kinks that finite differences straddle).
inline bool near_any(double x, std::initializer_list<double> points, double gap) {
  return std::any_of(points.begin(), points.end(), [&](double p) { return std::abs(x - p) < gap; });
}

}  // namespace solder::test
