// nn/conv2d.hpp: PyTorch's nn.Conv2d (zero padding) over NCHW activations (or channels-last
// ones): one group runs eval/cpu/conv_nhwc.hpp's convolution (tiles of output pixels summed over
// the taps in registers, the bias and an activation in its stores), except a pointwise one on
// NCHW tensors, which is a plain GEMM over x as stored; several groups run, per sample and
// group, solder's GEMM over columns packed from the image; backward as GEMMs, with dx gathered
// per input element (col2im without atomics). Depthwise layers (Groups == Cin) run a direct
// loop per plane.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "solder/config.hpp"
#include "solder/diagnostic.hpp"
#include "solder/eval/cpu/access.hpp"
#include "solder/eval/cpu/batch.hpp"
#include "solder/eval/cpu/chunking.hpp"
#include "solder/eval/cpu/conv_nhwc.hpp"
#include "solder/eval/cpu/conv_weight_grad.hpp"
#include "solder/eval/cpu/gemm.hpp"
#include "solder/eval/cpu/gemm_epilogue.hpp"
#include "solder/eval/cpu/parallel.hpp"
#include "solder/eval/cpu/row_writes.hpp"
#include "solder/memory.hpp"
#include "solder/nn/batch_check.hpp"
#include "solder/nn/layer_kind.hpp"
#include "solder/nn/linear.hpp"
#include "solder/nn/sample_shape.hpp"
#include "solder/ops/conv2d.hpp"
#include "solder/optim/optimizer.hpp"
#include "solder/shape.hpp"
#include "solder/tensor.hpp"

namespace solder::nn {

namespace detail {

/// Where the windows of a convolution fall (ops/conv2d.hpp), under the name generated code uses.
template <std::size_t H, std::size_t W, std::size_t Kh, std::size_t Kw, std::size_t S, std::size_t P, std::size_t D>
using conv2d_geometry = ops::conv2d_geometry<H, W, Kh, Kw, S, P, D>;

/// The columns of a convolution's product as an operand of solder's GEMM: packs panels of
/// col [group_in Kh Kw, Ho Wo] straight from the image x (one group's planes [group_in, H, W])
/// in the layout eval::cpu::gemm_from takes (panel p - p0 at (p - p0) (k1 - k0) nr, row k - k0
/// at (k - k0) width, zeros past the last column), so no column matrix is ever stored.
template <class G, std::size_t Kh, std::size_t Kw>
struct conv2d_columns {
  static constexpr std::size_t N = G::out_plane;
  const float* x;
  void operator()(float* dst, std::size_t p0, std::size_t p1, std::size_t k0, std::size_t k1) const {
    using L = eval::cpu::gemm_detail::b_panels<N>;
    for (std::size_t p = p0; p < p1; ++p) {
      const std::size_t n0 = p * L::nr, n1 = std::min(N, n0 + L::nr), width = L::width(p);
      float* panel = dst + (p - p0) * (k1 - k0) * L::nr;
      for (std::size_t k = k0; k < k1; ++k) {
        float* row = panel + (k - k0) * width;
        const std::size_t ci = k / (Kh * Kw), kh = k / Kw % Kh, kw = k % Kw;
        G::im2col_span(x + ci * G::in_plane, kh, kw, n0, n1, row);
        std::fill(row + (n1 - n0), row + width, 0.0f);
      }
    }
  }
};

using conv2d_identity = ops::conv2d_identity;

/// The GEMM epilogue of forward: C[m][n] = op(acc + bias[m]) (bias per row of C, an output
/// channel), or op(acc) without a bias; op an activation (ops/activations.hpp) or the identity.
template <bool WithBias, class Op = conv2d_identity>
struct conv2d_store_epilogue {
  const float* bias;
  float* C;
  std::size_t ldc;
  Op op{};

  template <std::size_t MR, std::size_t NV>
  SOLDER_INLINE void tile(const eval::cpu::vec<float> (&acc)[MR][NV], std::size_t m0, std::size_t n0, std::size_t mr,
                          std::size_t nr) const {
    using V = eval::cpu::vec<float>;
#pragma GCC unroll 16
    for (std::size_t r = 0; r < MR; ++r)
      if (r < mr) {
        float* c = C + (m0 + r) * ldc + n0;
        if constexpr (WithBias) {
          const V b(bias[m0 + r]);
          eval::cpu::gemm_detail::store_row<NV>(c, acc[r], nr, [&](const V& x, std::size_t) { return op.forward(x + b); });
        } else {
          eval::cpu::gemm_detail::store_row<NV>(c, acc[r], nr, [&](const V& x, std::size_t) { return op.forward(x); });
        }
      }
  }
};

/// The GEMM epilogue of dW over a run of samples: C = acc for the run's first sample, then
/// C = C + acc (one rounding per sample, in sample order).
struct conv2d_accumulate_epilogue {
  float* C;
  std::size_t ldc;
  bool first;

  template <std::size_t MR, std::size_t NV>
  SOLDER_INLINE void tile(const eval::cpu::vec<float> (&acc)[MR][NV], std::size_t m0, std::size_t n0, std::size_t mr,
                          std::size_t nr) const {
    using V = eval::cpu::vec<float>;
    constexpr std::size_t lanes = V::size;
#pragma GCC unroll 16
    for (std::size_t r = 0; r < MR; ++r)
      if (r < mr) {
        float* c = C + (m0 + r) * ldc + n0;
        if (first) {
          eval::cpu::gemm_detail::store_row<NV>(c, acc[r], nr, [](const V& x, std::size_t) { return x; });
        } else {
          eval::cpu::gemm_detail::store_row<NV>(c, acc[r], nr, [&](const V& x, std::size_t v) {
            const std::size_t col = v * lanes;  // store_row asks only for vectors with valid lanes
            const V old = col + lanes <= nr ? V::load_unaligned(c + col) : eval::cpu::load_first<V>(c + col, nr - col);
            return old + x;
          });
        }
      }
  }
};

/// What each thread keeps between calls: im2col's columns, the column gradient, (for the
/// threads that start a backward) the partial dW sums its chunks write, and weights packed for
/// one call.
enum class conv2d_slot { columns, column_grad, partial_dw, packed_weights, count };
inline float* conv2d_workspace(conv2d_slot slot, std::size_t n) {
  thread_local growing_buffer<float> spaces[std::size_t(conv2d_slot::count)];
  return spaces[std::size_t(slot)].get(n);
}

/// True when [p, p + n) and [q, q + m) (floats) overlap.
inline bool conv2d_overlaps(const float* p, std::size_t n, const float* q, std::size_t m) {
  const auto a = reinterpret_cast<std::uintptr_t>(p), b = reinterpret_cast<std::uintptr_t>(q);
  return a < b + m * sizeof(float) && b < a + n * sizeof(float);
}

}  // namespace detail

template <class Conv, class... Tail>
class conv_block;

/// y = conv2d(x, W) + b, torch's nn.Conv2d(Cin, Cout, (Kh, Kw), stride, padding, dilation,
/// groups, bias) with zero padding: x [batch, Cin, H, W] -> y [batch, Cout, Ho, Wo],
/// Ho = (H + 2 Pad - Dilation (Kh - 1) - 1) / Stride + 1 (Wo likewise); W [Cout, Cin/Groups,
/// Kh, Kw] and b [Cout] as torch stores them. H and W come from x's shape type. Results do not
/// depend on the thread count.
template <std::size_t Cin, std::size_t Cout, std::size_t Kh, std::size_t Kw, std::size_t Stride = 1,
          std::size_t Pad = 0, std::size_t Dilation = 1, std::size_t Groups = 1, bool Bias = true>
class conv2d {
  static_assert(Cin >= 1 && Cout >= 1, "solder::nn::conv2d: the channel counts Cin and Cout must be at least 1");
  static_assert(Kh >= 1 && Kw >= 1, "solder::nn::conv2d: the kernel size Kh x Kw must be at least 1 x 1");
  static_assert(Stride >= 1 && Dilation >= 1, "solder::nn::conv2d: Stride and Dilation must be at least 1");
  static_assert(Groups >= 1, "solder::nn::conv2d: Groups must be at least 1");
  static_assert(Cin % Groups == 0,
                "solder::nn::conv2d: Cin must be a multiple of Groups (each group takes Cin/Groups channels)");
  static_assert(Cout % Groups == 0,
                "solder::nn::conv2d: Cout must be a multiple of Groups (each group gives Cout/Groups channels)");

 public:
  static constexpr std::size_t in_channels = Cin;
  static constexpr std::size_t out_channels = Cout;
  static constexpr std::size_t kernel_height = Kh;
  static constexpr std::size_t kernel_width = Kw;
  static constexpr std::size_t stride = Stride;
  static constexpr std::size_t padding = Pad;
  static constexpr std::size_t dilation = Dilation;
  static constexpr std::size_t groups = Groups;
  static constexpr bool has_bias = Bias;
  static constexpr std::size_t group_in = Cin / Groups;    // input channels per group
  static constexpr std::size_t group_out = Cout / Groups;  // output channels per group
  /// Inputs of one output element: the K of each group's product, and torch's fan_in.
  static constexpr std::size_t fan_in = group_in * Kh * Kw;
  /// Groups of one input channel each (torch's depthwise layers) run a direct loop per plane:
  /// their products have K = Kh Kw, too short for the GEMM to pay for im2col.
  static constexpr bool depthwise = Groups == Cin && Groups > 1;
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

  struct planner_traits {
    // A product: the elementwise layers after it join its block, and a batch_norm right after
    // it too (folded into the weights in evaluation mode).
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

  tensor<float, shape<Cout, group_in, Kh, Kw>> weight;       // W
  tensor<float, shape<Cout, group_in, Kh, Kw>> weight_grad;  // dL/dW, written by backward
  [[no_unique_address]] std::conditional_t<Bias, tensor<float, shape<Cout>>, std::tuple<>> bias{};
  [[no_unique_address]] std::conditional_t<Bias, tensor<float, shape<Cout>>, std::tuple<>> bias_grad{};

  explicit conv2d(std::uint64_t seed = 0) { reset_parameters(seed); }

  /// torch's Conv2d.reset_parameters (kaiming_uniform with a = sqrt(5): W and b uniform in
  /// [-1/sqrt(fan_in), 1/sqrt(fan_in))), drawn from Philox stream (seed, 0) for W and (seed, 1)
  /// for b, as nn::linear.
  void reset_parameters(std::uint64_t seed) {
    packed_current = false;
    const float bound = float(1.0 / std::sqrt(double(fan_in)));
    detail::fill_uniform_philox(weight.data(), weight.size(), bound, seed, 0);
    if constexpr (Bias) detail::fill_uniform_philox(bias.data(), bias.size(), bound, seed, 1);
  }

  /// {prefix + "weight", prefix + "bias"}, as torch's state_dict names them.
  std::vector<optim::param> params(const std::string& prefix = "") {
    std::vector<optim::param> p{optim::make_param(prefix + "weight", weight, weight_grad)};
    if constexpr (Bias) p.push_back(optim::make_param(prefix + "bias", bias, bias_grad));
    return p;
  }

  /// y = conv2d(x) + b for x [batch, Cin, H, W], y [batch, Cout, Ho, Wo]; y may not overlap x.
  template <class SX, class SY>
  void forward(tensor_ref<const float, SX> x, tensor_ref<float, SY> y) {
    forward_activated(x, y, detail::conv2d_identity{});
  }
  /// y = op(conv2d(x) + b), the activation op (ops/activations.hpp) applied as each value is
  /// stored: one pass for a convolution and the activation after it.
  template <class SX, class SY, class Op>
  void forward_activated(tensor_ref<const float, SX> x, tensor_ref<float, SY> y, const Op& op) {
    if constexpr (check_shapes<SX, SY>()) {
      check_pair("solder::nn::conv2d::forward", x, y);
      run_forward<geometry_of<SX>>(x.data(), y.data(), samples(x), op, eval::cpu::row_epilogue::none());
    }
  }

  /// z = conv2d(x) + b, then the writes (solder::write(out, e), each e elementwise over tensors
  /// of z's shape, z among them, and broadcast ones such as a per-channel scale; an out may be
  /// z) evaluated on each part of z as soon as the convolution has stored it, while it is in
  /// cache: a residual add, dropout, any activation after a convolution in one pass over
  /// memory, with the bits assign_all(writes...) gives after forward(x, z).
  ///
  ///   conv.forward_with(x, y, write(y, relu(y + shortcut)));
  template <class SX, class SY, class W0, class... Ws>
  void forward_with(tensor_ref<const float, SX> x, tensor_ref<float, SY> z, const W0& w0, const Ws&... ws) {
    if constexpr (check_shapes<SX, SY>()) {
      check_pair("solder::nn::conv2d::forward_with", x, z);
      auto check_out = [&](const auto& w) {
        const std::size_t n = SY::elements(z.batch());
        if (detail::conv2d_overlaps(x.data(), x.size(), w.out.data(), n))
          solder::detail::fail("solder::nn::conv2d::forward_with: a write's output overlaps x; give it memory of its own");
      };
      check_out(w0);
      (check_out(ws), ...);
      const auto writes = eval::cpu::make_row_writes<SY>(z.batch(), w0, ws...);
      run_forward<geometry_of<SX>>(x.data(), z.data(), samples(x), detail::conv2d_identity{}, writes.epilogue());
    }
  }

  /// y = op(conv2d(x) + b) on channels-last tensors: x [batch, H, W, Cin], y [batch, Ho, Wo,
  /// Cout] (NHWC), the layout the convolution runs in, so nothing is transposed. The same
  /// values, bit for bit, as forward_activated on the NCHW tensors. One group only.
  template <class SX, class SY, class Op = detail::conv2d_identity>
  void forward_channels_last(tensor_ref<const float, SX> x, tensor_ref<float, SY> y, const Op& op = {}) {
    static_assert(Groups == 1, "solder::nn::conv2d::forward_channels_last: runs convolutions with one group");
    if constexpr (check_shapes<SX, SY, true>()) {
      check_pair("solder::nn::conv2d::forward_channels_last", x, y);
      using G = detail::conv2d_geometry<SX::extents[1], SX::extents[2], Kh, Kw, Stride, Pad, Dilation>;
      direct_forward<G>(x.data(), y.data(), x.size() / SX::inner_size, op, true, true);
    }
  }

  /// forward_activated with x [batch, Cin, H, W] and y [batch, Cout, Ho, Wo] each stored NCHW
  /// or channels-last (NHWC) as x_last and y_last say: how a chain runs the convolutions
  /// between which it keeps its images channels-last. One group only.
  template <class SX, class SY, class Op = detail::conv2d_identity>
  void forward_layouts(tensor_ref<const float, SX> x, tensor_ref<float, SY> y, bool x_last, bool y_last,
                       const Op& op = {}) {
    static_assert(Groups == 1, "solder::nn::conv2d::forward_layouts: runs convolutions with one group");
    if constexpr (check_shapes<SX, SY>()) {
      check_pair("solder::nn::conv2d::forward", x, y);
      direct_forward<geometry_of<SX>>(x.data(), y.data(), samples(x), op, x_last, y_last);
    }
  }

  /// Packs the weights once for the forward calls that follow (the model is frozen: eval()
  /// and parameters_changed() of a chain call it); weights_changed() returns to packing them
  /// per call, as training needs.
  void pack_weights() {
    if constexpr (direct) {
      if (!packed) packed = allocate_aligned<float>(packing::floats);
      packing::pack(weight.data(), packed.get());
      packed_current = true;
    }
  }
  void weights_changed() { packed_current = false; }
  template <class SX, class SY>
  void forward(const tensor<float, SX>& x, tensor<float, SY>& y) {
    forward(x.ref(), y.ref());
  }

  /// dx = dL/dx, and weight_grad, bias_grad (overwritten) for x [batch, Cin, H, W] and dy
  /// [batch, Cout, Ho, Wo]; y (the forward's output) is not read. dx may not overlap x or dy.
  template <class SX, class SY>
  void backward(tensor_ref<const float, SX> x, tensor_ref<const float, SY> y, tensor_ref<const float, SY> dy,
                tensor_ref<float, SX> dx) {
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
  void backward(const tensor<float, SX>& x, const tensor<float, SY>& y, const tensor<float, SY>& dy,
                tensor<float, SX>& dx) {
    backward(x.ref(), y.ref(), dy.ref(), dx.ref());
  }

  /// backward without dx (the first layer of a network: its input needs no gradient).
  template <class SX, class SY>
  void backward_params(tensor_ref<const float, SX> x, tensor_ref<const float, SY> y, tensor_ref<const float, SY> dy) {
    if constexpr (check_shapes<SX, SY>()) {
      const std::size_t batch = x.batch();
      if (y.batch() != batch || dy.batch() != batch)
        detail::batches_differ("solder::nn::conv2d::backward_params",
                               {{"x", batch}, {"y", y.batch()}, {"dy", dy.batch()}});
      gradients<geometry_of<SX>>(x.data(), dy.data(), nullptr, samples(x));
    }
  }

 private:
  /// One group that is not depthwise: eval/cpu/conv_nhwc.hpp's convolution, its weights packed.
  static constexpr bool direct = Groups == 1 && !depthwise;
  using packing = eval::cpu::conv_packed_weights<Cin, Cout, Kh, Kw>;
  aligned_array<float> packed;
  bool packed_current = false;

  static constexpr std::size_t span_height = Dilation * (Kh - 1) + 1;
  static constexpr std::size_t span_width = Dilation * (Kw - 1) + 1;
  static constexpr std::size_t min_height = span_height > 2 * Pad ? span_height - 2 * Pad : 1;
  static constexpr std::size_t min_width = span_width > 2 * Pad ? span_width - 2 * Pad : 1;
  /// A 1 x 1 kernel with stride 1 and no padding: im2col's columns are x itself.
  static constexpr bool columns_are_x = Kh == 1 && Kw == 1 && Stride == 1 && Pad == 0;
  /// FLOPs below which work stays on the calling thread (a parallel region costs microseconds).
  static constexpr double parallel_min_flops = 4.0e6;
  /// Floats the per-chunk dW partial sums of backward may take: chunks are capped so that
  /// (chunks - 1) weights fit, and larger layers run fewer chunks with the GEMM threaded.
  static constexpr std::size_t partial_budget_floats = std::size_t(8) << 20;
  static constexpr std::size_t weight_floats = Cout * fan_in;

  /// Samples in x: its batch, or a static shape's leading extent.
  template <class SX>
  static std::size_t samples(tensor_ref<const float, SX> x) {
    return x.size() / SX::inner_size;
  }
  template <class SX>
  using geometry_of = detail::conv2d_geometry<SX::extents[2], SX::extents[3], Kh, Kw, Stride, Pad, Dilation>;

  // ---- one group: the direct path --------------------------------------------------------

  /// y = op(conv2d(x) + b) on NCHW tensors by the path that fits the layer, then the epilogue
  /// over each part of y once stored.
  template <class G, class Op>
  void run_forward(const float* x, float* y, std::size_t batch, const Op& op, eval::cpu::row_epilogue after) const {
    if constexpr (depthwise)
      depthwise_forward<G>(x, y, batch, op, after);
    else if constexpr (Groups == 1 && !columns_are_x)
      direct_forward<G>(x, y, batch, op, false, false, after);
    else
      gemm_forward<G>(x, y, batch, op, after);
  }

  /// x and y NCHW, or channels-last (x_last, y_last). The output rows of all samples are cut
  /// into one run per thread (by the sizes alone; a row's values do not depend on who runs it).
  /// The epilogue runs on NCHW outputs only.
  template <class G, class Op>
  void direct_forward(const float* x, float* y, std::size_t batch, const Op& op, bool x_last, bool y_last,
                      eval::cpu::row_epilogue after = eval::cpu::row_epilogue::none()) const {
    namespace cd = eval::cpu::conv_detail;
    const float* w = packed_current ? packed.get() : pack_for_call();
    const double flops = double(batch) * double(Cout * G::out_plane) * 2.0 * fan_in;
    const int threads = flops >= parallel_min_flops ? num_threads() : 1;
    using kernel = eval::cpu::conv_nhwc<Cin, Cout, G::height, G::width, Kh, Kw, Stride, Pad, Dilation>;
    const cd::bias_op_store<Op> store{bias_data(), op};
    const auto run = [&](const auto& rows) {
      if (y_last)
        kernel::run(w, rows, cd::nhwc_store<Cout, G::out_height, G::out_width>{y}, store, batch, threads);
      else
        kernel::run(w, rows, cd::nchw_store<Cout, G::out_height, G::out_width>{y, after}, store, batch, threads);
    };
    if (x_last)
      run(cd::nhwc_rows<Cin, G::height, G::width>{x});
    else
      run(cd::nchw_rows<Cin, G::height, G::width>{x});
  }
  const float* pack_for_call() const {
    float* w = detail::conv2d_workspace(detail::conv2d_slot::packed_weights, packing::floats);
    packing::pack(weight.data(), w);
    return w;
  }

  // ---- several groups: the GEMM path ------------------------------------------------------

  /// Each sample is independent: samples are spread over the threads, or (fewer samples than
  /// threads) run in turn with the GEMM threaded; the GEMM's bits do not depend on its threads.
  template <class G, class Op>
  void gemm_forward(const float* x, float* y, std::size_t batch, const Op& op, eval::cpu::row_epilogue after) const {
    const int threads = num_threads();
    const double flops = double(batch) * double(Cout * G::out_plane) * 2.0 * fan_in;
    const bool over_samples = threads > 1 && batch >= std::size_t(threads) && flops >= parallel_min_flops;
    const int inner = over_samples ? 1 : threads;
    constexpr std::size_t Ho = G::out_height;
    eval::cpu::parallel_for(batch, over_samples ? threads : 1, [&](std::size_t n) {
      forward_sample<G>(x + n * Cin * G::in_plane, y + n * Cout * G::out_plane, inner, op);
      if (!after) return;
      if (over_samples)
        after.rows(n * Cout * Ho, Cout * Ho, 1);
      else
        eval::cpu::parallel_for(Cout, inner, [&](std::size_t c) { after.rows((n * Cout + c) * Ho, Ho, 1); });
    });
  }

  /// y_g [Cout/G, Ho Wo] = W_g [Cout/G, K] col_g [K, Ho Wo] (+ b_g) for each group g of one sample.
  template <class G, class Op>
  void forward_sample(const float* x, float* y, int threads, const Op& op) const {
    constexpr std::size_t K = fan_in, N = G::out_plane;
    for (std::size_t g = 0; g < Groups; ++g) {
      const float* xg = x + g * group_in * G::in_plane;
      const float* wg = weight.data() + g * group_out * K;
      float* yg = y + g * group_out * N;
      auto epi = detail::conv2d_store_epilogue<Bias, Op>{Bias ? bias_data() + g * group_out : nullptr, yg, N, op};
      if constexpr (columns_are_x)
        eval::cpu::gemm<N, K, false, false>(group_out, wg, K, xg, N, epi, threads);
      else  // the columns packed from the image panel by panel as the product needs them
        eval::cpu::gemm_from<N>(group_out, eval::cpu::gemm_detail::static_k<K>{},
                                eval::cpu::gemm_detail::a_strided<false>{wg, K},
                                detail::conv2d_columns<G, Kh, Kw>{xg}, epi, threads);
    }
  }

  const float* bias_data() const {
    if constexpr (Bias)
      return bias.data();
    else
      return nullptr;
  }

  /// The columns of one group of one sample, [group_in Kh Kw, Ho Wo], in this thread's workspace.
  template <class G>
  static const float* im2col(const float* x, int threads) {
    constexpr std::size_t rows = fan_in, N = G::out_plane;
    float* col = detail::conv2d_workspace(detail::conv2d_slot::columns, rows * N);
    eval::cpu::parallel_for(rows, rows * N >= eval::cpu::parallel_min_elements ? threads : 1,
                            [=](std::size_t k) { im2col_row<G>(x, col + k * N, k); });
    return col;
  }
  template <class G>
  static void im2col_row(const float* x, float* row, std::size_t k) {
    const std::size_t ci = k / G::taps, kh = k / Kw % Kh, kw = k % Kw;
    for (std::size_t ho = 0; ho < G::out_height; ++ho)
      G::im2col_row(x + ci * G::in_plane, kh, kw, ho, row + ho * G::out_width);
  }

  /// dx_g [group_in, H, W] = col2im(dcol), gathered per input element.
  template <class G>
  static void col2im(const float* dcol, float* dx, int threads) {
    eval::cpu::parallel_for(group_in, group_in * G::in_plane >= eval::cpu::parallel_min_elements ? threads : 1,
                            [=](std::size_t ci) { col2im_plane<G>(dcol, dx + ci * G::in_plane, ci); });
  }
  template <class G>
  static void col2im_plane(const float* dcol, float* dx, std::size_t ci) {
    for (std::size_t hi = 0; hi < G::height; ++hi)
      for (std::size_t wi = 0; wi < G::width; ++wi) dx[hi * G::width + wi] = G::col2im_at(dcol, ci, hi, wi);
  }

  template <class G>
  void gradients(const float* x, const float* dy, float* dx, std::size_t batch) {
    if constexpr (Bias) bias_gradient<G>(dy, batch);
    if constexpr (depthwise) {
      depthwise_gradients<G>(x, dy, dx, batch);
    } else if constexpr (dx_direct) {
      if constexpr (dw_direct)
        direct_dw<G>(x, dy, batch);
      else
        gemm_gradients<G>(x, dy, nullptr, batch);
      if (dx != nullptr) direct_dx<G>(dy, dx, batch);
    } else if constexpr (dw_direct) {
      direct_dw<G>(x, dy, batch);
      if (dx != nullptr) gemm_dx<G>(dy, dx, batch);
    } else {
      gemm_gradients<G>(x, dy, dx, batch);
    }
  }

  /// One group, not a pointwise layer on x as stored, and enough channels to fill the tiles:
  /// dW on the register tiles (eval/cpu/conv_weight_grad.hpp), from staged rows, no columns.
  /// The output rows are cut
  /// into runs by the sizes alone, each run's dW summed in float in row order, the runs added
  /// in order in double: the same bits for any thread count.
  static constexpr bool dw_direct = direct && !columns_are_x && eval::cpu::conv_weight_grad_fill(Cin, Cout) >= 0.2;
  template <class G>
  void direct_dw(const float* x, const float* dy, std::size_t batch) {
    using kernel = eval::cpu::conv_weight_grad<Cin, Cout, G::height, G::width, Kh, Kw, Stride, Pad, Dilation>;
    const std::size_t total = batch * G::out_height;
    // A run's rows do at least 128 multiply-adds per float of its partial sum, which is zeroed
    // and added once.
    constexpr std::size_t min_rows =
        std::max<std::size_t>(1, std::size_t(128.0 * double(kernel::partial_floats) / kernel::row_fmas) + 1);
    const std::size_t cap = std::min(eval::cpu::max_chunks, partial_budget_floats / kernel::partial_floats + 1);
    const std::size_t per_run = std::max(min_rows, (total + cap - 1) / cap);
    const std::size_t runs = std::max<std::size_t>(1, (total + per_run - 1) / per_run);
    float* parts = detail::conv2d_workspace(detail::conv2d_slot::partial_dw, runs * kernel::partial_floats);
    const double flops = double(batch) * double(Cout * G::out_plane) * 2.0 * fan_in;
    const int threads = flops >= parallel_min_flops ? num_threads() : 1;
    namespace cd = eval::cpu::conv_detail;
    eval::cpu::parallel_for(runs, threads, [&](std::size_t r) {
      kernel::run_rows(cd::nchw_rows<Cin, G::height, G::width>{x}, dy, parts + r * kernel::partial_floats, r * per_run,
                       std::min(total, (r + 1) * per_run));
    });
    constexpr std::size_t block = eval::cpu::min_chunk_elements;
    constexpr std::size_t floats = kernel::partial_floats;
    const std::size_t blocks = (floats + block - 1) / block;
    float* dw = weight_grad.data();
    eval::cpu::parallel_for(blocks, eval::cpu::threads_for(runs * floats), [=](std::size_t b) {
      kernel::combine(parts, runs, dw, b * block, std::min(floats, (b + 1) * block));
    });
  }

  /// With stride 1, dx is itself a convolution, of dy with the kernel transposed and turned
  /// around: dx[ci][h][w] = sum over co, kh, kw of dy[co][h + P - kh D][w + P - kw D]
  /// W[co][ci][kh][kw], i.e. a convolution of dy (Cout channels) to Cin channels with
  /// W~[ci][co][Kh-1-kh][Kw-1-kw], padding D (K - 1) - P, the same dilation: the direct path's
  /// tiles run it, no columns stored (square kernels: the tiles take one padding for both axes).
  static constexpr bool dx_direct =
      direct && Stride == 1 && Dilation * (Kh - 1) >= Pad && Dilation * (Kw - 1) >= Pad && Kh == Kw;
  template <class G>
  void direct_dx(const float* dy, float* dx, std::size_t batch) const {
    namespace cd = eval::cpu::conv_detail;
    constexpr std::size_t P = Dilation * (Kh - 1) - Pad;
    using kernel = eval::cpu::conv_nhwc<Cout, Cin, G::out_height, G::out_width, Kh, Kw, 1, P, Dilation>;
    static_assert(kernel::Ho == G::height && kernel::Wo == G::width);
    using turned = eval::cpu::conv_packed_weights<Cout, Cin, Kh, Kw>;
    float* flipped = detail::conv2d_workspace(detail::conv2d_slot::column_grad, Cin * Cout * Kh * Kw);
    for (std::size_t co = 0; co < Cout; ++co)
      for (std::size_t ci = 0; ci < Cin; ++ci)
        for (std::size_t t = 0; t < Kh * Kw; ++t)
          flipped[(ci * Cout + co) * Kh * Kw + (Kh * Kw - 1 - t)] = weight.data()[(co * Cin + ci) * Kh * Kw + t];
    float* w = detail::conv2d_workspace(detail::conv2d_slot::packed_weights, turned::floats);
    turned::pack(flipped, w);
    const double flops = double(batch) * double(Cin * G::in_plane) * 2.0 * Cout * Kh * Kw;
    kernel::run(w, cd::nchw_rows<Cout, G::out_height, G::out_width>{dy}, cd::nchw_store<Cin, G::height, G::width>{dx},
                cd::bias_op_store<detail::conv2d_identity>{nullptr, {}}, batch,
                flops >= parallel_min_flops ? num_threads() : 1);
  }

  /// db[co] = the sum of dy over samples and positions, in that order, in double: one channel
  /// per task, so the thread count cannot change it.
  template <class G>
  void bias_gradient(const float* dy, std::size_t batch) {
    float* db = bias_grad.data();
    eval::cpu::parallel_for(Cout, eval::cpu::threads_for(batch * Cout * G::out_plane), [=](std::size_t co) {
      double acc = 0;
      for (std::size_t n = 0; n < batch; ++n) {
        const float* d = dy + (n * Cout + co) * G::out_plane;
        for (std::size_t p = 0; p < G::out_plane; ++p) acc += double(d[p]);
      }
      db[co] = float(acc);
    });
  }

  /// dW = sum over samples of dy_g col_g^T, dx = col2im(W_g^T dy_g). The samples are cut into
  /// chunks by the sizes alone; each chunk sums its samples' dW in sample order (chunk 0 into
  /// weight_grad, the others into partial sums), then the chunks are added in order in double.
  template <class G>
  void gemm_gradients(const float* x, const float* dy, float* dx, std::size_t batch) {
    if (batch == 0) {
      weight_grad.fill(0.0f);
      return;
    }
    const std::size_t cap = std::min(eval::cpu::max_chunks, partial_budget_floats / weight_floats + 1);
    const std::size_t per_chunk = (batch + std::min(batch, cap) - 1) / std::min(batch, cap);
    const std::size_t chunks = (batch + per_chunk - 1) / per_chunk;
    float* partial =
        chunks > 1 ? detail::conv2d_workspace(detail::conv2d_slot::partial_dw, (chunks - 1) * weight_floats) : nullptr;

    const int threads = num_threads();
    const double flops = double(batch) * double(Cout * G::out_plane) * 4.0 * fan_in;
    const bool over_chunks = threads > 1 && chunks >= std::size_t(threads) && flops >= parallel_min_flops;
    const int inner = over_chunks ? 1 : threads;
    float* dw0 = weight_grad.data();
    eval::cpu::parallel_for(chunks, over_chunks ? threads : 1, [&](std::size_t c) {
      float* dw = c == 0 ? dw0 : partial + (c - 1) * weight_floats;
      const std::size_t begin = c * per_chunk, end = std::min(batch, begin + per_chunk);
      for (std::size_t n = begin; n < end; ++n)
        backward_sample<G>(x + n * Cin * G::in_plane, dy + n * Cout * G::out_plane,
                           dx ? dx + n * Cin * G::in_plane : nullptr, dw, n == begin, inner);
    });
    if (chunks == 1) return;
    constexpr std::size_t block = eval::cpu::min_chunk_elements;
    const std::size_t blocks = (weight_floats + block - 1) / block;
    eval::cpu::parallel_for(blocks, eval::cpu::threads_for(chunks * weight_floats), [=](std::size_t b) {
      const std::size_t end = std::min(weight_floats, (b + 1) * block);
      for (std::size_t i = b * block; i < end; ++i) {
        double acc = dw0[i];
        for (std::size_t c = 1; c < chunks; ++c) acc += double(partial[(c - 1) * weight_floats + i]);
        dw0[i] = float(acc);
      }
    });
  }

  /// dx alone (one group): per sample dcol [K, Ho Wo] = W^T dy, gathered into dx; samples
  /// spread over the threads, or (fewer samples than threads) the GEMM threaded.
  template <class G>
  void gemm_dx(const float* dy, float* dx, std::size_t batch) const {
    constexpr std::size_t K = fan_in, N = G::out_plane;
    const int threads = num_threads();
    const double flops = double(batch) * double(Cout * N) * 2.0 * K;
    const bool over_samples = threads > 1 && batch >= std::size_t(threads) && flops >= parallel_min_flops;
    const int inner = over_samples ? 1 : threads;
    eval::cpu::parallel_for(batch, over_samples ? threads : 1, [&](std::size_t n) {
      float* dcol = detail::conv2d_workspace(detail::conv2d_slot::column_grad, K * N);
      eval::cpu::gemm<N, Cout, true, false>(K, weight.data(), K, dy + n * Cout * N, N,
                                            detail::conv2d_store_epilogue<false>{nullptr, dcol, N}, inner);
      col2im<G>(dcol, dx + n * Cin * G::in_plane, inner);
    });
  }

  /// One sample's share: dW_g (+)= dy_g [Cout/G, Ho Wo] col_g^T [Ho Wo, K], and (dx given)
  /// dcol [K, Ho Wo] = W_g^T dy_g, gathered into dx_g.
  template <class G>
  void backward_sample(const float* x, const float* dy, float* dx, float* dw, bool first, int threads) const {
    constexpr std::size_t K = fan_in, N = G::out_plane;
    for (std::size_t g = 0; g < Groups; ++g) {
      const float* xg = x + g * group_in * G::in_plane;
      const float* dyg = dy + g * group_out * N;
      const float* wg = weight.data() + g * group_out * K;
      const float* col = columns_are_x ? xg : im2col<G>(xg, threads);
      eval::cpu::gemm<K, N, false, true>(group_out, dyg, N, col, N,
                                         detail::conv2d_accumulate_epilogue{dw + g * group_out * K, K, first}, threads);
      if (dx == nullptr) continue;
      float* dxg = dx + g * group_in * G::in_plane;
      float* dcol = columns_are_x ? dxg : detail::conv2d_workspace(detail::conv2d_slot::column_grad, K * N);
      eval::cpu::gemm<N, group_out, true, false>(K, wg, K, dyg, N,
                                                 detail::conv2d_store_epilogue<false>{nullptr, dcol, N}, threads);
      if constexpr (!columns_are_x) col2im<G>(dcol, dxg, threads);
    }
  }

  // ---- the depthwise path -----------------------------------------------------------------

  /// Each output plane (sample n, channel co) from its one input plane co / (Cout / Cin).
  template <class G, class Op>
  void depthwise_forward(const float* x, float* y, std::size_t batch, const Op& op, eval::cpu::row_epilogue after) const {
    const float* w = weight.data();
    const float* b = bias_data();
    const std::size_t planes = batch * Cout;
    eval::cpu::parallel_for(planes, eval::cpu::threads_for(planes * G::out_plane * G::taps), [=](std::size_t q) {
      const std::size_t n = q / Cout, co = q % Cout;
      depthwise_plane<G>(x + (n * Cin + co / group_out) * G::in_plane, w + co * G::taps, b ? b[co] : 0.0f,
                         y + q * G::out_plane, op);
      after.rows(q * G::out_height, G::out_height, 1);
    });
  }
  /// y = sum over taps of w[kh][kw] im2col(x)[kh][kw] (+ b), tap by tap over the whole plane
  /// (each tap's columns made in this thread's workspace, in L1 or L2).
  template <class G, class Op>
  static void depthwise_plane(const float* x, const float* w, float b, float* y, const Op& op) {
    if constexpr (Stride == 1) {
      depthwise_plane_rows<G>(x, w, b, y, op);
      return;
    }
    float* col = detail::conv2d_workspace(detail::conv2d_slot::columns, G::out_plane);
    std::fill_n(y, G::out_plane, 0.0f);
    for (std::size_t kh = 0; kh < Kh; ++kh)
      for (std::size_t kw = 0; kw < Kw; ++kw) {
        tap_columns<G>(x, kh, kw, col);
        const float wk = w[kh * Kw + kw];
        for (std::size_t p = 0; p < G::out_plane; ++p) y[p] += wk * col[p];
      }
    if constexpr (Bias)
      for (std::size_t p = 0; p < G::out_plane; ++p) y[p] += b;
    if constexpr (!std::is_same_v<Op, detail::conv2d_identity>)
      for (std::size_t p = 0; p < G::out_plane; ++p) y[p] = op.forward(y[p]);
  }
  /// Stride 1: the plane copied once into a zero-padded buffer (in L1), then each output row
  /// vector by vector, y[ho][wo..] = the taps' FMAs in (kh, kw) order on shifted runs of the
  /// padded rows, plus b, through op; no columns.
  /// A plane [Rows, Cols] copied into dst with Pd zeros on every side, rows Cols + 2 Pd floats
  /// apart, and one vector of zeros after the last row (vector loads run past a row's end).
  template <std::size_t Rows, std::size_t Cols, std::size_t Pd>
  static const float* padded_plane(const float* src, float* dst) {
    constexpr std::size_t PW = Cols + 2 * Pd, L = eval::cpu::vec<float>::size;
    std::fill_n(dst, Pd * PW + Pd, 0.0f);
    for (std::size_t h = 0; h < Rows; ++h) {
      float* row = dst + (h + Pd) * PW;
      std::copy_n(src + h * Cols, Cols, row + Pd);
      std::fill_n(row + Pd + Cols, 2 * Pd, 0.0f);  // this row's right edge, the next one's left
    }
    std::fill_n(dst + (Rows + Pd) * PW, Pd * PW + L, 0.0f);
    return dst;
  }
  template <std::size_t Rows, std::size_t Cols, std::size_t Pd>
  static constexpr std::size_t padded_floats = (Rows + 2 * Pd) * (Cols + 2 * Pd) + eval::cpu::vec<float>::size;

  template <class G, class Op>
  static void depthwise_plane_rows(const float* x, const float* w, float b, float* y, const Op& op) {
    using V = eval::cpu::vec<float>;
    constexpr std::size_t L = V::size, PW = G::width + 2 * Pad;
    constexpr std::size_t floats = padded_floats<G::height, G::width, Pad>;
    const float* pad = padded_plane<G::height, G::width, Pad>(
        x, detail::conv2d_workspace(detail::conv2d_slot::columns, floats));
    for (std::size_t ho = 0; ho < G::out_height; ++ho) {
      float* out = y + ho * G::out_width;
      for (std::size_t wo = 0; wo < G::out_width; wo += L) {
        V acc(0.0f);
        for (std::size_t kh = 0; kh < Kh; ++kh) {
          const float* in = pad + (ho + kh * Dilation) * PW + wo;
          for (std::size_t kw = 0; kw < Kw; ++kw)
            acc = eval::cpu::fma(V::load_unaligned(in + kw * Dilation), V(w[kh * Kw + kw]), acc);
        }
        if constexpr (Bias) acc = acc + V(b);
        if constexpr (!std::is_same_v<Op, detail::conv2d_identity>) acc = op.forward(acc);
        if (wo + L <= G::out_width)
          acc.store_unaligned(out + wo);
        else
          eval::cpu::store_first(out + wo, acc, G::out_width - wo);
      }
    }
  }

  /// col[ho Wo + wo] = im2col_at(x, 0, kh, kw, ho, wo): one tap's row of im2col for plane x.
  template <class G>
  static void tap_columns(const float* x, std::size_t kh, std::size_t kw, float* col) {
    for (std::size_t ho = 0; ho < G::out_height; ++ho) G::im2col_row(x, kh, kw, ho, col + ho * G::out_width);
  }
  /// Stride 1 with padding at most the kernel's span: dx and dW of a depthwise layer vectorized
  /// along rows over zero-padded copies of the planes, as its forward.
  static constexpr bool depthwise_rows_backward =
      depthwise && Stride == 1 && Dilation * (Kh - 1) >= Pad && Dilation * (Kw - 1) >= Pad;

  /// dx of one input plane: the sum over its `group_out` output planes j (dy_j = dy + j Ho Wo,
  /// kernel w_j = w + j Kh Kw) of the convolution of dy_j, padded by D (K - 1) - P, with w_j
  /// turned around: dx[h][w..] = sum over j, kh, kw of w_j[kh][kw] dyp_j[h + (Kh-1-kh) D][w + (Kw-1-kw) D].
  template <class G>
  static void depthwise_dx_rows(const float* dy, const float* w, float* dx) {
    using V = eval::cpu::vec<float>;
    // The padding each axis needs, and the one the copies get (the larger): dy row h + P - kh D
    // is padded row h + (Kh - 1 - kh) D + (Pd - PH), column w + P - kw D padded column
    // w + (Kw - 1 - kw) D + (Pd - PWd).
    constexpr std::size_t L = V::size, PH = Dilation * (Kh - 1) - Pad, PWd = Dilation * (Kw - 1) - Pad;
    constexpr std::size_t Pd = PH > PWd ? PH : PWd, PW = G::out_width + 2 * Pd;
    constexpr std::size_t floats = padded_floats<G::out_height, G::out_width, Pd>;
    float* space = detail::conv2d_workspace(detail::conv2d_slot::column_grad, group_out * floats);
    for (std::size_t j = 0; j < group_out; ++j)
      padded_plane<G::out_height, G::out_width, Pd>(dy + j * G::out_plane, space + j * floats);
    for (std::size_t h = 0; h < G::height; ++h)
      for (std::size_t w0 = 0; w0 < G::width; w0 += L) {
        V acc(0.0f);
        for (std::size_t j = 0; j < group_out; ++j)
          for (std::size_t kh = 0; kh < Kh; ++kh) {
            const float* in = space + j * floats + (h + (Kh - 1 - kh) * Dilation + (Pd - PH)) * PW + w0 + (Pd - PWd);
            for (std::size_t kw = 0; kw < Kw; ++kw)
              acc = eval::cpu::fma(V::load_unaligned(in + (Kw - 1 - kw) * Dilation), V(w[j * G::taps + kh * Kw + kw]), acc);
          }
        if (w0 + L <= G::width)
          acc.store_unaligned(dx + h * G::width + w0);
        else
          eval::cpu::store_first(dx + h * G::width + w0, acc, G::width - w0);
      }
  }

  /// sums[kh Kw + kw] = sum over ho, wo of dy[ho][wo] xp[ho + kh D][wo + kw D] for one sample's
  /// plane (xp: x padded by P), in float: lane l of tap k's vector sums its row vectors' lane l
  /// in order, then the lanes are added in order.
  template <class G>
  static void depthwise_dw_rows(const float* x, const float* dy, float* sums) {
    using V = eval::cpu::vec<float>;
    constexpr std::size_t L = V::size, PW = G::width + 2 * Pad;
    constexpr std::size_t floats = padded_floats<G::height, G::width, Pad>;
    const float* xp = padded_plane<G::height, G::width, Pad>(x, detail::conv2d_workspace(detail::conv2d_slot::columns, floats));
    V acc[G::taps];
    for (auto& a : acc) a = V(0.0f);
    for (std::size_t ho = 0; ho < G::out_height; ++ho)
      for (std::size_t wo = 0; wo < G::out_width; wo += L) {
        const std::size_t n = G::out_width - wo < L ? G::out_width - wo : L;  // zeros past the row: 0 x anything
        const V d = eval::cpu::load_first<V>(dy + ho * G::out_width + wo, n);
        for (std::size_t kh = 0; kh < Kh; ++kh) {
          const float* in = xp + (ho + kh * Dilation) * PW + wo;
          for (std::size_t kw = 0; kw < Kw; ++kw)
            acc[kh * Kw + kw] = eval::cpu::fma(d, eval::cpu::load_first<V>(in + kw * Dilation, n), acc[kh * Kw + kw]);
        }
      }
    for (std::size_t k = 0; k < G::taps; ++k) sums[k] = lane_sum(acc[k]);
  }

  /// sum_p a[p] b[p] in float: lane j of a vector sums the p = j (mod lanes) in order, then
  /// the lanes are added in a fixed order (the same bits on every call).
  static float dot(const float* a, const float* b, std::size_t n) {
    using V = eval::cpu::vec<float>;
    constexpr std::size_t lanes = V::size;
    V acc(0.0f);
    std::size_t p = 0;
    for (; p + lanes <= n; p += lanes) acc = acc + V::load_unaligned(a + p) * V::load_unaligned(b + p);
    if (p < n) acc = acc + eval::cpu::load_first<V>(a + p, n - p) * eval::cpu::load_first<V>(b + p, n - p);
    return lane_sum(acc);
  }
  /// The lanes of v added in order, in float (the same bits on every call).
  static float lane_sum(const eval::cpu::vec<float>& v) {
    constexpr std::size_t lanes = eval::cpu::vec<float>::size;
    alignas(64) float part[lanes];
    v.store_aligned(part);
    float s = 0.0f;
    for (std::size_t j = 0; j < lanes; ++j) s += part[j];
    return s;
  }

  /// dx per input plane (gathered from its Cout / Cin output planes), dW per output channel
  /// (each sample's sum in float, see dot, the samples added in order in double): one task per
  /// plane or channel, so the thread count cannot change a result.
  template <class G>
  void depthwise_gradients(const float* x, const float* dy, float* dx, std::size_t batch) {
    constexpr std::size_t mult = group_out;
    const float* w = weight.data();
    if constexpr (depthwise_rows_backward) {
      if (dx != nullptr) {
        const std::size_t planes = batch * Cin;
        const int threads = eval::cpu::threads_for(planes * G::in_plane * G::taps * mult);
        eval::cpu::parallel_for(planes, threads, [=](std::size_t q) {
          const std::size_t n = q / Cin, ci = q % Cin;
          depthwise_dx_rows<G>(dy + (n * Cout + ci * mult) * G::out_plane, w + ci * mult * G::taps, dx + q * G::in_plane);
        });
      }
      float* dw = weight_grad.data();
      eval::cpu::parallel_for(Cout, eval::cpu::threads_for(batch * Cout * G::out_plane * G::taps), [=](std::size_t co) {
        double acc[G::taps] = {};
        float sums[G::taps];
        for (std::size_t n = 0; n < batch; ++n) {
          depthwise_dw_rows<G>(x + (n * Cin + co / mult) * G::in_plane, dy + (n * Cout + co) * G::out_plane, sums);
          for (std::size_t k = 0; k < G::taps; ++k) acc[k] += double(sums[k]);
        }
        for (std::size_t k = 0; k < G::taps; ++k) dw[co * G::taps + k] = float(acc[k]);
      });
      return;
    }
    if (dx != nullptr) {
      const std::size_t planes = batch * Cin;
      const int threads = eval::cpu::threads_for(planes * G::in_plane * G::taps * mult);
      eval::cpu::parallel_for(planes, threads, [=](std::size_t q) {
        const std::size_t n = q / Cin, ci = q % Cin;
        const float* d = dy + (n * Cout + ci * mult) * G::out_plane;
        float* out = dx + q * G::in_plane;
        for (std::size_t hi = 0; hi < G::height; ++hi)
          for (std::size_t wi = 0; wi < G::width; ++wi)
            out[hi * G::width + wi] = G::depthwise_dx_at(d, w + ci * mult * G::taps, mult, hi, wi);
      });
    }
    float* dw = weight_grad.data();
    eval::cpu::parallel_for(Cout, eval::cpu::threads_for(batch * Cout * G::out_plane * G::taps), [=](std::size_t co) {
      float* col = detail::conv2d_workspace(detail::conv2d_slot::columns, G::out_plane);
      double acc[G::taps] = {};
      for (std::size_t n = 0; n < batch; ++n) {
        const float* xp = x + (n * Cin + co / mult) * G::in_plane;
        const float* d = dy + (n * Cout + co) * G::out_plane;
        for (std::size_t k = 0; k < G::taps; ++k) {
          tap_columns<G>(xp, k / Kw, k % Kw, col);
          acc[k] += double(dot(d, col, G::out_plane));
        }
      }
      for (std::size_t k = 0; k < G::taps; ++k) dw[co * G::taps + k] = float(acc[k]);
    });
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
          fixed_string s("");
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
