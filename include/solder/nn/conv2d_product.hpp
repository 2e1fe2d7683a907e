// nn/conv2d_product.hpp: a convolution with one group written once over the executor's verbs, as
// matrix products over a batch's image patches (expr/operand.hpp's image_patches) and the
// passes of ops/conv2d.hpp around them: what a backend without convolution kernels of its own
// (CUDA) runs. A backend with convolution kernels of its own (the CPU's executor::conv2d) runs
// those instead, with the same interface.
//
//   forward    c [batch Ho Wo, Cout] = patches(x) W^T             (a product, c channels-last)
//              y [batch, Cout, Ho, Wo] = op(c + b), reordered      (planes)
//   backward   g [batch Ho Wo, Cout] = dy reordered                (planes)
//              db = dy summed per channel                          (rows<dyn>, a fixed order)
//              dW [Cout, Cin Kh Kw] = g^T patches(x)               (the product's rule)
//              dcol [batch Ho Wo, Cin Kh Kw] = g W                 (the product's rule)
//              dx = col2im(dcol), gathered per element             (planes, no atomics)
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

/// A convolution layer's work in memory of Space (Spec: ops::conv2d_spec, one group) by the
/// verbs of executor<backend_of_t<Space>>, for images of the geometry G each call names: x
/// [batch, Cin, H, W], y [batch, Cout, Ho, Wo], weights [Cout, Cin, Kh, Kw] and bias [Cout] as
/// torch stores them (bias null without one), every pointer memory of Space. Its scratch (the
/// products' channels-last output or gradient, and dcol) is grown to the largest batch and
/// kept. Results do not depend on the launch shape: the products' and the sums' orders are
/// fixed by the sizes.
template <class Spec, class Space>
class conv2d_product {
  static_assert(MemorySpace<Space>, "solder::nn::conv2d: Space must be a memory space (solder::host, solder::device)");
  static constexpr bool one_group = Spec::groups == 1 && !Spec::depthwise;
  static_assert(one_group,
                "solder::nn::conv2d: a backend without convolution kernels of its own runs convolutions with one group; "
                "set Groups = 1, or run the layer in host memory");

  static constexpr std::size_t Cin = Spec::in_channels, Cout = Spec::out_channels, K = Spec::fan_in;
  using exec = executor<backend_of_t<Space>>;
  /// Pixel rows [batch Ho Wo, Cout] (the products' output and their gradient input), patch
  /// gradients [batch Ho Wo, Cin Kh Kw], and the weight [Cout, Cin Kh Kw] as the products read
  /// it.
  using pixels = shape<dyn, Cout>;
  using columns = shape<dyn, K>;
  using weights = shape<Cout, K>;

 public:
  /// Nothing is packed: the products read the weights as torch stores them.
  void pack_weights(const float*) {}
  void weights_changed() {}

  /// y = op(conv2d(x, weight) + bias) on NCHW tensors, op an activation of ops/activations.hpp
  /// (or ops::conv2d_identity) applied with the bias as each value of y is written.
  template <class G, class Op = ops::conv2d_identity>
  void forward(const float* weight, const float* bias, const float* x, float* y, std::size_t batch, const Op& op = {}) {
    static_assert(check_geometry<G>());
    const std::size_t rows = batch * G::out_plane;
    if (rows == 0) return;
    grow(pixel_rows, rows);
    const tensor_ref<float, pixels, Space> c(pixel_rows.data(), rows);
    exec::run(write(c, product<G>(x, weight, batch)));
    exec::planes(batch, Cout, G::out_plane, Cout * G::out_plane,
                 ops::conv2d_nhwc_to_nchw<Cout, G::out_plane, Op>{c.data(), y, bias, op});
  }

  /// weight_grad [Cout, Cin, Kh, Kw] and bias_grad [Cout] (overwritten; null without a bias)
  /// and, unless dx is null, dx = dL/dx [batch, Cin, H, W], for x and dy [batch, Cout, Ho, Wo].
  template <class G>
  void backward(const float* weight, const float* x, const float* dy, float* dx, float* weight_grad, float* bias_grad,
                std::size_t batch) {
    static_assert(check_geometry<G>());
    const std::size_t rows = batch * G::out_plane;
    // From dy as stored: a channel's values lie in runs of Ho Wo there (Cout apart in g).
    if (bias_grad != nullptr)
      exec::template rows<dyn>(Cout, ops::conv2d_channel_sums<Cout, G::out_plane, false>{dy, bias_grad, rows});
    if (rows == 0) {  // no terms: dW = 0, and nothing to gather
      exec::elements(Cout * K, ops::fill_elements{weight_grad, 0.0f});
      return;
    }
    grow(pixel_rows, rows);
    const tensor_ref<const float, pixels, Space> g(pixel_rows.data(), rows);
    exec::planes(batch, G::out_plane, Cout, Cout * G::out_plane,
                 ops::conv2d_nchw_to_nhwc<Cout, G::out_plane>{dy, pixel_rows.data()});
    // dW = g^T patches(x) and dcol = g W: the product's rules, as a linear layer's.
    exec::run(write(tensor_ref<float, weights, Space>(weight_grad),
                    std::get<0>(autodiff::right_grads(product<G>(x, weight, batch), g))));
    if (dx == nullptr) return;
    grow(column_rows, rows);
    const tensor_ref<float, columns, Space> dcol(column_rows.data(), rows);
    exec::run(write(dcol, autodiff::left_grad(product<G>(x, weight, batch), g)));
    exec::planes(batch * Cin, G::height, G::width, G::in_plane, ops::conv2d_col2im<G, Cin>{dcol.data(), dx});
  }

 private:
  tensor<float, pixels, Space> pixel_rows{1};
  tensor<float, columns, Space> column_rows{1};

  template <class S>
  static void grow(tensor<float, S, Space>& t, std::size_t rows) {
    if (t.batch() < rows) t = tensor<float, S, Space>(rows);
  }
  static tensor_ref<const float, weights, Space> weight_view(const float* weight) {
    return tensor_ref<const float, weights, Space>(weight);
  }
  /// The convolution as a product: patches(x) W^T, [batch Ho Wo, Cout].
  template <class G>
  static auto product(const float* x, const float* weight, std::size_t batch) {
    return matmul(image_patches<G, Cin, Space>{x, batch}, transpose(weight_view(weight)));
  }
  /// G must be where the layer's windows fall on some H x W image.
  template <class G>
  static constexpr bool check_geometry() {
    using want = typename Spec::template geometry<G::height, G::width>;
    static_assert(G::kernel_height == want::kernel_height && G::kernel_width == want::kernel_width &&
                      G::stride == want::stride && G::padding == want::padding && G::dilation == want::dilation,
                  "solder::nn::conv2d: the geometry must have the layer's kernel, stride, padding and dilation");
    return true;
  }
};

}  // namespace solder::nn::detail
