// expr/write.hpp: one output of an assignment, an output view paired with the expression it
// receives; assign_all (solder/assign.hpp) evaluates several of them in one pass. The images
// under a batch's patches (expr/operand.hpp, image_patches_grad) are an output too: the patch
// matrix's gradient written to them is gathered back onto their pixels.
#pragma once

#include <cstddef>
#include <type_traits>

#include "solder/backend.hpp"
#include "solder/expr/expression.hpp"
#include "solder/expr/operand.hpp"

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

/// The gradient of a batch's image patches, `expr` [batch Ho Wo, C Kh Kw], written back onto
/// the images `out` (col2im): a convolution's dx from its product's left gradient g W.
template <class G, std::size_t C, class Space, class E, std::size_t Stored = C>
struct patch_gradient_write {
  image_patches_grad<G, C, Space, Stored> out;
  E expr;
};

template <class G, std::size_t C, class Space, std::size_t Stored, class E>
auto write(image_patches_grad<G, C, Space, Stored> out, const E& e) {
  static_assert(check_spaces<Space, space_of<leaf_t<E>>>());
  static_assert(std::is_same_v<shape_of<leaf_t<E>>, shape<dyn, C * G::taps>>,
                "solder::write: the gradient of a batch's image patches is a [batch Ho Wo, C Kh Kw] expression");
  return patch_gradient_write<G, C, Space, leaf_t<E>, Stored>{out, as_expr(e)};
}

}  // namespace solder
