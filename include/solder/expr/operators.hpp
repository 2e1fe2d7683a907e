// expr/operators.hpp: the user-facing spelling of elementwise expressions: operators
// (+ - * /, comparisons, unary -) and named functions (exp, relu, where, dropout, ...), each a
// map node over one op from ops/.
#pragma once

#include <type_traits>

#include "solder/expr/map.hpp"
#include "solder/expr/random.hpp"
#include "solder/ops.hpp"
#include "solder/ops/dropout.hpp"

namespace solder {

/// An operand of an operator: an expression, or an arithmetic scalar next to one.
template <class T>
concept Scalar = std::is_arithmetic_v<std::remove_cvref_t<T>>;

namespace detail {

/// Scalars become constants of the expression's value type (so `x * 2` stays float).
template <class Like, class X>
auto operand(const X& x) {
  if constexpr (Scalar<X>)
    return constant<value_of<Like>>{value_of<Like>(x)};
  else
    return as_expr(x);
}
template <class A, class B>
using expr_side = std::conditional_t<Expression<A>, A, B>;

template <class Op, class A, class B>
auto binary(Op op, const A& a, const B& b) {
  using Like = expr_side<A, B>;
  return map(op, operand<Like>(a), operand<Like>(b));
}

}  // namespace detail

/// Operands of a binary operator: two expressions, or an expression and a scalar.
template <class A, class B>
concept Operands = (Expression<A> && Expression<B>) || (Expression<A> && Scalar<B>) || (Scalar<A> && Expression<B>);

// a + b, a - b, a * b, a / b: elementwise with broadcasting.
template <class A, class B> requires Operands<A, B> auto operator+(const A& a, const B& b) { return detail::binary(ops::add{}, a, b); }
template <class A, class B> requires Operands<A, B> auto operator-(const A& a, const B& b) { return detail::binary(ops::sub{}, a, b); }
template <class A, class B> requires Operands<A, B> auto operator*(const A& a, const B& b) { return detail::binary(ops::mul{}, a, b); }
template <class A, class B> requires Operands<A, B> auto operator/(const A& a, const B& b) { return detail::binary(ops::div{}, a, b); }
template <Expression A> auto operator-(const A& a) { return map(ops::neg{}, a); }

// Comparisons give masks (1/0 when stored into a float tensor; conditions for `where`).
template <class A, class B> requires Operands<A, B> auto operator<(const A& a, const B& b) { return detail::binary(ops::less{}, a, b); }
template <class A, class B> requires Operands<A, B> auto operator<=(const A& a, const B& b) { return detail::binary(ops::less_equal{}, a, b); }
template <class A, class B> requires Operands<A, B> auto operator>(const A& a, const B& b) { return detail::binary(ops::greater{}, a, b); }
template <class A, class B> requires Operands<A, B> auto operator>=(const A& a, const B& b) { return detail::binary(ops::greater_equal{}, a, b); }
template <class A, class B> requires Operands<A, B> auto operator==(const A& a, const B& b) { return detail::binary(ops::equal{}, a, b); }
template <class A, class B> requires Operands<A, B> auto operator!=(const A& a, const B& b) { return detail::binary(ops::not_equal{}, a, b); }

// Named elementwise functions, one per op.
template <Expression E> auto abs(const E& e) { return map(ops::abs{}, e); }
template <Expression E> auto exp(const E& e) { return map(ops::exp{}, e); }
template <Expression E> auto log(const E& e) { return map(ops::log{}, e); }
template <Expression E> auto sqrt(const E& e) { return map(ops::sqrt{}, e); }
template <Expression E> auto rsqrt(const E& e) { return map(ops::rsqrt{}, e); }
template <Expression E> auto tanh(const E& e) { return map(ops::tanh{}, e); }
template <Expression E> auto sigmoid(const E& e) { return map(ops::sigmoid{}, e); }
template <Expression E> auto relu(const E& e) { return map(ops::relu{}, e); }
template <Expression E> auto leaky_relu(const E& e, float negative_slope = 0.01f) { return map(ops::leaky_relu{negative_slope}, e); }
template <Expression E> auto elu(const E& e, float alpha = 1.0f) { return map(ops::elu{alpha}, e); }
/// gelu(x) = x * Phi(x) (erf form, PyTorch's default).
template <Expression E> auto gelu(const E& e) { return map(ops::gelu{}, e); }
/// gelu with the tanh approximation (PyTorch's approximate='tanh').
template <Expression E> auto gelu_tanh(const E& e) { return map(ops::gelu_tanh{}, e); }
template <Expression E> auto silu(const E& e) { return map(ops::silu{}, e); }
template <Expression E> auto softplus(const E& e, float beta = 1.0f, float threshold = 20.0f) { return map(ops::softplus{beta, threshold}, e); }
template <Expression E> auto clamp(const E& e, float lo, float hi) { return map(ops::clamp{lo, hi}, e); }
/// Elementwise minimum and maximum (NaN if either operand is NaN).
template <class A, class B> requires Operands<A, B> auto minimum(const A& a, const B& b) { return detail::binary(ops::min{}, a, b); }
template <class A, class B> requires Operands<A, B> auto maximum(const A& a, const B& b) { return detail::binary(ops::max{}, a, b); }
/// where(c, a, b) = c ? a : b, c a mask expression (a comparison, a keep mask).
template <Expression C, class A, class B>
  requires Operands<A, B>
auto where(const C& c, const A& a, const B& b) {
  using Like = detail::expr_side<A, B>;
  return map(ops::where{}, as_expr(c), detail::operand<Like>(a), detail::operand<Like>(b));
}

/// dropout(x): x * keep / (1 - p), the keep mask drawn from (rng.seed, rng.offset, element
/// index) and regenerated wherever it is read (never stored). Training-mode dropout.
template <Expression E>
auto dropout(const E& e, float p, philox_state rng) {
  auto keep = dropout_mask<shape_of<E>>::with_p(p, rng, e.batch());
  return map(ops::dropout{float(keep.scale())}, keep, e);
}

}  // namespace solder
