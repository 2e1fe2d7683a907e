// ops/compare.hpp: comparisons (less, less_equal, greater, greater_equal, equal, not_equal)
// that return masks, where(cond, a, b), the elementwise min and max, and clamp.
//
// Contract and conventions as in ops/arithmetic.hpp and docs/ops.md. A comparison returns
// simd::mask_t<V> (bool for scalars, a batch_bool for batches) and is not differentiable; its
// NaN rule is IEEE: every comparison with NaN is false except not_equal, which is true.
#pragma once

#include <math.h>

#include "solder/config.hpp"
#include "solder/simd.hpp"

namespace solder::ops {

/// m = a < b; false where either is NaN.
struct less {
  static constexpr int arity = 2;
  static constexpr const char* name = "less";
  static constexpr int flops = 1;
  static constexpr bool differentiable(int /*arg*/) { return false; }
  template <class V> SOLDER_HD SOLDER_INLINE simd::mask_t<V> forward(const V& a, const V& b) const { return a < b; }
};

/// m = a <= b; false where either is NaN.
struct less_equal {
  static constexpr int arity = 2;
  static constexpr const char* name = "less_equal";
  static constexpr int flops = 1;
  static constexpr bool differentiable(int /*arg*/) { return false; }
  template <class V> SOLDER_HD SOLDER_INLINE simd::mask_t<V> forward(const V& a, const V& b) const { return a <= b; }
};

/// m = a > b; false where either is NaN.
struct greater {
  static constexpr int arity = 2;
  static constexpr const char* name = "greater";
  static constexpr int flops = 1;
  static constexpr bool differentiable(int /*arg*/) { return false; }
  template <class V> SOLDER_HD SOLDER_INLINE simd::mask_t<V> forward(const V& a, const V& b) const { return a > b; }
};

/// m = a >= b; false where either is NaN.
struct greater_equal {
  static constexpr int arity = 2;
  static constexpr const char* name = "greater_equal";
  static constexpr int flops = 1;
  static constexpr bool differentiable(int /*arg*/) { return false; }
  template <class V> SOLDER_HD SOLDER_INLINE simd::mask_t<V> forward(const V& a, const V& b) const { return a >= b; }
};

/// m = a == b; false where either is NaN, true for -0 == +0.
struct equal {
  static constexpr int arity = 2;
  static constexpr const char* name = "equal";
  static constexpr int flops = 1;
  static constexpr bool differentiable(int /*arg*/) { return false; }
  template <class V> SOLDER_HD SOLDER_INLINE simd::mask_t<V> forward(const V& a, const V& b) const { return a == b; }
};

/// m = a != b; true where either is NaN (the negation of equal, as IEEE and torch.ne).
struct not_equal {
  static constexpr int arity = 2;
  static constexpr const char* name = "not_equal";
  static constexpr int flops = 1;
  static constexpr bool differentiable(int /*arg*/) { return false; }
  // not a != b: xsimd's != is false where either is NaN (see simd.hpp)
  template <class V> SOLDER_HD SOLDER_INLINE simd::mask_t<V> forward(const V& a, const V& b) const { return !(a == b); }
};

/// y = cond ? a : b, cond a mask; the gradient goes to the chosen operand only (0 to the
/// other, even where that one is NaN or inf: a NaN in the branch not taken never leaks).
/// cond is not differentiable.
struct where {
  static constexpr int arity = 3;
  static constexpr const char* name = "where";
  static constexpr int flops = 1;
  static constexpr bool differentiable(int arg) { return arg != 0; }
  template <class M, class V>
  SOLDER_HD SOLDER_INLINE V forward(const M& c, const V& a, const V& b) const {
    return simd::select(c, a, b);
  }
  template <int I, class M, class V>
  SOLDER_HD SOLDER_INLINE V backward(const M& c, const V& /*a*/, const V& /*b*/, const V& /*y*/, const V& g) const {
    static_assert(I == 1 || I == 2, "solder::ops::where: backward<I> takes I = 1 or 2; the condition has no gradient");
    if constexpr (I == 1)
      return simd::select(c, g, V(0));
    else
      return simd::select(c, V(0), g);
  }
};

/// y = max(a, b) elementwise (torch.maximum); NaN if either is NaN. Gradient: all of g to the
/// larger operand, g / 2 to each on a tie (as PyTorch), NaN to both where y is NaN.
struct max {
  static constexpr int arity = 2;
  static constexpr const char* name = "max";
  static constexpr int flops = 1;
  static constexpr bool differentiable(int /*arg*/) { return true; }
  template <class V> SOLDER_HD SOLDER_INLINE V forward(const V& a, const V& b) const { return simd::max(a, b); }
  template <int I, class V>
  SOLDER_HD SOLDER_INLINE V backward(const V& a, const V& b, const V& y, const V& g) const {
    static_assert(I == 0 || I == 1, "solder::ops::max: backward<I> takes I = 0 or 1");
    // mine: this operand is the larger one; theirs: the other one is
    const auto mine = I == 0 ? b < a : a < b;
    const auto theirs = I == 0 ? a < b : b < a;
    return simd::select(mine, g, simd::select(theirs, V(0), simd::keep_nan(y, V(0.5) * g)));
  }
};

/// y = min(a, b) elementwise (torch.minimum); NaN if either is NaN. Gradient: all of g to the
/// smaller operand, g / 2 to each on a tie (as PyTorch), NaN to both where y is NaN.
struct min {
  static constexpr int arity = 2;
  static constexpr const char* name = "min";
  static constexpr int flops = 1;
  static constexpr bool differentiable(int /*arg*/) { return true; }
  template <class V> SOLDER_HD SOLDER_INLINE V forward(const V& a, const V& b) const { return simd::min(a, b); }
  template <int I, class V>
  SOLDER_HD SOLDER_INLINE V backward(const V& a, const V& b, const V& y, const V& g) const {
    static_assert(I == 0 || I == 1, "solder::ops::min: backward<I> takes I = 0 or 1");
    const auto mine = I == 0 ? a < b : b < a;
    const auto theirs = I == 0 ? b < a : a < b;
    return simd::select(mine, g, simd::select(theirs, V(0), simd::keep_nan(y, V(0.5) * g)));
  }
};

/// y = min(max(x, lo), hi) (torch.clamp; all hi when lo > hi). The gradient passes for
/// lo <= x <= hi and is 0 outside, as in PyTorch. clamp(NaN) = NaN with gradient NaN; the
/// defaults leave x unbounded (clamp{0, 6} is relu6).
struct clamp {
  float lo = -INFINITY;
  float hi = INFINITY;

  static constexpr int arity = 1;
  static constexpr const char* name = "clamp";
  static constexpr int flops = 2;
  static constexpr bool differentiable(int /*arg*/) { return true; }
  template <class V>
  SOLDER_HD SOLDER_INLINE V forward(const V& x) const {
    return simd::min(simd::max(x, V(lo)), V(hi));
  }
  template <int I, class V>
  SOLDER_HD SOLDER_INLINE V backward(const V& x, const V& /*y*/, const V& g) const {
    static_assert(I == 0, "solder::ops::clamp: backward<I> takes I = 0 (one argument)");
    return simd::select(V(lo) <= x && x <= V(hi), g, simd::keep_nan(x, V(0)));
  }
};

}  // namespace solder::ops
