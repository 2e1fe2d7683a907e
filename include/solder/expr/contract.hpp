// expr/contract.hpp: the matrix product as an expression node. matmul(x, transpose(w)) is a
// [M, N] expression like any other, so relu(matmul(x, transpose(w)) + b) is one node tree; the
// backend runs the product and applies the rest of the tree to each tile before its single
// store (DESIGN.md, decision 3). The inner extent K may be the run-time batch:
// matmul(transpose(g), x) for g [batch, Out] and x [batch, In] is a linear layer's dW [Out, In].
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

#include "solder/backend.hpp"
#include "solder/diagnostic.hpp"
#include "solder/expr/expression.hpp"
#include "solder/expr/map.hpp"
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
  using a_type = A;
  using b_type = B;
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

// ---------------------------------------------------------------------------------------------
// Finding and replacing the product in an expression tree (for every backend)
// ---------------------------------------------------------------------------------------------

template <class Combine, class Keep, class Result, class E>
struct reduce_node;

namespace detail {
/// The first of Ts that is not void (void if all are).
template <class... Ts>
struct first_non_void {
  using type = void;
};
template <class T, class... Ts>
struct first_non_void<T, Ts...> {
  using type = std::conditional_t<std::is_void_v<T>, typename first_non_void<Ts...>::type, T>;
};
}  // namespace detail

/// How many product nodes E holds, and the first one's type (void if none).
template <class E>
struct find_contract {
  static constexpr std::size_t count = 0;
  using type = void;
};
template <class A, class B>
struct find_contract<contract_node<A, B>> {
  static constexpr std::size_t count = 1;
  using type = contract_node<A, B>;
};
template <class Op, class... Args>
struct find_contract<map_node<Op, Args...>> {
  static constexpr std::size_t count = (find_contract<Args>::count + ... + 0);
  using type = typename detail::first_non_void<typename find_contract<Args>::type...>::type;
};
template <class C, class K, class R, class E>
struct find_contract<reduce_node<C, K, R, E>> : find_contract<E> {};

/// The product node inside e (an elementwise tree holding exactly one).
template <class E>
const auto& contract_of(const E& e) {
  if constexpr (requires { typename E::a_traits; }) {
    return e;
  } else {
    constexpr std::size_t i = []<class... Args>(std::type_identity<detail::tuple<Args...>>) {
      constexpr bool holds[] = {(find_contract<Args>::count != 0)...};
      std::size_t k = 0;
      while (!holds[k]) ++k;
      return k;
    }(std::type_identity<decltype(e.args)>{});
    return contract_of(detail::get<i>(e.args));
  }
}

/// e with its product replaced by `leaf`, an expression of the product's shape that stands
/// for the backend's accumulators in an epilogue.
template <class E, class Leaf>
auto replace_contract(const E& e, const Leaf& leaf) {
  if constexpr (requires { typename E::a_traits; }) {
    return leaf;
  } else if constexpr (find_contract<E>::count == 0) {
    return e;
  } else {
    return detail::apply(
        [&](const auto&... a) {
          return map_node<decltype(e.op), decltype(replace_contract(a, leaf))...>(e.op, replace_contract(a, leaf)...);
        },
        e.args);
  }
}

}  // namespace solder
