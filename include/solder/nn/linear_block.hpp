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
//
// A batch_norm right after the linear layer joins its block (the planner's rewrite linear ->
// batch_norm, as for a convolution, docs/convolution.md):
//
//   nn::linear_block<nn::linear<64, 128>, nn::batch_norm<128>, nn::relu> layer;
//
// In evaluation mode the normalization is folded into the layer once, when the model is frozen
// (pack_weights: eval() and parameters_changed() call it), per output feature j:
//   s_j = gamma_j / sqrt(running_var_j + eps),  W'[j] = W[j] s_j,  b'_j = (b_j - mean_j) s_j + beta_j
// and forward is one GEMM with W', b' and the tail in its epilogue. In training the batch's
// statistics are its own, so nothing can be folded: the GEMM, the normalization (its statistics
// in one pass, then y), the tail in one pass; backward runs them the other way. A backward in
// evaluation mode is the unfolded form's: what the folded forward did not keep is made again.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "solder/autodiff/product.hpp"
#include "solder/autodiff/vjp.hpp"
#include "solder/assign.hpp"
#include "solder/nn/batch_check.hpp"
#include "solder/nn/batch_norm.hpp"
#include "solder/nn/buffer.hpp"
#include "solder/nn/elementwise_block.hpp"
#include "solder/nn/linear.hpp"
#include "solder/nn/product_tail.hpp"
#include "solder/ops/batch_norm.hpp"
#include "solder/optim/optimizer.hpp"
#include "solder/random/seed.hpp"

namespace solder::nn {

namespace detail {
template <class L>
inline constexpr bool is_linear = false;
template <std::size_t In, std::size_t Out, bool B, class S>
inline constexpr bool is_linear<linear<In, Out, B, S>> = true;

/// product_tail of Out features in Space as a template of the tail's layers alone.
template <class Space, std::size_t Out>
struct product_tail_of {
  template <class... Tail>
  using type = product_tail<Space, Out, Tail...>;
};
}  // namespace detail

template <class Linear, class... Tail>
class linear_block
    : public detail::leading_norm<detail::product_tail_of<typename Linear::space, Linear::out_features>::template type,
                                  Tail...>::rest {
  static_assert(detail::is_linear<Linear>, "solder::nn::linear_block: the first layer must be an nn::linear");
  using split =
      detail::leading_norm<detail::product_tail_of<typename Linear::space, Linear::out_features>::template type, Tail...>;
  using base = typename split::rest;

 public:
  /// Where the parameters, the buffers and the tensors it takes live: the linear layer's space.
  using space = typename Linear::space;
  static constexpr std::size_t in_features = Linear::in_features;
  static constexpr std::size_t out_features = Linear::out_features;
  /// Whether a batch_norm follows the linear layer in the block (folded in evaluation mode).
  static constexpr bool has_norm = split::has_norm;
  using norm_type = typename split::norm;
  /// The elementwise layers after the linear layer (and after its batch_norm).
  using typename base::tail_type;
  static constexpr std::size_t tail_size = split::rest_size;
  /// The index in the block of the tail's first layer (the linear layer is 0).
  static constexpr std::size_t tail_first = has_norm ? 2 : 1;
  /// Whether the block keeps tensors of its output's size for backward beyond x and y: z = x W^T
  /// + b when the tail's derivative needs it, or with a batch_norm, z and its output.
  static constexpr bool keeps_preactivation = has_norm || base::keeps_preactivation;
  /// How many: with a batch_norm, z and (with a tail) the normalization's output; else z when kept.
  static constexpr std::size_t kept_outputs =
      has_norm ? 1 + (tail_size > 0 ? 1 : 0) : (base::keeps_preactivation ? 1 : 0);
  static_assert(!has_norm || split::channels == out_features,
                "solder::nn::linear_block: the batch_norm after a linear layer must have the layer's output features "
                "as its channels; use batch_norm<Out> for a linear<In, Out>");
  using base::tail;

  Linear linear;
  [[no_unique_address]] norm_type norm;
  /// With a batch_norm: whether eval mode runs the folded GEMM (default) or the layer and the
  /// normalization as written (the unfolded form, for comparisons; the same values within
  /// rounding).
  bool fold_in_eval = true;

  explicit linear_block(std::uint64_t seed = 0) : linear(seed) {}

  /// The product layer of the block (what the planner and the chain address as the block's head).
  Linear& head() { return linear; }
  const Linear& head() const { return linear; }

  /// Layer At of the block as the user wrote it: the linear layer, the batch_norm, the tail's layers.
  template <std::size_t At>
  auto& layer() {
    return layer_of<At>(*this);
  }
  template <std::size_t At>
  const auto& layer() const {
    return layer_of<At>(*this);
  }

  void train() {
    base::train();
    if constexpr (has_norm) norm.train();
  }
  void eval() {
    base::eval();
    if constexpr (has_norm) norm.eval();
  }

  /// Packs W once into the GEMM's layout; every forward then reads the packed copy (no packing
  /// per call) until the weights change. Call it again after changing `linear.weight` (an
  /// optimizer step); weights_changed() returns to packing per call. With a batch_norm it packs
  /// the folded W' instead (and makes b'), from the running statistics as they are now (the
  /// model is frozen), which eval-mode forwards then read.
  /// In device memory nothing is packed (the backend's product stages its own panels); W' is
  /// kept as a tensor there.
  void pack_weights() {
    if constexpr (std::is_same_v<space, host>) {
      if (!packed) packed = std::make_unique<packed_matrix<out_features, in_features, true>>();
      if constexpr (has_norm)
        fold();
      else
        packed->pack(linear.weight.data(), in_features);
      packed_current = true;
    } else if constexpr (has_norm) {
      fold();
      packed_current = true;
    }
  }
  void weights_changed() { packed_current = false; }

  // The block contract (nn/block.hpp).
  static constexpr bool channels_last_capable = false;
  static constexpr bool input_grad_optional = true;
  /// The linear layer drawn as torch draws it from stream (seed, first); a batch_norm's
  /// parameters and statistics as torch starts them.
  void reset(std::uint64_t seed, std::size_t first) {
    linear.reset_parameters(random::derive_seed(seed, first));
    if constexpr (has_norm) {
      norm.reset_parameters();
      norm.reset_running_stats();
    }
    weights_changed();
  }
  /// The linear layer's parameters (and a batch_norm's), named from the index `first` of the
  /// linear layer in the chain ("0.weight", "0.bias", "1.weight", "1.bias").
  std::vector<optim::basic_param<space>> params_from(std::size_t first) {
    std::vector<optim::basic_param<space>> out = named_params(std::to_string(first) + ".", linear);
    if constexpr (has_norm)
      for (auto& p : norm.params(std::to_string(first + 1) + ".")) out.push_back(std::move(p));
    return out;
  }
  /// A batch_norm's running statistics, named as torch's state_dict names them.
  std::vector<basic_buffer<space>> buffers_from(std::size_t first) {
    if constexpr (has_norm)
      return norm.buffers(std::to_string(first + 1) + ".");
    else
      return {};
  }
  /// f(k, d) for every dropout d of the tail, k its index in the block.
  template <class F>
  void for_each_dropout(F&& f) {
    tail.for_each_dropout([&](std::size_t k, auto& d) { f(tail_first + k, d); });
  }

  static const char* plan_kind()
    requires has_norm
  {
    return "GEMM, BN folded in eval";
  }
  static std::string plan_note()
    requires has_norm
  {
    return "eval: batch_norm folded into the GEMM when frozen (W' = W g/sqrt(var+eps), b' = (b-mean) g/sqrt(var+eps) "
           "+ beta), the tail in its epilogue; train: the GEMM, batch statistics and normalization, then the tail";
  }

  /// y = tail(x W^T + b) for x [batch, In], y [batch, Out]: one GEMM. In training mode each
  /// call draws fresh dropout masks, and keeps z when keeps_preactivation. With a batch_norm,
  /// y = tail(norm(x W^T + b)): one GEMM with W', b' in evaluation mode (after pack_weights).
  template <class SX, class SY>
  void forward(tensor_ref<const float, SX, space> x, tensor_ref<float, SY, space> y) {
    static_assert(check_shapes<SX, SY>());
    if constexpr (has_norm)
      forward_normalized(x, y);
    else
      this->in_current_mode([&](auto m) { forward_as<decltype(m)::value>(x, y); });
  }
  template <class SX, class SY>
  void forward(const tensor<float, SX, space>& x, tensor<float, SY, space>& y) {
    forward(x.ref(), y.ref());
  }

  /// Gradients of the last forward: linear.weight_grad, linear.bias_grad (and with a batch_norm
  /// its weight_grad and bias_grad; overwritten) and dx = dL/dx. x and y are that forward's
  /// input and output.
  template <class SX, class SY>
  void backward(tensor_ref<const float, SX, space> x, tensor_ref<const float, SY, space> y,
                tensor_ref<const float, SY, space> dy, tensor_ref<float, SX, space> dx) {
    // dx [batch, In] = g W, the product's rule.
    assign(dx, autodiff::left_grad(linear.product(x), gradients(x, y, dy)));
  }
  template <class SX, class SY>
  void backward(const tensor<float, SX, space>& x, const tensor<float, SY, space>& y, const tensor<float, SY, space>& dy,
                tensor<float, SX, space>& dx) {
    backward(x.ref(), y.ref(), dy.ref(), dx.ref());
  }

  /// backward without dx (the first layer of a network: its input needs no gradient).
  template <class SX, class SY>
  void backward_params(tensor_ref<const float, SX, space> x, tensor_ref<const float, SY, space> y,
                       tensor_ref<const float, SY, space> dy) {
    gradients(x, y, dy);
  }

  /// The expression forward evaluates, for x: tail(x W^T + b) (without a batch_norm, whose
  /// training statistics are a pass of their own).
  template <mode M, class X>
  auto expression(const X& x) const
    requires(!has_norm)
  {
    return tail.template expression<M>(linear.expression(x));
  }

 private:
  std::unique_ptr<packed_matrix<out_features, in_features, true>> packed;
  bool packed_current = false;

  template <std::size_t At, class Self>
  static auto& layer_of(Self& self) {
    return detail::block_layer<At, has_norm>(self.linear, self.norm, self.tail.layers);
  }

  // With a batch_norm: the folded bias b' (W' is packed), whether the last forward ran the
  // folded GEMM, its batch, and rows of Out floats grown to the largest batch: the product's
  // output z, the tail's input u (the normalization's output), and their gradients.
  using vector_type = tensor<float, shape<out_features>, space>;
  using weight_type = tensor<float, shape<out_features, in_features>, space>;
  [[no_unique_address]] std::conditional_t<has_norm, vector_type, std::tuple<>> folded_bias{};
  /// W' in device memory (the host packs it instead).
  [[no_unique_address]] std::conditional_t<has_norm && !std::is_same_v<space, host>, weight_type, std::tuple<>>
      folded_weight{};
  bool folded_last = false;
  std::size_t saved_batch = 0;
  using rows_or_none = typename base::template rows_if<has_norm>;
  [[no_unique_address]] rows_or_none z_buf = base::template one_row_if<has_norm>(),
                                     u_buf = base::template one_row_if<has_norm>(),
                                     gz_buf = base::template one_row_if<has_norm>(),
                                     gu_buf = base::template one_row_if<has_norm>();

  /// The gate g = dL/dz with db (one pass), then dW = g^T x; returns g. With a batch_norm, z is
  /// the product's output before it.
  template <class SX, class SY>
  tensor_ref<const float, SY, space> gradients(tensor_ref<const float, SX, space> x, tensor_ref<const float, SY, space> y,
                                               tensor_ref<const float, SY, space> dy) {
    static_assert(check_shapes<SX, SY>());
    const std::size_t batch = dy.batch();
    if (x.batch() != batch || y.batch() != batch)
      detail::batches_differ("solder::nn::linear_block::backward", {{"x", x.batch()}, {"y", y.batch()}, {"dy", batch}});
    if constexpr (has_norm) {
      return gradients_normalized(x, y, dy);
    } else {
      const auto g = this->gate(y, dy, linear.bias_grad, "solder::nn::linear_block::backward");
      // dW [Out, In] = g^T x, the product's rule: it sums over the batch.
      assign(linear.weight_grad, std::get<0>(autodiff::right_grads(linear.product(x), g)));
      return g;
    }
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
  void forward_as(tensor_ref<const float, SX, space> x, tensor_ref<float, SY, space> y) {
    if constexpr (std::is_same_v<space, host>) {
      if (packed_current) return this->template store<M>(y, packed_product(x));
    }
    this->template store<M>(y, linear.expression(x));
  }

  template <class S>
  static tensor_ref<const float, S, space> cview(tensor_ref<float, S, space> t) {
    return tensor_ref<const float, S, space>(t);
  }

  /// The forward with a batch_norm: folded (evaluation mode, frozen), or as written.
  template <class SX, class SY>
  void forward_normalized(tensor_ref<const float, SX, space> x, tensor_ref<float, SY, space> y) {
    const std::size_t batch = x.batch();
    if (y.batch() != batch)
      detail::batches_differ("solder::nn::linear_block::forward", {{"x", batch}, {"y", y.batch()}});
    saved_batch = batch;
    folded_last = this->current == mode::eval && fold_in_eval && packed_current;
    if (folded_last) {
      // One GEMM with W' and b', the tail in its epilogue.
      if constexpr (std::is_same_v<space, host>)
        this->template store<mode::eval>(y, matmul(x, *packed) + folded_bias);
      else
        this->template store<mode::eval>(y, matmul(x, transpose(folded_weight)) + folded_bias);
      return;
    }
    const auto z = this->template workspace<SY>(z_buf, batch);
    assign(z, linear.expression(x));
    const auto u = tail_size > 0 ? this->template workspace<SY>(u_buf, batch) : y;  // the tail's input
    norm.forward(cview(z), u);
    if constexpr (tail_size > 0) tail.forward(cview(u), y);
  }

  /// The tail's and the normalization's backward, then db and dW from g = dL/dz; returns g.
  template <class SX, class SY>
  tensor_ref<const float, SY, space> gradients_normalized(tensor_ref<const float, SX, space> x,
                                                          tensor_ref<const float, SY, space> y,
                                                          tensor_ref<const float, SY, space> dy) {
    const std::size_t batch = dy.batch();
    if (saved_batch != batch)
      solder::detail::fail_counts("solder::nn::linear_block::backward: the last forward had ", saved_batch,
                                  " samples, dy has ", batch, "; run forward on this batch first");
    const auto z = this->template workspace<SY>(z_buf, batch);
    const auto gz = this->template workspace<SY>(gz_buf, batch);
    // A folded forward left neither z nor the normalization's state of this batch, nor the
    // tail's input u: backward is the unfolded form's, so they are made again here, as the
    // unfolded forward makes them (without a tail, u is only scratch: gz is written later).
    if (folded_last) {
      assign(z, linear.expression(x));
      norm.forward(cview(z), tail_size > 0 ? this->template workspace<SY>(u_buf, batch) : gz);
    }
    const auto u = tail_size > 0 ? cview(this->template workspace<SY>(u_buf, batch)) : y;
    const auto gu = [&] {
      if constexpr (tail_size > 0) {
        const auto g = this->template workspace<SY>(gu_buf, batch);
        tail.backward(u, y, dy, g);
        return cview(g);
      } else {
        return dy;
      }
    }();
    norm.backward(cview(z), u, gu, gz);
    const auto g = cview(gz);
    if constexpr (Linear::has_bias) assign(linear.bias_grad, sum_to<shape<out_features>>(g));
    // dW [Out, In] = g^T x, the product's rule: it sums over the batch.
    assign(linear.weight_grad, std::get<0>(autodiff::right_grads(linear.product(x), g)));
    return g;
  }

  /// W' (packed) and b' from the linear layer, the normalization's parameters and its running
  /// statistics: ops::batch_norm_fold per output feature.
  void fold() {
    std::vector<float> host_w;  // W' [Out, In] until packed, on the host
    float* w = nullptr;
    if constexpr (std::is_same_v<space, host>) {
      host_w.resize(out_features * in_features);
      w = host_w.data();
    } else {
      w = folded_weight.data();
    }
    executor<backend_of_t<space>>::elements(out_features * in_features,
                                            ops::batch_norm_fold_elements{linear.weight.data(), bias_data(),
                                                                          norm.weight.data(), norm.bias.data(),
                                                                          norm.running_mean.data(),
                                                                          norm.running_var.data(), w, folded_bias.data(),
                                                                          in_features, norm.eps});
    if constexpr (std::is_same_v<space, host>) packed->pack(w, in_features);
  }
  const float* bias_data() const {
    if constexpr (Linear::has_bias)
      return linear.bias.data();
    else
      return nullptr;
  }
};

}  // namespace solder::nn
