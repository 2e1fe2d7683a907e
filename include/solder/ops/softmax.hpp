// ops/softmax.hpp: softmax and log_softmax of a row, forward and backward, and the two steps
// they share with softmax cross-entropy (the row max, the sum of exp(x - max)); written once
// over a row walker, so the CPU's vector walk and a CUDA walker run the same body.
//
// A row walker R (docs/ops.md, "Row ops"; the one the backend's rows<N> verb hands a body: the
// CPU's vector walk, a CUDA warp) provides:
//   R::scalar, R::value, R::accum   the row's element type, what one step computes on (a
//                                   vector, or one element), and the type of row sums
//   r.size()                        the row's length
//   r.each(f)                       f(at) for every step `at` of the row
//   r.load(at, p[, pad]), r.store(at, p, v)   the step's columns of the row at p
//   r.sum(f), r.sums<K>(f), r.max(f)          reductions of f(at) over the row's columns only,
//                                   in an order fixed by the length (sums<K>: f returns
//                                   R::terms<K>{...}; the result binds as auto [a, b])
//   r.once(f)                       f() once per row, after the row's earlier stores
// The ops use nothing else: simd:: for the math, the walker for memory and reductions.
#pragma once

#include <cstddef>

#include "solder/config.hpp"
#include "solder/simd.hpp"

// xsimd's exp and log1p inline AVX-512 intrinsics into these bodies on the CPU (see config.hpp).
SOLDER_INTRINSIC_WARNINGS_OFF

namespace solder::ops {

/// The sums of a softmax row's exp step: sum_j exp(x_j - m), and sum_j (m - x_j).
template <class A>
struct exp_sums {
  A sum;
  A gap;
};

/// m = max_j x_j over a row; NaN if the row holds one (which then reaches every x_j - m).
template <class R>
SOLDER_HD SOLDER_INLINE typename R::scalar row_max(const R& r, const typename R::scalar* x) {
  return r.max([&](auto at) SOLDER_INLINE_LAMBDA { return r.load(at, x); });
}

/// The step every softmax shares: sum_j e_j, e_j = exp(x_j - m) <= 1 for m = row_max(x), so
/// nothing overflows. Park: e_j is written to park[j] (the output, until the sum is known).
/// Gap: also sum_j (m - x_j) >= 0, label smoothing's term (else gap = 0).
template <bool Park, bool Gap, class R>
SOLDER_HD SOLDER_INLINE exp_sums<typename R::accum> shifted_exp_sum(const R& r, const typename R::scalar* x,
                                                                    typename R::scalar m, typename R::scalar* park) {
  using V = typename R::value;
  const V vm(m);
  if constexpr (Gap) {
    const auto [s, gap] = r.template sums<2>([&](auto at) SOLDER_INLINE_LAMBDA {
      const V d = vm - r.load(at, x);
      const V e = simd::exp(simd::neg(d));
      if constexpr (Park) r.store(at, park, e);
      return typename R::template terms<2>{e, d};
    });
    return {s, gap};
  } else {
    const auto s = r.sum([&](auto at) SOLDER_INLINE_LAMBDA {
      const V e = simd::exp(simd::neg(vm - r.load(at, x)));
      if constexpr (Park) r.store(at, park, e);
      return e;
    });
    return {s, typename R::accum(0)};
  }
}

/// y_j = exp(x_j - m) / s along a row, m = max x, s = sum_k exp(x_k - m): torch's
/// softmax(x, dim=-1). Backward from y alone: dx = y (dy - sum(dy y)). A NaN in the row, +inf
/// (inf - inf), or a row of only -inf gives a row of NaN, as torch; y may be x.
struct softmax {
  static constexpr const char* name = "softmax";
  /// Per element: max, subtract, exp, sum, multiply.
  static constexpr int forward_flops = 5;
  /// Per element: the product and sum of sum(dy y), a subtraction, a multiply.
  static constexpr int backward_flops = 4;
  /// Backward reads the output y, not the input.
  static constexpr bool output_backward = true;

  template <class R>
  SOLDER_HD SOLDER_INLINE void forward(const R& r, const typename R::scalar* x, typename R::scalar* y) const {
    using V = typename R::value;
    using T = typename R::scalar;
    const T m = row_max(r, x);
    const auto s = shifted_exp_sum<true, false>(r, x, m, y).sum;
    const V scale(T(typename R::accum(1) / s));
    r.each([&](auto at) SOLDER_INLINE_LAMBDA { r.store(at, y, r.load(at, y) * scale); });
  }
  /// dx = y (dy - sum(dy y)); dx may be dy.
  template <class R>
  SOLDER_HD SOLDER_INLINE void backward(const R& r, const typename R::scalar* y, const typename R::scalar* dy,
                                        typename R::scalar* dx) const {
    using V = typename R::value;
    using T = typename R::scalar;
    const V dot(T(r.sum([&](auto at) SOLDER_INLINE_LAMBDA { return r.load(at, dy) * r.load(at, y); })));
    r.each([&](auto at) SOLDER_INLINE_LAMBDA { r.store(at, dx, r.load(at, y) * (r.load(at, dy) - dot)); });
  }
};

/// y_j = (x_j - m) - log s along a row (m, s as softmax): torch's log_softmax(x, dim=-1).
/// Backward from y alone: dx = dy - exp(y) sum(dy). NaN and infinity as softmax; y may be x.
struct log_softmax {
  static constexpr const char* name = "log_softmax";
  /// Per element: max, subtract, exp, sum, and two subtractions.
  static constexpr int forward_flops = 6;
  /// Per element: the sum of dy, exp, and a multiply-subtract.
  static constexpr int backward_flops = 4;
  /// Backward reads the output y, not the input.
  static constexpr bool output_backward = true;

  template <class R>
  SOLDER_HD SOLDER_INLINE void forward(const R& r, const typename R::scalar* x, typename R::scalar* y) const {
    using V = typename R::value;
    using T = typename R::scalar;
    const T m = row_max(r, x);
    const auto s = shifted_exp_sum<false, false>(r, x, m, nullptr).sum;
    const V vm(m), log_s(T(simd::log(s)));
    r.each([&](auto at) SOLDER_INLINE_LAMBDA { r.store(at, y, (r.load(at, x) - vm) - log_s); });
  }
  /// dx = dy - exp(y) sum(dy); dx may be dy.
  template <class R>
  SOLDER_HD SOLDER_INLINE void backward(const R& r, const typename R::scalar* y, const typename R::scalar* dy,
                                        typename R::scalar* dx) const {
    using V = typename R::value;
    using T = typename R::scalar;
    const V s(T(r.sum([&](auto at) SOLDER_INLINE_LAMBDA { return r.load(at, dy); })));
    r.each([&](auto at) SOLDER_INLINE_LAMBDA {
      r.store(at, dx, simd::fma(simd::neg(simd::exp(r.load(at, y))), s, r.load(at, dy)));
    });
  }
};

}  // namespace solder::ops

SOLDER_INTRINSIC_WARNINGS_ON
