// eval/cpu/conv_product.hpp: the CPU's products, with those over a batch's images
// (expr/operand.hpp) run by the convolution kernels of conv2d.hpp. A convolution's gradients
// are its product's, written by the layer as autodiff/product.hpp derives them:
//
//   dW = g^T patches(x)     right_grads(matmul(patches(x), transpose(W)), g), g = dy as pixel rows
//   dx = col2im(g W)        left_grad of the same product, written to image_patches_grad{dx}
//
// A layer of several groups writes them per group, over the group's channels of the images
// (image_patches<G, C, Space, Stored> and image_pixels with Stored > C). The CPU never stores
// the patch matrix or g: dW runs on the dW tiles (conv_weight_grad.hpp) or per-sample GEMMs
// over each image's columns, dx on the tiles' convolution of dy with the kernel turned around
// (one group, stride 1) or per-sample GEMMs gathered per input element. Every other product
// runs solder's GEMM (product.hpp).
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
template <class G, std::size_t C, class Space, std::size_t Stored>
inline constexpr bool is_images<image_patches<G, C, Space, Stored>> = true;
template <std::size_t C, std::size_t Plane, class Space, bool Trans, std::size_t Stored>
inline constexpr bool is_images<image_pixels<C, Plane, Space, Trans, Stored>> = true;

/// Whether the product C reads a batch's images (its patches or its pixel rows).
template <class C>
inline constexpr bool reads_images = is_images<typename C::a_type> || is_images<typename C::b_type>;

/// The layer (no bias) one of whose groups takes Cin of In channels of images of geometry G to
/// Cout of Out: its kernels run that group's products. Several groups when Cin < In.
template <class G, std::size_t Cin, std::size_t In, std::size_t Cout, std::size_t Out>
using layer_of = conv2d<ops::conv2d_spec<In, Out, G::kernel_height, G::kernel_width, G::stride, G::padding, G::dilation,
                                         In / Cin, false>>;

/// Whether groups of Cin of In and Cout of Out channels split the images into the same number
/// of groups, not of one channel each (a depthwise layer runs its own backward).
template <std::size_t Cin, std::size_t In, std::size_t Cout, std::size_t Out>
inline constexpr bool same_groups = In % Cin == 0 && Out % Cout == 0 && In / Cin == Out / Cout && (In == Cin || Cin > 1);

/// g^T patches(x): a convolution's (or one group's) dW, g its output gradient as pixel rows.
template <class C>
inline constexpr bool is_weight_gradient = false;
template <std::size_t Cout, std::size_t Plane, std::size_t Out, class G, std::size_t Cin, std::size_t In>
inline constexpr bool
    is_weight_gradient<contract_node<image_pixels<Cout, Plane, host, true, Out>, image_patches<G, Cin, host, In>>> =
        Plane == G::out_plane && same_groups<Cin, In, Cout, Out>;

/// g W for W [Cout, Cin Kh Kw] stored as torch stores a weight (or one group's rows of it),
/// written to the images of image_patches_grad<G, Cin, host, In>: a convolution's dx.
template <class E, class G, std::size_t Cin, std::size_t In>
inline constexpr bool is_patch_gradient = false;
template <std::size_t Cout, std::size_t Plane, std::size_t Out, std::size_t K, class G, std::size_t Cin, std::size_t In>
inline constexpr bool is_patch_gradient<
    contract_node<image_pixels<Cout, Plane, host, false, Out>, tensor_ref<const float, shape<Cout, K>, host>>, G, Cin, In> =
    Plane == G::out_plane && K == Cin * G::taps && same_groups<Cin, In, Cout, Out>;

inline bool overlaps(const float* p, std::size_t n, const float* q, std::size_t m) {
  return contract_detail::overlaps(p, n * sizeof(float), q, m * sizeof(float));
}
/// The floats from a group's first plane to its last over `batch` samples of `stored` planes.
inline std::size_t group_span(std::size_t batch, std::size_t stored, std::size_t channels, std::size_t plane) {
  return batch == 0 ? 0 : ((batch - 1) * stored + channels) * plane;
}

template <std::size_t Cout, std::size_t Plane, std::size_t Out, class G, std::size_t Cin, std::size_t In, class T, class S>
void weight_gradient(const tensor_ref<T, S, host>& out,
                     const contract_node<image_pixels<Cout, Plane, host, true, Out>, image_patches<G, Cin, host, In>>& c) {
  const std::size_t batch = c.b.samples;
  if (c.a.samples != batch)
    solder::detail::fail_counts("solder::assign: a convolution's weight gradient g^T patches(x) has ", c.a.samples,
                                " samples of g and ", batch, " of x; the product sums over the batch");
  if (overlaps(out.data(), Cout * Cin * G::taps, c.a.images, group_span(batch, Out, Cout, Plane)) ||
      overlaps(out.data(), Cout * Cin * G::taps, c.b.images, group_span(batch, In, Cin, G::in_plane)))
    solder::detail::fail("solder::assign: the output of a matrix product overlaps one of its operands");
  layer_of<G, Cin, In, Cout, Out>::template weight_gradient<G>(c.b.images, c.a.images, out.data(), batch);
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
    static_assert(never<"solder::assign: on the CPU a product over a batch's images is a convolution's gradient, "
                        "g^T patches(x) or g W (its forward runs nn::conv2d)",
                        C>);
  }
}

/// dx = col2im(g W): a convolution's (or one group's) input gradient, g its output gradient dy
/// [batch, Cout, Ho, Wo] read as pixel rows and W its weight [Cout, Cin Kh Kw].
template <class G, std::size_t Cin, class E, std::size_t In>
void assign_patch_gradient(const patch_gradient_write<G, Cin, host, E, In>& w) {
  namespace cp = conv_product_detail;
  if constexpr (!cp::is_patch_gradient<E, G, Cin, In>) {
    static_assert(never<"solder::assign: the gradient of a batch's image patches is written from g W: g as image_pixels, "
                        "W a stored [Cout, C Kh Kw] weight",
                        E>);
  } else {
    constexpr std::size_t Cout = E::a_traits::cols, Out = std::remove_cvref_t<decltype(w.expr.a)>::stored_channels;
    const std::size_t batch = w.out.samples;
    if (w.expr.a.samples != batch)
      solder::detail::fail_counts("solder::assign: the gradient of the image patches of ", batch,
                                  " samples is written from g of ", w.expr.a.samples);
    const std::size_t n = cp::group_span(batch, In, Cin, G::in_plane);
    if (cp::overlaps(w.out.images, n, w.expr.a.images, cp::group_span(batch, Out, Cout, G::out_plane)) ||
        cp::overlaps(w.out.images, n, w.expr.b.data(), Cout * Cin * G::taps))
      solder::detail::fail("solder::assign: the images receiving a patch gradient overlap g or W; give them memory of their own");
    if (batch == 0) return;
    cp::layer_of<G, Cin, In, Cout, Out>::template input_gradient<G>(w.expr.b.data(), w.expr.a.images, w.out.images, batch);
  }
}

}  // namespace solder::eval::cpu
