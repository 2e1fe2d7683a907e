// shape.hpp: static extents, row-major strides, broadcasting, and a leading dynamic batch extent.
#pragma once

#include <array>
#include <cstddef>
#include <string>

#include "solder/config.hpp"
#include "solder/diagnostic.hpp"

namespace solder {

/// The extent of a runtime batch dimension; allowed only as a shape's leading extent.
inline constexpr std::size_t dyn = std::size_t(-1);

/// shape<Ns...>: row-major extents, e.g. shape<256, 4096> or shape<dyn, 64> (runtime batch).
template <std::size_t... Ns>
struct shape {
  static constexpr std::size_t rank = sizeof...(Ns);
  static constexpr std::array<std::size_t, rank> extents{Ns...};

  /// True when the leading extent is `dyn`: the batch size is a runtime value.
  static constexpr bool dynamic = rank > 0 && extents[0] == dyn;

  /// Elements per index of the leading extent (the product of all but the first extent).
  static constexpr std::size_t inner_size = [] {
    std::size_t n = 1;
    for (std::size_t d = 1; d < rank; ++d) n *= extents[d];
    return n;
  }();

  /// Total elements; for a dynamic shape, the elements of one batch entry.
  static constexpr std::size_t size = rank == 0 ? 1 : dynamic ? inner_size : inner_size * extents[0];

  /// Extent of the innermost (contiguous) dimension; 1 for a scalar shape.
  static constexpr std::size_t last = rank == 0 ? 1 : extents[rank - 1];

  /// Row-major strides in elements.
  static constexpr std::array<std::size_t, rank> strides = [] {
    std::array<std::size_t, rank> s{};
    std::size_t n = 1;
    for (std::size_t d = rank; d-- > 0;) {
      s[d] = n;
      if (d > 0) n *= extents[d];
    }
    return s;
  }();

  static constexpr std::size_t extent(std::size_t d) { return extents[d]; }

  /// Element count for a runtime batch size (ignored by static shapes).
  static constexpr std::size_t elements(std::size_t batch) { return dynamic ? batch * inner_size : size; }
};

/// True for any solder::shape<...>.
template <class T>
inline constexpr bool is_shape = false;
template <std::size_t... Ns>
inline constexpr bool is_shape<shape<Ns...>> = true;

namespace detail {

template <std::size_t... Ns>
constexpr bool valid_extents() {
  constexpr std::array<std::size_t, sizeof...(Ns)> e{Ns...};
  for (std::size_t d = 0; d < e.size(); ++d)
    if (e[d] == 0 || (e[d] == dyn && d != 0)) return false;
  return true;
}

/// valid_extents of a shape type (false for anything else).
template <class S>
inline constexpr bool valid_shape = false;
template <std::size_t... Ns>
inline constexpr bool valid_shape<shape<Ns...>> = valid_extents<Ns...>();

/// "[256, 4096]" or "[?, 64]" at compile time.
template <class S>
constexpr void append_shape(fixed_string& out) {
  out.append("[");
  for (std::size_t d = 0; d < S::rank; ++d) {
    if (d) out.append(", ");
    if (S::extents[d] == dyn)
      out.append("?");
    else
      out.append(S::extents[d]);
  }
  out.append("]");
}

}  // namespace detail

namespace detail {
/// The text of a shape's extents, one function for every shape.
inline std::string shape_text(const std::size_t* extents, std::size_t rank, std::size_t batch) {
  std::string s = "[";
  for (std::size_t d = 0; d < rank; ++d) {
    if (d) s += ", ";
    s += extents[d] == dyn ? (batch ? std::to_string(batch) : std::string("?")) : std::to_string(extents[d]);
  }
  return s + "]";
}
}  // namespace detail

/// Shape text for runtime messages: "[32, 4096]" (the batch filled in for dynamic shapes).
template <class S>
std::string to_string(std::size_t batch = 0) {
  return detail::shape_text(S::extents.data(), S::rank, batch);
}

/// Concept: a well-formed shape (every extent >= 1, `dyn` only in front).
template <class S>
concept Shape = detail::valid_shape<S>;

// ---- broadcasting (NumPy rules: align from the right; equal extents or one of them 1) ----

namespace detail {

template <class A, class B>
struct broadcast_rule {
  static constexpr std::size_t rank = A::rank > B::rank ? A::rank : B::rank;
  /// Extent of A (or B) at output dimension d, 1 where the shape has no such dimension.
  template <class S>
  static constexpr std::size_t at(std::size_t d) {
    return d + S::rank < rank ? 1 : S::extents[d + S::rank - rank];
  }
  static constexpr bool ok = [] {
    for (std::size_t d = 0; d < rank; ++d) {
      std::size_t a = at<A>(d), b = at<B>(d);
      if (a == dyn || b == dyn) {
        // A runtime batch meets only another runtime batch or a 1, and stays in front.
        if (d != 0 || (a != b && a != 1 && b != 1)) return false;
      } else if (a != b && a != 1 && b != 1) {
        return false;
      }
    }
    return true;
  }();
  static constexpr std::array<std::size_t, rank> extents = [] {
    std::array<std::size_t, rank> e{};
    for (std::size_t d = 0; d < rank; ++d) {
      std::size_t a = at<A>(d), b = at<B>(d);
      e[d] = a == 1 ? b : a;
    }
    return e;
  }();
  static constexpr fixed_string message = [] {
    fixed_string m("solder: cannot broadcast ");
    append_shape<A>(m);
    m.append(" with ");
    append_shape<B>(m);
    return m;
  }();
  template <std::size_t... I>
  static auto make(std::index_sequence<I...>) -> shape<extents[I]...>;
  using type = decltype(make(std::make_index_sequence<rank>{}));
};

}  // namespace detail

/// True when A and B broadcast together.
template <class A, class B>
inline constexpr bool broadcastable = detail::broadcast_rule<A, B>::ok;

/// Reports a broadcast mismatch once, in the user's terms; returns whether the shapes fit.
template <class A, class B>
constexpr bool check_broadcast() {
  if constexpr (broadcastable<A, B>)
    return true;
  else
    return diagnostic<detail::broadcast_rule<A, B>::message>::reported;
}

/// The shape A and B broadcast to (A itself after a reported mismatch, so errors don't cascade).
template <class A, class B>
using broadcast_t = std::conditional_t<broadcastable<A, B>, typename detail::broadcast_rule<A, B>::type, A>;

/// True when `From` can be broadcast to exactly `To` (the result of broadcasting is `To`).
template <class From, class To>
inline constexpr bool broadcasts_to = broadcastable<From, To> && std::is_same_v<broadcast_t<To, From>, To>;

/// Reports, once, that `From` cannot be assigned or broadcast into `To`.
template <class From, class To>
constexpr bool check_broadcasts_to() {
  if constexpr (broadcasts_to<From, To>) {
    return true;
  } else {
    constexpr fixed_string m = [] {
      fixed_string s("solder: cannot assign an expression of shape ");
      detail::append_shape<From>(s);
      s.append(" to a tensor of shape ");
      detail::append_shape<To>(s);
      return s;
    }();
    return diagnostic<m>::reported;
  }
}

}  // namespace solder
