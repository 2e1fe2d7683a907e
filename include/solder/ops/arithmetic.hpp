// ops/arithmetic.hpp: the arithmetic ops (add, sub, mul, div, neg, abs, exp, log, sqrt, rsqrt),
// forward and derivative written once for float, double, xsimd batches and CUDA device code.
//
// Every op follows the contract of docs/ops.md: arity, name, flops (per element, each
// elementary function counted as one), differentiable(i), forward(args...) and
// backward<I>(args..., y, g) = g * d forward / d arg_I. The NaN/Inf rule of each op is IEEE
// arithmetic unless its comment says otherwise; gradients are the formula's derivative
// evaluated in IEEE arithmetic (so 0 * inf is NaN, as in PyTorch).
#pragma once

#include "solder/config.hpp"
#include "solder/simd.hpp"

namespace solder::ops {

/// y = a + b; d/da = d/db = 1.
struct add {
  static constexpr int arity = 2;
  static constexpr const char* name = "add";
  static constexpr int flops = 1;
  static constexpr bool differentiable(int /*arg*/) { return true; }
  template <class V> SOLDER_HD SOLDER_INLINE V forward(const V& a, const V& b) const { return a + b; }
  template <int I, class V>
  SOLDER_HD SOLDER_INLINE V backward(const V& /*a*/, const V& /*b*/, const V& /*y*/, const V& g) const {
    static_assert(I == 0 || I == 1, "solder::ops::add: backward<I> takes I = 0 or 1");
    return g;
  }
};

/// y = a - b; d/da = 1, d/db = -1.
struct sub {
  static constexpr int arity = 2;
  static constexpr const char* name = "sub";
  static constexpr int flops = 1;
  static constexpr bool differentiable(int /*arg*/) { return true; }
  template <class V> SOLDER_HD SOLDER_INLINE V forward(const V& a, const V& b) const { return a - b; }
  template <int I, class V>
  SOLDER_HD SOLDER_INLINE V backward(const V& /*a*/, const V& /*b*/, const V& /*y*/, const V& g) const {
    static_assert(I == 0 || I == 1, "solder::ops::sub: backward<I> takes I = 0 or 1");
    if constexpr (I == 0)
      return g;
    else
      return simd::neg(g);
  }
};

/// y = a * b; d/da = b, d/db = a (0 * inf = NaN in both directions).
struct mul {
  static constexpr int arity = 2;
  static constexpr const char* name = "mul";
  static constexpr int flops = 1;
  static constexpr bool differentiable(int /*arg*/) { return true; }
  template <class V> SOLDER_HD SOLDER_INLINE V forward(const V& a, const V& b) const { return a * b; }
  template <int I, class V>
  SOLDER_HD SOLDER_INLINE V backward(const V& a, const V& b, const V& /*y*/, const V& g) const {
    static_assert(I == 0 || I == 1, "solder::ops::mul: backward<I> takes I = 0 or 1");
    if constexpr (I == 0)
      return g * b;
    else
      return g * a;
  }
};

/// y = a / b; d/da = 1 / b, d/db = -a / b^2 = -y / b. x / 0 = +-inf, 0 / 0 = NaN (IEEE);
/// the b-gradient is formed as -(g / b) * y, which overflows only where the result does.
struct div {
  static constexpr int arity = 2;
  static constexpr const char* name = "div";
  static constexpr int flops = 1;
  static constexpr bool differentiable(int /*arg*/) { return true; }
  template <class V> SOLDER_HD SOLDER_INLINE V forward(const V& a, const V& b) const { return a / b; }
  template <int I, class V>
  SOLDER_HD SOLDER_INLINE V backward(const V& /*a*/, const V& b, const V& y, const V& g) const {
    static_assert(I == 0 || I == 1, "solder::ops::div: backward<I> takes I = 0 or 1");
    if constexpr (I == 0)
      return g / b;
    else
      return simd::neg(g / b) * y;
  }
};

/// y = -x; dy/dx = -1. neg(0) = -0, neg(NaN) = NaN.
struct neg {
  static constexpr int arity = 1;
  static constexpr const char* name = "neg";
  static constexpr int flops = 1;
  static constexpr bool differentiable(int /*arg*/) { return true; }
  template <class V> SOLDER_HD SOLDER_INLINE V forward(const V& x) const { return simd::neg(x); }
  template <int I, class V>
  SOLDER_HD SOLDER_INLINE V backward(const V& /*x*/, const V& /*y*/, const V& g) const {
    static_assert(I == 0, "solder::ops::neg: backward<I> takes I = 0 (one argument)");
    return simd::neg(g);
  }
};

/// y = |x|; dy/dx = sign(x) with abs'(0) = 0 as in PyTorch. abs(-0) = 0, abs(+-inf) = inf,
/// abs(NaN) = NaN, and the gradient at a NaN input is NaN.
struct abs {
  static constexpr int arity = 1;
  static constexpr const char* name = "abs";
  static constexpr int flops = 1;
  static constexpr bool differentiable(int /*arg*/) { return true; }
  template <class V> SOLDER_HD SOLDER_INLINE V forward(const V& x) const { return simd::abs(x); }
  template <int I, class V>
  SOLDER_HD SOLDER_INLINE V backward(const V& x, const V& /*y*/, const V& g) const {
    static_assert(I == 0, "solder::ops::abs: backward<I> takes I = 0 (one argument)");
    return g * simd::sign(x);
  }
};

/// y = e^x; dy/dx = y. exp(-inf) = 0, exp(+inf) = inf, exp(x > 88.7) = inf in float; results
/// below FLT_MIN (x < -87.3) may be flushed to 0 on batches.
struct exp {
  static constexpr int arity = 1;
  static constexpr const char* name = "exp";
  static constexpr int flops = 1;
  static constexpr bool differentiable(int /*arg*/) { return true; }
  template <class V> SOLDER_HD SOLDER_INLINE V forward(const V& x) const { return simd::exp(x); }
  template <int I, class V>
  SOLDER_HD SOLDER_INLINE V backward(const V& /*x*/, const V& y, const V& g) const {
    static_assert(I == 0, "solder::ops::exp: backward<I> takes I = 0 (one argument)");
    return g * y;
  }
};

/// y = ln x; dy/dx = 1 / x. log(+-0) = -inf, log(x < 0) = NaN, log(+inf) = inf; the gradient
/// is g / x everywhere, also where the forward is NaN (as in PyTorch).
struct log {
  static constexpr int arity = 1;
  static constexpr const char* name = "log";
  static constexpr int flops = 1;
  static constexpr bool differentiable(int /*arg*/) { return true; }
  template <class V> SOLDER_HD SOLDER_INLINE V forward(const V& x) const { return simd::log(x); }
  template <int I, class V>
  SOLDER_HD SOLDER_INLINE V backward(const V& x, const V& /*y*/, const V& g) const {
    static_assert(I == 0, "solder::ops::log: backward<I> takes I = 0 (one argument)");
    return g / x;
  }
};

/// y = sqrt(x); dy/dx = 1 / (2 y). sqrt(-0) = -0, sqrt(x < 0) = NaN, sqrt(+inf) = inf; the
/// gradient at +0 is g / 0 (+-inf, NaN where g = 0, as in PyTorch), at +inf it is 0.
struct sqrt {
  static constexpr int arity = 1;
  static constexpr const char* name = "sqrt";
  static constexpr int flops = 1;
  static constexpr bool differentiable(int /*arg*/) { return true; }
  template <class V> SOLDER_HD SOLDER_INLINE V forward(const V& x) const { return simd::sqrt(x); }
  template <int I, class V>
  SOLDER_HD SOLDER_INLINE V backward(const V& /*x*/, const V& y, const V& g) const {
    static_assert(I == 0, "solder::ops::sqrt: backward<I> takes I = 0 (one argument)");
    return V(0.5) * g / y;
  }
};

/// y = 1 / sqrt(x); dy/dx = -y^3 / 2. rsqrt(+0) = +inf, rsqrt(-0) = -inf, rsqrt(+inf) = 0,
/// rsqrt(x < 0) = NaN; exact to rounding on every target (no approximate instruction).
struct rsqrt {
  static constexpr int arity = 1;
  static constexpr const char* name = "rsqrt";
  static constexpr int flops = 2;
  static constexpr bool differentiable(int /*arg*/) { return true; }
  template <class V> SOLDER_HD SOLDER_INLINE V forward(const V& x) const { return simd::rsqrt(x); }
  template <int I, class V>
  SOLDER_HD SOLDER_INLINE V backward(const V& /*x*/, const V& y, const V& g) const {
    static_assert(I == 0, "solder::ops::rsqrt: backward<I> takes I = 0 (one argument)");
    return V(-0.5) * g * (y * y * y);
  }
};

}  // namespace solder::ops
