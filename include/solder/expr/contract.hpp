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
#include "solder/shape.hpp"
#include "solder/tensor.hpp"

namespace solder {

/// B' [K, N] packed once into the GEMM's layout (a weight reused by every call); defined by
/// the backend that packs it (eval/cpu/gemm_packing.hpp).
template <std::size_t N, std::size_t K, bool TransB>
class packed_matrix;

/// A stored [R, C] matrix read as its transpose [C, R] (a view; nothing is copied). Only a
/// product's operand may be transposed: the product reads it transposed while packing. R may
/// be the dynamic batch, which then becomes the product's inner extent.
template <class S>
struct transposed {
  static_assert(S::rank == 2, "solder::transpose: only a [rows, cols] matrix can be transposed (a product's operand)");
  using stored_shape = S;
  using space_type = host;
  tensor_ref<const float, S> ref;
  std::size_t batch() const { return ref.batch(); }
};

/// transpose(w) for a matrix operand of matmul: w [N, K] (PyTorch's linear weight) read as [K, N].
template <class S>
transposed<S> transpose(const tensor<float, S>& t) {
  return {t.ref()};
}
template <class T, class S>
transposed<S> transpose(tensor_ref<T, S> t) {
  static_assert(std::is_same_v<std::remove_const_t<T>, float>, "solder::transpose: products are implemented for float");
  return {tensor_ref<const float, S>(t)};
}

/// A packed_matrix as a product's right operand.
template <std::size_t N, std::size_t K, bool TransB>
struct prepacked {
  using space_type = host;
  const packed_matrix<N, K, TransB>* packed;
};

namespace detail {

/// What a product operand is: its extents as the product reads it (`rows` x `cols`, either
/// may be dyn: the run-time batch), whether it is stored transposed, whether it is pre-packed,
/// and its run-time batch.
template <class X>
struct operand_traits;
template <class S>
struct operand_traits<tensor_ref<const float, S>> {
  static constexpr std::size_t rank = S::rank;
  static constexpr std::size_t rows = S::extents[0], cols = S::last;
  static constexpr bool trans = false, packed = false;
  static std::size_t batch(const tensor_ref<const float, S>& t) { return t.batch(); }
};
template <class S>
struct operand_traits<transposed<S>> {
  static constexpr std::size_t rank = 2;
  static constexpr std::size_t rows = S::extents[1], cols = S::extents[0];
  static constexpr bool trans = true, packed = false;
  static std::size_t batch(const transposed<S>& t) { return t.batch(); }
};
template <std::size_t N, std::size_t K, bool TransB>
struct operand_traits<prepacked<N, K, TransB>> {
  static constexpr std::size_t rank = 2;
  static constexpr std::size_t rows = K, cols = N;
  static constexpr bool trans = TransB, packed = true;
  static std::size_t batch(const prepacked<N, K, TransB>&) { return 1; }
};

template <class T, class S>
tensor_ref<const float, S> as_operand(tensor_ref<T, S> t) {
  static_assert(std::is_same_v<std::remove_const_t<T>, float>, "solder::matmul: products are implemented for float");
  return tensor_ref<const float, S>(t);
}
template <class T, class S>
tensor_ref<const float, S> as_operand(const tensor<T, S>& t) {
  return as_operand(t.ref());
}
template <class S>
transposed<S> as_operand(const transposed<S>& t) {
  return t;
}
template <std::size_t N, std::size_t K, bool TransB>
prepacked<N, K, TransB> as_operand(const packed_matrix<N, K, TransB>& p) {
  return {&p};
}

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

/// C = A' B' [M, N]: A' [M, K] (a tensor, or transpose(a) of a [K, M] one), B' [K, N] (a
/// tensor, transpose(w) of a [N, K] weight, or a packed_matrix). M may be the dynamic batch (x
/// W^T), or K may be (g^T x: both operands' batches, which must agree).
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
