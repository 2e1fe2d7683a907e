// nn/linear.hpp: y = x W^T + b, PyTorch's nn.Linear: weight [Out, In], bias [Out], and its
// default initialization, drawn from Philox so a seed gives the same weights on every machine.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <vector>

#include "solder/expr/contract.hpp"
#include "solder/expr/operators.hpp"
#include "solder/nn/elementwise.hpp"
#include "solder/nn/layer_kind.hpp"
#include "solder/random/philox.hpp"
#include "solder/tensor.hpp"

namespace solder::nn {

namespace detail {

/// Fills [p, p + n) with values uniform in [-bound, bound): element i takes 24 bits of
/// Philox4x32-10 block i / 4 of stream (seed, offset), so the values depend on nothing else.
inline void fill_uniform_philox(float* p, std::size_t n, float bound, std::uint64_t seed, std::uint64_t offset) {
  const random::philox_key key{{std::uint32_t(seed), std::uint32_t(seed >> 32)}};
  for (std::size_t i = 0; i < n; i += 4) {
    const std::uint64_t block = i / 4;
    const random::philox_ctr r = random::philox4x32_10(
        {{std::uint32_t(block), std::uint32_t(block >> 32), std::uint32_t(offset), std::uint32_t(offset >> 32)}}, key);
    for (std::size_t k = 0; k < 4 && i + k < n; ++k) {
      const double u = double(r.v[k] >> 8) * 0x1p-24;  // [0, 1)
      p[i + k] = float((2.0 * u - 1.0) * double(bound));
    }
  }
}

/// The same values into a tensor of any memory space: drawn on the host, copied into it.
template <class T>
void fill_uniform_philox(T& t, float bound, std::uint64_t seed, std::uint64_t offset) {
  using space = typename T::space_type;
  if constexpr (std::is_same_v<space, host>) {
    fill_uniform_philox(t.data(), t.size(), bound, seed, offset);
  } else {
    std::vector<float> values(t.size());
    fill_uniform_philox(values.data(), values.size(), bound, seed, offset);
    executor<backend_of_t<space>>::copy_from_host(t.data(), values.data(), values.size());
  }
}

}  // namespace detail

/// y = x W^T (+ b). W [Out, In] and b [Out] as PyTorch stores them, so a state_dict loads as is;
/// initialized as PyTorch does (kaiming_uniform with a = sqrt(5), i.e. W and b uniform in
/// [-1/sqrt(In), 1/sqrt(In))), from `seed`. On its own it is one GEMM; nn::linear_block fuses the
/// activation and dropout after it into the GEMM's epilogue, and folds a batch_norm right after
/// it into W and b in evaluation mode. W and b live in Space (host memory by default;
/// `in_space<device>` is the same layer over CUDA memory).
template <class Linear, class... Tail>
class linear_block;

template <std::size_t In, std::size_t Out, bool Bias = true, class Space = host>
struct linear {
  static_assert(In >= 1 && Out >= 1, "solder::nn::linear: feature counts must be at least 1");
  using space = Space;
  /// The same layer with its parameters in memory space S.
  template <class S>
  using in_space = linear<In, Out, Bias, S>;
  static constexpr std::size_t in_features = In;
  static constexpr std::size_t out_features = Out;
  static constexpr bool has_bias = Bias;
  static constexpr const char* name = "linear";
  /// Parameter names in params() order, as PyTorch's state_dict names them.
  static constexpr const char* param_names[] = {"weight", "bias"};
  /// The block the planner runs this layer as, with the batch_norm (if any) and the elementwise
  /// layers after it.
  template <class... Tail>
  using block = linear_block<linear, Tail...>;
  /// What the planner and cost.hpp know of the layer (nn/layer_info.hpp).
  struct planner_traits {
    // A product: the elementwise layers after it join its block, and a batch_norm right after
    // it too (torch's BatchNorm1d on its [Out] samples, folded into W and b in evaluation mode).
    static constexpr layer_kind kind = layer_kind::product;
    static constexpr bool folds_normalization = true;
    static constexpr std::size_t in = In, out = Out;
    static constexpr std::size_t parameters = In * Out + (Bias ? Out : 0);
    // 2 FLOPs per multiply-add of the product (dW and dx backward), and the bias add.
    static constexpr double forward_flops(std::size_t) { return 2.0 * In * Out + (Bias ? ops::add::flops * Out : 0); }
    static constexpr double backward_flops(std::size_t) { return 4.0 * In * Out + (Bias ? ops::add::flops * Out : 0); }
    static constexpr double input_grad_flops(std::size_t) { return 2.0 * In * Out; }
    static constexpr std::size_t saved_floats(std::size_t) { return 0; }
  };

  tensor<float, shape<Out, In>, Space> weight;       // W
  tensor<float, shape<Out, In>, Space> weight_grad;  // dL/dW, written by backward
  [[no_unique_address]] std::conditional_t<Bias, tensor<float, shape<Out>, Space>, std::tuple<>> bias{};
  [[no_unique_address]] std::conditional_t<Bias, tensor<float, shape<Out>, Space>, std::tuple<>> bias_grad{};

  explicit linear(std::uint64_t seed = 0) { reset_parameters(seed); }

  /// PyTorch's nn.Linear.reset_parameters, drawn from Philox stream (seed, 0) for W and
  /// (seed, 1) for b.
  void reset_parameters(std::uint64_t seed) {
    const float bound = float(1.0 / std::sqrt(double(In)));
    detail::fill_uniform_philox(weight, bound, seed, 0);
    if constexpr (Bias) detail::fill_uniform_philox(bias, bound, seed, 1);
  }

  auto params() {
    if constexpr (Bias)
      return std::tie(weight, bias);
    else
      return std::tie(weight);
  }
  auto grads() {
    if constexpr (Bias)
      return std::tie(weight_grad, bias_grad);
    else
      return std::tie(weight_grad);
  }

  /// The layer's product node for x [batch, In]: matmul(x, transpose(W)), [batch, Out].
  template <class X>
  auto product(const X& x) const {
    static_assert(check_input<shape_of<X>>());
    return matmul(x, transpose(weight));
  }

  /// The layer as an expression of x [..., In]: matmul(x, transpose(W)) (+ b).
  template <class X>
  auto expression(const X& x) const {
    if constexpr (Bias)
      return product(x) + bias;
    else
      return product(x);
  }

  template <class S>
  static constexpr bool check_input() {
    if constexpr (S::rank == 2 && S::last == In) {
      return true;
    } else {
      constexpr fixed_string m = [] {
        fixed_string s("solder::nn::linear: a layer of ");
        s.append(In).append(" inputs cannot take an input of shape ");
        solder::detail::append_shape<S>(s);
        s.append("; it needs [batch, ").append(In).append("]");
        return s;
      }();
      return diagnostic<m>::reported;
    }
  }
};

}  // namespace solder::nn
