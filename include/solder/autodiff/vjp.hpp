// autodiff/vjp.hpp: reverse mode for elementwise expressions, at compile time. From each op's
// backward rule, builds the expression of the gradient with respect to each argument; it is
// evaluated like any expression, so a chain's whole backward runs as one fused pass.
#pragma once

#include <tuple>
#include <utility>

#include "solder/expr/map.hpp"
#include "solder/expr/operators.hpp"
#include "solder/expr/reduce.hpp"

namespace solder {

namespace autodiff {

/// The op whose forward is Op's backward with respect to argument I:
/// forward(args..., y, g) = Op::backward<I>(args..., y, g).
template <class Op, int I>
struct backward_op {
  static constexpr int arity = Op::arity + 2;
  static constexpr const char* name = Op::name;
  static constexpr int flops = 2 * Op::flops;
  static constexpr bool differentiable(int) { return false; }  // first order only
  [[no_unique_address]] Op op;
  template <class... X>
  SOLDER_HD SOLDER_INLINE auto forward(const X&... x) const {
    return op.template backward<I>(x...);
  }
};

/// True when expression E reads autodiff argument Id through a differentiable path.
template <std::size_t Id, class E>
inline constexpr bool depends_on = false;
template <std::size_t Id, std::size_t J, class T, class S, class Space>
inline constexpr bool depends_on<Id, variable<J, T, S, Space>> = Id == J;
template <std::size_t Id, class Op, class... Args>
inline constexpr bool depends_on<Id, map_node<Op, Args...>> = [] {
  bool any = false;
  int i = 0;
  ((any = any || (Op::differentiable(i) && depends_on<Id, Args>), ++i), ...);
  return any;
}();

/// Sums the contributions of several paths (one term: itself).
template <class First, class... Rest>
auto sum_terms(const First& first, const Rest&... rest) {
  if constexpr (sizeof...(Rest) == 0)
    return first;
  else
    return first + sum_terms(rest...);
}

/// dL/d(argument Id) through expression e, given dL/de = g, at e's (broadcast) shape.
template <std::size_t Id, class E, class G>
auto grad(const E& e, const G& g);

template <std::size_t Id, int I, class Op, class... Args, class G>
auto grad_through_arg(const map_node<Op, Args...>& e, const G& g) {
  const auto& arg = solder::detail::get<I>(e.args);
  auto g_arg = solder::detail::apply(
      [&](const Args&... a) { return map_node<backward_op<Op, I>, Args..., map_node<Op, Args...>, G>({e.op}, a..., e, g); },
      e.args);
  return grad<Id>(arg, g_arg);
}

template <std::size_t Id, class Op, class... Args, class G, std::size_t... I>
auto grad_map(const map_node<Op, Args...>& e, const G& g, std::index_sequence<I...>) {
  // Every argument on a differentiable path to Id contributes one term.
  auto terms = std::tuple_cat([&] {
    if constexpr (Op::differentiable(int(I)) && depends_on<Id, Args>)
      return std::make_tuple(grad_through_arg<Id, int(I)>(e, g));
    else
      return std::tuple<>{};
  }()...);
  return std::apply([](const auto&... t) { return sum_terms(t...); }, terms);
}

template <std::size_t Id, class E, class G>
auto grad(const E& e, const G& g) {
  if constexpr (requires { E::id; })
    return g;
  else
    return grad_map<Id>(e, g, std::make_index_sequence<solder::detail::tuple_size_v<decltype(e.args)>>{});
}

template <std::size_t Id, class E, class S>
constexpr bool check_uses() {
  if constexpr (depends_on<Id, E>)
    return true;
  else
    return diagnostic<"solder::vjp: the function does not depend (differentiably) on this argument; drop it "
                      "from the call",
                      std::integral_constant<std::size_t, Id>, S>::reported;
}

}  // namespace autodiff

/// Vector-Jacobian product of an elementwise function: for y = f(x0, x1, ...) and the upstream
/// gradient dy, returns one expression per argument, dL/dx_i (a sum_to reduction where x_i was
/// broadcast). Nothing is evaluated until the expressions are assigned; assigning them with
/// one assign_all runs the whole backward as one pass:
///
///   auto [gx, gb] = vjp([](auto x, auto b) { return relu(x + b); }, dy, x, b);
///   assign_all(write(dx, gx), write(db, gb));   // db = column sums, same pass
template <class F, class G, class... Ts>
auto vjp(F f, const G& dy, const Ts&... xs) {
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    auto y = f(var<I>(xs)...);
    using Y = decltype(y);
    static_assert(std::is_same_v<shape_of<Y>, shape_of<G>>,
                  "solder::vjp: the upstream gradient must have the function's output shape");
    auto g = as_expr(dy);
    auto one = [&]<std::size_t Id, class X>(const X&) {
      using S = shape_of<X>;
      static_assert(autodiff::check_uses<Id, Y, S>());
      if constexpr (autodiff::depends_on<Id, Y>) {
        auto full = autodiff::grad<Id>(y, g);
        if constexpr (std::is_same_v<shape_of<decltype(full)>, S>)
          return full;
        else
          return sum_to<S>(full);
      }
    };
    return std::make_tuple(one.template operator()<I>(xs)...);
  }(std::index_sequence_for<Ts...>{});
}

}  // namespace solder
