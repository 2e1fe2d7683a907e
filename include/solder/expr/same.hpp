// expr/same.hpp: whether two expressions of one type compute the same values: the same tensors,
// constants, masks and op parameters. A pass whose writes share an expression (dx = g and the
// bias gradient sum(g) of one backward) evaluates it once per element when they do.
#pragma once

#include <cstring>
#include <type_traits>

#include "solder/expr/expression.hpp"
#include "solder/expr/map.hpp"
#include "solder/expr/random.hpp"
#include "solder/tensor.hpp"

namespace solder {

namespace detail {

/// The same bytes: for the scalars and op parameters compared here, the same value (-0 and +0,
/// or two NaNs, count as different, which only loses the sharing).
template <class T>
bool same_bytes(const T& a, const T& b) {
  static_assert(std::is_trivially_copyable_v<T>);
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

/// Ops without parameters are equal; an op with parameters (a slope, a scale) is compared by its
/// bytes, so padding in it could only make two equal ops look different.
template <class Op>
bool same_op(const Op& a, const Op& b) {
  if constexpr (std::is_empty_v<Op>)
    return true;
  else if constexpr (std::is_trivially_copyable_v<Op>)
    return same_bytes(a, b);
  else
    return false;
}

}  // namespace detail

/// True when a and b certainly compute the same values; false when they may not (a node kind
/// not listed here is never called the same).
template <class E>
bool same_expression(const E&, const E&) {
  return false;
}
template <class T, class S, class Space>
bool same_expression(const tensor_ref<T, S, Space>& a, const tensor_ref<T, S, Space>& b) {
  return a.data() == b.data() && a.batch() == b.batch();
}
template <std::size_t Id, class T, class S, class Space>
bool same_expression(const variable<Id, T, S, Space>& a, const variable<Id, T, S, Space>& b) {
  return same_expression(a.ref, b.ref);
}
template <class T>
bool same_expression(const constant<T>& a, const constant<T>& b) {
  return detail::same_bytes(a.value, b.value);
}
template <class S>
bool same_expression(const dropout_mask<S>& a, const dropout_mask<S>& b) {
  return a.rng.seed == b.rng.seed && a.rng.offset == b.rng.offset && a.rng.first == b.rng.first &&
         a.rng.rounds == b.rng.rounds && a.threshold == b.threshold && a.batch_ == b.batch_;
}
template <class Op, class... Args>
bool same_expression(const map_node<Op, Args...>& a, const map_node<Op, Args...>& b) {
  return a.batch_ == b.batch_ && detail::same_op(a.op, b.op) && [&]<std::size_t... I>(std::index_sequence<I...>) {
    return (same_expression(detail::get<I>(a.args), detail::get<I>(b.args)) && ...);
  }(std::index_sequence_for<Args...>{});
}

}  // namespace solder
