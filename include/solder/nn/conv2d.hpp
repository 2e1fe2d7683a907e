// nn/conv2d.hpp: PyTorch's nn.Conv2d (zero padding) over NCHW activations (or channels-last
// ones): the layer's parameters, shapes, planner traits and checks. Its geometry and im2col
// index maps are ops/conv2d.hpp's; the backend of its memory space runs it: with convolution
// kernels of its own where it has them (the CPU's: register tiles for one group, a GEMM over
// im2col columns for groups and pointwise layers, a direct loop per plane for depthwise ones;
// docs/convolution.md), else as matrix products over image patches (nn/conv2d_product.hpp).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "solder/assign.hpp"
#include "solder/config.hpp"
#include "solder/diagnostic.hpp"
#include "solder/nn/batch_check.hpp"
#include "solder/nn/block.hpp"
#include "solder/nn/conv2d_product.hpp"
#include "solder/nn/layer_kind.hpp"
#include "solder/nn/linear.hpp"
#include "solder/nn/sample_shape.hpp"
#include "solder/ops/conv2d.hpp"
#include "solder/optim/optimizer.hpp"
#include "solder/shape.hpp"
#include "solder/tensor.hpp"

namespace solder::nn {

namespace detail {

/// True when [p, p + n) and [q, q + m) (floats) overlap.
inline bool conv2d_overlaps(const float* p, std::size_t n, const float* q, std::size_t m) {
  const auto a = reinterpret_cast<std::uintptr_t>(p), b = reinterpret_cast<std::uintptr_t>(q);
  return a < b + m * sizeof(float) && b < a + n * sizeof(float);
}

/// The convolution kernels of executor E for Spec in memory of Space: the backend's own
/// (E::conv2d<Spec>) where it has them, else products over image patches.
template <class E, class Spec, class Space>
struct conv2d_kernels {
  using type = conv2d_product<Spec, Space>;
  static constexpr bool own = false;
};
template <class E, class Spec, class Space>
  requires requires { typename E::template conv2d<Spec>; }
struct conv2d_kernels<E, Spec, Space> {
  using type = typename E::template conv2d<Spec>;
  static constexpr bool own = true;
};

}  // namespace detail

template <class Conv, class... Tail>
class conv_block;

/// y = conv2d(x, W) + b, torch's nn.Conv2d(Cin, Cout, (Kh, Kw), stride, padding, dilation,
/// groups, bias) with zero padding: x [batch, Cin, H, W] -> y [batch, Cout, Ho, Wo],
/// Ho = (H + 2 Pad - Dilation (Kh - 1) - 1) / Stride + 1 (Wo likewise); W [Cout, Cin/Groups,
/// Kh, Kw] and b [Cout] as torch stores them. H and W come from x's shape type. Results do not
/// depend on the thread count. W, b and the tensors it takes live in Space (host memory by
/// default; `in_space<device>` is the same layer over CUDA memory: a product per group).
template <std::size_t Cin, std::size_t Cout, std::size_t Kh, std::size_t Kw, std::size_t Stride = 1,
          std::size_t Pad = 0, std::size_t Dilation = 1, std::size_t Groups = 1, bool Bias = true, class Space = host>
class conv2d : public ops::conv2d_spec<Cin, Cout, Kh, Kw, Stride, Pad, Dilation, Groups, Bias> {
  static_assert(Cin >= 1 && Cout >= 1, "solder::nn::conv2d: the channel counts Cin and Cout must be at least 1");
  static_assert(Kh >= 1 && Kw >= 1, "solder::nn::conv2d: the kernel size Kh x Kw must be at least 1 x 1");
  static_assert(Stride >= 1 && Dilation >= 1, "solder::nn::conv2d: Stride and Dilation must be at least 1");
  static_assert(Groups >= 1, "solder::nn::conv2d: Groups must be at least 1");
  static_assert(Cin % Groups == 0,
                "solder::nn::conv2d: Cin must be a multiple of Groups (each group takes Cin/Groups channels)");
  static_assert(Cout % Groups == 0,
                "solder::nn::conv2d: Cout must be a multiple of Groups (each group gives Cout/Groups channels)");

 public:
  // The layer's constants, as its spec (ops/conv2d.hpp) states them: channels, kernel, stride,
  // padding, dilation, groups, bias, group_in and group_out, fan_in (torch's too), and depthwise
  // (groups of one input channel each run a direct loop per plane: their products have K = Kh Kw,
  // too short for the GEMM to pay for im2col).
  using base_spec = ops::conv2d_spec<Cin, Cout, Kh, Kw, Stride, Pad, Dilation, Groups, Bias>;
  using base_spec::in_channels, base_spec::out_channels, base_spec::kernel_height, base_spec::kernel_width,
      base_spec::stride, base_spec::padding, base_spec::dilation, base_spec::groups, base_spec::has_bias,
      base_spec::group_in, base_spec::group_out, base_spec::fan_in, base_spec::depthwise;
  using space = Space;
  /// The same layer with its parameters in memory space S.
  template <class S>
  using in_space = conv2d<Cin, Cout, Kh, Kw, Stride, Pad, Dilation, Groups, Bias, S>;
  static constexpr const char* name = "conv2d";
  /// Parameter names in params() order, as PyTorch's state_dict names them.
  static constexpr const char* param_names[] = {"weight", "bias"};

  /// The output extent along an axis of `in` elements with a kernel of `k` taps (0 when the
  /// dilated kernel does not fit in the padded input).
  static constexpr std::size_t output_size(std::size_t in, std::size_t k) {
    return ops::conv2d_output_size(in, k, Stride, Pad, Dilation);
  }

  /// What the planner and cost.hpp know of the layer (nn/layer_info.hpp).
  /// The block the planner runs this layer as, with the batch_norm and elementwise layers after it.
  template <class... Tail>
  using block = conv_block<conv2d, Tail...>;
  /// Whether the backend of Space runs it with convolution kernels of its own (the CPU's: they
  /// also take channels-last images), rather than as products over image patches.
  static constexpr bool own_kernels =
      detail::conv2d_kernels<executor<backend_of_t<Space>>, base_spec, Space>::own;

  struct planner_traits {
    // A product: the elementwise layers after it join its block, and a batch_norm right after
    // it too (folded into the weights once the model is frozen).
    static constexpr layer_kind kind = layer_kind::product;
    static constexpr bool folds_normalization = true;
    static constexpr std::size_t in = 0, out = 0;  // samples are images, not feature vectors
    static constexpr std::size_t parameters = Cout * fan_in + (Bias ? Cout : 0);
    // Per output element: fan_in multiply-adds, and the bias add.
    static constexpr double forward_flops(std::size_t out_features) {
      return double(out_features) * (2.0 * fan_in + (Bias ? 1.0 : 0.0));
    }
    // The products for dW and dx (twice forward's), and db's sum.
    static constexpr double backward_flops(std::size_t out_features) {
      return double(out_features) * (4.0 * fan_in + (Bias ? 1.0 : 0.0));
    }
    static constexpr double input_grad_flops(std::size_t out_features) { return double(out_features) * 2.0 * fan_in; }
    static constexpr std::size_t saved_floats(std::size_t) { return 0; }
    /// [Cin, H, W] with at least one window along each axis.
    static constexpr bool takes(sample_shape s) {
      return s.rank == 3 && s[0] == Cin && output_size(s[1], Kh) >= 1 && output_size(s[2], Kw) >= 1;
    }
    static constexpr sample_shape gives(sample_shape s) {
      if (!takes(s)) return sample_shape{};
      return sample_shape(Cout, output_size(s[1], Kh), output_size(s[2], Kw));
    }
    /// "[64, H, W] with H, W >= 3": the smallest extents the padded, dilated kernel fits in.
    static constexpr void append_takes(fixed_string& m) {
      m.append("[").append(Cin).append(", H, W] with ");
      if (min_height == min_width)
        m.append("H, W >= ").append(min_height);
      else
        m.append("H >= ").append(min_height).append(", W >= ").append(min_width);
    }
  };

  tensor<float, shape<Cout, group_in, Kh, Kw>, Space> weight;       // W
  tensor<float, shape<Cout, group_in, Kh, Kw>, Space> weight_grad;  // dL/dW, written by backward
  [[no_unique_address]] std::conditional_t<Bias, tensor<float, shape<Cout>, Space>, std::tuple<>> bias{};
  [[no_unique_address]] std::conditional_t<Bias, tensor<float, shape<Cout>, Space>, std::tuple<>> bias_grad{};

  explicit conv2d(std::uint64_t seed = 0) { reset_parameters(seed); }

  /// torch's Conv2d.reset_parameters (kaiming_uniform with a = sqrt(5): W and b uniform in
  /// [-1/sqrt(fan_in), 1/sqrt(fan_in))), drawn from Philox stream (seed, 0) for W and (seed, 1)
  /// for b, as nn::linear.
  void reset_parameters(std::uint64_t seed) {
    kernels.weights_changed();
    const float bound = float(1.0 / std::sqrt(double(fan_in)));
    detail::fill_uniform_philox(weight, bound, seed, 0);
    if constexpr (Bias) detail::fill_uniform_philox(bias, bound, seed, 1);
  }

  /// {prefix + "weight", prefix + "bias"}, as torch's state_dict names them.
  std::vector<optim::basic_param<Space>> params(const std::string& prefix = "") {
    std::vector<optim::basic_param<Space>> p{optim::make_param(prefix + "weight", weight, weight_grad)};
    if constexpr (Bias) p.push_back(optim::make_param(prefix + "bias", bias, bias_grad));
    return p;
  }

  /// y = conv2d(x) + b for x [batch, Cin, H, W], y [batch, Cout, Ho, Wo]; y may not overlap x.
  template <class SX, class SY>
  void forward(tensor_ref<const float, SX, Space> x, tensor_ref<float, SY, Space> y) {
    forward_activated(x, y, ops::conv2d_identity{});
  }
  /// y = op(conv2d(x) + b), the activation op (ops/activations.hpp) applied as each value is
  /// stored: one pass for a convolution and the activation after it.
  template <class SX, class SY, class Op>
  void forward_activated(tensor_ref<const float, SX, Space> x, tensor_ref<float, SY, Space> y, const Op& op) {
    if constexpr (check_shapes<SX, SY>()) {
      check_pair("solder::nn::conv2d::forward", x, y);
      kernels.template forward<geometry_of<SX>>(weight.data(), bias_data(), x.data(), y.data(), samples(x), op);
    }
  }

  /// z = conv2d(x) + b, then the writes (solder::write(out, e), each e elementwise over tensors
  /// of z's shape, z among them, and broadcast ones such as a per-channel scale; an out may be
  /// z) computed on each part of z as soon as the convolution has stored it, while it is in
  /// cache: a residual add, dropout, any activation after a convolution in one pass over
  /// memory, with the bits assign_all(writes...) gives after forward(x, z).
  ///
  ///   conv.forward_with(x, y, write(y, relu(y + shortcut)));
  template <class SX, class SY, class W0, class... Ws>
  void forward_with(tensor_ref<const float, SX, Space> x, tensor_ref<float, SY, Space> z, const W0& w0, const Ws&... ws) {
    if constexpr (check_shapes<SX, SY>()) {
      check_pair("solder::nn::conv2d::forward_with", x, z);
      auto check_out = [&](const auto& w) {
        const std::size_t n = SY::elements(z.batch());
        if (detail::conv2d_overlaps(x.data(), x.size(), w.out.data(), n))
          solder::detail::fail("solder::nn::conv2d::forward_with: a write's output overlaps x; give it memory of its own");
      };
      check_out(w0);
      (check_out(ws), ...);
      if constexpr (detail::has_row_epilogue<exec>) {
        const auto writes = exec::template row_writes<SY>(z.batch(), w0, ws...);
        kernels.template forward<geometry_of<SX>>(weight.data(), bias_data(), x.data(), z.data(), samples(x),
                                                  ops::conv2d_identity{}, writes.epilogue());
      } else {
        kernels.template forward<geometry_of<SX>>(weight.data(), bias_data(), x.data(), z.data(), samples(x));
        exec::run(w0, ws...);
      }
    }
  }

  /// y = op(conv2d(x) + b) on channels-last tensors: x [batch, H, W, Cin], y [batch, Ho, Wo,
  /// Cout] (NHWC), the layout the convolution runs in, so nothing is transposed. The same
  /// values, bit for bit, as forward_activated on the NCHW tensors. One group only.
  template <class SX, class SY, class Op = ops::conv2d_identity>
  void forward_channels_last(tensor_ref<const float, SX, Space> x, tensor_ref<float, SY, Space> y, const Op& op = {}) {
    if constexpr (Groups != 1)
      static_assert(Groups == 1, "solder::nn::conv2d::forward_channels_last: runs convolutions with one group");
    else if constexpr (!own_kernels)
      static_assert(own_kernels, "solder::nn::conv2d::forward_channels_last: channels-last images need the convolution kernels "
                                 "of the CPU backend (host memory)");
    else if constexpr (check_shapes<SX, SY, true>()) {
      check_pair("solder::nn::conv2d::forward_channels_last", x, y);
      using G = typename spec::template geometry<SX::extents[1], SX::extents[2]>;
      kernels.template forward_layouts<G>(weight.data(), bias_data(), x.data(), y.data(), x.size() / SX::inner_size, true,
                                          true, op);
    }
  }

  /// forward_activated with x [batch, Cin, H, W] and y [batch, Cout, Ho, Wo] each stored NCHW
  /// or channels-last (NHWC) as x_last and y_last say: how a chain runs the convolutions
  /// between which it keeps its images channels-last. One group only.
  template <class SX, class SY, class Op = ops::conv2d_identity>
  void forward_layouts(tensor_ref<const float, SX, Space> x, tensor_ref<float, SY, Space> y, bool x_last, bool y_last,
                       const Op& op = {}) {
    if constexpr (Groups != 1)
      static_assert(Groups == 1, "solder::nn::conv2d::forward_layouts: runs convolutions with one group");
    else if constexpr (!own_kernels)
      static_assert(own_kernels, "solder::nn::conv2d::forward_layouts: channels-last images need the convolution kernels "
                                 "of the CPU backend (host memory)");
    else if constexpr (check_shapes<SX, SY>()) {
      check_pair("solder::nn::conv2d::forward", x, y);
      kernels.template forward_layouts<geometry_of<SX>>(weight.data(), bias_data(), x.data(), y.data(), samples(x), x_last,
                                                        y_last, op);
    }
  }

  /// Packs the weights once for the forward calls that follow (the model is frozen: a chain
  /// calls it when it leaves training and when its parameters change); weights_changed()
  /// returns to packing them per call, as training needs.
  void pack_weights() { kernels.pack_weights(weight.data()); }
  void weights_changed() { kernels.weights_changed(); }
  template <class SX, class SY>
  void forward(const tensor<float, SX, Space>& x, tensor<float, SY, Space>& y) { forward(x.ref(), y.ref()); }

  /// dx = dL/dx, and weight_grad, bias_grad (overwritten) for x [batch, Cin, H, W] and dy
  /// [batch, Cout, Ho, Wo]; y (the forward's output) is not read. dx may not overlap x or dy.
  template <class SX, class SY>
  void backward(tensor_ref<const float, SX, Space> x, tensor_ref<const float, SY, Space> y, tensor_ref<const float, SY, Space> dy,
                tensor_ref<float, SX, Space> dx) {
    if constexpr (check_shapes<SX, SY>()) {
      const std::size_t batch = x.batch();
      if (y.batch() != batch || dy.batch() != batch || dx.batch() != batch)
        detail::batches_differ("solder::nn::conv2d::backward",
                               {{"x", batch}, {"y", y.batch()}, {"dy", dy.batch()}, {"dx", dx.batch()}});
      if (detail::conv2d_overlaps(dx.data(), dx.size(), x.data(), x.size()) ||
          detail::conv2d_overlaps(dx.data(), dx.size(), dy.data(), dy.size()))
        solder::detail::fail("solder::nn::conv2d::backward: dx overlaps x or dy; give dx memory of its own");
      gradients<geometry_of<SX>>(x.data(), dy.data(), dx.data(), samples(x));
    }
  }
  template <class SX, class SY>
  void backward(const tensor<float, SX, Space>& x, const tensor<float, SY, Space>& y, const tensor<float, SY, Space>& dy,
                tensor<float, SX, Space>& dx) {
    backward(x.ref(), y.ref(), dy.ref(), dx.ref());
  }

  /// backward without dx (the first layer of a network: its input needs no gradient).
  template <class SX, class SY>
  void backward_params(tensor_ref<const float, SX, Space> x, tensor_ref<const float, SY, Space> y, tensor_ref<const float, SY, Space> dy) {
    if constexpr (check_shapes<SX, SY>()) {
      const std::size_t batch = x.batch();
      if (y.batch() != batch || dy.batch() != batch)
        detail::batches_differ("solder::nn::conv2d::backward_params",
                               {{"x", batch}, {"y", y.batch()}, {"dy", dy.batch()}});
      gradients<geometry_of<SX>>(x.data(), dy.data(), nullptr, samples(x));
    }
  }

 private:
  using exec = executor<backend_of_t<Space>>;
  /// The layer as its backend sees it, and the backend's work for it (which keeps the weights
  /// packed for a frozen model).
  using spec = base_spec;
  typename detail::conv2d_kernels<exec, spec, Space>::type kernels;

  static constexpr std::size_t span_height = Dilation * (Kh - 1) + 1;
  static constexpr std::size_t span_width = Dilation * (Kw - 1) + 1;
  static constexpr std::size_t min_height = span_height > 2 * Pad ? span_height - 2 * Pad : 1;
  static constexpr std::size_t min_width = span_width > 2 * Pad ? span_width - 2 * Pad : 1;
  /// Samples in x: its batch, or a static shape's leading extent.
  template <class SX>
  static std::size_t samples(tensor_ref<const float, SX, Space> x) { return x.size() / SX::inner_size; }
  template <class SX>
  using geometry_of = typename spec::template geometry<SX::extents[2], SX::extents[3]>;

  /// Its groups' products' gradients (nn/conv2d_product.hpp); a depthwise layer's on the CPU's loops.
  template <class G>
  void gradients(const float* x, const float* dy, float* dx, std::size_t batch) {
    if constexpr (!(depthwise && own_kernels))
      detail::conv2d_gradients<spec, Space>::template backward<G>(weight.data(), x, dy, dx, weight_grad.data(),
                                                                  bias_grad_data(), batch);
    else
      kernels.template backward<G>(weight.data(), x, dy, dx, weight_grad.data(), bias_grad_data(), batch);
  }

  const float* bias_data() const {
    if constexpr (Bias)
      return bias.data();
    else
      return nullptr;
  }
  float* bias_grad_data() {
    if constexpr (Bias)
      return bias_grad.data();
    else
      return nullptr;
  }

  // ---- shapes -----------------------------------------------------------------------------

  /// x and y of one forward call: the same batch, and memory of their own.
  template <class X, class Y>
  static void check_pair(const char* where, const X& x, const Y& y) {
    if (x.batch() != y.batch()) detail::batches_differ(where, {{"x", x.batch()}, {"y", y.batch()}});
    if (detail::conv2d_overlaps(x.data(), x.size(), y.data(), y.size()))
      solder::detail::fail(std::string(where) + ": y overlaps x; a convolution cannot run in place");
  }

  /// x [batch, Cin, H, W] with the kernel fitting, y [batch, Cout, Ho, Wo] (Last: x [batch, H,
  /// W, Cin], y [batch, Ho, Wo, Cout]); one message for the first rule broken.
  template <class SX, class SY, bool Last = false>
  static constexpr bool check_shapes() {
    [[maybe_unused]] constexpr const char* where = Last ? "solder::nn::conv2d::forward_channels_last: " : "solder::nn::conv2d: ";
    constexpr std::size_t c_axis = Last ? 3 : 1, h_axis = Last ? 1 : 2;
    if constexpr (!(SX::rank == 4 && SX::extents[c_axis] == Cin)) {
      constexpr fixed_string m = [] {
        fixed_string s("");
        s.append(where);
        s.append("x must be [batch, ");
        if constexpr (Last)
          s.append("H, W, ").append(Cin).append("]; got x ");
        else
          s.append(Cin).append(", H, W]; got x ");
        solder::detail::append_shape<SX>(s);
        return s;
      }();
      return diagnostic<m>::reported;
    } else if constexpr (output_size(SX::extents[h_axis], Kh) == 0 || output_size(SX::extents[h_axis + 1], Kw) == 0) {
      constexpr fixed_string m = [] {
        fixed_string s("");
        s.append(where);
        s.append("x ");
        solder::detail::append_shape<SX>(s);
        s.append(" is smaller than the padded ").append(Kh).append("x").append(Kw).append(" kernel; samples must be ");
        planner_traits::append_takes(s);
        return s;
      }();
      return diagnostic<m>::reported;
    } else {
      constexpr std::size_t ho = output_size(SX::extents[h_axis], Kh), wo = output_size(SX::extents[h_axis + 1], Kw);
      using want = std::conditional_t<Last, shape<SX::extents[0], ho, wo, Cout>, shape<SX::extents[0], Cout, ho, wo>>;
      if constexpr (std::is_same_v<SY, want>) {
        return true;
      } else {
        constexpr fixed_string m = [] {
          fixed_string s;
          s.append(where);
          s.append("y must be ");
          solder::detail::append_shape<want>(s);
          s.append(" for x ");
          solder::detail::append_shape<SX>(s);
          s.append("; got y ");
          solder::detail::append_shape<SY>(s);
          return s;
        }();
        return diagnostic<m>::reported;
      }
    }
  }
};

}  // namespace solder::nn

// The block a chain runs a convolution as; it needs conv2d complete, so it comes after it.
#include "solder/nn/conv_block.hpp"
