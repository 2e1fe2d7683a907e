// tuple.hpp: detail::tuple, the values an expression node, an evaluator or a pass holds one of
// per operand: a plain aggregate with get<I>, apply and make_tuple, for host and device code.
// std::tuple would do the same at several times the cost in compile time (its constructors'
// constraints and layers of bases are instantiated for every combination of operand types a
// model has; docs/PERFORMANCE.md, "Compile time").
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

#include "solder/config.hpp"

namespace solder::detail {

namespace tuple_parts {
template <std::size_t I, class T>
struct leaf {
  T value;
};
template <class Indices, class... T>
struct leaves;
template <std::size_t... I, class... T>
struct leaves<std::index_sequence<I...>, T...> : leaf<I, T>... {};
}  // namespace tuple_parts

/// tuple<A, B>{{{a}, {b}}} (every brace written: compilers warn of elided ones), or
/// make_tuple(a, b): element I is get<I>(t). The functions below are constexpr, so device code
/// calls them as it calls std::get (nvcc's --expt-relaxed-constexpr), and host code may use
/// them with host-only types.
template <class... T>
struct tuple : tuple_parts::leaves<std::index_sequence_for<T...>, T...> {};

/// Element I (found through its base, as std::get finds a std::tuple's).
template <std::size_t I, class T>
SOLDER_INLINE constexpr T& get(tuple_parts::leaf<I, T>& t) {
  return t.value;
}
template <std::size_t I, class T>
SOLDER_INLINE constexpr const T& get(const tuple_parts::leaf<I, T>& t) {
  return t.value;
}

template <class... T>
constexpr tuple<std::decay_t<T>...> make_tuple(T&&... v) {
  return {{{std::forward<T>(v)}...}};
}

template <class T>
inline constexpr std::size_t tuple_size_v = 0;
template <class... T>
inline constexpr std::size_t tuple_size_v<tuple<T...>> = sizeof...(T);

template <std::size_t I, class T>
struct tuple_element;
template <std::size_t I, class... T>
struct tuple_element<I, tuple<T...>> {
  using type = std::remove_cvref_t<decltype(get<I>(std::declval<tuple<T...>&>()))>;
};
template <std::size_t I, class T>
using tuple_element_t = typename tuple_element<I, T>::type;

namespace tuple_parts {
template <class F, class Tuple, std::size_t... I>
SOLDER_INLINE constexpr decltype(auto) apply(F&& f, Tuple& t, std::index_sequence<I...>) {
  return std::forward<F>(f)(get<I>(t)...);
}
}  // namespace tuple_parts

/// f(get<0>(t), get<1>(t), ...), always inlined (so that calls without results inside f, a
/// prefetch, are never judged free of side effects and dropped before inlining).
template <class F, class... T>
SOLDER_INLINE constexpr decltype(auto) apply(F&& f, tuple<T...>& t) {
  return tuple_parts::apply(std::forward<F>(f), t, std::index_sequence_for<T...>{});
}
template <class F, class... T>
SOLDER_INLINE constexpr decltype(auto) apply(F&& f, const tuple<T...>& t) {
  return tuple_parts::apply(std::forward<F>(f), t, std::index_sequence_for<T...>{});
}

}  // namespace solder::detail
