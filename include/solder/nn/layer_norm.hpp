// nn/layer_norm.hpp: PyTorch's nn.LayerNorm(N) over the feature axis of [batch, N] activations,
// as a block of its own: one visit per row forward (statistics, then y) and backward (two sums,
// then dx and this row's share of dweight and dbias). The row math is ops::layer_norm
// (ops/layer_norm.hpp), run on executor<cpu>'s row walk.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

#include "solder/assign.hpp"
#include "solder/config.hpp"
#include "solder/diagnostic.hpp"
#include "solder/nn/batch_check.hpp"
#include "solder/nn/block.hpp"
#include "solder/ops/layer_norm.hpp"
#include "solder/optim/optimizer.hpp"
#include "solder/shape.hpp"
#include "solder/tensor.hpp"

namespace solder::nn {

/// y = (x - E[x]) / sqrt(Var[x] + eps) * weight + bias over each row of x [batch, N]: torch's
/// nn.LayerNorm(N, eps) with elementwise_affine (weight [N] starts at 1, bias [N] at 0; Var is
/// the biased variance). Keeps each row's mean and 1/sqrt(Var + eps) for backward. Results
/// do not depend on the thread count. A NaN or infinity in a row makes that row's y NaN.
template <std::size_t N>
class layer_norm : public block_defaults<> {
  static_assert(N >= 1, "solder::nn::layer_norm: the feature count N must be at least 1");
  using exec = executor<cpu>;
  using row = exec::row<N>;

 public:
  static constexpr std::size_t in_features = N;
  static constexpr std::size_t out_features = N;
  static constexpr const char* name = "layer_norm";
  static constexpr std::size_t parameter_count = 2 * N;
  /// Per sample, approximate: the op's count per element (ops/layer_norm.hpp), N elements.
  static constexpr double forward_flops = double(ops::layer_norm::forward_flops) * N;
  static constexpr double backward_flops = double(ops::layer_norm::backward_flops) * N;
  /// Floats per sample kept for backward beyond x and y: the row's mean and rstd.
  static constexpr std::size_t saved_floats = 2;

  tensor<float, shape<N>> weight;       // gamma
  tensor<float, shape<N>> bias;         // beta
  tensor<float, shape<N>> weight_grad;  // dL/dweight, written by backward
  tensor<float, shape<N>> bias_grad;    // dL/dbias, written by backward
  float eps;                            // added to the variance, as torch's eps

  explicit layer_norm(float eps = 1e-5f) : eps(eps) { reset_parameters(); }

  /// torch's LayerNorm.reset_parameters: weight 1, bias 0.
  void reset_parameters() {
    weight.fill(1.0f);
    bias.fill(0.0f);
  }

  /// {prefix + "weight", prefix + "bias"}, as torch's state_dict names them.
  std::vector<optim::param> params(const std::string& prefix = "") {
    return {optim::make_param(prefix + "weight", weight, weight_grad), optim::make_param(prefix + "bias", bias, bias_grad)};
  }

  // As a block of its own (nn/block.hpp): torch's reset_parameters, names from the layer's index.
  void reset(std::uint64_t /*seed*/, std::size_t /*first*/) { reset_parameters(); }
  std::vector<optim::param> params_from(std::size_t first) { return params(std::to_string(first) + "."); }

  /// y = layer_norm(x) for x, y [batch, N]; y may be x (in place). Saves each row's statistics.
  template <class SX, class SY>
  void forward(tensor_ref<const float, SX> x, tensor_ref<float, SY> y) {
    static_assert(check_shapes<SX, SY>());
    if (x.batch() != y.batch())
      detail::batches_differ("solder::nn::layer_norm::forward", {{"x", x.batch()}, {"y", y.batch()}});
    const std::size_t rows = SX::elements(x.batch()) / N;
    if (stats.batch() < rows) stats = tensor<float, shape<dyn, 2>>(rows);
    saved_rows = rows;
    const float *xp = x.data(), *w = weight.data(), *b = bias.data();
    float* yp = y.data();
    float* stats_p = stats.data();
    const double e = eps;
    // Rows are independent: how they are split among threads cannot change a result.
    exec::for_rows(rows, N, [=](std::size_t r) { forward_row(xp + r * N, yp + r * N, w, b, e, stats_p + 2 * r); });
  }
  template <class SX, class SY>
  void forward(const tensor<float, SX>& x, tensor<float, SY>& y) {
    forward(x.ref(), y.ref());
  }

  /// dx = dL/dx, and weight_grad, bias_grad (overwritten), for the last forward, whose input
  /// and output x and y were; uses the statistics it saved. dx may be dy (in place).
  template <class SX, class SY>
  void backward(tensor_ref<const float, SX> x, tensor_ref<const float, SY> y, tensor_ref<const float, SY> dy,
                tensor_ref<float, SX> dx) {
    static_assert(check_shapes<SX, SY>());
    const std::size_t batch = x.batch();
    if (y.batch() != batch || dy.batch() != batch || dx.batch() != batch)
      detail::batches_differ("solder::nn::layer_norm::backward",
                             {{"x", batch}, {"y", y.batch()}, {"dy", dy.batch()}, {"dx", dx.batch()}});
    const std::size_t rows = SX::elements(batch) / N;
    if (saved_rows == 0)
      solder::detail::fail("solder::nn::layer_norm::backward: no forward has run; backward needs the row statistics "
                           "of the forward on this batch");
    if (rows != saved_rows)
      solder::detail::fail("solder::nn::layer_norm::backward: the last forward saw " + std::to_string(saved_rows) +
                           " rows but backward got " + std::to_string(rows) + "; run forward on this batch first");
    // Chunks depend on the sizes only; each sums its rows' dweight and dbias in float for up
    // to flush_rows rows, then in double; the chunks are added in order. So the gradients are
    // the same for any thread count.
    const exec::chunking parts(rows, N);
    if (partial.batch() < parts.count) {
      partial = tensor<float, shape<dyn, 2 * N>>(parts.count);
      total = tensor<double, shape<dyn, 2 * N>>(parts.count);
    }
    const float *xp = x.data(), *dyp = dy.data(), *w = weight.data(), *st = stats.data();
    float* dxp = dx.data();
    exec::for_chunks(parts, N, [&](std::size_t c) {
      float* p = partial.data() + c * 2 * N;  // [dweight, dbias] of this chunk
      double* t = total.data() + c * 2 * N;
      std::fill_n(p, 2 * N, 0.0f);
      std::fill_n(t, 2 * N, 0.0);
      const std::size_t begin = parts.begin(c), end = parts.end(c);
      for (std::size_t r = begin; r < end; ++r) {
        backward_row(xp + r * N, dyp + r * N, w, st + 2 * r, dxp + r * N, p);
        if ((r - begin + 1) % flush_rows == 0 || r + 1 == end) {
          for (std::size_t j = 0; j < 2 * N; ++j) t[j] += double(p[j]);
          std::fill_n(p, 2 * N, 0.0f);
        }
      }
    });
    for (std::size_t j = 0; j < N; ++j) {
      double dw = 0, db = 0;
      for (std::size_t c = 0; c < parts.count; ++c) {
        dw += total.data()[c * 2 * N + j];
        db += total.data()[c * 2 * N + N + j];
      }
      weight_grad[j] = float(dw);
      bias_grad[j] = float(db);
    }
  }
  template <class SX, class SY>
  void backward(const tensor<float, SX>& x, const tensor<float, SY>& y, const tensor<float, SY>& dy, tensor<float, SX>& dx) {
    backward(x.ref(), y.ref(), dy.ref(), dx.ref());
  }

 private:
  /// Rows summed in float before a flush to double: 64 terms, about 64 u of relative error.
  static constexpr std::size_t flush_rows = 64;

  // One row each way, flattened: the op's loops and the walker's reductions become one body
  // whatever else the translation unit holds (left to GCC's unit-growth budget, a large unit
  // calls them out of line).
  SOLDER_FLATTEN_KERNEL static void forward_row(const float* x, float* y, const float* w,
                                                                        const float* b, double eps, float* stats) {
    const auto st = ops::layer_norm{}.forward(row{}, x, y, w, b, eps);
    stats[0] = st.mean;
    stats[1] = st.rstd;
  }
  /// dx of one row; its dweight and dbias terms added to p[0, N) and p[N, 2N).
  SOLDER_FLATTEN_KERNEL static void backward_row(const float* x, const float* dy, const float* w,
                                                                         const float* stats, float* dx, float* p) {
    ops::layer_norm{}.backward(row{}, x, dy, w, {stats[0], stats[1]}, dx, p, p + N);
  }

  tensor<float, shape<dyn, 2>> stats{1};          // [mean, rstd] per row of the last forward
  std::size_t saved_rows = 0;                     // its rows; 0: no forward yet
  tensor<float, shape<dyn, 2 * N>> partial{1};    // backward: float sums per chunk
  tensor<double, shape<dyn, 2 * N>> total{1};     // backward: double sums per chunk

  template <class SX, class SY>
  static constexpr bool check_shapes() {
    if constexpr (SX::rank == 2 && SX::last == N && std::is_same_v<SX, SY>) {
      return true;
    } else {
      constexpr fixed_string m = [] {
        fixed_string s("solder::nn::layer_norm: a layer of ");
        s.append(N).append(" features needs x and y of one shape [batch, ").append(N).append("]; got x ");
        solder::detail::append_shape<SX>(s);
        s.append(" and y ");
        solder::detail::append_shape<SY>(s);
        return s;
      }();
      return diagnostic<m>::reported;
    }
  }
};

}  // namespace solder::nn
