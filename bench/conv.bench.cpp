// conv.bench.cpp: ResNet's block, y = relu(batch_norm(conv3x3(x))), in inference (the
// normalization folded into the weights) and training, and MobileNet's depthwise-separable pair,
// solder's conv_block against oneDNN's convolution with a bias and a ReLU post-op. One thread.
//
// Cases:
//   BM_conv_bn_relu_infer/<impl>/<N>x64x56x56 (N = 32, and 1 for latency): 64 -> 64 channels,
//     3x3, stride 1, pad 1, no convolution bias (the batch_norm follows); eval mode, impl in
//     solder_folded           nn::conv_block after pack_weights: one convolution with W' = W s
//                             and b' = (b - mean) s + beta whose stores apply the ReLU
//     solder_folded_channels_last  the same on channels-last tensors (x [N, 56, 56, 64], y
//                             [N, 56, 56, 64]: forward_channels_last), the layout the convolution
//                             runs in, so nothing is transposed (as onednn_postops_blocked)
//     solder_unfolded         the same block with fold_in_eval = false: convolution, the
//                             normalization's eval pass, the ReLU pass
//     onednn_postops_nchw     convolution_forward on plain nchw / oihw memory, bias and ReLU as
//                             its post-op, W' and b' folded here as conv_block folds them
//     onednn_postops_blocked  the same with format_tag::any: x and W' reordered once, outside the
//                             timing, into the layouts oneDNN prefers; its output stays in its
//                             blocked layout (the next oneDNN layer would read it as is)
//   BM_conv_bn_relu_train/<impl>/32x64x56x56: forward then backward (dx, dW, dgamma, dbeta) with
//     a fixed dy, batch statistics; impl solder (the conv_block a chain plans, train mode) and
//     solder_unfused (conv2d, batch_norm, relu run one by one, as nn::unfused_chain runs them)
//   BM_depthwise_separable/<impl>/32x64x56x56: depthwise 3x3 (Groups = 64) + batch_norm + ReLU,
//     then pointwise 1x1 64 -> 128 + batch_norm + ReLU, eval mode; impl solder_folded,
//     solder_unfolded, onednn_postops_blocked (two convolutions, the second reading the first's
//     blocked output)
//   BM_conv_residual_relu_paired/solder_epilogue_vs_solder_separate/32x64x56x56: y =
//     relu(conv3x3(x) + shortcut) in eval mode, the add and ReLU as the convolution's epilogue
//     on each output row (conv2d::forward_with) against a separate elementwise pass; the two
//     outputs must be the same bits
//   BM_conv_weight_grad_paired/solder_vs_onednn_<nchw|blocked>/32x64x56x56: dW of the 3x3
//     layer from x and dy (solder: conv2d::backward_params; oneDNN: convolution_backward_weights
//     on plain memory, or on x and dy reordered once into its preferred layouts, dW left in its
//     own), the two dW compared before timing; flops: one product
//   <family>_paired/solder_folded_vs_<peer>/<shape> (infer: solder_unfolded and both oneDNN
//     forms, N = 32 and 1; depthwise: solder_unfolded, onednn_postops_blocked),
//   BM_conv_bn_relu_infer_paired/solder_folded_channels_last_vs_onednn_postops_blocked/<shape>
//     (N = 32 and 1: each in the layout it runs in), .../solder_folded_channels_last_vs_
//     solder_unfolded/<shape> (a block between two others in a frozen chain, with the rewrite
//     and without: the folded block reads and writes channels-last images, the unfolded one
//     cannot) and BM_conv_bn_relu_train_paired/
//     solder_vs_solder_unfused/32x64x56x56: the two timed call by call (bench/README.md, "Paired
//     cases"); speedup = median(peer time / solder time), <impl>_GFLOPs from each median call.
// Counters: GFLOPs (2 N Cout Ho Wo Cin/G Kh Kw per convolution; training counts three such
// products: forward, dx and dW; the normalization and ReLU passes are not counted) and roofline
// (GFLOPs / BM_peak_fma's one-thread peak in this process). Every inference case checks its
// output against a double-precision reference at seeded points before timing, and the two
// training forms are compared (dx and every gradient); a case that disagrees reports an error
// instead of a time. The oneDNN cases' label names the implementation oneDNN chose.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "common.hpp"
#include "solder/nn/batch_norm.hpp"
#include "solder/nn/chain.hpp"
#include "solder/nn/conv2d.hpp"
#include "solder/nn/conv_block.hpp"
#include "solder/nn/elementwise_block.hpp"

#if SOLDER_BENCH_HAS_DNNL
#include <dnnl.hpp>
#endif

namespace {

using namespace solder_bench;
using solder::dyn;
using solder::shape;
namespace nn = solder::nn;

enum seed : std::uint64_t { seed_x = 41, seed_dy = 42, seed_layer = 43, seed_norm = 44, seed_points = 45 };

constexpr std::size_t C = 64, H = 56, W = 56;  // every case's input sample [C, H, W]
using image = shape<dyn, C, H, W>;
using image128 = shape<dyn, 128, H, W>;

// No convolution bias before a batch_norm, as torchvision's ResNet and MobileNet.
using conv3x3 = nn::conv2d<C, C, 3, 3, 1, 1, 1, 1, false>;
using conv_bn_relu = nn::conv_block<conv3x3, nn::batch_norm<C>, nn::relu>;
using depthwise3x3 = nn::conv2d<C, C, 3, 3, 1, 1, 1, C, false>;
using pointwise = nn::conv2d<C, 128, 1, 1, 1, 0, 1, 1, false>;
using depthwise_block = nn::conv_block<depthwise3x3, nn::batch_norm<C>, nn::relu>;
using pointwise_block = nn::conv_block<pointwise, nn::batch_norm<128>, nn::relu>;

// The blocks timed here are the ones a chain of these layers plans and runs.
using resnet_chain = nn::chain<nn::input<C, H, W>, conv3x3, nn::batch_norm<C>, nn::relu>;
using separable_chain =
    nn::chain<nn::input<C, H, W>, depthwise3x3, nn::batch_norm<C>, nn::relu, pointwise, nn::batch_norm<128>, nn::relu>;
static_assert(std::is_same_v<std::tuple_element_t<0, resnet_chain::blocks_type>, conv_bn_relu>);
static_assert(std::is_same_v<std::tuple_element_t<0, separable_chain::blocks_type>, depthwise_block>);
static_assert(std::is_same_v<std::tuple_element_t<1, separable_chain::blocks_type>, pointwise_block>);

/// 2 N Cout Ho Wo (Cin / Groups) Kh Kw: the multiply-adds of one convolution (stride 1, same size).
template <class Conv>
double conv_flops(std::size_t n) {
  return 2.0 * double(n) * double(Conv::out_channels) * double(H * W) * double(Conv::fan_in);
}

/// dst [n, H, W, C] = src [n, C, H, W].
void to_channels_last(const float* src, float* dst, std::size_t n) {
  for (std::size_t s = 0; s < n; ++s)
    for (std::size_t c = 0; c < C; ++c)
      for (std::size_t i = 0; i < H * W; ++i) dst[(s * H * W + i) * C + c] = src[(s * C + c) * H * W + i];
}

std::string image_name(std::size_t n) { return std::to_string(n) + "x" + std::to_string(C) + "x" + std::to_string(H) + "x" + std::to_string(W); }

/// Running statistics and affine parameters far from torch's starting ones (mean 0, var 1,
/// gamma 1, beta 0), so folding them changes every weight and a wrong fold shows.
template <std::size_t Ch>
void set_norm(nn::batch_norm<Ch>& bn, std::uint64_t seed) {
  fill_uniform({bn.weight.data(), Ch}, seed, 0.5f, 1.5f);
  fill_uniform({bn.bias.data(), Ch}, seed + 1, -0.5f, 0.5f);
  fill_uniform({bn.running_mean.data(), Ch}, seed + 2, -0.2f, 0.2f);
  fill_uniform({bn.running_var.data(), Ch}, seed + 3, 0.5f, 2.0f);
}

template <class S>
solder::tensor_ref<const float, S> cref(const solder::tensor<float, S>& t) {
  return t.ref();
}

// ---------------------------------------------------------------------------------------------
// Reference: relu(batch_norm(conv(x))) in double at sampled output elements
// ---------------------------------------------------------------------------------------------

/// A reference value with what bounds its float rounding: mag, the sum of |terms| of every sum
/// that led to it, and terms, how many roundings a float evaluation may make along the way.
struct ref_value {
  double v = 0, mag = 0, terms = 0;
};

/// One conv_block's layers as torch stores them (W [Cout, Cin/G, K, K], stride 1, zero padding).
struct layer_ref {
  std::size_t cin, cout, k, pad, groups;
  const float *w, *gamma, *beta, *mean, *var;
  double eps;
};

template <class Block>
layer_ref layer_ref_of(Block& b) {
  using Conv = std::remove_cvref_t<decltype(b.conv)>;
  return {Conv::in_channels, Conv::out_channels, Conv::kernel_height, Conv::padding, Conv::groups, b.conv.weight.data(),
          b.norm.weight.data(), b.norm.bias.data(), b.norm.running_mean.data(), b.norm.running_var.data(), b.norm.eps};
}

/// Output (co, ho, wo) of one sample of relu(batch_norm_eval(conv(in))); in(c, h, w) is the
/// block's input inside the plane (the padding reads 0).
template <class In>
ref_value conv_bn_relu_at(const layer_ref& L, const In& in, std::size_t co, std::size_t ho, std::size_t wo) {
  const std::size_t gin = L.cin / L.groups, g = co / (L.cout / L.groups);
  double z = 0, mag = 0, terms_in = 0;
  for (std::size_t ci = 0; ci < gin; ++ci)
    for (std::size_t kh = 0; kh < L.k; ++kh)
      for (std::size_t kw = 0; kw < L.k; ++kw) {
        const std::ptrdiff_t h = std::ptrdiff_t(ho + kh) - std::ptrdiff_t(L.pad);
        const std::ptrdiff_t w = std::ptrdiff_t(wo + kw) - std::ptrdiff_t(L.pad);
        if (h < 0 || w < 0 || h >= std::ptrdiff_t(H) || w >= std::ptrdiff_t(W)) continue;
        const ref_value a = in(g * gin + ci, std::size_t(h), std::size_t(w));
        const double wt = L.w[((co * gin + ci) * L.k + kh) * L.k + kw];
        z += wt * a.v;
        mag += std::abs(wt) * (std::abs(a.v) + a.mag);
        terms_in = std::max(terms_in, a.terms);
      }
  const double s = double(L.gamma[co]) / std::sqrt(double(L.var[co]) + L.eps);
  // Folded or not, a float evaluation rounds the gin K K products and sums, the scale, the fold
  // of W and b, the shift and the affine step: at most 8 roundings besides the sum's.
  return {std::max((z - double(L.mean[co])) * s + double(L.beta[co]), 0.0),
          std::abs(s) * (mag + std::abs(double(L.mean[co]))) + std::abs(double(L.beta[co])),
          terms_in + double(gin * L.k * L.k) + 8};
}

/// A float result is within margin * terms * u * mag of the exact one: each rounding errs by at
/// most u of its operands' magnitudes, and mag bounds them all. margin 2 leaves room for the
/// double roundings of a folded weight (W s rounded, then the product rounded).
constexpr double rounding_margin = 2.0;
constexpr double float_u = 0x1p-24;
constexpr int checked_points = 4096;

/// Checks `checked_points` seeded elements of y [N, Cout, H, W] (NCHW) against want(n, co, h, w).
/// Returns an error message, empty when all agree; NaN fails.
template <class Want>
std::string check_points(const float* y, std::size_t n, std::size_t cout, const Want& want) {
  std::mt19937_64 gen(seed_points);
  for (int i = 0; i < checked_points; ++i) {
    const std::size_t s = gen() % n, co = gen() % cout, h = gen() % H, w = gen() % W;
    const ref_value r = want(s, co, h, w);
    const double got = y[((s * cout + co) * H + h) * W + w];
    if (!(std::abs(got - r.v) <= rounding_margin * r.terms * float_u * r.mag))
      return "y[" + std::to_string(s) + "][" + std::to_string(co) + "][" + std::to_string(h) + "][" + std::to_string(w) +
             "] = " + std::to_string(got) + ", reference " + std::to_string(r.v);
  }
  return "";
}

/// The input sample n of x [N, C, H, W] as a reference input (exact: mag 0).
auto input_of(const float* x, std::size_t n) {
  return [=](std::size_t c, std::size_t h, std::size_t w) { return ref_value{x[((n * C + c) * H + h) * W + w], 0, 0}; };
}

/// W' = W s and b' = (b - mean) s + beta per output channel, s = gamma / sqrt(var + eps), in
/// double and rounded once, as conv_block folds them: what oneDNN is given.
template <class Block>
std::pair<std::vector<float>, std::vector<float>> fold(Block& b) {
  using Conv = std::remove_cvref_t<decltype(b.conv)>;
  constexpr std::size_t per = Conv::fan_in, cout = Conv::out_channels;
  std::vector<float> w(cout * per), bias(cout);
  for (std::size_t c = 0; c < cout; ++c) {
    const double s = double(b.norm.weight[c]) / std::sqrt(double(b.norm.running_var[c]) + b.norm.eps);
    for (std::size_t i = 0; i < per; ++i) w[c * per + i] = float(double(b.conv.weight.data()[c * per + i]) * s);
    bias[c] = float(-double(b.norm.running_mean[c]) * s + double(b.norm.bias[c]));
  }
  return {w, bias};
}

// ---------------------------------------------------------------------------------------------
// oneDNN: convolutions with a bias and a ReLU post-op
// ---------------------------------------------------------------------------------------------

#if SOLDER_BENCH_HAS_DNNL
/// One convolution of a oneDNN net: y = relu(conv(x, W') + b'), stride 1.
struct onednn_layer_spec {
  std::size_t cin, cout, k, pad, groups;
  const float *w, *b;  // W' [Cout, Cin/G, K, K], b' [Cout]
};

/// m itself when it already has layout md, else a copy reordered into md (done once, outside
/// any timing).
dnnl::memory dnnl_reordered(dnnl::engine& eng, dnnl::stream& strm, dnnl::memory m, const dnnl::memory::desc& md) {
  if (m.get_desc() == md) return m;
  dnnl::memory out(md, eng);
  dnnl::reorder(m, out).execute(strm, m, out);
  strm.wait();
  return out;
}

/// Convolutions run one after another, each reading the previous one's output; every operand
/// made (and reordered) once when the net is built. oneDNN's OpenMP runtime reads
/// omp_get_max_threads(), so the thread count is set before building and running it.
struct onednn_net {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  struct layer {
    dnnl::convolution_forward prim;
    dnnl::memory src, wei, bias, dst;
  };
  std::vector<layer> layers;
  std::string impl;  // the implementations oneDNN chose, e.g. "brg:avx512_core"

  /// blocked: source, weights and output in the layouts the primitive prefers (format_tag::any),
  /// x and W' reordered into them here; else nchw and oihw / goihw as given.
  onednn_net(const std::vector<onednn_layer_spec>& specs, std::size_t n, const float* x, bool blocked) {
    using namespace dnnl;
    using dt = memory::data_type;
    using tag = memory::format_tag;
    const memory::dim N = memory::dim(n), h = memory::dim(H), w = memory::dim(W);
    memory prev({{N, memory::dim(specs.front().cin), h, w}, dt::f32, tag::nchw}, eng, const_cast<float*>(x));
    for (const auto& s : specs) {
      const memory::dim cin = memory::dim(s.cin), cout = memory::dim(s.cout), k = memory::dim(s.k),
                        p = memory::dim(s.pad), g = memory::dim(s.groups);
      const memory::dims src_dims{N, cin, h, w}, dst_dims{N, cout, h + 2 * p - k + 1, w + 2 * p - k + 1};
      const memory::dims wei_dims = g > 1 ? memory::dims{g, cout / g, cin / g, k, k} : memory::dims{cout, cin, k, k};
      const memory::desc wei_user_md(wei_dims, dt::f32, g > 1 ? tag::goihw : tag::oihw);
      const memory::desc src_md = blocked && layers.empty() ? memory::desc(src_dims, dt::f32, tag::any) : prev.get_desc();
      const memory::desc wei_md = blocked ? memory::desc(wei_dims, dt::f32, tag::any) : wei_user_md;
      const memory::desc dst_md(dst_dims, dt::f32, blocked ? tag::any : tag::nchw);
      const memory::desc bias_md({cout}, dt::f32, tag::x);
      post_ops ops;
      ops.append_eltwise(1.0f, algorithm::eltwise_relu, 0.0f, 0.0f);
      primitive_attr attr;
      attr.set_post_ops(ops);
      const convolution_forward::primitive_desc pd(
          convolution_forward::desc(prop_kind::forward_inference, algorithm::convolution_direct, src_md, wei_md, bias_md,
                                    dst_md, {1, 1}, {p, p}, {p, p}),
          attr, eng);
      layer l;
      l.prim = convolution_forward(pd);
      l.src = dnnl_reordered(eng, strm, prev, pd.src_desc());
      l.wei = dnnl_reordered(eng, strm, memory(wei_user_md, eng, const_cast<float*>(s.w)), pd.weights_desc());
      l.bias = memory(bias_md, eng);
      std::memcpy(l.bias.get_data_handle(), s.b, s.cout * sizeof(float));
      l.dst = memory(pd.dst_desc(), eng);
      impl += (impl.empty() ? "" : " + ") + std::string(pd.impl_info_str());
      prev = l.dst;
      layers.push_back(std::move(l));
    }
  }

  void run() {
    for (auto& l : layers)
      l.prim.execute(strm, {{DNNL_ARG_SRC, l.src}, {DNNL_ARG_WEIGHTS, l.wei}, {DNNL_ARG_BIAS, l.bias}, {DNNL_ARG_DST, l.dst}});
    strm.wait();
  }

  /// The last output as nchw into y (for the check, outside any timing).
  void output_to(float* y) {
    dnnl::memory out = layers.back().dst;
    dnnl::memory::desc plain(out.get_desc().dims(), dnnl::memory::data_type::f32, dnnl::memory::format_tag::nchw);
    dnnl::memory y_mem(plain, eng, y);
    dnnl::reorder(out, y_mem).execute(strm, out, y_mem);
    strm.wait();
  }
};

/// oneDNN's weight gradient of the 3x3 layer (convolution_backward_weights, no bias) from x
/// and dy [N, 64, 56, 56]: on nchw / oihw memory, or (blocked) in the layouts it prefers, x
/// and dy reordered once outside the timing and dW left in its layout.
struct onednn_weight_grad {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  dnnl::convolution_backward_weights prim;
  dnnl::memory src, diff_dst, diff_wei;
  std::string impl;

  onednn_weight_grad(std::size_t n, const float* x, const float* dy, bool blocked) {
    using namespace dnnl;
    using dt = memory::data_type;
    using tag = memory::format_tag;
    const memory::dim N = memory::dim(n), c = memory::dim(C), h = memory::dim(H), w = memory::dim(W);
    const memory::dims image_dims{N, c, h, w}, wei_dims{c, c, 3, 3};
    const auto desc = [&](const memory::dims& d, tag plain) { return memory::desc(d, dt::f32, blocked ? tag::any : plain); };
    const memory::desc src_md = desc(image_dims, tag::nchw), wei_md = desc(wei_dims, tag::oihw),
                       dst_md = desc(image_dims, tag::nchw);
    const convolution_forward::primitive_desc hint(
        convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_direct, src_md, wei_md, dst_md,
                                  {1, 1}, {1, 1}, {1, 1}),
        eng);
    const convolution_backward_weights::primitive_desc pd(
        convolution_backward_weights::desc(algorithm::convolution_direct, src_md, wei_md, dst_md, {1, 1}, {1, 1}, {1, 1}),
        eng, hint);
    prim = convolution_backward_weights(pd);
    src = dnnl_reordered(eng, strm, memory({image_dims, dt::f32, tag::nchw}, eng, const_cast<float*>(x)), pd.src_desc());
    diff_dst =
        dnnl_reordered(eng, strm, memory({image_dims, dt::f32, tag::nchw}, eng, const_cast<float*>(dy)), pd.diff_dst_desc());
    diff_wei = memory(pd.diff_weights_desc(), eng);
    impl = pd.impl_info_str();
  }
  void run() {
    prim.execute(strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_DIFF_WEIGHTS, diff_wei}});
    strm.wait();
  }
  /// dW as oihw into w (for the check, outside any timing).
  void weights_to(float* w) {
    dnnl::memory::desc plain(diff_wei.get_desc().dims(), dnnl::memory::data_type::f32, dnnl::memory::format_tag::oihw);
    dnnl::memory out(plain, eng, w);
    dnnl::reorder(diff_wei, out).execute(strm, diff_wei, out);
    strm.wait();
  }
};
#endif

// ---------------------------------------------------------------------------------------------
// Timing shared by every case
// ---------------------------------------------------------------------------------------------

/// One thread for solder and for oneDNN's OpenMP team; the peak calibrated before the case runs.
void single_thread() {
  peak_gflops(1);
  solder::set_num_threads(1);
  omp_set_num_threads(1);
}

/// Times call() (one warm-up call first) and sets GFLOPs and roofline.
template <class F>
void time_case(benchmark::State& state, double flops, F&& call) {
  call();
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    call();
    benchmark::ClobberMemory();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  set_flop_counters(state, flops, seconds, 1);
}

enum class impl { solder_folded, solder_folded_channels_last, solder_unfolded, onednn_postops_nchw, onednn_postops_blocked };
const char* impl_name(impl i) {
  constexpr const char* names[] = {"solder_folded", "solder_folded_channels_last", "solder_unfolded",
                                   "onednn_postops_nchw", "onednn_postops_blocked"};
  return names[int(i)];
}

// ---------------------------------------------------------------------------------------------
// The eval-mode problems: BM_conv_bn_relu_infer and BM_depthwise_separable
// ---------------------------------------------------------------------------------------------

/// conv3x3 + batch_norm + ReLU on x [N, 64, 56, 56].
struct infer_problem {
  std::size_t N;
  conv_bn_relu block{seed_layer};
  solder::tensor<float, image> x, y;
  // x and y channels-last: [N, 56, 56, 64]
  solder::tensor<float, shape<dyn, H, W, C>> x_last, y_last;
  std::vector<float> w_folded, b_folded;
#if SOLDER_BENCH_HAS_DNNL
  std::map<bool, std::unique_ptr<onednn_net>> onednn;  // by blocked
#endif

  explicit infer_problem(std::size_t n) : N(n), x(n), y(n), x_last(n), y_last(n) {
    fill_uniform({x.data(), x.size()}, seed_x);
    to_channels_last(x.data(), x_last.data(), N);
    set_norm(block.norm, seed_norm);
    block.eval();
    block.pack_weights();
    std::tie(w_folded, b_folded) = fold(block);
  }
  double flops() const { return conv_flops<conv3x3>(N); }
  void solder_forward(bool folded) {
    block.fold_in_eval = folded;
    block.forward(x, y);
  }
  void solder_forward_channels_last() {
    block.fold_in_eval = true;
    block.forward_channels_last(cref(x_last), y_last.ref());
  }
  /// y (nchw) from y_last, for the check.
  void output_from_channels_last() {
    for (std::size_t s = 0; s < N; ++s)
      for (std::size_t c = 0; c < C; ++c)
        for (std::size_t i = 0; i < H * W; ++i) y.data()[(s * C + c) * H * W + i] = y_last.data()[(s * H * W + i) * C + c];
  }
#if SOLDER_BENCH_HAS_DNNL
  std::unique_ptr<onednn_net> make_onednn(bool blocked) {
    return std::make_unique<onednn_net>(std::vector<onednn_layer_spec>{{C, C, 3, 1, 1, w_folded.data(), b_folded.data()}}, N,
                                        x.data(), blocked);
  }
#endif
  std::string check(const float* out) {
    const layer_ref L = layer_ref_of(block);
    return check_points(out, N, C, [&](std::size_t s, std::size_t co, std::size_t h, std::size_t w) {
      return conv_bn_relu_at(L, input_of(x.data(), s), co, h, w);
    });
  }
};

/// Depthwise 3x3 + batch_norm + ReLU, then pointwise 1x1 64 -> 128 + batch_norm + ReLU.
struct separable_problem {
  std::size_t N;
  depthwise_block dw{seed_layer};
  pointwise_block pw{seed_layer + 1};
  solder::tensor<float, image> x, mid;
  solder::tensor<float, image128> y;
  std::vector<float> dw_w, dw_b, pw_w, pw_b;
#if SOLDER_BENCH_HAS_DNNL
  std::map<bool, std::unique_ptr<onednn_net>> onednn;
#endif

  explicit separable_problem(std::size_t n) : N(n), x(n), mid(n), y(n) {
    fill_uniform({x.data(), x.size()}, seed_x);
    set_norm(dw.norm, seed_norm);
    set_norm(pw.norm, seed_norm + 10);
    dw.eval();
    dw.pack_weights();
    pw.eval();
    pw.pack_weights();
    std::tie(dw_w, dw_b) = fold(dw);
    std::tie(pw_w, pw_b) = fold(pw);
  }
  double flops() const { return conv_flops<depthwise3x3>(N) + conv_flops<pointwise>(N); }
  void solder_forward(bool folded) {
    dw.fold_in_eval = pw.fold_in_eval = folded;
    dw.forward(x, mid);
    pw.forward(mid, y);
  }
#if SOLDER_BENCH_HAS_DNNL
  /// Blocked only: the pointwise convolution reads the depthwise one's output in its layout.
  std::unique_ptr<onednn_net> make_onednn(bool blocked) {
    return std::make_unique<onednn_net>(
        std::vector<onednn_layer_spec>{{C, C, 3, 1, C, dw_w.data(), dw_b.data()}, {C, 128, 1, 0, 1, pw_w.data(), pw_b.data()}}, N,
        x.data(), blocked);
  }
#endif
  std::string check(const float* out) {
    const layer_ref L1 = layer_ref_of(dw), L2 = layer_ref_of(pw);
    return check_points(out, N, 128, [&](std::size_t s, std::size_t co, std::size_t h, std::size_t w) {
      const auto first = [&](std::size_t c, std::size_t hh, std::size_t ww) {
        return conv_bn_relu_at(L1, input_of(x.data(), s), c, hh, ww);
      };
      return conv_bn_relu_at(L2, first, co, h, w);
    });
  }
};

template <class Problem>
Problem& problem_for(std::size_t n) {
  static std::map<std::size_t, std::unique_ptr<Problem>> made;
  auto& p = made[n];
  if (!p) p = std::make_unique<Problem>(n);
  return *p;
}

/// The call of `which` on p, run once and checked against the reference (not timed); empty,
/// with the case marked as skipped, when it cannot run or computes something else.
template <class Problem>
std::function<void()> checked_call(benchmark::State& state, Problem& p, impl which) {
  std::function<void()> call;
  std::function<void()> output = [] {};  // brings the output to p.y as nchw (not timed)
  if (which == impl::solder_folded_channels_last) {
    if constexpr (requires { p.solder_forward_channels_last(); }) {
      call = [&p] { p.solder_forward_channels_last(); };
      output = [&p] { p.output_from_channels_last(); };
    } else {
      state.SkipWithError("no channels-last form of this problem");
      return {};
    }
  } else if (which == impl::solder_folded || which == impl::solder_unfolded) {
    // The form is set on every call: a paired case alternates the two forms of the same blocks.
    call = [&p, folded = which == impl::solder_folded] { p.solder_forward(folded); };
  } else {
#if SOLDER_BENCH_HAS_DNNL
    const bool blocked = which == impl::onednn_postops_blocked;
    auto& net = p.onednn[blocked];
    if (!net) {
      try {
        net = p.make_onednn(blocked);
      } catch (const dnnl::error& e) {
        state.SkipWithError((std::string(impl_name(which)) + ": " + e.what()).c_str());
        return {};
      }
    }
    state.SetLabel(net->impl);
    call = [n = net.get()] { n->run(); };
    output = [n = net.get(), &p] { n->output_to(p.y.data()); };
#else
    state.SkipWithError("built without oneDNN (SOLDER_BENCH_HAS_DNNL)");
    return {};
#endif
  }
  p.y.fill(std::numeric_limits<float>::quiet_NaN());
  call();
  output();
  if (const std::string err = p.check(p.y.data()); !err.empty()) {
    state.SkipWithError((std::string(impl_name(which)) + ": " + err).c_str());
    return {};
  }
  return call;
}

template <class Problem>
void forward_case(benchmark::State& state, impl which, std::size_t n) {
  single_thread();
  Problem& p = problem_for<Problem>(n);
  if (const auto call = checked_call(state, p, which)) time_case(state, p.flops(), call);
}

/// `mine` (a solder form) against `peer` call by call (time_pairs): speedup = median over the
/// pairs of the peer's time / mine's; each one's GFLOP/s from its median call.
template <class Problem>
void paired_case(benchmark::State& state, impl mine, impl peer, std::size_t n) {
  single_thread();
  Problem& p = problem_for<Problem>(n);
  const auto a = checked_call(state, p, mine);
  const auto b = a ? checked_call(state, p, peer) : nullptr;
  if (!b) return;
  const paired_times t = time_pairs(state, a, b);
  state.counters["speedup"] = t.speedup_of_a();
  state.counters[std::string(impl_name(mine)) + "_GFLOPs"] = p.flops() / paired_times::median(t.a) * 1e-9;
  state.counters[std::string(impl_name(peer)) + "_GFLOPs"] = p.flops() / paired_times::median(t.b) * 1e-9;
}

// ---------------------------------------------------------------------------------------------
// BM_conv_bn_relu_train
// ---------------------------------------------------------------------------------------------

/// The block as a chain trains it, and the same three layers one kernel each, with the same
/// parameters; one batch, one fixed dy.
struct train_problem {
  std::size_t N;
  conv_bn_relu block{seed_layer};
  conv3x3 conv{seed_layer};
  nn::batch_norm<C> norm;
  nn::elementwise_block<nn::relu> act;
  solder::tensor<float, image> x, y, dy, dx, z, u, gu, gz;

  explicit train_problem(std::size_t n) : N(n), x(n), y(n), dy(n), dx(n), z(n), u(n), gu(n), gz(n) {
    fill_uniform({x.data(), x.size()}, seed_x);
    fill_uniform({dy.data(), dy.size()}, seed_dy);
    set_norm(block.norm, seed_norm);
    set_norm(norm, seed_norm);
  }
  // Forward, dx and dW: three products of the convolution's size.
  double flops() const { return 3 * conv_flops<conv3x3>(N); }
  void fused() {
    block.forward(x, y);
    block.backward(x, y, dy, dx);
  }
  void unfused() {
    conv.forward(x, z);
    norm.forward(z, u);
    act.forward(cref(u), y.ref());
    act.backward(cref(u), cref(y), cref(dy), gu.ref());
    norm.backward(z, u, gu, gz);
    conv.backward(x, z, gz, dx);
  }
};

/// Largest |a - b| over n floats, relative to the largest |b|; NaN gives infinity.
double relative_difference(const float* a, const float* b, std::size_t n) {
  double d = 0, m = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double e = std::abs(double(a[i]) - double(b[i]));
    d = std::isnan(e) ? std::numeric_limits<double>::infinity() : std::max(d, e);
    m = std::max(m, std::abs(double(b[i])));
  }
  return d / m;
}

/// The two forms run the same operations in the same order; 1e-5 allows for a summation order
/// that differs (dW sums N Ho Wo = 100352 products per weight).
constexpr double train_tolerance = 1e-5;

/// The training problem for batch n, both forms run once and compared (dx and every gradient)
/// the first time; nullptr, with the case marked as skipped, when they differ.
train_problem* checked_train(benchmark::State& state, std::size_t n) {
  static std::map<std::size_t, std::unique_ptr<train_problem>> made;
  auto& pp = made[n];
  if (pp) return pp.get();
  auto p = std::make_unique<train_problem>(n);
  p->fused();
  const auto copy = [](const auto& t) { return std::vector<float>(t.begin(), t.end()); };
  const std::vector<float> dx = copy(p->dx), dw = copy(p->block.conv.weight_grad), dg = copy(p->block.norm.weight_grad),
                           db = copy(p->block.norm.bias_grad);
  p->dx.fill(std::numeric_limits<float>::quiet_NaN());
  p->unfused();
  const double worst = std::max({relative_difference(p->dx.data(), dx.data(), dx.size()),
                                 relative_difference(p->conv.weight_grad.data(), dw.data(), dw.size()),
                                 relative_difference(p->norm.weight_grad.data(), dg.data(), dg.size()),
                                 relative_difference(p->norm.bias_grad.data(), db.data(), db.size())});
  if (!(worst <= train_tolerance)) {
    state.SkipWithError(("solder and solder_unfused gradients differ by " + std::to_string(worst) + " of their scale").c_str());
    return nullptr;
  }
  pp = std::move(p);
  return pp.get();
}

void train_case(benchmark::State& state, bool fused, std::size_t n) {
  single_thread();
  train_problem* p = checked_train(state, n);
  if (!p) return;
  if (fused)
    time_case(state, p->flops(), [p] { p->fused(); });
  else
    time_case(state, p->flops(), [p] { p->unfused(); });
}

/// solder against solder_unfused call by call: speedup = median of unfused time / fused time.
void train_paired_case(benchmark::State& state, std::size_t n) {
  single_thread();
  train_problem* p = checked_train(state, n);
  if (!p) return;
  const paired_times t = time_pairs(state, [p] { p->fused(); }, [p] { p->unfused(); });
  state.counters["speedup"] = t.speedup_of_a();
  state.counters["solder_GFLOPs"] = p->flops() / paired_times::median(t.a) * 1e-9;
  state.counters["solder_unfused_GFLOPs"] = p->flops() / paired_times::median(t.b) * 1e-9;
}

// ---------------------------------------------------------------------------------------------
// BM_conv_residual_relu_paired
// ---------------------------------------------------------------------------------------------

/// ResNet's block end, y = relu(conv3x3(x) + shortcut), eval mode, weights packed: the add and
/// the ReLU as the convolution's epilogue on each output row (forward_with) against the
/// convolution, then one elementwise pass over y.
struct residual_problem {
  std::size_t N;
  conv3x3 conv{seed_layer};
  solder::tensor<float, image> x, shortcut, y, y_separate;
  explicit residual_problem(std::size_t n) : N(n), x(n), shortcut(n), y(n), y_separate(n) {
    fill_uniform({x.data(), x.size()}, seed_x);
    fill_uniform({shortcut.data(), shortcut.size()}, seed_dy);
    conv.pack_weights();
  }
  double flops() const { return conv_flops<conv3x3>(N); }
  void epilogue() { conv.forward_with(cref(x), y.ref(), solder::write(y, solder::relu(cref(y) + cref(shortcut)))); }
  void separate() {
    conv.forward(x, y_separate);
    solder::assign(y_separate, solder::relu(cref(y_separate) + cref(shortcut)));
  }
};

void residual_paired_case(benchmark::State& state, std::size_t n) {
  single_thread();
  static residual_problem p(n);
  p.epilogue();
  p.separate();
  if (std::memcmp(p.y.data(), p.y_separate.data(), p.y.size() * sizeof(float)) != 0) {
    state.SkipWithError("the epilogue's output differs from the separate pass's");
    return;
  }
  const paired_times t = time_pairs(state, [] { p.epilogue(); }, [] { p.separate(); });
  state.counters["speedup"] = t.speedup_of_a();
  state.counters["solder_epilogue_GFLOPs"] = p.flops() / paired_times::median(t.a) * 1e-9;
  state.counters["solder_separate_GFLOPs"] = p.flops() / paired_times::median(t.b) * 1e-9;
}

// ---------------------------------------------------------------------------------------------
// BM_conv_weight_grad_paired
// ---------------------------------------------------------------------------------------------

#if SOLDER_BENCH_HAS_DNNL
/// dW of the 3x3 layer from x and dy: solder's backward_params (dW on the register tiles; no
/// bias) against oneDNN's convolution_backward_weights, checked against each other first.
void weight_grad_paired_case(benchmark::State& state, bool blocked, std::size_t n) {
  single_thread();
  static std::map<std::size_t, std::unique_ptr<train_problem>> problems;
  auto& p = problems[n];
  if (!p) p = std::make_unique<train_problem>(n);
  onednn_weight_grad peer(n, p->x.data(), p->dy.data(), blocked);
  const auto mine = [q = p.get()] { q->conv.backward_params(cref(q->x), cref(q->y), cref(q->dy)); };
  mine();
  peer.run();
  std::vector<float> theirs(p->conv.weight_grad.size());
  peer.weights_to(theirs.data());
  // Each weight sums N Ho Wo = 100352 products; oneDNN's blocked kernels keep one float sum per
  // weight over all of them (differences of about 1e-5 of the scale), solder float sums per run
  // of rows added in double.
  constexpr double peer_tolerance = 1e-4;
  const double worst = relative_difference(p->conv.weight_grad.data(), theirs.data(), theirs.size());
  if (!(worst <= peer_tolerance)) {
    state.SkipWithError(("solder's and oneDNN's dW differ by " + std::to_string(worst) + " of their scale").c_str());
    return;
  }
  const paired_times t = time_pairs(state, mine, [&] { peer.run(); });
  const double flops = conv_flops<conv3x3>(n);
  state.counters["speedup"] = t.speedup_of_a();
  state.counters["solder_GFLOPs"] = flops / paired_times::median(t.a) * 1e-9;
  state.counters[std::string(blocked ? "onednn_blocked" : "onednn_nchw") + "_GFLOPs"] = flops / paired_times::median(t.b) * 1e-9;
  state.SetLabel(peer.impl);
}
#endif

// ---------------------------------------------------------------------------------------------
// Registration
// ---------------------------------------------------------------------------------------------

/// Pairs per paired case: a few seconds of calls at this machine's speed (about 70 ms per
/// convolution at N = 32, 2 ms at N = 1, 50 ms per depthwise-separable pair, 400 ms per
/// training step).
int pairs_for(std::size_t n, bool train = false) { return train ? 4 : n == 1 ? 300 : 12; }

const bool registered = [] {
  const std::string shape32 = image_name(32);
  for (std::size_t n : {32, 1})
    for (impl which : {impl::solder_folded, impl::solder_folded_channels_last, impl::solder_unfolded,
                       impl::onednn_postops_nchw, impl::onednn_postops_blocked}) {
      const std::string name = std::string("BM_conv_bn_relu_infer/") + impl_name(which) + "/" + image_name(n);
      benchmark::RegisterBenchmark(name.c_str(), forward_case<infer_problem>, which, n)->Unit(benchmark::kMillisecond);
    }
  for (bool fused : {true, false}) {
    const std::string name = std::string("BM_conv_bn_relu_train/") + (fused ? "solder/" : "solder_unfused/") + shape32;
    benchmark::RegisterBenchmark(name.c_str(), train_case, fused, std::size_t{32})->Unit(benchmark::kMillisecond);
  }
  for (impl which : {impl::solder_folded, impl::solder_unfolded, impl::onednn_postops_blocked}) {
    const std::string name = std::string("BM_depthwise_separable/") + impl_name(which) + "/" + shape32;
    benchmark::RegisterBenchmark(name.c_str(), forward_case<separable_problem>, which, std::size_t{32})
        ->Unit(benchmark::kMillisecond);
  }
  // The paired cases: solder's inference form against each peer, and training fused against unfused.
  const std::pair<impl, impl> infer_pairs[] = {{impl::solder_folded, impl::solder_unfolded},
                                                {impl::solder_folded, impl::onednn_postops_nchw},
                                                {impl::solder_folded, impl::onednn_postops_blocked},
                                                {impl::solder_folded_channels_last, impl::onednn_postops_blocked},
                                                {impl::solder_folded_channels_last, impl::solder_unfolded}};
  for (std::size_t n : {32, 1})
    for (const auto& [mine, peer] : infer_pairs) {
      const std::string name = std::string("BM_conv_bn_relu_infer_paired/") + impl_name(mine) + "_vs_" +
                               impl_name(peer) + "/" + image_name(n);
      benchmark::RegisterBenchmark(name.c_str(), paired_case<infer_problem>, mine, peer, n)
          ->Unit(benchmark::kMillisecond)
          ->Iterations(pairs_for(n));
    }
  benchmark::RegisterBenchmark(("BM_conv_bn_relu_train_paired/solder_vs_solder_unfused/" + shape32).c_str(), train_paired_case,
                               std::size_t{32})
      ->Unit(benchmark::kMillisecond)
      ->Iterations(pairs_for(32, true));
#if SOLDER_BENCH_HAS_DNNL
  for (bool blocked : {false, true}) {
    const std::string name = std::string("BM_conv_weight_grad_paired/solder_vs_") +
                             (blocked ? "onednn_blocked/" : "onednn_nchw/") + shape32;
    benchmark::RegisterBenchmark(name.c_str(), weight_grad_paired_case, blocked, std::size_t{32})
        ->Unit(benchmark::kMillisecond)
        ->Iterations(pairs_for(32));
  }
#endif
  benchmark::RegisterBenchmark(("BM_conv_residual_relu_paired/solder_epilogue_vs_solder_separate/" + shape32).c_str(),
                               residual_paired_case, std::size_t{32})
      ->Unit(benchmark::kMillisecond)
      ->Iterations(pairs_for(32));
  for (impl peer : {impl::solder_unfolded, impl::onednn_postops_blocked}) {
    const std::string name = std::string("BM_depthwise_separable_paired/solder_folded_vs_") + impl_name(peer) + "/" + shape32;
    benchmark::RegisterBenchmark(name.c_str(), paired_case<separable_problem>, impl::solder_folded, peer, std::size_t{32})
        ->Unit(benchmark::kMillisecond)
        ->Iterations(pairs_for(32));
  }
  return true;
}();

}  // namespace
