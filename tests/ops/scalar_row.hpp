// tests/ops/scalar_row.hpp: a row walker that takes one element per step, in order, with sums
// in double: the walker the row-op tests run float and double through (beside the CPU's vector
// walker), written to the interface of ops/softmax.hpp and host+device like the ops.
#pragma once

#include <math.h>

#include <array>
#include <cstddef>

#include "solder/config.hpp"
#include "solder/simd.hpp"

namespace solder::test {

/// The walk of a row of n elements of T, one element per step.
template <class T>
struct scalar_row {
  using scalar = T;
  using value = T;
  using accum = double;
  template <std::size_t K>
  using terms = std::array<T, K>;
  /// One column.
  struct step {
    std::size_t j;
  };

  std::size_t n;

  SOLDER_HD std::size_t size() const { return n; }
  SOLDER_HD static T load(step at, const T* p, T /*pad*/ = T(0)) { return p[at.j]; }
  SOLDER_HD static void store(step at, T* p, T v) { p[at.j] = v; }

  template <class F>
  SOLDER_HD void each(const F& f) const {
    for (std::size_t j = 0; j < n; ++j) f(step{j});
  }
  /// The K sums in column order, in double.
  template <std::size_t K, class F>
  SOLDER_HD std::array<double, K> sums(const F& f) const {
    std::array<double, K> total{};
    for (std::size_t j = 0; j < n; ++j) {
      const terms<K> v = f(step{j});
      for (std::size_t k = 0; k < K; ++k) total[k] += double(v[k]);
    }
    return total;
  }
  template <class F>
  SOLDER_HD double sum(const F& f) const {
    double total = 0;
    for (std::size_t j = 0; j < n; ++j) total += double(f(step{j}));
    return total;
  }
  /// The largest f(at); NaN if any is NaN (simd::max).
  template <class F>
  SOLDER_HD T max(const F& f) const {
    T m = T(-INFINITY);
    for (std::size_t j = 0; j < n; ++j) m = simd::max(m, f(step{j}));
    return m;
  }
  template <class F>
  SOLDER_HD static void once(const F& f) {
    f();
  }
};

}  // namespace solder::test
