// nn/batch_norm.hpp: PyTorch's nn.BatchNorm2d(C) on [batch, C, H, W] and nn.BatchNorm1d(C) on
// [batch, C] activations, as a block of its own. Training: one pass of shifted sums per channel,
// then one pass writing y; evaluation: one pass with the running statistics. The channel math
// and the passes' bodies are ops/batch_norm.hpp's, run by the executor of the layer's space on
// its row walks: along one sample's plane of H*W values of a channel, or (1-d) across one
// sample's C channels.
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
#include "solder/ops/optimizer.hpp"
#include "solder/ops/rows.hpp"
#include "solder/optim/optimizer.hpp"
#include "solder/shape.hpp"
#include "solder/tensor.hpp"

namespace solder::nn {

/// y = (x - E[x]) / sqrt(Var[x] + eps) * weight + bias per channel of x [batch, C, H, W] or
/// [batch, C]: torch's nn.BatchNorm2d / BatchNorm1d(C, eps, momentum), affine (weight [C] starts
/// at 1, bias [C] at 0) and tracking running statistics. Training (the default) uses the
/// batch's mean and biased Var over (batch, H, W) and moves running_mean and running_var (the
/// unbiased Var) towards them by momentum; eval() uses the running ones. Results do not depend
/// on the thread count. Its parameters, statistics and the tensors it takes live in Space (host
/// memory by default).
template <std::size_t C, class Space = host>
class batch_norm : public block_defaults<Space> {
  static_assert(C >= 1, "solder::nn::batch_norm: the channel count C must be at least 1");
  using exec = executor<backend_of_t<Space>>;
  using op = ops::batch_norm;
  /// What a walk runs on the rows of y it has written: the backend's producer epilogue where it
  /// has one (forward_with's writes then run there, while the rows are in cache), else nothing.
  using epilogue = typename detail::row_epilogue_of<exec>::type;

 public:
  using space = Space;
  /// The same layer over memory space S.
  template <class S>
  using in_space = batch_norm<C, S>;
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

  tensor<float, shape<C>, Space> weight;        // gamma
  tensor<float, shape<C>, Space> bias;          // beta
  tensor<float, shape<C>, Space> weight_grad;   // dL/dweight, written by backward
  tensor<float, shape<C>, Space> bias_grad;     // dL/dbias, written by backward
  tensor<float, shape<C>, Space> running_mean;  // updated by training forwards
  tensor<float, shape<C>, Space> running_var;   // of the unbiased variance
  std::int64_t num_batches_tracked = 0;         // training forwards run (torch's int64 buffer)
  double eps;                                   // added to the variance, as torch's eps
  double momentum;                              // weight of the batch's statistics in the running ones

  explicit batch_norm(double eps = 1e-5, double momentum = 0.1) : eps(eps), momentum(momentum) { reset_parameters(); }

  /// torch's reset_running_stats: running_mean 0, running_var 1, no batches tracked.
  void reset_running_stats() {
    exec::elements(C, ops::fill_elements{running_mean.data(), 0.0f});
    exec::elements(C, ops::fill_elements{running_var.data(), 1.0f});
    num_batches_tracked = 0;
  }
  /// torch's _NormBase.reset_parameters: the running statistics reset, weight 1, bias 0.
  void reset_parameters() {
    reset_running_stats();
    exec::elements(C, ops::fill_elements{weight.data(), 1.0f});
    exec::elements(C, ops::fill_elements{bias.data(), 0.0f});
  }

  /// {prefix + "weight", prefix + "bias"}, as torch's state_dict names them.
  std::vector<optim::basic_param<Space>> params(const std::string& prefix = "") {
    return {optim::make_param(prefix + "weight", weight, weight_grad), optim::make_param(prefix + "bias", bias, bias_grad)};
  }
  /// {prefix + "running_mean", prefix + "running_var"}: the state_dict's other float tensors.
  /// Its third, num_batches_tracked, is an int64 in torch; it is the member of that name.
  std::vector<basic_buffer<Space>> buffers(const std::string& prefix = "") {
    return {{prefix + "running_mean", tensor_ref<float, shape<dyn>, Space>(running_mean.data(), C), {C}},
            {prefix + "running_var", tensor_ref<float, shape<dyn>, Space>(running_var.data(), C), {C}}};
  }

  /// Training mode (the default): batch statistics, running statistics updated.
  void train() { in_training = true; }
  /// Evaluation mode: the running statistics normalize, and nothing changes them.
  void eval() { in_training = false; }
  bool training() const { return in_training; }

  // As a block of its own (nn/block.hpp): torch's reset_parameters, and the state_dict's names
  // from the layer's index.
  void reset(std::uint64_t /*seed*/, std::size_t /*first*/) { reset_parameters(); }
  std::vector<optim::basic_param<Space>> params_from(std::size_t first) { return params(std::to_string(first) + "."); }
  std::vector<basic_buffer<Space>> buffers_from(std::size_t first) { return buffers(std::to_string(first) + "."); }

  /// y = batch_norm(x) for x, y [batch, C, H, W] or [batch, C]; y may be x (in place). In
  /// training, needs more than one value per channel (batch * H * W >= 2), as torch.
  template <class SX, class SY>
  void forward(tensor_ref<const float, SX, Space> x, tensor_ref<float, SY, Space> y) {
    run_forward(x, y, epilogue{});
  }
  template <class SX, class SY>
  void forward(const tensor<float, SX, Space>& x, tensor<float, SY, Space>& y) {
    forward(x.ref(), y.ref());
  }

  /// y = batch_norm(x), then the writes (solder::write(out, e), e elementwise over tensors of
  /// y's shape, y among them; an out may be y): with the bits assign_all(writes...) gives after
  /// forward(x, y). Where the backend has a producer epilogue, on each plane of y (each sample,
  /// for [batch, C]) as soon as it is normalized, while it is in cache: the normalization and
  /// the activation after it in one pass.
  template <class SX, class SY, class W0, class... Ws>
  void forward_with(tensor_ref<const float, SX, Space> x, tensor_ref<float, SY, Space> y, const W0& w0,
                    const Ws&... ws) {
    if constexpr (detail::has_row_epilogue<exec>) {
      const auto writes = exec::template row_writes<SY>(y.batch(), w0, ws...);
      run_forward(x, y, writes.epilogue());
    } else {
      run_forward(x, y, epilogue{});
      exec::run(w0, ws...);
    }
  }

  /// dx = dL/dx, and weight_grad, bias_grad (overwritten), for the last forward, whose input
  /// and output x and y were; in the mode that forward ran in, with the statistics it used. dx
  /// may be dy.
  template <class SX, class SY>
  void backward(tensor_ref<const float, SX, Space> x, tensor_ref<const float, SY, Space> y,
                tensor_ref<const float, SY, Space> dy, tensor_ref<float, SX, Space> dx) {
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
    const float *xp = x.data(), *dyp = dy.data();
    const auto sums = channel_sums<hw, true>(batch, xp, dyp);
    exec::elements(C, channels(ops::batch_norm_channels::pass::backward, sums, xp, batch, hw));
    const std::size_t walks = hw == 1 ? batch : batch * C;
    if (saved_training)
      exec::template rows<walk_len<hw>>(
          walks, ops::batch_norm_backward_walks<C, hw, true>{xp, dyp, dx.data(), saved_mean.data(), saved_rstd.data(),
                                                             scale.data(), dweight_mean.data(), dbias_mean.data()});
    else
      exec::template rows<walk_len<hw>>(
          walks, ops::batch_norm_backward_walks<C, hw, false>{xp, dyp, dx.data(), saved_mean.data(), saved_rstd.data(),
                                                              scale.data(), nullptr, nullptr});
  }
  template <class SX, class SY>
  void backward(const tensor<float, SX, Space>& x, const tensor<float, SY, Space>& y,
                const tensor<float, SY, Space>& dy, tensor<float, SX, Space>& dx) {
    backward(x.ref(), y.ref(), dy.ref(), dx.ref());
  }

 private:
  /// y = batch_norm(x), the epilogue run on each walk's rows of y once written.
  template <class SX, class SY, class After>
  void run_forward(tensor_ref<const float, SX, Space> x, tensor_ref<float, SY, Space> y, After after) {
    static_assert(check_shapes<SX, SY>());
    if (x.batch() != y.batch())
      detail::batches_differ("solder::nn::batch_norm::forward", {{"x", x.batch()}, {"y", y.batch()}});
    constexpr std::size_t hw = plane_size<SX>();
    const std::size_t batch = samples<SX>(x.batch());
    const float* xp = x.data();
    if (in_training) {
      if (batch * hw < 2)
        solder::detail::fail("solder::nn::batch_norm::forward: expected more than 1 value per channel when training, "
                             "got input size " + solder::to_string<SX>(x.batch()) +
                             "; train on a larger batch, or call eval()");
      // Each channel's values shifted by its first one (sample 0), which lies within the spread.
      const auto sums = channel_sums<hw, false>(batch, xp, nullptr);
      exec::elements(C, channels(ops::batch_norm_channels::pass::train_forward, sums, xp, batch, hw));
      ++num_batches_tracked;
    } else {
      exec::elements(C, channels(ops::batch_norm_channels::pass::eval_forward, {}, xp, batch, hw));
    }
    saved_batch = batch;
    saved_plane = hw;
    saved_training = in_training;
    has_saved = true;
    exec::template rows<walk_len<hw>>(hw == 1 ? batch : batch * C,
                                      ops::batch_norm_forward_walks<C, hw, After>{xp, y.data(), saved_mean.data(),
                                                                                  scale.data(), bias.data(), after,
                                                                                  SY::last});
  }

  /// Values per sample and channel: H * W, or 1 for [batch, C].
  template <class S>
  static constexpr std::size_t plane_size() {
    if constexpr (S::rank == 4)
      return S::extents[2] * S::extents[3];
    else
      return 1;
  }
  /// The length of a walk: a plane of HW values, or (HW = 1) a sample's C channels.
  template <std::size_t HW>
  static constexpr std::size_t walk_len = HW == 1 ? C : HW;

  /// Samples in a tensor of shape S with batch() `batch` (a static shape's own extent).
  template <class S>
  static constexpr std::size_t samples(std::size_t batch) {
    return S::elements(batch) / (C * plane_size<S>());
  }

  /// The two per-channel sums of a pass over `batch` samples (the statistics', or with Grads
  /// the gradients'), the same bits for any thread count: HW > 1, each plane's sums in double,
  /// added per channel in sample order; HW = 1, chunks of samples (fixed by the sizes) in float
  /// columns flushed to double every 16 samples, the chunks added in order.
  template <std::size_t HW, bool Grads>
  ops::batch_norm_sums channel_sums(std::size_t batch, const float* x, const float* dy) {
    const float *mean = saved_mean.data(), *rstd = saved_rstd.data();
    if constexpr (HW == 1) {
      const auto parts = exec::chunks_of(batch, C);
      if (partial.batch() < parts.count) {
        partial = tensor<float, shape<dyn, 2 * C>, Space>(parts.count);
        total = tensor<double, shape<dyn, 2 * C>, Space>(parts.count);
      }
      exec::template chunks<C>(parts, ops::batch_norm_chunk_sums<C, typename exec::chunking, Grads>{
                                          x, dy, mean, rstd, partial.data(), total.data(), parts});
      return {total.data(), parts.count, 2 * C, C, 1};
    } else {
      if (planes.batch() < batch * C) planes = tensor<double, shape<dyn, 2>, Space>(batch * C);
      exec::template rows<HW>(batch * C, ops::batch_norm_plane_sums<HW, Grads>{x, dy, mean, rstd, planes.data(), C});
      return {planes.data(), batch, 2 * C, 1, 2};
    }
  }

  /// The per-channel body of a pass (ops::batch_norm_channels) over this layer's tensors.
  ops::batch_norm_channels channels(ops::batch_norm_channels::pass what, ops::batch_norm_sums sums, const float* x,
                                    std::size_t batch, std::size_t plane) {
    return {what,
            sums,
            x,
            plane,
            double(batch * plane),
            eps,
            momentum,
            saved_training,
            weight.data(),
            running_mean.data(),
            running_var.data(),
            saved_mean.data(),
            saved_rstd.data(),
            scale.data(),
            weight_grad.data(),
            bias_grad.data(),
            dweight_mean.data(),
            dbias_mean.data()};
  }

  bool in_training = true;
  // The last forward's per-channel statistics (batch or running), kept for backward.
  tensor<float, shape<C>, Space> saved_mean;
  tensor<float, shape<C>, Space> saved_rstd;
  std::size_t saved_batch = 0;
  std::size_t saved_plane = 0;
  bool saved_training = true;
  bool has_saved = false;
  // A pass's per-channel coefficients: k = weight rstd, and backward's dweight / n, dbias / n.
  tensor<float, shape<C>, Space> scale;
  tensor<float, shape<C>, Space> dweight_mean;
  tensor<float, shape<C>, Space> dbias_mean;
  tensor<double, shape<dyn, 2>, Space> planes{1};      // per-plane sums (HW > 1)
  tensor<float, shape<dyn, 2 * C>, Space> partial{1};  // per-chunk float columns (HW = 1)
  tensor<double, shape<dyn, 2 * C>, Space> total{1};   // per-chunk double columns (HW = 1)

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
template <template <class...> class Rest, std::size_t C, class Space, class... After>
struct leading_norm<Rest, batch_norm<C, Space>, After...> {
  static constexpr bool has_norm = true;
  using norm = batch_norm<C, Space>;
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
