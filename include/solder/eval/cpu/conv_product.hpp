// eval/cpu/conv_product.hpp: the CPU's products, with those over a batch's images
// (expr/operand.hpp) run by the convolution kernels of conv2d.hpp. A convolution's gradients
// are its product's, written by the layer as autodiff/product.hpp derives them:
//
//   dW = g^T patches(x)     right_grads(matmul(patches(x), transpose(W)), g), g = dy as pixel rows
//   dx = col2im(g W)        left_grad of the same product, written to image_patches_grad{dx}
//
// The CPU never stores the patch matrix or g: dW runs on the dW tiles (conv_weight_grad.hpp)
// or per-sample GEMMs over each image's columns, dx on the tiles' convolution of dy with the
// kernel turned around (stride 1) or per-sample GEMMs gathered per input element. Every other
// product runs solder's GEMM (product.hpp).
#pragma once

#include <cstddef>
#include <type_traits>

#include "solder/config.hpp"
#include "solder/diagnostic.hpp"
#include "solder/eval/cpu/conv2d.hpp"
#include "solder/eval/cpu/product.hpp"
#include "solder/expr/operand.hpp"
#include "solder/expr/write.hpp"
#include "solder/ops/conv2d.hpp"

namespace solder::eval::cpu {

namespace conv_product_detail {

template <class X>
inline constexpr bool is_images = false;
template <class G, std::size_t C, class Space>
inline constexpr bool is_images<image_patches<G, C, Space>> = true;
template <std::size_t C, std::size_t Plane, class Space, bool Trans>
inline constexpr bool is_images<image_pixels<C, Plane, Space, Trans>> = true;

/// Whether the product C reads a batch's images (its patches or its pixel rows).
template <class C>
inline constexpr bool reads_images = is_images<typename C::a_type> || is_images<typename C::b_type>;

/// g^T patches(x): a convolution's dW, g its output gradient as pixel rows.
template <class C>
inline constexpr bool is_weight_gradient = false;
template <std::size_t Cout, std::size_t Plane, class G, std::size_t Cin>
inline constexpr bool is_weight_gradient<contract_node<image_pixels<Cout, Plane, host, true>, image_patches<G, Cin, host>>> =
    Plane == G::out_plane;

/// g W for W [Cout, Cin Kh Kw] stored as torch stores a weight: a convolution's patch gradient.
template <class C, class G, std::size_t Cin>
inline constexpr bool is_patch_gradient = false;
template <std::size_t Cout, std::size_t Plane, std::size_t K, class G, std::size_t Cin>
inline constexpr bool is_patch_gradient<contract_node<image_pixels<Cout, Plane, host, false>, tensor_ref<const float, shape<Cout, K>, host>>,
                                        G, Cin> = Plane == G::out_plane && K == Cin * G::taps;

/// The layer (one group, no bias) whose kernels run a product over images of geometry G.
template <class G, std::size_t Cin, std::size_t Cout>
using one_group =
    conv2d<ops::conv2d_spec<Cin, Cout, G::kernel_height, G::kernel_width, G::stride, G::padding, G::dilation, 1, false>>;

inline bool overlaps(const float* p, std::size_t n, const float* q, std::size_t m) {
  return contract_detail::overlaps(p, n * sizeof(float), q, m * sizeof(float));
}

template <std::size_t Cout, std::size_t Plane, class G, std::size_t Cin, class T, class S>
void weight_gradient(const tensor_ref<T, S, host>& out,
                     const contract_node<image_pixels<Cout, Plane, host, true>, image_patches<G, Cin, host>>& c) {
  const std::size_t batch = c.b.samples;
  if (c.a.samples != batch)
    solder::detail::fail_counts("solder::assign: a convolution's weight gradient g^T patches(x) has ", c.a.samples,
                                " samples of g and ", batch, " of x; the product sums over the batch");
  if (overlaps(out.data(), Cout * Cin * G::taps, c.a.images, batch * Cout * Plane) ||
      overlaps(out.data(), Cout * Cin * G::taps, c.b.images, batch * Cin * G::in_plane))
    solder::detail::fail("solder::assign: the output of a matrix product overlaps one of its operands");
  one_group<G, Cin, Cout>::template weight_gradient<G>(c.b.images, c.a.images, out.data(), batch);
}

}  // namespace conv_product_detail

/// assign_all for writes holding a product: solder's GEMM, or for a product over a batch's
/// images (its one write the product itself) the convolution's kernels.
template <class W0, class... Ws>
void assign_contract(const W0& w0, const Ws&... ws) {
  using C = product_of_t<W0, Ws...>;
  namespace cp = conv_product_detail;
  if constexpr (!cp::reads_images<C>) {
    assign_product(w0, ws...);
  } else if constexpr (cp::is_weight_gradient<C> && sizeof...(Ws) == 0 && std::is_same_v<decltype(w0.expr), C>) {
    static_assert(std::is_same_v<typename write_traits<W0>::iter_shape, typename C::shape_type>,
                  "solder::assign: a convolution's weight gradient g^T patches(x) is [Cout, Cin Kh Kw]");
    cp::weight_gradient(w0.out, w0.expr);
  } else {
    static_assert(never<"solder::assign: on the CPU a product over a batch's images is a convolution's gradient: "
                        "write(dW, g^T patches(x)) alone, or write(image_patches_grad{dx, batch}, g W); a convolution's "
                        "forward runs nn::conv2d",
                        C>);
  }
}

/// dx = col2im(g W): a convolution's input gradient, g its output gradient dy [batch, Cout,
/// Ho, Wo] read as pixel rows and W its weight [Cout, Cin Kh Kw].
template <class G, std::size_t Cin, class E>
void assign_patch_gradient(const patch_gradient_write<G, Cin, host, E>& w) {
  namespace cp = conv_product_detail;
  if constexpr (!cp::is_patch_gradient<E, G, Cin>) {
    static_assert(never<"solder::assign: on the CPU the gradient of a batch's image patches is written from g W, g a "
                        "convolution's output gradient as pixel rows (image_pixels) and W its [Cout, Cin Kh Kw] weight",
                        E>);
  } else {
    constexpr std::size_t Cout = E::a_traits::cols;
    const std::size_t batch = w.out.samples;
    if (w.expr.a.samples != batch)
      solder::detail::fail_counts("solder::assign: the gradient of the image patches of ", batch,
                                  " samples is written from g of ", w.expr.a.samples);
    const std::size_t n = batch * Cin * G::in_plane;
    if (cp::overlaps(w.out.images, n, w.expr.a.images, batch * Cout * G::out_plane) ||
        cp::overlaps(w.out.images, n, w.expr.b.data(), Cout * Cin * G::taps))
      solder::detail::fail("solder::assign: the images receiving a patch gradient overlap g or W; give them memory of their own");
    if (batch == 0) return;
    cp::one_group<G, Cin, Cout>::template input_gradient<G>(w.expr.b.data(), w.expr.a.images, w.out.images, batch);
  }
}

}  // namespace solder::eval::cpu
