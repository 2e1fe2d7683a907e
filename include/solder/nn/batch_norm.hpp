// nn/batch_norm.hpp: PyTorch's nn.BatchNorm2d(C) on [batch, C, H, W] and nn.BatchNorm1d(C) on
// [batch, C] activations, as a block of its own. Training: one pass of shifted sums per channel,
// then one pass writing y; evaluation: one pass with the running statistics. The channel math
// is ops::batch_norm (ops/batch_norm.hpp), run on executor<cpu>'s row walks: along one sample's
// plane of H*W values of a channel, or (1-d) across one sample's C channels.
#pragma once

#include <algorithm>
#include <array>
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
#include "solder/nn/buffer.hpp"
#include "solder/nn/layer_kind.hpp"
#include "solder/nn/sample_shape.hpp"
#include "solder/ops/batch_norm.hpp"
#include "solder/optim/optimizer.hpp"
#include "solder/shape.hpp"
#include "solder/tensor.hpp"

namespace solder::nn {

/// y = (x - E[x]) / sqrt(Var[x] + eps) * weight + bias per channel of x [batch, C, H, W] or
/// [batch, C]: torch's nn.BatchNorm2d / BatchNorm1d(C, eps, momentum), affine (weight [C] starts
/// at 1, bias [C] at 0) and tracking running statistics. Training (the default) uses the
/// batch's mean and biased Var over (batch, H, W) and moves running_mean and running_var (the
/// unbiased Var) towards them by momentum; eval() uses the running ones. Results do not depend
/// on the thread count.
template <std::size_t C>
class batch_norm : public block_defaults<> {
  static_assert(C >= 1, "solder::nn::batch_norm: the channel count C must be at least 1");
  using exec = executor<cpu>;
  using op = ops::batch_norm;
  /// A walk across one sample's C channels: 1-d input, one value per channel and sample.
  using across = exec::row<C>;
  /// A walk along one sample's plane of HW values of a channel.
  template <std::size_t HW>
  using along = exec::row<HW>;

 public:
  static constexpr const char* name = "batch_norm";

  /// What the planner and cost.hpp know of the layer (nn/layer_info.hpp): it keeps the shape of
  /// what it is given, [C] or [C, H, W]; FLOPs per output feature (element).
  struct planner_traits {
    static constexpr layer_kind kind = layer_kind::block;
    static constexpr std::size_t in = 0, out = 0;
    static constexpr std::size_t parameters = 2 * C;
    static constexpr double forward_flops(std::size_t f) { return double(op::forward_flops) * double(f); }
    static constexpr double backward_flops(std::size_t f) { return double(op::backward_flops) * double(f); }
    /// Backward keeps a mean and rstd per channel, nothing per sample.
    static constexpr std::size_t saved_floats(std::size_t) { return 0; }
    static constexpr bool takes(sample_shape s) { return (s.rank == 1 || s.rank == 3) && s[0] == C; }
    static constexpr sample_shape gives(sample_shape s) { return s; }
    /// Right after a product that can take it (a convolution), the planner puts it in the
    /// product's block, which folds it into the weights in evaluation mode (nn/plan.hpp).
    static constexpr bool folds_into_product = true;
    static constexpr void append_takes(fixed_string& m) {
      m.append("[").append(C).append("] or [").append(C).append(", H, W]");
    }
  };

  tensor<float, shape<C>> weight;        // gamma
  tensor<float, shape<C>> bias;          // beta
  tensor<float, shape<C>> weight_grad;   // dL/dweight, written by backward
  tensor<float, shape<C>> bias_grad;     // dL/dbias, written by backward
  tensor<float, shape<C>> running_mean;  // updated by training forwards
  tensor<float, shape<C>> running_var;   // of the unbiased variance
  std::int64_t num_batches_tracked = 0;  // training forwards run (torch's int64 buffer)
  double eps;                            // added to the variance, as torch's eps
  double momentum;                       // weight of the batch's statistics in the running ones

  explicit batch_norm(double eps = 1e-5, double momentum = 0.1) : eps(eps), momentum(momentum) { reset_parameters(); }

  /// torch's reset_running_stats: running_mean 0, running_var 1, no batches tracked.
  void reset_running_stats() {
    running_mean.fill(0.0f);
    running_var.fill(1.0f);
    num_batches_tracked = 0;
  }
  /// torch's _NormBase.reset_parameters: the running statistics reset, weight 1, bias 0.
  void reset_parameters() {
    reset_running_stats();
    weight.fill(1.0f);
    bias.fill(0.0f);
  }

  /// {prefix + "weight", prefix + "bias"}, as torch's state_dict names them.
  std::vector<optim::param> params(const std::string& prefix = "") {
    return {optim::make_param(prefix + "weight", weight, weight_grad), optim::make_param(prefix + "bias", bias, bias_grad)};
  }
  /// {prefix + "running_mean", prefix + "running_var"}: the state_dict's other float tensors.
  /// Its third, num_batches_tracked, is an int64 in torch; it is the member of that name.
  std::vector<buffer> buffers(const std::string& prefix = "") {
    return {{prefix + "running_mean", tensor_ref<float, shape<dyn>>(running_mean.data(), C), {C}},
            {prefix + "running_var", tensor_ref<float, shape<dyn>>(running_var.data(), C), {C}}};
  }

  /// Training mode (the default): batch statistics, running statistics updated.
  void train() { in_training = true; }
  /// Evaluation mode: the running statistics normalize, and nothing changes them.
  void eval() { in_training = false; }
  bool training() const { return in_training; }

  // As a block of its own (nn/block.hpp): torch's reset_parameters, and the state_dict's names
  // from the layer's index.
  void reset(std::uint64_t /*seed*/, std::size_t /*first*/) { reset_parameters(); }
  std::vector<optim::param> params_from(std::size_t first) { return params(std::to_string(first) + "."); }
  std::vector<buffer> buffers_from(std::size_t first) { return buffers(std::to_string(first) + "."); }

  /// y = batch_norm(x) for x, y [batch, C, H, W] or [batch, C]; y may be x (in place). In
  /// training, needs more than one value per channel (batch * H * W >= 2), as torch.
  template <class SX, class SY>
  void forward(tensor_ref<const float, SX> x, tensor_ref<float, SY> y) {
    run_forward(x, y, exec::row_epilogue::none());
  }
  template <class SX, class SY>
  void forward(const tensor<float, SX>& x, tensor<float, SY>& y) {
    forward(x.ref(), y.ref());
  }

  /// y = batch_norm(x), then the writes (solder::write(out, e), e elementwise over tensors of
  /// y's shape, y among them; an out may be y) on each plane of y (each sample, for [batch, C])
  /// as soon as it is normalized, while it is in cache: the normalization and the activation
  /// after it in one pass, with the bits assign_all(writes...) gives after forward(x, y).
  template <class SX, class SY, class W0, class... Ws>
  void forward_with(tensor_ref<const float, SX> x, tensor_ref<float, SY> y, const W0& w0, const Ws&... ws) {
    const auto writes = exec::template row_writes<SY>(y.batch(), w0, ws...);
    run_forward(x, y, writes.epilogue());
  }

  /// dx = dL/dx, and weight_grad, bias_grad (overwritten), for the last forward, whose input
  /// and output x and y were; in the mode that forward ran in, with the statistics it used. dx
  /// may be dy.
  template <class SX, class SY>
  void backward(tensor_ref<const float, SX> x, tensor_ref<const float, SY> y, tensor_ref<const float, SY> dy,
                tensor_ref<float, SX> dx) {
    static_assert(check_shapes<SX, SY>());
    if (y.batch() != x.batch() || dy.batch() != x.batch() || dx.batch() != x.batch())
      detail::batches_differ("solder::nn::batch_norm::backward",
                             {{"x", x.batch()}, {"y", y.batch()}, {"dy", dy.batch()}, {"dx", dx.batch()}});
    const std::size_t batch = samples<SX>(x.batch());
    if (!has_saved)
      solder::detail::fail("solder::nn::batch_norm::backward: no forward has run; backward needs the channel "
                           "statistics of the forward on this batch");
    constexpr std::size_t hw = plane_size<SX>();
    if (batch != saved_batch || hw != saved_plane)
      solder::detail::fail("solder::nn::batch_norm::backward: the last forward saw a batch of " +
                           std::to_string(saved_batch) + " (" + std::to_string(saved_plane) +
                           " values per sample and channel) but backward got " + std::to_string(batch) + " (" +
                           std::to_string(hw) + "); run forward on this batch first");
    const float *xp = x.data(), *dyp = dy.data(), *mean = saved_mean.data(), *rstd = saved_rstd.data();
    channel_sums<hw>(
        batch, [=](std::size_t r, float* sdy, float* sdyx) { grads_across(xp + r * C, dyp + r * C, mean, rstd, sdy, sdyx); },
        [=](std::size_t q) { return grads_along<hw>(xp + q * hw, dyp + q * hw, mean[q % C], rstd[q % C]); });
    const double n = double(batch * hw);
    for (std::size_t c = 0; c < C; ++c) {
      weight_grad[c] = float(sums(1, c));
      bias_grad[c] = float(sums(0, c));
      scale[c] = float(double(weight[c]) * double(saved_rstd[c]));
      if (saved_training) {
        dweight_mean[c] = float(sums(1, c) / n);
        dbias_mean[c] = float(sums(0, c) / n);
      }
    }
    float* dxp = dx.data();
    const float *k = scale.data(), *gw = dweight_mean.data(), *gb = dbias_mean.data();
    if (saved_training) {
      for_walks<hw>(batch, [=](auto walk, std::size_t at, auto channel) {
        backward_walk<typename decltype(walk)::type>(xp + at, dyp + at, dxp + at, channel(mean), channel(rstd),
                                                     channel(k), channel(gw), channel(gb));
      });
    } else {
      for_walks<hw>(batch, [=](auto walk, std::size_t at, auto channel) {
        backward_eval_walk<typename decltype(walk)::type>(dyp + at, dxp + at, channel(k));
      });
    }
  }
  template <class SX, class SY>
  void backward(const tensor<float, SX>& x, const tensor<float, SY>& y, const tensor<float, SY>& dy, tensor<float, SX>& dx) {
    backward(x.ref(), y.ref(), dy.ref(), dx.ref());
  }

 private:
  /// y = batch_norm(x), the epilogue run on each walk's rows of y once written.
  template <class SX, class SY>
  void run_forward(tensor_ref<const float, SX> x, tensor_ref<float, SY> y, exec::row_epilogue after) {
    static_assert(check_shapes<SX, SY>());
    if (x.batch() != y.batch())
      detail::batches_differ("solder::nn::batch_norm::forward", {{"x", x.batch()}, {"y", y.batch()}});
    constexpr std::size_t hw = plane_size<SX>();
    const std::size_t batch = samples<SX>(x.batch());
    const float* xp = x.data();
    if (in_training) {
      const std::size_t n = batch * hw;  // values per channel
      if (n < 2)
        solder::detail::fail("solder::nn::batch_norm::forward: expected more than 1 value per channel when training, "
                             "got input size " + solder::to_string<SX>(x.batch()) +
                             "; train on a larger batch, or call eval()");
      // Each channel's values shifted by its first one (sample 0), which lies within the spread.
      channel_sums<hw>(
          batch, [=](std::size_t r, float* s1, float* s2) { statistics_across(xp + r * C, xp, s1, s2); },
          [=](std::size_t q) { return statistics_along<hw>(xp + q * hw, xp[(q % C) * hw]); });
      for (std::size_t c = 0; c < C; ++c) {
        const auto m = op::moments(double(n), double(xp[c * hw]), sums(0, c), sums(1, c));
        const double rstd = op::rstd(m.var, eps);
        saved_mean[c] = float(m.mean);
        saved_rstd[c] = float(rstd);
        scale[c] = float(double(weight[c]) * rstd);
        running_mean[c] = float(op::running(double(running_mean[c]), m.mean, momentum));
        running_var[c] = float(op::running(double(running_var[c]), m.var_unbiased, momentum));
      }
      ++num_batches_tracked;
    } else {
      for (std::size_t c = 0; c < C; ++c) {
        const double rstd = op::rstd(double(running_var[c]), eps);
        saved_mean[c] = running_mean[c];
        saved_rstd[c] = float(rstd);
        scale[c] = float(double(weight[c]) * rstd);
      }
    }
    saved_batch = batch;
    saved_plane = hw;
    saved_training = in_training;
    has_saved = true;
    float* yp = y.data();
    const float *mean = saved_mean.data(), *k = scale.data(), *b = bias.data();
    for_walks<hw>(batch, [=](auto walk, std::size_t at, auto channel) {
      forward_walk<typename decltype(walk)::type>(xp + at, yp + at, channel(mean), channel(k), channel(b));
      // The walk's rows of y: a plane's H rows, or (1-d) one sample's row.
      constexpr std::size_t walk_len = hw == 1 ? C : hw;
      after.rows(at / SY::last, walk_len / SY::last, 1);
    });
  }

  /// Samples a chunk adds up in float columns (1-d) before a flush to double: 16 terms, as the
  /// row walker's blocks, so a column sum errs by about 20 u of its terms' magnitudes.
  static constexpr std::size_t flush_rows = 16;

  /// Values per sample and channel: H * W, or 1 for [batch, C].
  template <class S>
  static constexpr std::size_t plane_size() {
    if constexpr (S::rank == 4)
      return S::extents[2] * S::extents[3];
    else
      return 1;
  }

  /// Samples in a tensor of shape S with batch() `batch` (a static shape's own extent).
  template <class S>
  static constexpr std::size_t samples(std::size_t batch) {
    return S::elements(batch) / (C * plane_size<S>());
  }

  /// f(walk, at, channel) for every walk of a pass over `batch` samples, at its offset `at`:
  /// across each sample's channels (HW = 1), or along each (sample, channel) plane. channel(p)
  /// is a per-channel array's operand for the walk: the array itself, or its channel's value.
  /// Walks are independent, so how they are split among threads cannot change a result.
  template <std::size_t HW, class F>
  static void for_walks(std::size_t batch, const F& f) {
    if constexpr (HW == 1)
      exec::for_rows(batch, C, [&](std::size_t r) {
        f(std::type_identity<across>{}, r * C, [](const float* p) { return p; });
      });
    else
      exec::for_rows(batch * C, HW, [&](std::size_t q) {
        f(std::type_identity<along<HW>>{}, q * HW, [c = q % C](const float* p) { return p[c]; });
      });
  }

  /// sums(0, c) and sums(1, c): channel c's totals of two terms over the batch, the same bits
  /// for any thread count. HW = 1: add_row(r, s0, s1) adds sample r's terms to float columns,
  /// which chunks of samples (fixed by the sizes) flush to double every flush_rows samples, and
  /// the chunks are added in order. HW > 1: plane(q) gives plane q's two sums in double (q =
  /// sample * C + channel), added per channel in sample order.
  template <std::size_t HW, class AddRow, class Plane>
  void channel_sums(std::size_t batch, const AddRow& add_row, const Plane& plane) {
    double* out = channel_totals.data();
    if constexpr (HW == 1) {
      const exec::chunking parts(batch, C);
      if (partial.batch() < parts.count) {
        partial = tensor<float, shape<dyn, 2 * C>>(parts.count);
        total = tensor<double, shape<dyn, 2 * C>>(parts.count);
      }
      float* pp = partial.data();
      double* tp = total.data();
      exec::for_chunks(parts, C, [&](std::size_t k) {
        float* p = pp + k * 2 * C;  // [terms 0, terms 1] of this chunk
        double* t = tp + k * 2 * C;
        std::fill_n(p, 2 * C, 0.0f);
        std::fill_n(t, 2 * C, 0.0);
        const std::size_t begin = parts.begin(k), end = parts.end(k);
        for (std::size_t r = begin; r < end; ++r) {
          add_row(r, p, p + C);
          if ((r - begin + 1) % flush_rows == 0 || r + 1 == end) {
            for (std::size_t j = 0; j < 2 * C; ++j) t[j] += double(p[j]);
            std::fill_n(p, 2 * C, 0.0f);
          }
        }
      });
      for (std::size_t j = 0; j < 2 * C; ++j) {
        double s = 0;
        for (std::size_t k = 0; k < parts.count; ++k) s += tp[k * 2 * C + j];
        out[j] = s;
      }
    } else {
      if (planes.batch() < batch * C) planes = tensor<double, shape<dyn, 2>>(batch * C);
      double* ps = planes.data();
      exec::for_rows(batch * C, HW, [=](std::size_t q) {
        const std::array<double, 2> s = plane(q);
        ps[2 * q] = s[0];
        ps[2 * q + 1] = s[1];
      });
      exec::for_rows(C, 2 * batch, [=](std::size_t c) {
        double s0 = 0, s1 = 0;
        for (std::size_t i = 0; i < batch; ++i) {
          s0 += ps[2 * (i * C + c)];
          s1 += ps[2 * (i * C + c) + 1];
        }
        out[c] = s0;
        out[C + c] = s1;
      });
    }
  }
  double sums(std::size_t term, std::size_t c) const { return channel_totals[term * C + c]; }

  // The walks, flattened: the op's loops and the walker's reductions become one body whatever
  // else the translation unit holds (see layer_norm).
  SOLDER_FLATTEN_KERNEL static void statistics_across(const float* x, const float* shift, float* s1, float* s2) {
    op{}.add_statistics(across{}, x, shift, s1, s2);
  }
  template <std::size_t HW>
  SOLDER_FLATTEN_KERNEL static std::array<double, 2> statistics_along(const float* x, float shift) {
    return op{}.statistics_sums(along<HW>{}, x, shift);
  }
  SOLDER_FLATTEN_KERNEL static void grads_across(const float* x, const float* dy, const float* mean, const float* rstd,
                                                 float* sdy, float* sdyx) {
    op{}.add_grads(across{}, x, dy, mean, rstd, sdy, sdyx);
  }
  template <std::size_t HW>
  SOLDER_FLATTEN_KERNEL static std::array<double, 2> grads_along(const float* x, const float* dy, float mean, float rstd) {
    return op{}.grad_sums(along<HW>{}, x, dy, mean, rstd);
  }
  template <class R, class P>
  SOLDER_FLATTEN_KERNEL static void forward_walk(const float* x, float* y, P mean, P k, P b) {
    op{}.forward(R{}, x, y, mean, k, b);
  }
  template <class R, class P>
  SOLDER_FLATTEN_KERNEL static void backward_walk(const float* x, const float* dy, float* dx, P mean, P rstd, P k, P gw,
                                                  P gb) {
    op{}.backward(R{}, x, dy, dx, mean, rstd, k, gw, gb);
  }
  template <class R, class P>
  SOLDER_FLATTEN_KERNEL static void backward_eval_walk(const float* dy, float* dx, P k) {
    op{}.backward_eval(R{}, dy, dx, k);
  }

  bool in_training = true;
  // The last forward's per-channel statistics (batch or running), kept for backward.
  tensor<float, shape<C>> saved_mean;
  tensor<float, shape<C>> saved_rstd;
  std::size_t saved_batch = 0;
  std::size_t saved_plane = 0;
  bool saved_training = true;
  bool has_saved = false;
  // A pass's per-channel coefficients: k = weight rstd, and backward's dweight / n, dbias / n.
  tensor<float, shape<C>> scale;
  tensor<float, shape<C>> dweight_mean;
  tensor<float, shape<C>> dbias_mean;
  tensor<double, shape<2, C>> channel_totals;   // channel_sums' result
  tensor<double, shape<dyn, 2>> planes{1};      // per-plane sums (HW > 1)
  tensor<float, shape<dyn, 2 * C>> partial{1};  // per-chunk float columns (HW = 1)
  tensor<double, shape<dyn, 2 * C>> total{1};   // per-chunk double columns (HW = 1)

  template <class SX, class SY>
  static constexpr bool check_shapes() {
    if constexpr (std::is_same_v<SX, SY> && (SX::rank == 2 || SX::rank == 4) && SX::extents[1] == C) {
      return true;
    } else {
      constexpr fixed_string m = [] {
        fixed_string s("solder::nn::batch_norm<");
        s.append(C).append(">: x and y need one shape, [batch, ").append(C).append("] or [batch, ");
        s.append(C).append(", H, W]; got x ");
        solder::detail::append_shape<SX>(s);
        s.append(" and y ");
        solder::detail::append_shape<SY>(s);
        return s;
      }();
      return diagnostic<m>::reported;
    }
  }
};

namespace detail {
/// A product block's tail (the layers after its product) split into the batch_norm that leads
/// it, if any, which folds into the product, and the layers after that, run as Rest<...>.
template <template <class...> class Rest, class... Tail>
struct leading_norm {
  static constexpr bool has_norm = false;
  using norm = std::tuple<>;
  using rest = Rest<Tail...>;
  static constexpr std::size_t rest_size = sizeof...(Tail);
  static constexpr std::size_t channels = 0;
};
template <template <class...> class Rest, std::size_t C, class... After>
struct leading_norm<Rest, batch_norm<C>, After...> {
  static constexpr bool has_norm = true;
  using norm = batch_norm<C>;
  using rest = Rest<After...>;
  static constexpr std::size_t rest_size = sizeof...(After);
  static constexpr std::size_t channels = C;
};

/// Layer At of a product block as the user wrote it: its product layer, the batch_norm folded
/// into it (if any), the tail's layers.
template <std::size_t At, bool HasNorm, class Head, class Norm, class TailLayers>
auto& block_layer(Head& head, Norm& norm, TailLayers& tail) {
  if constexpr (At == 0)
    return head;
  else if constexpr (HasNorm && At == 1)
    return norm;
  else
    return std::get<At - (HasNorm ? 2 : 1)>(tail);
}
}  // namespace detail

}  // namespace solder::nn
