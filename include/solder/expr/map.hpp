// expr/map.hpp: the n-ary elementwise node, map(op, operands...), with broadcasting.
#pragma once

#include <type_traits>
#include <utility>

#include "solder/expr/expression.hpp"
#include "solder/shape.hpp"
#include "solder/tuple.hpp"

namespace solder {

namespace detail {

template <class... S>
struct broadcast_all;
template <class S>
struct broadcast_all<S> {
  using type = S;
  static constexpr bool ok = true;
};
template <class A, class B, class... Rest>
struct broadcast_all<A, B, Rest...> {
  static constexpr bool ok = check_broadcast<A, B>() && broadcast_all<broadcast_t<A, B>, Rest...>::ok;
  using type = typename broadcast_all<broadcast_t<A, B>, Rest...>::type;
};

}  // namespace detail

/// y = op(args...) elementwise, operands broadcast together. Holds operands by value (tensors
/// as views), so a node is cheap to copy and lives as long as the tensors it reads.
template <class Op, class... Args>
struct map_node {
  static_assert(sizeof...(Args) == Op::arity, "solder::map: the op takes a different number of operands");
  static_assert(detail::broadcast_all<shape_of<Args>...>::ok);  // reports the shapes on a mismatch
  static_assert(check_spaces<space_of<Args>...>());
  using expression_tag = solder::expression_tag;
  using space_type = common_space_t<space_of<Args>...>;
  using shape_type = typename detail::broadcast_all<shape_of<Args>...>::type;
  using value_type = decltype(std::declval<const Op&>().forward(std::declval<value_of<Args>>()...));

  [[no_unique_address]] Op op;
  detail::tuple<Args...> args;
  std::size_t batch_ = 1;

  map_node(Op o, Args... a) : op(o), args{{{a}...}} {
    bool known = false;
    auto join = [&](const auto& x) {
      if constexpr (shape_of<decltype(x)>::dynamic) {
        batch_ = detail::common_batch<shape_type>(batch_, known, x.batch(), true);
        known = true;
      }
    };
    (join(a), ...);
  }
  std::size_t batch() const { return batch_; }
};

/// Builds op(operands...) from tensors, views, constants or expressions.
template <class Op, class... E>
auto map(Op op, const E&... e) {
  return map_node<Op, leaf_t<E>...>(op, as_expr(e)...);
}

}  // namespace solder
