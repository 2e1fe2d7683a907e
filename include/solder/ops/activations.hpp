// ops/activations.hpp: the activation ops (tanh, sigmoid, relu, leaky_relu, elu, gelu,
// gelu_tanh, silu, softplus), forward and derivative written once for every value type.
//
// Contract and conventions as in ops/arithmetic.hpp and docs/ops.md. Shared NaN rule: a NaN
// input gives a NaN output and a NaN gradient (piecewise ops use simd::keep_nan for the
// latter, since their gates would otherwise turn NaN into 0 or g). Kinks follow PyTorch.
#pragma once

#include "solder/config.hpp"
#include "solder/simd.hpp"

namespace solder::ops {

/// y = tanh(x); dy/dx = 1 - y^2. tanh(+-inf) = +-1 with gradient 0.
struct tanh {
  static constexpr int arity = 1;
  static constexpr const char* name = "tanh";
  static constexpr int flops = 1;
  static constexpr bool differentiable(int /*arg*/) { return true; }
  template <class V> SOLDER_HD SOLDER_INLINE V forward(const V& x) const { return simd::tanh(x); }
  template <int I, class V>
  SOLDER_HD SOLDER_INLINE V backward(const V& /*x*/, const V& y, const V& g) const {
    static_assert(I == 0, "solder::ops::tanh: backward<I> takes I = 0 (one argument)");
    return g * simd::fma(simd::neg(y), y, V(1));
  }
};

/// y = 1 / (1 + e^-x); dy/dx = y (1 - y). Never overflows: sigmoid(+inf) = 1, sigmoid(-inf) = 0,
/// full relative precision in both tails (simd::sigmoid). The gradient is formed from y, so
/// where y rounds to 1 (x > 17 in float) it is 0 instead of < 4e-8.
struct sigmoid {
  static constexpr int arity = 1;
  static constexpr const char* name = "sigmoid";
  static constexpr int flops = 4;
  static constexpr bool differentiable(int /*arg*/) { return true; }
  template <class V> SOLDER_HD SOLDER_INLINE V forward(const V& x) const { return simd::sigmoid(x); }
  template <int I, class V>
  SOLDER_HD SOLDER_INLINE V backward(const V& /*x*/, const V& y, const V& g) const {
    static_assert(I == 0, "solder::ops::sigmoid: backward<I> takes I = 0 (one argument)");
    return g * (y * (V(1) - y));
  }
};

/// y = max(x, 0); relu'(0) = 0 as in PyTorch. relu(NaN) = NaN, relu(-0) = +0, and the
/// gradient at a NaN input is NaN.
struct relu {
  static constexpr int arity = 1;
  static constexpr const char* name = "relu";
  static constexpr int flops = 1;
  static constexpr bool differentiable(int /*arg*/) { return true; }
  // x <= 0 is false for NaN, so one compare keeps NaN and maps -0 to +0.
  template <class V> SOLDER_HD SOLDER_INLINE V forward(const V& x) const { return simd::select(x <= V(0), V(0), x); }
  template <int I, class V>
  SOLDER_HD SOLDER_INLINE V backward(const V& x, const V& /*y*/, const V& g) const {
    static_assert(I == 0, "solder::ops::relu: backward<I> takes I = 0 (one argument)");
    return simd::select(V(0) < x, g, simd::keep_nan(x, V(0)));
  }
};

/// y = x for x > 0, negative_slope * x otherwise; the gradient at 0 is negative_slope, as in
/// PyTorch. NaN gives NaN (also as gradient); leaky_relu(-inf) = -inf for a positive slope.
struct leaky_relu {
  float negative_slope = 0.01f;

  static constexpr int arity = 1;
  static constexpr const char* name = "leaky_relu";
  static constexpr int flops = 2;
  static constexpr bool differentiable(int /*arg*/) { return true; }
  template <class V>
  SOLDER_HD SOLDER_INLINE V forward(const V& x) const {
    return simd::select(V(0) < x, x, x * V(negative_slope));
  }
  template <int I, class V>
  SOLDER_HD SOLDER_INLINE V backward(const V& x, const V& /*y*/, const V& g) const {
    static_assert(I == 0, "solder::ops::leaky_relu: backward<I> takes I = 0 (one argument)");
    return simd::select(V(0) < x, g, simd::keep_nan(x, g * V(negative_slope)));
  }
};

/// y = x for x > 0, alpha (e^x - 1) otherwise; dy/dx = 1 for x > 0, alpha e^x otherwise (so
/// alpha at 0, as in PyTorch). elu(-inf) = -alpha with gradient 0; NaN gives NaN.
struct elu {
  float alpha = 1.0f;

  static constexpr int arity = 1;
  static constexpr const char* name = "elu";
  static constexpr int flops = 3;
  static constexpr bool differentiable(int /*arg*/) { return true; }
  template <class V>
  SOLDER_HD SOLDER_INLINE V forward(const V& x) const {
    return simd::select(V(0) < x, x, V(alpha) * simd::expm1(x));
  }
  // alpha e^x rather than PyTorch's optional y + alpha, which cancels for x << 0.
  template <int I, class V>
  SOLDER_HD SOLDER_INLINE V backward(const V& x, const V& /*y*/, const V& g) const {
    static_assert(I == 0, "solder::ops::elu: backward<I> takes I = 0 (one argument)");
    return simd::select(V(0) < x, g, g * (V(alpha) * simd::exp(x)));
  }
};

/// y = x Phi(x), Phi the standard normal CDF (PyTorch's gelu, approximate='none');
/// dy/dx = Phi(x) + x phi(x). Phi is computed as erfc(-x / sqrt 2) / 2, which keeps its
/// relative precision for x << 0 where 1 + erf(x / sqrt 2) cancels. gelu(-inf) = 0 with
/// gradient 0, gelu(+inf) = +inf with gradient 1; NaN gives NaN.
struct gelu {
  static constexpr int arity = 1;
  static constexpr const char* name = "gelu";
  static constexpr int flops = 5;
  static constexpr bool differentiable(int /*arg*/) { return true; }
  template <class V>
  SOLDER_HD SOLDER_INLINE V forward(const V& x) const {
    const V cdf = V(0.5) * simd::erfc(x * V(-0.7071067811865475));
    return simd::select(cdf == V(0), cdf, x * cdf);  // cdf is 0 only for x << 0; avoids -inf * 0
  }
  template <int I, class V>
  SOLDER_HD SOLDER_INLINE V backward(const V& x, const V& /*y*/, const V& g) const {
    static_assert(I == 0, "solder::ops::gelu: backward<I> takes I = 0 (one argument)");
    const V cdf = V(0.5) * simd::erfc(x * V(-0.7071067811865475));
    const V pdf = V(0.3989422804014327) * simd::exp(V(-0.5) * x * x);
    return g * simd::select(pdf == V(0), cdf, simd::fma(x, pdf, cdf));  // +-inf * 0 at |x| = inf
  }
};

/// y = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (PyTorch's gelu, approximate='tanh'),
/// computed as x sigmoid(z), z = 2 sqrt(2/pi) (x + 0.044715 x^3): the same function, without
/// the cancellation of 1 + tanh for x << 0. dy/dx = s + x s (1 - s) dz/dx, s = sigmoid(z).
/// gelu_tanh(-inf) = 0 with gradient 0, gelu_tanh(+inf) = +inf with gradient 1; NaN gives NaN.
struct gelu_tanh {
  static constexpr int arity = 1;
  static constexpr const char* name = "gelu_tanh";
  static constexpr int flops = 9;
  static constexpr bool differentiable(int /*arg*/) { return true; }
  template <class V>
  SOLDER_HD SOLDER_INLINE V forward(const V& x) const {
    const V s = simd::sigmoid(x * simd::fma(V(c3), x * x, V(c1)));
    return simd::select(s == V(0), s, x * s);  // s is 0 only for x << 0; avoids -inf * 0
  }
  template <int I, class V>
  SOLDER_HD SOLDER_INLINE V backward(const V& x, const V& /*y*/, const V& g) const {
    static_assert(I == 0, "solder::ops::gelu_tanh: backward<I> takes I = 0 (one argument)");
    const V x2 = x * x;
    const auto s = simd::sigmoid_with_slope(x * simd::fma(V(c3), x2, V(c1)));
    const V dz = simd::fma(V(3 * c3), x2, V(c1));
    // slope is 0 only where x s'(z) z' is below the smallest float, and at +-inf where it is
    // inf * 0: there the derivative is s itself.
    return g * simd::select(s.slope == V(0), s.value, simd::fma(x * s.slope, dz, s.value));
  }

 private:
  static constexpr double c1 = 1.5957691216057308;   // 2 sqrt(2/pi)
  static constexpr double c3 = 0.07135481627260025;  // 2 sqrt(2/pi) 0.044715
};

/// y = x sigmoid(x) (also called swish); dy/dx = s (1 + x (1 - s)), s = sigmoid(x).
/// silu(-inf) = 0 with gradient 0, silu(+inf) = +inf with gradient 1; NaN gives NaN.
struct silu {
  static constexpr int arity = 1;
  static constexpr const char* name = "silu";
  static constexpr int flops = 5;
  static constexpr bool differentiable(int /*arg*/) { return true; }
  template <class V>
  SOLDER_HD SOLDER_INLINE V forward(const V& x) const {
    const V s = simd::sigmoid(x);
    return simd::select(s == V(0), s, x * s);  // s is 0 only for x << 0; avoids -inf * 0
  }
  template <int I, class V>
  SOLDER_HD SOLDER_INLINE V backward(const V& x, const V& /*y*/, const V& g) const {
    static_assert(I == 0, "solder::ops::silu: backward<I> takes I = 0 (one argument)");
    const auto s = simd::sigmoid_with_slope(x);
    return g * simd::select(s.slope == V(0), s.value, simd::fma(x, s.slope, s.value));  // +-inf * 0
  }
};

/// y = log(1 + e^(beta x)) / beta, and y = x where beta x > threshold (PyTorch's convention;
/// beta > 0). dy/dx = sigmoid(beta x), 1 above the threshold. Never overflows:
/// softplus(+inf) = +inf with gradient 1, softplus(-inf) = 0 with gradient 0; NaN gives NaN.
struct softplus {
  float beta = 1.0f;
  float threshold = 20.0f;

  static constexpr int arity = 1;
  static constexpr const char* name = "softplus";
  static constexpr int flops = 5;
  static constexpr bool differentiable(int /*arg*/) { return true; }
  template <class V>
  SOLDER_HD SOLDER_INLINE V forward(const V& x) const {
    const V bx = x * V(beta);
    return simd::select(V(threshold) < bx, x, simd::softplus(bx) / V(beta));
  }
  template <int I, class V>
  SOLDER_HD SOLDER_INLINE V backward(const V& x, const V& /*y*/, const V& g) const {
    static_assert(I == 0, "solder::ops::softplus: backward<I> takes I = 0 (one argument)");
    const V bx = x * V(beta);
    return simd::select(V(threshold) < bx, g, g * simd::sigmoid(bx));
  }
};

}  // namespace solder::ops
