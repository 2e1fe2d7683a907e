// autodiff/product.hpp: the reverse of a matrix product node. For C = A' B' and the gradient G
// of C (stored), dA' = G B'^T and dB' = A'^T G; each is again a product expression, evaluated by
// the same GEMM (one pass each, with any epilogue the caller wraps around it). A stored part of
// an operand gets the block of that gradient where it lies, in the orientation it is stored in;
// generated parts (sketches) are constants and get none. G may be any untransposed operand: a
// stored matrix, or a convolution's output gradient read as pixel rows (image_pixels).
//
//   auto c = matmul(x, transpose(w));                  // y = x W^T
//   assign(dx, autodiff::left_grad(c, g));             // dx = g W
//   assign(dw, std::get<0>(autodiff::right_grads(c, g)));  // dW = g^T x
#pragma once

#include <cstddef>
#include <tuple>
#include <type_traits>

#include "solder/expr/contract.hpp"

namespace solder::autodiff {

namespace product_detail {

/// Columns [C0, C1) of a stored matrix operand: itself when that is all of them.
template <std::size_t C0, std::size_t C1, class X>
auto column_range(const X& x) {
  using T = solder::detail::operand_traits<X>;
  if constexpr (C0 == 0 && C1 == T::cols) {
    return x;
  } else {
    static_assert(requires { typename X::shape_type; } && !T::trans,
                  "solder::autodiff: a block of this product's gradient needs columns of a stored, untransposed matrix");
    return solder::columns<C0, C1>(x);
  }
}

/// The gradients of the stored leaves of B' (rows [R0, ...) and columns [C0, ...) of B'), given
/// A' and G: a tuple, leaves in order.
template <std::size_t R0, std::size_t C0, class B, class A, class G>
auto right_leaves(const B& b, const A& a, const G& g) {
  using T = solder::detail::operand_traits<B>;
  constexpr std::size_t R1 = R0 + T::rows, C1 = C0 + T::cols;
  if constexpr (requires { b.seed; }) {
    return std::tuple<>{};  // a sketch: a constant
  } else if constexpr (requires { b.a; b.b; }) {
    using TA = solder::detail::operand_traits<std::remove_cvref_t<decltype(b.a)>>;
    constexpr bool side = std::remove_cvref_t<B>::axis == sketch_stack::columns;
    return std::tuple_cat(right_leaves<R0, C0>(b.a, a, g),
                          right_leaves<side ? R0 : R0 + TA::rows, side ? C0 + TA::cols : C0>(b.b, a, g));
  } else if constexpr (T::form == solder::detail::operand_form::stored) {
    static_assert(!requires { B::first; },
                  "solder::autodiff: a column block of a product operand has no gradient of its own; pass the matrix");
    if constexpr (!T::trans)  // dB'[R0:R1, C0:C1] = A'[:, R0:R1]^T G[:, C0:C1]
      return std::make_tuple(matmul(transpose(column_range<R0, R1>(a)), column_range<C0, C1>(g)));
    else  // that block is W^T for W stored: dW = G[:, C0:C1]^T A'[:, R0:R1]
      return std::make_tuple(matmul(transpose(column_range<C0, C1>(g)), column_range<R0, R1>(a)));
  } else {
    static_assert(T::form != solder::detail::operand_form::prepacked,
                  "solder::autodiff: a packed_matrix is read-only; differentiate the product of the matrix it packs");
    return std::tuple<>{};
  }
}

/// G (an operand: a stored matrix, or a batch's images read as pixel rows) has C's shape.
template <class C, class G>
constexpr bool check_gradient() {
  using T = solder::detail::operand_traits<G>;
  static_assert(!T::trans && std::is_same_v<shape<T::rows, T::cols>, typename C::shape_type>,
                "solder::autodiff: the gradient of a product must have the product's shape");
  return true;
}

}  // namespace product_detail

/// dL/dA for C = A' B' [M, N] and G = dL/dC (a stored [M, N] matrix), as a product expression:
/// G B'^T when A' = A, (G B'^T)^T = B' G^T when A' = transpose(a).
template <class A, class B, class G>
auto left_grad(const contract_node<A, B>& c, const G& g) {
  static_assert(product_detail::check_gradient<contract_node<A, B>, std::remove_cvref_t<decltype(solder::detail::as_operand(g))>>());
  const auto gg = solder::detail::as_operand(g);
  if constexpr (contract_node<A, B>::a_traits::trans)
    return matmul(c.b, transpose(gg));
  else
    return matmul(gg, transpose(c.b));
}

/// dL/d(each stored part of B) for C = A' B' and G = dL/dC, as a tuple of product expressions in
/// the order the parts appear in B' (a sketch's part has none): for B' = B, A'^T G; for
/// B' = transpose(w), G^T A'; for a part of a concatenation, the block of A'^T G where it lies.
template <class A, class B, class G>
auto right_grads(const contract_node<A, B>& c, const G& g) {
  static_assert(product_detail::check_gradient<contract_node<A, B>, std::remove_cvref_t<decltype(solder::detail::as_operand(g))>>());
  static_assert(!contract_node<A, B>::a_traits::trans,
                "solder::autodiff: the gradient of a product's right operand needs an untransposed left operand");
  return product_detail::right_leaves<0, 0>(c.b, c.a, solder::detail::as_operand(g));
}

}  // namespace solder::autodiff
