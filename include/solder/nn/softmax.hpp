// nn/softmax.hpp: softmax and log_softmax over the feature axis of [batch, N] activations, as
// blocks of their own: one visit per row, stable (the row max is subtracted before exp), and a
// backward pass that needs the output y alone. The row math is ops::softmax / ops::log_softmax
// (ops/softmax.hpp), run as row bodies (ops/rows.hpp) by the rows<N> of the executor of the
// layer's memory space (host by default).
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
#include "solder/ops/rows.hpp"
#include "solder/ops/softmax.hpp"
#include "solder/optim/optimizer.hpp"
#include "solder/shape.hpp"
#include "solder/tensor.hpp"

namespace solder::nn {

namespace detail {

/// What softmax<N> and log_softmax<N> share; Log picks the function.
template <std::size_t N, bool Log, class Space>
class softmax_layer : public block_defaults<Space> {
  static_assert(N >= 1, "solder::nn::softmax, log_softmax: the feature count N must be at least 1");
  using op = std::conditional_t<Log, ops::log_softmax, ops::softmax>;
  using exec = executor<backend_of_t<Space>>;
  static constexpr const char* who = Log ? "solder::nn::log_softmax" : "solder::nn::softmax";

 public:
  static constexpr std::size_t in_features = N;
  static constexpr std::size_t out_features = N;
  static constexpr const char* name = Log ? "log_softmax" : "softmax";
  static constexpr std::size_t parameter_count = 0;
  /// Per sample, approximate: the op's count per element (ops/softmax.hpp), N elements.
  static constexpr double forward_flops = double(op::forward_flops) * N;
  static constexpr double backward_flops = double(op::backward_flops) * N;
  /// Backward reads y alone.
  static constexpr std::size_t saved_floats = 0;

  using space = Space;

  /// No parameters.
  std::vector<optim::basic_param<Space>> params(const std::string& /*prefix*/ = "") { return {}; }

  /// y = softmax(x) (or log_softmax) along each row of x, y [batch, N]; y may be x (in place).
  template <class SX, class SY>
  void forward(tensor_ref<const float, SX, Space> x, tensor_ref<float, SY, Space> y) {
    static_assert(check_shapes<SX, SY>());
    if (x.batch() != y.batch())
      detail::batches_differ(who, "::forward", {{"x", x.batch()}, {"y", y.batch()}});
    const float* xp = x.data();
    float* yp = y.data();
    exec::template rows<N>(SX::elements(x.batch()) / N, ops::rows_forward<op, N>{xp, yp});
  }
  template <class SX, class SY>
  void forward(const tensor<float, SX, Space>& x, tensor<float, SY, Space>& y) {
    forward(x.ref(), y.ref());
  }

  /// dx = dL/dx from the last forward's output y and dy = dL/dy (x is not read); dx may be dy.
  template <class SX, class SY>
  void backward(tensor_ref<const float, SX, Space> x, tensor_ref<const float, SY, Space> y,
                tensor_ref<const float, SY, Space> dy, tensor_ref<float, SX, Space> dx) {
    static_assert(check_shapes<SX, SY>());
    const std::size_t batch = x.batch();
    if (y.batch() != batch || dy.batch() != batch || dx.batch() != batch)
      detail::batches_differ(who, "::backward",
                             {{"x", batch}, {"y", y.batch()}, {"dy", dy.batch()}, {"dx", dx.batch()}});
    const float *yp = y.data(), *dyp = dy.data();
    float* dxp = dx.data();
    exec::template rows<N>(SY::elements(batch) / N, ops::rows_backward_from_output<op, N>{yp, dyp, dxp});
  }
  template <class SX, class SY>
  void backward(const tensor<float, SX, Space>& x, const tensor<float, SY, Space>& y, const tensor<float, SY, Space>& dy,
                tensor<float, SX, Space>& dx) {
    backward(x.ref(), y.ref(), dy.ref(), dx.ref());
  }

 private:
  template <class SX, class SY>
  static constexpr bool check_shapes() {
    if constexpr (SX::rank == 2 && SX::last == N && std::is_same_v<SX, SY>) {
      return true;
    } else {
      constexpr fixed_string m = [] {
        fixed_string s;
        s.append(who).append(": a layer of ").append(N).append(" features needs x and y of one shape [batch, ").append(N);
        s.append("]; got x ");
        solder::detail::append_shape<SX>(s);
        s.append(" and y ");
        solder::detail::append_shape<SY>(s);
        return s;
      }();
      return diagnostic<m>::reported;
    }
  }
};

}  // namespace detail

/// y_j = exp(x_j - max x) / sum_k exp(x_k - max x) along each row of x [batch, N]: torch's
/// softmax(x, dim=-1). Backward: dx = y (dy - sum(dy y)), from y alone. A NaN in a row, or a row
/// of -inf, gives a row of NaN (as torch); +inf in a row gives NaN too. Results do not depend
/// on the thread count. Space: where x and y live (host by default).
template <std::size_t N, class Space = host>
struct softmax : detail::softmax_layer<N, false, Space> {
  template <class S>
  using in_space = softmax<N, S>;
};

/// y_j = x_j - max x - log sum_k exp(x_k - max x) along each row of x [batch, N]: torch's
/// log_softmax(x, dim=-1). Backward: dx = dy - exp(y) sum(dy), from y alone. NaN and infinity
/// as softmax.
template <std::size_t N, class Space = host>
struct log_softmax : detail::softmax_layer<N, true, Space> {
  template <class S>
  using in_space = log_softmax<N, S>;
};

}  // namespace solder::nn
