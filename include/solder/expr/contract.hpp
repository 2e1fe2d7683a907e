// expr/contract.hpp: the matrix product as an expression node. matmul(x, transpose(w)) is a
// [M, N] expression like any other, so relu(matmul(x, transpose(w)) + b) is one node tree; the
// backend runs the product and applies the rest of the tree to each tile before its single
// store (DESIGN.md, decision 3). The inner extent K may be the run-time batch:
// matmul(transpose(g), x) for g [batch, Out] and x [batch, In] is a linear layer's dW [Out, In].
#pragma once

#include <cstddef>
#include <type_traits>

#include "solder/backend.hpp"
#include "solder/diagnostic.hpp"
#include "solder/expr/expression.hpp"
#include "solder/expr/operand.hpp"
#include "solder/shape.hpp"
#include "solder/tensor.hpp"

namespace solder {

namespace detail {

/// Appends "[rows, cols]" of an operand as the product reads it ("?" for the batch).
template <class Tr>
constexpr void append_operand(fixed_string& s) {
  s.append("[");
  if (Tr::rows == dyn) s.append("?");
  else s.append(Tr::rows);
  s.append(", ");
  if (Tr::cols == dyn) s.append("?");
  else s.append(Tr::cols);
  s.append("]");
}

template <class TA, class TB>
constexpr bool check_product() {
  if constexpr (TA::rank != 2 || TB::rank != 2) {
    return diagnostic<"solder::matmul: operands must be matrices [rows, cols]", TA, TB>::reported;
  } else if constexpr (TA::form == operand_form::prepacked) {
    return diagnostic<"solder::matmul: a packed_matrix can only be the right operand", TA>::reported;
  } else if constexpr (TB::cols == dyn) {
    return diagnostic<"solder::matmul: the right operand's columns must be static (a weight, or x for dW = g^T x)", TB>::reported;
  } else if constexpr (TA::cols != TB::rows) {
    constexpr fixed_string m = [] {
      fixed_string s("solder::matmul: cannot multiply ");
      append_operand<TA>(s);
      s.append(" by ");
      append_operand<TB>(s);
      s.append(": inner extents ");
      if (TA::cols == dyn) s.append("? (the batch)");
      else s.append(TA::cols);
      s.append(" and ");
      if (TB::rows == dyn) s.append("? (the batch)");
      else s.append(TB::rows);
      s.append(" differ");
      return s;
    }();
    return diagnostic<m>::reported;
  } else {
    return true;
  }
}

}  // namespace detail

/// C = A' B' [M, N]: A' [M, K] and B' [K, N] are operands (expr/operand.hpp): a tensor,
/// transpose(w) of a [N, K] weight, columns<C0, C1>(t), a packed_matrix (B' only), a
/// sign_sketch, hcat/vcat of those. M may be the dynamic batch (x W^T), or K may be (g^T x:
/// both operands' batches, which must agree).
template <class A, class B>
struct contract_node {
  using a_traits = detail::operand_traits<A>;
  using b_traits = detail::operand_traits<B>;
  static_assert(detail::check_product<a_traits, b_traits>());
  static_assert(check_spaces<space_of<A>, space_of<B>>());
  using expression_tag = solder::expression_tag;
  using value_type = float;
  using space_type = common_space_t<space_of<A>, space_of<B>>;
  using shape_type = shape<a_traits::rows, b_traits::cols>;
  static constexpr std::size_t K = a_traits::cols;  // dyn: the run-time batch (inner())
  static constexpr std::size_t N = b_traits::cols;

  A a;
  B b;
  /// The batch of the product's shape: its rows when they are dynamic.
  std::size_t batch() const { return a_traits::rows == dyn ? a_traits::batch(a) : 1; }
  /// Rows of the product (the batch when A's rows are dynamic).
  std::size_t rows() const { return a_traits::rows == dyn ? a_traits::batch(a) : a_traits::rows; }
  /// The inner extent (the batch when it is dynamic: then A's and B's batches, checked equal
  /// when the product is evaluated).
  std::size_t inner() const { return K == dyn ? a_traits::batch(a) : K; }
};

/// The matrix product a b as an expression (see contract_node for the operand forms).
template <class A, class B>
auto matmul(const A& a, const B& b) {
  using OA = decltype(detail::as_operand(a));
  using OB = decltype(detail::as_operand(b));
  return contract_node<OA, OB>{detail::as_operand(a), detail::as_operand(b)};
}

}  // namespace solder
