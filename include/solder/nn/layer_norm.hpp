// nn/layer_norm.hpp: PyTorch's nn.LayerNorm(N) over the feature axis of [batch, N] activations,
// as a block of its own: one visit per row forward (statistics, then y) and backward (two sums,
// then dx and this row's share of dweight and dbias). The row math is ops::layer_norm
// (ops/layer_norm.hpp), run as row and chunk bodies by the executor of the layer's space.
#pragma once

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
#include "solder/ops/optimizer.hpp"
#include "solder/optim/optimizer.hpp"
#include "solder/shape.hpp"
#include "solder/tensor.hpp"

namespace solder::nn {

/// y = (x - E[x]) / sqrt(Var[x] + eps) * weight + bias over each row of x [batch, N]: torch's
/// nn.LayerNorm(N, eps) with elementwise_affine (weight [N] starts at 1, bias [N] at 0; Var is
/// the biased variance). Keeps each row's mean and 1/sqrt(Var + eps) for backward. Results
/// do not depend on the thread count. A NaN or infinity in a row makes that row's y NaN. Its
/// parameters, statistics and the tensors it takes live in Space (host memory by default).
template <std::size_t N, class Space = host>
class layer_norm : public block_defaults<Space> {
  static_assert(N >= 1, "solder::nn::layer_norm: the feature count N must be at least 1");
  using exec = executor<backend_of_t<Space>>;

 public:
  using space = Space;
  /// The same layer over memory space S.
  template <class S>
  using in_space = layer_norm<N, S>;
  static constexpr std::size_t in_features = N;
  static constexpr std::size_t out_features = N;
  static constexpr const char* name = "layer_norm";
  static constexpr std::size_t parameter_count = 2 * N;
  /// Per sample, approximate: the op's count per element (ops/layer_norm.hpp), N elements.
  static constexpr double forward_flops = double(ops::layer_norm::forward_flops) * N;
  static constexpr double backward_flops = double(ops::layer_norm::backward_flops) * N;
  /// Floats per sample kept for backward beyond x and y: the row's mean and rstd.
  static constexpr std::size_t saved_floats = 2;

  tensor<float, shape<N>, Space> weight;       // gamma
  tensor<float, shape<N>, Space> bias;         // beta
  tensor<float, shape<N>, Space> weight_grad;  // dL/dweight, written by backward
  tensor<float, shape<N>, Space> bias_grad;    // dL/dbias, written by backward
  float eps;                                   // added to the variance, as torch's eps

  explicit layer_norm(float eps = 1e-5f) : eps(eps) { reset_parameters(); }

  /// torch's LayerNorm.reset_parameters: weight 1, bias 0.
  void reset_parameters() {
    exec::elements(N, ops::fill_elements{weight.data(), 1.0f});
    exec::elements(N, ops::fill_elements{bias.data(), 0.0f});
  }

  /// {prefix + "weight", prefix + "bias"}, as torch's state_dict names them.
  std::vector<optim::basic_param<Space>> params(const std::string& prefix = "") {
    return {optim::make_param(prefix + "weight", weight, weight_grad), optim::make_param(prefix + "bias", bias, bias_grad)};
  }

  // As a block of its own (nn/block.hpp): torch's reset_parameters, names from the layer's index.
  void reset(std::uint64_t /*seed*/, std::size_t /*first*/) { reset_parameters(); }
  std::vector<optim::basic_param<Space>> params_from(std::size_t first) { return params(std::to_string(first) + "."); }

  /// y = layer_norm(x) for x, y [batch, N]; y may be x (in place). Saves each row's statistics.
  template <class SX, class SY>
  void forward(tensor_ref<const float, SX, Space> x, tensor_ref<float, SY, Space> y) {
    static_assert(check_shapes<SX, SY>());
    if (x.batch() != y.batch())
      detail::batches_differ("solder::nn::layer_norm::forward", {{"x", x.batch()}, {"y", y.batch()}});
    const std::size_t rows = SX::elements(x.batch()) / N;
    if (stats.batch() < rows) stats = tensor<float, shape<dyn, 2>, Space>(rows);
    saved_rows = rows;
    // Rows are independent: how they are split among threads cannot change a result.
    exec::template rows<N>(rows, ops::layer_norm_forward_rows<N>{x.data(), weight.data(), bias.data(), y.data(),
                                                                 stats.data(), stats.data() + 1, 2, double(eps)});
  }
  template <class SX, class SY>
  void forward(const tensor<float, SX, Space>& x, tensor<float, SY, Space>& y) {
    forward(x.ref(), y.ref());
  }

  /// dx = dL/dx, and weight_grad, bias_grad (overwritten), for the last forward, whose input
  /// and output x and y were; uses the statistics it saved. dx may be dy (in place).
  template <class SX, class SY>
  void backward(tensor_ref<const float, SX, Space> x, tensor_ref<const float, SY, Space> y,
                tensor_ref<const float, SY, Space> dy, tensor_ref<float, SX, Space> dx) {
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
    // to 64 rows, then in double; the chunks are added in order. So the gradients are the same
    // for any thread count (and launch shape).
    const auto parts = exec::chunks_of(rows, N);
    if (partial.batch() < parts.count) {
      partial = tensor<float, shape<dyn, 2 * N>, Space>(parts.count);
      total = tensor<double, shape<dyn, 2 * N>, Space>(parts.count);
    }
    const float* st = stats.data();
    exec::template chunks<N>(parts, ops::layer_norm_backward_chunks<N, typename exec::chunking>{
                                        x.data(), dy.data(), weight.data(), st, st + 1, 2, dx.data(), partial.data(),
                                        total.data(), parts});
    exec::elements(2 * N, ops::layer_norm_param_grads{total.data(), parts.count, N, weight_grad.data(), bias_grad.data()});
  }
  template <class SX, class SY>
  void backward(const tensor<float, SX, Space>& x, const tensor<float, SY, Space>& y, const tensor<float, SY, Space>& dy,
                tensor<float, SX, Space>& dx) {
    backward(x.ref(), y.ref(), dy.ref(), dx.ref());
  }

 private:
  tensor<float, shape<dyn, 2>, Space> stats{1};        // [mean, rstd] per row of the last forward
  std::size_t saved_rows = 0;                          // its rows; 0: no forward yet
  tensor<float, shape<dyn, 2 * N>, Space> partial{1};  // backward: float sums per chunk
  tensor<double, shape<dyn, 2 * N>, Space> total{1};   // backward: double sums per chunk

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
