// ops/activations.hpp: the activation ops (tanh, sigmoid, relu, leaky_relu, elu, gelu,
// gelu_tanh, silu, softplus), forward and derivative written once for every value type, and
// gradient_from_output, the gradient of relu, sigmoid or tanh formed from the output alone.
//
// Contract and conventions as in ops/arithmetic.hpp and docs/ops.md. Shared NaN rule: a NaN
// input gives a NaN output and a NaN gradient (piecewise ops use simd::keep_nan for the
// latter, since their gates would otherwise turn NaN into 0 or g). Kinks follow PyTorch.
//
// An op whose backward reads x only through y = f(x) says so with two traits, so a backward
// pass can read the output it keeps anyway instead of a saved input:
//   from_output    backward_from_output(y, g) = backward<0>(x, y, g), bit for bit
//   zero_at_zero   f'(x) = 0 wherever f(x) = 0, so a dropout after the op needs no mask either:
//                  a zero output is a dropped element or a zero derivative, both a zero
//                  gradient; backward_from_output(y, g, scale) takes y = scale keep f(x).
#pragma once

#include "solder/config.hpp"
#include "solder/ops/dropout.hpp"
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

  static constexpr bool from_output = true;
  static constexpr bool zero_at_zero = false;  // tanh(0) = 0 with slope 1: a dropout needs its mask
  /// dL/dx from y = tanh(x) and g = dL/dy: backward reads y only.
  template <class V>
  SOLDER_HD SOLDER_INLINE V backward_from_output(const V& y, const V& g) const {
    return backward<0>(y, y, g);
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

  static constexpr bool from_output = true;
  static constexpr bool zero_at_zero = true;  // sigmoid(x) = 0 only where it underflows, with slope 0
  /// dL/dx from y = sigmoid(x) and g = dL/dy: backward reads y only.
  template <class V>
  SOLDER_HD SOLDER_INLINE V backward_from_output(const V& y, const V& g) const {
    return backward<0>(y, y, g);
  }
  /// dL/dx from y = scale keep sigmoid(x) (a dropout after the op) and g = dL/dy: backward at
  /// s = y / scale (sigmoid(x) to within one rounding) for the gradient g scale where kept, +0
  /// where y = 0 (dropped, or sigmoid underflowed with slope 0), whatever g holds.
  template <class V>
  SOLDER_HD SOLDER_INLINE V backward_from_output(const V& y, const V& g, const V& scale) const {
    const V s = y / scale;
    return simd::select(y == V(0), V(0), backward<0>(s, s, g * scale));
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

  static constexpr bool from_output = true;
  static constexpr bool zero_at_zero = true;
  /// dL/dx from y = relu(x) and g = dL/dy: backward with y for x, which it may be since y > 0
  /// exactly where x > 0 and y is NaN exactly where x is.
  template <class V>
  SOLDER_HD SOLDER_INLINE V backward_from_output(const V& y, const V& g) const {
    return backward<0>(y, y, g);
  }
  /// dL/dx from y = scale keep relu(x) (a dropout after the op, scale >= 1) and g = dL/dy:
  /// g scale where y > 0 (kept and x > 0), NaN where y is (kept and x NaN), else +0.
  template <class V>
  SOLDER_HD SOLDER_INLINE V backward_from_output(const V& y, const V& g, const V& scale) const {
    return backward<0>(y, y, g * scale);
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

/// An op whose gradient follows from its output (see from_output above).
template <class Op>
concept DifferentiableFromOutput = requires {
  requires Op::from_output;
};
/// ... and whose derivative is 0 wherever its output is, so a dropout after it needs no mask.
template <class Op>
concept ZeroAtZero = DifferentiableFromOutput<Op> && requires {
  requires Op::zero_at_zero;
};

/// dx = gradient_from_output(y, g): the gradient of activation Act from its output and the
/// upstream gradient g = dL/dy, where y = Act(x), or with Dropout, y = scale keep Act(x). The
/// elementwise node a backward pass builds from a saved output; not differentiable itself.
template <class Act, bool Dropout = false>
struct gradient_from_output {
  static_assert(DifferentiableFromOutput<Act>,
                "solder::ops::gradient_from_output: the op does not give its gradient from its output; use its backward");
  static_assert(!Dropout || ZeroAtZero<Act>,
                "solder::ops::gradient_from_output: the op's zero output does not tell a dropped element; the "
                "dropout's mask is needed");

  static constexpr int arity = 2;
  static constexpr const char* name = "gradient_from_output";
  /// The derivative costs what the op does (the convention of the layers' backward FLOPs),
  /// plus the dropout's scaling.
  static constexpr int flops = Act::flops + (Dropout ? dropout::flops : 0);
  static constexpr bool differentiable(int /*arg*/) { return false; }

  [[no_unique_address]] Act act{};  // no padding: two equal ops have equal bytes (expr/same.hpp)
  /// The dropout's 1 / (1 - p); unused without Dropout.
  float scale = 1;

  template <class V>
  SOLDER_HD SOLDER_INLINE V forward(const V& y, const V& g) const {
    if constexpr (Dropout)
      return act.backward_from_output(y, g, V(scale));
    else
      return act.backward_from_output(y, g);
  }
};

}  // namespace solder::ops
