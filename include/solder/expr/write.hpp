// expr/write.hpp: one output of an assignment, an output view paired with the expression it
// receives; assign_all (solder/assign.hpp) evaluates several of them in one pass.
#pragma once

#include <type_traits>

#include "solder/backend.hpp"
#include "solder/expr/expression.hpp"

namespace solder {

/// One output of a fused pass: `out` receives `expr` (an elementwise expression, a reduction
/// of one, or an expression holding a matrix product).
template <class T, class S, class E, class Space = host>
struct write_target {
  tensor_ref<T, S, Space> out;
  E expr;
};

/// Pairs an output with the expression to evaluate into it, for assign_all. The expression
/// must live in the output's memory space.
template <class T, class S, class Space, class E>
auto write(tensor_ref<T, S, Space> out, const E& e) {
  static_assert(!std::is_const_v<T>, "solder::assign: cannot assign to a view of const elements");
  static_assert(check_spaces<Space, space_of<leaf_t<E>>>());
  return write_target<T, S, leaf_t<E>, Space>{out, as_expr(e)};
}
template <class T, class S, class Space, class E>
auto write(tensor<T, S, Space>& out, const E& e) {
  return write(out.ref(), e);
}

}  // namespace solder
