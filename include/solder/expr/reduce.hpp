// expr/reduce.hpp: reductions (sum, mean, max) over an axis, over everything, or down to a
// broadcast operand's shape; evaluated in the same pass that produces their operand.
#pragma once

#include <array>
#include <limits>
#include <utility>

#include "solder/expr/expression.hpp"
#include "solder/simd.hpp"

namespace solder {

namespace reduction {
/// s = a + b; identity 0.
struct sum {
  template <class V> SOLDER_HD SOLDER_INLINE static V combine(const V& a, const V& b) { return a + b; }
  template <class T> static constexpr T identity() { return T(0); }
};
/// s = max(a, b), NaN-propagating; identity -inf.
struct max {
  template <class V> SOLDER_HD SOLDER_INLINE static V combine(const V& a, const V& b) { return simd::max(a, b); }
  template <class T> static constexpr T identity() { return -std::numeric_limits<T>::infinity(); }
};
}  // namespace reduction

namespace detail {

template <class S, std::size_t Axis, std::size_t... I>
auto keep_axis(std::index_sequence<I...>) -> shape<(I == Axis ? 1 : S::extents[I])...>;
template <class S, std::size_t Axis, std::size_t... I>
auto drop_axis(std::index_sequence<I...>) -> shape<S::extents[I < Axis ? I : I + 1]...>;
template <std::size_t>
inline constexpr std::size_t one = 1;
template <class S, std::size_t... I>
auto all_ones(std::index_sequence<I...>) -> shape<one<I>...>;
/// T right-aligned into rank R, padded with leading 1s.
template <class T, std::size_t R, std::size_t... I>
auto pad_to_rank(std::index_sequence<I...>) -> shape<(I < R - T::rank ? 1 : T::extents[I - (R - T::rank)])...>;

}  // namespace detail

/// The reduction of E with Combine down to `Keep` (E's rank, 1 on every reduced extent); the
/// result is read as `Result`, the same elements in the same order. `scale` multiplies the
/// result (1/count for a mean).
template <class Combine, class Keep, class Result, class E>
struct reduce_node {
  using expression_tag = solder::expression_tag;
  using shape_type = Result;
  using keep_shape = Keep;
  using combine_type = Combine;
  using operand_type = E;
  using value_type = value_of<E>;
  using space_type = space_of<E>;
  static_assert(Keep::rank == shape_of<E>::rank);

  E operand;
  value_type scale = 1;
  std::size_t batch() const { return Result::dynamic ? operand.batch() : 1; }
};

template <class E>
inline constexpr bool is_reduce = false;
template <class C, class K, class R, class E>
inline constexpr bool is_reduce<reduce_node<C, K, R, E>> = true;

namespace detail {

template <std::size_t Axis, class S>
constexpr bool check_axis() {
  if constexpr (Axis < S::rank) {
    return true;
  } else {
    constexpr fixed_string m = [] {
      fixed_string s("solder::reduce: axis ");
      s.append(Axis).append(" is out of range for shape ");
      append_shape<S>(s);
      return s;
    }();
    return diagnostic<m>::reported;
  }
}

template <class Combine, std::size_t Axis, class E>
auto reduce_axis(const E& e, bool mean) {
  using S = shape_of<E>;
  constexpr std::size_t axis = check_axis<Axis, S>() ? Axis : 0;
  using Keep = decltype(keep_axis<S, axis>(std::make_index_sequence<S::rank>{}));
  using Result = decltype(drop_axis<S, axis>(std::make_index_sequence<S::rank - 1>{}));
  reduce_node<Combine, Keep, Result, leaf_t<E>> r{as_expr(e)};
  if (mean) r.scale = value_of<E>(1) / value_of<E>(S::extents[axis] == dyn ? e.batch() : S::extents[axis]);
  return r;
}

template <class Combine, class E>
auto reduce_all(const E& e, bool mean) {
  using S = shape_of<E>;
  using Keep = decltype(all_ones<S>(std::make_index_sequence<S::rank>{}));
  reduce_node<Combine, Keep, shape<>, leaf_t<E>> r{as_expr(e)};
  if (mean) r.scale = value_of<E>(1) / value_of<E>(S::elements(e.batch()));
  return r;
}

}  // namespace detail

/// sum over axis Axis: [B, N] -> sum<0> -> [N].
template <std::size_t Axis, Expression E>
auto sum(const E& e) {
  return detail::reduce_axis<reduction::sum, Axis>(e, false);
}
/// mean over axis Axis.
template <std::size_t Axis, Expression E>
auto mean(const E& e) {
  return detail::reduce_axis<reduction::sum, Axis>(e, true);
}
/// max over axis Axis (NaN if any element is NaN).
template <std::size_t Axis, Expression E>
auto max(const E& e) {
  return detail::reduce_axis<reduction::max, Axis>(e, false);
}
/// sum of every element, shape [].
template <Expression E>
auto sum(const E& e) {
  return detail::reduce_all<reduction::sum>(e, false);
}
/// mean of every element, shape [].
template <Expression E>
auto mean(const E& e) {
  return detail::reduce_all<reduction::sum>(e, true);
}

/// The sum of E over the dimensions along which a T-shaped operand was broadcast to E's shape:
/// the gradient of a broadcast operand (a bias [N] over [B, N], a scale [C, 1, 1] over [C, H, W]).
template <class T, Expression E>
auto sum_to(const E& e) {
  using S = shape_of<E>;
  static_assert(check_broadcasts_to<T, S>());
  using Keep = decltype(detail::pad_to_rank<T, S::rank>(std::make_index_sequence<S::rank>{}));
  return reduce_node<reduction::sum, Keep, T, leaf_t<E>>{as_expr(e)};
}

}  // namespace solder
