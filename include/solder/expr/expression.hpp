// expr/expression.hpp: what an expression is, and its leaves other than tensors: scalar
// constants and the tagged variables that autodiff differentiates with respect to.
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>

#include "solder/shape.hpp"
#include "solder/tensor.hpp"

namespace solder {

/// An expression: a node or leaf with a shape, a value type and a runtime batch.
template <class E>
concept Expression = ExpressionType<E> && requires(const std::remove_cvref_t<E>& e) {
  typename std::remove_cvref_t<E>::shape_type;
  typename std::remove_cvref_t<E>::value_type;
  { e.batch() } -> std::convertible_to<std::size_t>;
};

/// A scalar operand (`x * 2.0f`): shape [] broadcasts to anything.
template <class T>
struct constant {
  using expression_tag = solder::expression_tag;
  using value_type = T;
  using shape_type = shape<>;
  using space_type = any_space;
  T value;
  std::size_t batch() const { return 1; }
};

/// A tensor leaf tagged with a compile-time id, so autodiff knows which leaves to
/// differentiate with respect to (see autodiff/vjp.hpp). Evaluates exactly like the tensor.
template <std::size_t Id, class T, class S, class Space = host>
struct variable {
  using expression_tag = solder::expression_tag;
  using value_type = std::remove_const_t<T>;
  using shape_type = S;
  using space_type = Space;
  static constexpr std::size_t id = Id;
  tensor_ref<const T, S, Space> ref;
  std::size_t batch() const { return ref.batch(); }
};

/// Tags a tensor as autodiff argument `Id`.
template <std::size_t Id, class T, class S, class Space>
variable<Id, T, S, Space> var(tensor_ref<T, S, Space> t) {
  return {tensor_ref<const T, S, Space>(t)};
}
template <std::size_t Id, class T, class S, class Space>
variable<Id, T, S, Space> var(const tensor<T, S, Space>& t) {
  return {t.ref()};
}

namespace detail {

template <class T>
struct leaf_of {
  using type = T;
};
template <class T, class S, class Space>
struct leaf_of<tensor<T, S, Space>> {
  using type = tensor_ref<const T, S, Space>;
};
template <class T, class S, class Space>
struct leaf_of<tensor_ref<T, S, Space>> {
  using type = tensor_ref<const T, S, Space>;
};

}  // namespace detail

/// How an operand is held inside a node: tensors as const views, everything else by value.
template <class E>
using leaf_t = typename detail::leaf_of<std::remove_cvref_t<E>>::type;

template <class E>
leaf_t<E> as_expr(const E& e) {
  if constexpr (std::is_same_v<leaf_t<E>, std::remove_cvref_t<E>>)
    return e;
  else
    return leaf_t<E>(e);
}

template <class E>
using shape_of = typename std::remove_cvref_t<E>::shape_type;
template <class E>
using value_of = typename std::remove_cvref_t<E>::value_type;
/// The memory space E's leaves live in (any_space when none lives in memory).
template <class E>
using space_of = typename std::remove_cvref_t<E>::space_type;

namespace detail {

[[noreturn, gnu::cold, gnu::noinline]] inline void fail_batches_differ(const std::size_t* extents, std::size_t rank,
                                                                     std::size_t a, std::size_t b) {
  fail_message({"solder: batch sizes differ between operands of an expression of shape ", shape_text(extents, rank, 0),
                ": ", a, " vs ", b});
}

/// The batch two operands share; a mismatch of two runtime batches is a clear error.
template <class S>
std::size_t common_batch(std::size_t a, bool a_known, std::size_t b, bool b_known) {
  if (a_known && b_known && a != b) fail_batches_differ(S::extents.data(), S::rank, a, b);
  return a_known ? a : b_known ? b : 1;
}

}  // namespace detail

}  // namespace solder
