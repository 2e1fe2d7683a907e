// expr/contract.hpp: the matrix product as an expression node. matmul(x, transpose(w)) is a
// [M, N] expression like any other, so relu(matmul(x, transpose(w)) + b) is one node tree; the
// CPU evaluator (eval/cpu/contract.hpp) runs the product with solder's GEMM and applies the
// rest of the tree to each register tile before its single store (DESIGN.md, decision 3).
#pragma once

#include <cstddef>
#include <type_traits>

#include "solder/diagnostic.hpp"
#include "solder/expr/expression.hpp"
#include "solder/shape.hpp"
#include "solder/tensor.hpp"

namespace solder {

namespace eval::cpu {
template <std::size_t N, std::size_t K, bool TransB>
class packed_b;
}  // namespace eval::cpu

/// A stored [R, C] matrix read as its transpose [C, R] (a view; nothing is copied). Only a
/// product's operand may be transposed: the GEMM reads it transposed while packing.
template <class S>
struct transposed {
  static_assert(S::rank == 2 && !S::dynamic,
                "solder::transpose: only a static [rows, cols] matrix can be transposed (a product's operand)");
  using stored_shape = S;
  using shape_type = shape<S::extents[1], S::extents[0]>;
  using space_type = host;
  tensor_ref<const float, S> ref;
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

/// B' [K, N] packed once (eval::cpu::packed_b) as a product's right operand.
template <std::size_t N, std::size_t K, bool TransB>
struct prepacked {
  using shape_type = shape<K, N>;
  using space_type = host;
  const eval::cpu::packed_b<N, K, TransB>* packed;
};

namespace detail {

/// What a product operand is: its shape as the product reads it ([rows, cols]), whether it is
/// stored transposed, and whether it is pre-packed.
template <class X>
struct operand_traits;
template <class S>
struct operand_traits<tensor_ref<const float, S>> {
  using shape_type = S;
  static constexpr bool trans = false, packed = false;
};
template <class S>
struct operand_traits<transposed<S>> {
  using shape_type = typename transposed<S>::shape_type;
  static constexpr bool trans = true, packed = false;
};
template <std::size_t N, std::size_t K, bool TransB>
struct operand_traits<prepacked<N, K, TransB>> {
  using shape_type = shape<K, N>;
  static constexpr bool trans = TransB, packed = true;
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
prepacked<N, K, TransB> as_operand(const eval::cpu::packed_b<N, K, TransB>& p) {
  return {&p};
}

template <class SA, class SB>
constexpr bool check_product() {
  if constexpr (SA::rank != 2 || SB::rank != 2) {
    constexpr fixed_string m = [] {
      fixed_string s("solder::matmul: operands must be matrices; got ");
      solder::detail::append_shape<SA>(s);
      s.append(" and ");
      solder::detail::append_shape<SB>(s);
      return s;
    }();
    return diagnostic<m>::reported;
  } else if constexpr (SB::dynamic) {
    return diagnostic<"solder::matmul: the right operand needs static extents (a weight)", SB>::reported;
  } else if constexpr (SA::last != SB::extents[0]) {
    constexpr fixed_string m = [] {
      fixed_string s("solder::matmul: cannot multiply ");
      solder::detail::append_shape<SA>(s);
      s.append(" by ");
      solder::detail::append_shape<SB>(s);
      s.append(": inner extents ").append(SA::last).append(" and ").append(SB::extents[0]).append(" differ");
      return s;
    }();
    return diagnostic<m>::reported;
  } else {
    return true;
  }
}

}  // namespace detail

/// C = A' B' [M, N]: A' [M, K] (a tensor, or transpose of a static [K, M] one), B' [K, N] (a
/// tensor, transpose(w) of a [N, K] weight, or a eval::cpu::packed_b). M may be the dynamic batch.
template <class A, class B>
struct contract_node {
  using a_traits = detail::operand_traits<A>;
  using b_traits = detail::operand_traits<B>;
  using a_shape = typename a_traits::shape_type;
  using b_shape = typename b_traits::shape_type;
  static_assert(detail::check_product<a_shape, b_shape>());
  static_assert(check_spaces<space_of<A>, space_of<B>>());
  using expression_tag = solder::expression_tag;
  using value_type = float;
  using space_type = common_space_t<space_of<A>, space_of<B>>;
  using shape_type = shape<a_shape::extents[0], b_shape::last>;
  static constexpr std::size_t K = a_shape::last;
  static constexpr std::size_t N = b_shape::last;

  A a;
  B b;
  /// Rows of the product (the batch when A's first extent is dynamic).
  std::size_t batch() const {
    if constexpr (a_shape::dynamic)
      return a.batch();
    else
      return 1;
  }
  std::size_t rows() const {
    if constexpr (a_shape::dynamic)
      return a.batch();
    else
      return a_shape::extents[0];
  }
};

/// The matrix product a b as an expression (see contract_node for the operand forms).
template <class A, class B>
auto matmul(const A& a, const B& b) {
  using OA = decltype(detail::as_operand(a));
  using OB = decltype(detail::as_operand(b));
  return contract_node<OA, OB>{detail::as_operand(a), detail::as_operand(b)};
}

}  // namespace solder
