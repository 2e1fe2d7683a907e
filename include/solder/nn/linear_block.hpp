// nn/linear_block.hpp: a linear layer and the elementwise layers after it as ONE kernel forward
// (the GEMM with the activation and dropout in its epilogue) and a fused backward (one
// elementwise pass for the gate and the bias gradient, then dW = g^T x and dx = g W as GEMMs,
// the product node's derived rules of autodiff/product.hpp).
//
//   nn::linear_block<nn::linear<64, 128>, nn::relu, nn::dropout<0.1f>> layer;
//   layer.forward(x, y);           // y = dropout(relu(x W^T + b)): one GEMM
//   layer.backward(x, y, dy, dx);  // dW, db and dx
//
// What backward needs from forward: x and y, which a network keeps anyway (x is the previous
// layer's output, y the next one's input). When the activation's derivative does not follow
// from y (gelu, silu, tanh before dropout), the layer also keeps the pre-activation z = x W^T + b,
// Out floats per sample, written by the same GEMM epilogue as y.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>

#include "solder/autodiff/product.hpp"
#include "solder/autodiff/vjp.hpp"
#include "solder/assign.hpp"
#include "solder/nn/batch_check.hpp"
#include "solder/nn/elementwise_block.hpp"
#include "solder/nn/linear.hpp"
#include "solder/nn/product_tail.hpp"

namespace solder::nn {

namespace detail {
template <class L>
inline constexpr bool is_linear = false;
template <std::size_t In, std::size_t Out, bool B>
inline constexpr bool is_linear<linear<In, Out, B>> = true;
}  // namespace detail

template <class Linear, class... Tail>
class linear_block : public product_tail<Linear::out_features, Tail...> {
  static_assert(detail::is_linear<Linear>, "solder::nn::linear_block: the first layer must be an nn::linear");
  using base = product_tail<Linear::out_features, Tail...>;

 public:
  static constexpr std::size_t in_features = Linear::in_features;
  static constexpr std::size_t out_features = Linear::out_features;
  using typename base::tail_type;
  using base::keeps_preactivation;
  using base::tail;

  Linear linear;

  explicit linear_block(std::uint64_t seed = 0) : linear(seed) {}

  /// The product layer of the block (what the planner and the chain address as the block's head).
  Linear& head() { return linear; }
  const Linear& head() const { return linear; }

  /// Packs W once into the GEMM's layout; every forward then reads the packed copy (no packing
  /// per call) until the weights change. Call it again after changing `linear.weight` (an
  /// optimizer step); weights_changed() returns to packing per call.
  void pack_weights() {
    if (!packed) packed = std::make_unique<packed_matrix<out_features, in_features, true>>();
    packed->pack(linear.weight.data(), in_features);
    packed_current = true;
  }
  void weights_changed() { packed_current = false; }

  /// y = tail(x W^T + b) for x [batch, In], y [batch, Out]: one GEMM. In training mode each
  /// call draws fresh dropout masks, and keeps z when keeps_preactivation.
  template <class SX, class SY>
  void forward(tensor_ref<const float, SX> x, tensor_ref<float, SY> y) {
    static_assert(check_shapes<SX, SY>());
    this->in_current_mode([&](auto m) { forward_as<decltype(m)::value>(x, y); });
  }
  template <class SX, class SY>
  void forward(const tensor<float, SX>& x, tensor<float, SY>& y) {
    forward(x.ref(), y.ref());
  }

  /// Gradients of the last forward: linear.weight_grad, linear.bias_grad (overwritten) and
  /// dx = dL/dx. x and y are that forward's input and output.
  template <class SX, class SY>
  void backward(tensor_ref<const float, SX> x, tensor_ref<const float, SY> y, tensor_ref<const float, SY> dy,
                tensor_ref<float, SX> dx) {
    // dx [batch, In] = g W, the product's rule.
    assign(dx, autodiff::left_grad(linear.product(x), gradients(x, y, dy)));
  }
  template <class SX, class SY>
  void backward(const tensor<float, SX>& x, const tensor<float, SY>& y, const tensor<float, SY>& dy, tensor<float, SX>& dx) {
    backward(x.ref(), y.ref(), dy.ref(), dx.ref());
  }

  /// backward without dx (the first layer of a network: its input needs no gradient).
  template <class SX, class SY>
  void backward_params(tensor_ref<const float, SX> x, tensor_ref<const float, SY> y, tensor_ref<const float, SY> dy) {
    gradients(x, y, dy);
  }

  /// The expression forward evaluates, for x: tail(x W^T + b).
  template <mode M, class X>
  auto expression(const X& x) const {
    return tail.template expression<M>(linear.expression(x));
  }

 private:
  std::unique_ptr<packed_matrix<out_features, in_features, true>> packed;
  bool packed_current = false;

  /// The gate g = dL/dz with db (one pass), then dW = g^T x; returns g.
  template <class SX, class SY>
  tensor_ref<const float, SY> gradients(tensor_ref<const float, SX> x, tensor_ref<const float, SY> y,
                                        tensor_ref<const float, SY> dy) {
    static_assert(check_shapes<SX, SY>());
    const std::size_t batch = dy.batch();
    if (x.batch() != batch || y.batch() != batch)
      detail::batches_differ("solder::nn::linear_block::backward", {{"x", x.batch()}, {"y", y.batch()}, {"dy", batch}});
    const auto g = this->gate(y, dy, linear.bias_grad, "solder::nn::linear_block::backward");
    // dW [Out, In] = g^T x, the product's rule: it sums over the batch.
    assign(linear.weight_grad, std::get<0>(autodiff::right_grads(linear.product(x), g)));
    return g;
  }

  template <class SX, class SY>
  static constexpr bool check_shapes() {
    static_assert(Linear::template check_input<SX>());
    using want = shape<SX::extents[0], out_features>;
    if constexpr (std::is_same_v<SY, want>) {
      return true;
    } else {
      constexpr fixed_string m = [] {
        fixed_string s("solder::nn::linear_block: the output of a layer with input ");
        solder::detail::append_shape<SX>(s);
        s.append(" must have shape ");
        solder::detail::append_shape<want>(s);
        s.append(", not ");
        solder::detail::append_shape<SY>(s);
        return s;
      }();
      return diagnostic<m>::reported;
    }
  }

  /// x W^T + b with the packed weights (pack_weights).
  template <class X>
  auto packed_product(const X& x) const {
    if constexpr (Linear::has_bias)
      return matmul(x, *packed) + linear.bias;
    else
      return matmul(x, *packed);
  }

  template <mode M, class SX, class SY>
  void forward_as(tensor_ref<const float, SX> x, tensor_ref<float, SY> y) {
    if (packed_current)
      this->template store<M>(y, packed_product(x));
    else
      this->template store<M>(y, linear.expression(x));
  }
};

}  // namespace solder::nn
