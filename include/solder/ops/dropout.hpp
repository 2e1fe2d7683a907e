// ops/dropout.hpp: applying a keep mask; the mask itself is a leaf (expr/random.hpp).
#pragma once

#include "solder/config.hpp"
#include "solder/simd.hpp"

namespace solder::ops {

/// dropout(keep, x) = keep ? x * scale : 0, scale = 1 / (1 - p). A dropped element is +0 even
/// when x is NaN or Inf (it is removed, not multiplied by 0); a kept NaN stays NaN.
struct dropout {
  static constexpr int arity = 2;
  static constexpr const char* name = "dropout";
  static constexpr int flops = 1;
  static constexpr bool differentiable(int arg) { return arg == 1; }
  float scale = 1;

  template <class M, class V>
  SOLDER_HD SOLDER_INLINE V forward(const M& keep, const V& x) const {
    return simd::select(keep, x * V(scale), V(0));
  }
  /// d/dx = keep ? scale : 0 (the mask is regenerated from its counter, never stored).
  template <int I, class M, class V>
  SOLDER_HD SOLDER_INLINE V backward(const M& keep, const V& /*x*/, const V& /*y*/, const V& g) const {
    static_assert(I == 1, "solder::ops::dropout: the mask is not differentiable");
    return simd::select(keep, g * V(scale), V(0));
  }
};

}  // namespace solder::ops
