// eval/cpu/row.hpp: the CPU's row walker: one row of floats walked with xsimd vectors, the
// walker every row op of ops/ (softmax, layer_norm, the losses) is written over. Whole vectors,
// then the tail through the same vector code on a masked load, so every column is computed the
// same way; row sums in a fixed order (float vectors per block, block totals in double).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <limits>
#include <utility>

#include "solder/config.hpp"
#include "solder/eval/cpu/access.hpp"
#include "solder/eval/cpu/batch.hpp"
#include "solder/shape.hpp"
#include "solder/simd.hpp"

namespace solder::eval::cpu {

/// One step of a row walk: the columns [j, j + lanes) (a whole vector), or, Tail, the row's
/// last n < lanes columns from j. Whole and tail steps are distinct types, so the tail's
/// masking is laid out at compile time.
template <bool Tail>
struct row_step {
  static constexpr bool tail = Tail;
  std::size_t j;
  std::size_t n;
};

namespace detail {
/// A row's length: a constant for row<N>, a member for row<dyn>.
template <std::size_t N>
struct row_length {
  static constexpr std::size_t size() { return N; }
};
template <>
struct row_length<dyn> {
  std::size_t n;
  constexpr std::size_t size() const { return n; }
};
}  // namespace detail

/// The walk of a row of N floats (N = dyn: a length given at run time) over vec<float>, as the
/// row ops of ops/ use it (docs/ops.md, "Row ops"):
///   r.each([&](auto at) { r.store(at, y, r.load(at, x) * 2); });
///   double s = r.sum([&](auto at) { return r.load(at, x); });
/// `at` is a row_step<false> for whole vectors and row_step<true> for the last, partial one.
/// Reductions (sum, sums, max) count the row's columns only: a tail's lanes past the row's end
/// are replaced by the neutral value before they join, whatever f computed there.
template <std::size_t N>
struct row {
  using scalar = float;
  using value = vec<float>;
  using accum = double;
  using mask = typename value::batch_bool_type;
  /// What f of sums<K> returns: K vectors of one step.
  template <std::size_t K>
  using terms = std::array<value, K>;

  static constexpr std::size_t lanes = value::size;
  /// Elements a float vector accumulator sums before its total joins a double: 16 terms per
  /// lane, so a row sum errs by about 20 u of its terms' magnitudes whatever N is.
  static constexpr std::size_t block = 16 * lanes;

  constexpr row()
    requires(N != dyn)
  = default;
  explicit constexpr row(std::size_t n)
    requires(N == dyn)
      : length{n} {}
  /// The walk of another run-time length (a shorter last chunk).
  constexpr row with_length(std::size_t n) const
    requires(N == dyn)
  {
    return row(n);
  }

  /// The row's length; columns [0, full()) are whole vectors, the last rest() a tail.
  constexpr std::size_t size() const { return length.size(); }
  constexpr std::size_t full() const { return size() / lanes * lanes; }
  constexpr std::size_t rest() const { return size() - full(); }

  /// The step's columns of the row at p: p[at.j, at.j + lanes), or on the tail p[at.j, at.j +
  /// at.n) with the other lanes set to `pad`; reads nothing past the row.
  template <bool Tail>
  static SOLDER_INLINE value load(row_step<Tail> at, const float* p, float pad = 0.0f) {
    if constexpr (Tail)
      return load_first<value>(p + at.j, at.n, pad);
    else
      return value::load_unaligned(p + at.j);
  }
  /// Stores the step's lanes of v to the row at p; nothing is written past the row.
  template <bool Tail>
  static SOLDER_INLINE void store(row_step<Tail> at, float* p, const value& v) {
    if constexpr (Tail)
      store_first(p + at.j, v, at.n);
    else
      v.store_unaligned(p + at.j);
  }
  /// True in the step's lanes that hold columns of the row: a constant for row<N>.
  template <bool Tail>
  static SOLDER_INLINE mask valid(row_step<Tail> at) {
    if constexpr (!Tail) {
      return mask(true);
    } else if constexpr (N != dyn) {
      return [&]<std::size_t... K>(std::index_sequence<K...>) SOLDER_INLINE_LAMBDA { return mask{(K < N % lanes)...}; }(
          std::make_index_sequence<lanes>{});
    } else {
      alignas(alignment) static constexpr std::array<float, lanes> iota = [] {
        std::array<float, lanes> a{};
        for (std::size_t k = 0; k < lanes; ++k) a[k] = float(k);
        return a;
      }();
      return value::load_aligned(iota.data()) < value(float(at.n));
    }
  }

  /// The sum of v's lanes, in float.
  static SOLDER_INLINE float hsum(const value& v) { return xsimd::hadd(v); }
  /// The largest of v's lanes; NaN if any lane is NaN.
  static SOLDER_INLINE float hmax(const value& v) {
    alignas(alignment) float buf[lanes];
    v.store_aligned(buf);
    // A tree of plain compares (one max instruction each, log2(lanes) dependent steps); they
    // may drop a NaN, which the test beside them restores.
    for (std::size_t w = lanes / 2; w > 0; w /= 2)
      for (std::size_t k = 0; k < w; ++k) buf[k] = buf[k] < buf[k + w] ? buf[k + w] : buf[k];
    return xsimd::any(xsimd::isnan(v)) ? std::numeric_limits<float>::quiet_NaN() : buf[0];
  }

  /// f(at) for every whole vector, then for the tail.
  template <class F>
  SOLDER_INLINE void each(const F& f) const {
    const std::size_t end = full();
    for (std::size_t j = 0; j < end; j += lanes) f(row_step<false>{j, lanes});
    if (rest() != 0) f(row_step<true>{end, rest()});
  }

  /// The K sums over the row of f(at)[k] (f returns terms<K>), in a fixed order: float vectors
  /// per block of `block` columns, each block's total added to a double; the tail joins the
  /// last block, so a row of up to `block` columns costs one horizontal add per sum. One loop
  /// over the whole vectors (a nest of loops would set up f's constants once per block), and
  /// f is called at one place for whole vectors and one for the tail, so its body is inlined
  /// twice, not once per case.
  template <std::size_t K, class F>
  SOLDER_INLINE std::array<accum, K> sums(const F& f) const {
    std::array<accum, K> total;
    total.fill(-0.0);  // -0 + x is x exactly, so the first block's add folds away
    terms<K> acc;
    acc.fill(value(0.0f));
    const auto flush = [&]() SOLDER_INLINE_LAMBDA {
      for (std::size_t k = 0; k < K; ++k) total[k] += accum(hsum(acc[k]));
      acc.fill(value(0.0f));
    };
    const std::size_t end = full();
    for (std::size_t j = 0; j < end; j += lanes) {
      const terms<K> v = f(row_step<false>{j, lanes});
      for (std::size_t k = 0; k < K; ++k) acc[k] += v[k];
      if ((j + lanes) % block == 0) flush();
    }
    if (rest() != 0) {
      const row_step<true> at{end, rest()};
      const mask in = valid(at);
      const terms<K> v = f(at);
      for (std::size_t k = 0; k < K; ++k) acc[k] += xsimd::select(in, v[k], value(0.0f));
    }
    if (end % block != 0 || rest() != 0) flush();  // the last block, partial
    return total;
  }
  /// sums<1> of f(at), a vector.
  template <class F>
  SOLDER_INLINE accum sum(const F& f) const {
    return sums<1>([&](auto at) SOLDER_INLINE_LAMBDA { return terms<1>{f(at)}; })[0];
  }
  /// The largest f(at) over the row; NaN if any is NaN.
  template <class F>
  SOLDER_INLINE float max(const F& f) const {
    constexpr float lowest = -std::numeric_limits<float>::infinity();
    const std::size_t end = full();
    value acc(lowest);
    std::size_t j = 0;
    if (end != 0) {  // start from the first vector rather than from -inf: one max fewer
      acc = f(row_step<false>{0, lanes});
      j = lanes;
    }
    for (; j < end; j += lanes) acc = simd::max(acc, f(row_step<false>{j, lanes}));
    if (rest() != 0) {
      const row_step<true> at{end, rest()};
      acc = simd::max(acc, xsimd::select(valid(at), f(at), value(lowest)));
    }
    return hmax(acc);
  }

  /// f() once for the row, after the row's earlier stores (a walker that splits a row among
  /// threads runs it on one of them, after a barrier).
  template <class F>
  static SOLDER_INLINE void once(const F& f) {
    f();
  }

 private:
  [[no_unique_address]] detail::row_length<N> length;
};

}  // namespace solder::eval::cpu
