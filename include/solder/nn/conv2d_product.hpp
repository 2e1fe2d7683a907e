// nn/conv2d_product.hpp: a convolution written once over the executor's verbs, as a matrix
// product per group over a batch's image patches (expr/operand.hpp's image_patches) whose
// gradients are the product's rules (autodiff/product.hpp), and the passes of ops/conv2d.hpp
// around it. Every backend runs its backward (conv2d_gradients; on the CPU but for depthwise
// layers); its forward is what a backend without convolution kernels of its own (CUDA) runs
// (the CPU's executor::conv2d has its own, with the same interface).
//
//   forward    c [batch Ho Wo, Cout/G] = patches(x_g) W_g^T       (a product per group g)
//              y_g [batch, Cout/G, Ho, Wo] = op(c + b_g)           (planes, reordered)
//   backward   db = dy summed per channel                          (rows<dyn>, a fixed order)
//   per group  g = dy_g read as pixel rows [batch Ho Wo, Cout/G]   (image_pixels, nothing copied)
//              dW_g [Cout/G, Cin/G Kh Kw] = g^T patches(x_g)       (the product's right gradient)
//              dx_g = col2im(g W_g)                                (its left gradient, written
//                                                                   to image_patches_grad{dx_g})
#pragma once

#include <cstddef>

#include "solder/autodiff/product.hpp"
#include "solder/backend.hpp"
#include "solder/executor.hpp"
#include "solder/expr/contract.hpp"
#include "solder/expr/operand.hpp"
#include "solder/expr/write.hpp"
#include "solder/ops/conv2d.hpp"
#include "solder/ops/optimizer.hpp"
#include "solder/shape.hpp"
#include "solder/tensor.hpp"

namespace solder::nn::detail {

/// G must be where the windows of the layer Spec fall on some H x W image.
template <class Spec, class G>
constexpr bool conv2d_check_geometry() {
  using want = typename Spec::template geometry<G::height, G::width>;
  static_assert(G::kernel_height == want::kernel_height && G::kernel_width == want::kernel_width &&
                    G::stride == want::stride && G::padding == want::padding && G::dilation == want::dilation,
                "solder::nn::conv2d: the geometry must have the layer's kernel, stride, padding and dilation");
  return true;
}

/// A convolution layer's backward (Spec: ops::conv2d_spec, any groups) in memory of Space by
/// the verbs of executor<backend_of_t<Space>>: each group's forward is the product
/// patches(x_g) W_g^T over its channels of the images, and its dx and dW are that product's
/// gradients by autodiff/product.hpp's rules, its output gradient g being dy_g read as pixel
/// rows where it lies. Every backend runs these writes its own way (the CPU on its convolution
/// kernels, no patch matrix stored); a depthwise layer on the CPU runs that backend's own loops
/// instead (nn::conv2d).
template <class Spec, class Space>
struct conv2d_gradients {
  static constexpr std::size_t Cin = Spec::in_channels, Cout = Spec::out_channels, K = Spec::fan_in;
  static constexpr std::size_t group_in = Spec::group_in, group_out = Spec::group_out;
  using exec = executor<backend_of_t<Space>>;

  /// weight_grad [Cout, Cin/Groups, Kh, Kw] and bias_grad [Cout] (overwritten; null without a
  /// bias) and, unless dx is null, dx = dL/dx [batch, Cin, H, W], for x and dy [batch, Cout,
  /// Ho, Wo], every pointer memory of Space.
  template <class G>
  static void backward(const float* weight, const float* x, const float* dy, float* dx, float* weight_grad,
                       float* bias_grad, std::size_t batch) {
    static_assert(conv2d_check_geometry<Spec, G>());
    const std::size_t rows = batch * G::out_plane;
    // From dy as stored: a channel's values lie in runs of Ho Wo there.
    if (bias_grad != nullptr)
      exec::template rows<dyn>(Cout, ops::conv2d_channel_sums<Cout, G::out_plane, false>{dy, bias_grad, rows});
    if (rows == 0) {  // no terms: dW = 0, and no image to write
      exec::elements(Cout * K, ops::fill_elements{weight_grad, 0.0f});
      return;
    }
    for (std::size_t q = 0; q < Spec::groups; ++q) {
      const auto c = product<G>(x, weight, batch, q);
      const image_pixels<group_out, G::out_plane, Space, false, Cout> g{dy + q * group_out * G::out_plane, batch};
      exec::run(write(tensor_ref<float, shape<group_out, K>, Space>(weight_grad + q * group_out * K),
                      std::get<0>(autodiff::right_grads(c, g))));
      if (dx != nullptr)
        exec::run(write(image_patches_grad<G, group_in, Space, Cin>{dx + q * group_in * G::in_plane, batch},
                        autodiff::left_grad(c, g)));
    }
  }

  /// Group q's forward product patches(x_q) W_q^T [batch Ho Wo, Cout/Groups]: its channels of
  /// the images, its rows of the weight.
  template <class G>
  static auto product(const float* x, const float* weight, std::size_t batch, std::size_t q) {
    return matmul(image_patches<G, group_in, Space, Cin>{x + q * group_in * G::in_plane, batch},
                  transpose(tensor_ref<const float, shape<group_out, K>, Space>(weight + q * group_out * K)));
  }
};

/// A convolution layer's work in memory of Space (Spec: ops::conv2d_spec) by the verbs of
/// executor<backend_of_t<Space>>, for images of the geometry G each call names: x [batch, Cin,
/// H, W], y [batch, Cout, Ho, Wo], weights [Cout, Cin/Groups, Kh, Kw] and bias [Cout] as torch
/// stores them (bias null without one), every pointer memory of Space. The forward runs group by
/// group, each a product into scratch (its channels-last output, grown to the largest batch and
/// kept) reordered into its channels of y. Results do not depend on the launch shape: the
/// products' and the sums' orders are fixed by the sizes.
template <class Spec, class Space>
class conv2d_product {
  static_assert(MemorySpace<Space>, "solder::nn::conv2d: Space must be a memory space (solder::host, solder::device)");

  static constexpr std::size_t Cout = Spec::out_channels, group_out = Spec::group_out;
  using exec = executor<backend_of_t<Space>>;
  using gradients = conv2d_gradients<Spec, Space>;
  /// Pixel rows [batch Ho Wo, Cout/Groups]: a group's forward product.
  using pixels = shape<dyn, group_out>;

 public:
  /// Nothing is packed: the products read the weights as torch stores them.
  void pack_weights(const float*) {}
  void weights_changed() {}

  /// y = op(conv2d(x, weight) + bias) on NCHW tensors, op an activation of ops/activations.hpp
  /// (or ops::conv2d_identity) applied with the bias as each value of y is written.
  template <class G, class Op = ops::conv2d_identity>
  void forward(const float* weight, const float* bias, const float* x, float* y, std::size_t batch, const Op& op = {}) {
    static_assert(conv2d_check_geometry<Spec, G>());
    const std::size_t rows = batch * G::out_plane;
    if (rows == 0) return;
    grow(pixel_rows, rows);
    const tensor_ref<float, pixels, Space> c(pixel_rows.data(), rows);
    for (std::size_t q = 0; q < Spec::groups; ++q) {
      exec::run(write(c, gradients::template product<G>(x, weight, batch, q)));
      exec::planes(batch, group_out, G::out_plane, group_out * G::out_plane,
                   ops::conv2d_nhwc_to_nchw<group_out, G::out_plane, Op, Cout>{
                       c.data(), y + q * group_out * G::out_plane, bias ? bias + q * group_out : nullptr, op});
    }
  }

  /// weight_grad [Cout, Cin, Kh, Kw] and bias_grad [Cout] (overwritten; null without a bias)
  /// and, unless dx is null, dx = dL/dx [batch, Cin, H, W]: conv2d_gradients.
  template <class G>
  static void backward(const float* weight, const float* x, const float* dy, float* dx, float* weight_grad,
                       float* bias_grad, std::size_t batch) {
    gradients::template backward<G>(weight, x, dy, dx, weight_grad, bias_grad, batch);
  }

 private:
  tensor<float, pixels, Space> pixel_rows{1};

  template <class S>
  static void grow(tensor<float, S, Space>& t, std::size_t rows) {
    if (t.batch() < rows) t = tensor<float, S, Space>(rows);
  }
};

}  // namespace solder::nn::detail
