// nn/elementwise.hpp: the elementwise layers (bias, activations, dropout). Each one only says
// how it transforms an expression; nn::elementwise_block turns a run of them into one pass forward and one
// pass backward.
#pragma once

#include <cstddef>
#include <tuple>

#include "solder/expr/operators.hpp"
#include "solder/expr/random.hpp"
#include "solder/nn/layer_kind.hpp"
#include "solder/ops.hpp"
#include "solder/tensor.hpp"

namespace solder::nn {

/// Training or inference behaviour of layers that differ (dropout).
enum class mode { train, eval };

/// y = x + b; b [N] broadcast over the rows of x [..., N]. PyTorch's Linear bias. Its
/// parameter lives in Space (host memory by default).
template <std::size_t N, class Space = host>
struct bias {
  using space = Space;
  template <class S>
  using in_space = bias<N, S>;
  static constexpr std::size_t features = N;
  static constexpr const char* name = "bias";
  tensor<float, shape<N>, Space> value;  // b
  tensor<float, shape<N>, Space> grad;   // dL/db, written by backward

  /// What the planner and cost.hpp know of the layer (nn/layer_info.hpp).
  struct planner_traits {
    static constexpr layer_kind kind = layer_kind::elementwise;
    static constexpr std::size_t in = N, out = N;
    static constexpr std::size_t parameters = N;
    static constexpr double forward_flops(std::size_t) { return double(ops::add::flops) * N; }
    static constexpr double backward_flops(std::size_t) { return double(ops::add::flops) * N; }  // db's sum
    static constexpr std::size_t saved_floats(std::size_t) { return 0; }
  };

  auto params() { return std::tie(value); }
  auto grads() { return std::tie(grad); }
  template <mode M, class E, class B>
  auto apply(const E& x, const B& b) const {
    static_assert(check_input<shape_of<E>>());
    return x + b;
  }
  template <class S>
  static constexpr bool check_input() {
    if constexpr (S::rank >= 1 && S::last == N) {
      return true;
    } else {
      constexpr fixed_string m = [] {
        fixed_string s("solder::nn::bias: a bias of ");
        s.append(N).append(" features cannot be added to an input of shape ");
        solder::detail::append_shape<S>(s);
        s.append("; its last extent must be ").append(N);
        return s;
      }();
      return diagnostic<m>::reported;
    }
  }
};

/// y = op(x) for an elementwise op of ops/ (relu, gelu, tanh, ...). No parameters; Space is
/// the memory space of the tensors it is applied to in a chain (host by default).
template <class Op, class Space = host>
struct activation {
  using space = Space;
  template <class S>
  using in_space = activation<Op, S>;
  static constexpr const char* name = Op::name;
  /// Takes the width it is given (in = out = 0); FLOPs per feature of that width.
  struct planner_traits {
    static constexpr layer_kind kind = layer_kind::elementwise;
    static constexpr std::size_t in = 0, out = 0;
    static constexpr std::size_t parameters = 0;
    static constexpr double forward_flops(std::size_t f) { return double(Op::flops) * double(f); }
    static constexpr double backward_flops(std::size_t f) { return 2.0 * double(Op::flops) * double(f); }
    static constexpr std::size_t saved_floats(std::size_t) { return 0; }
  };
  Op op{};
  auto params() { return std::tuple<>{}; }
  auto grads() { return std::tuple<>{}; }
  template <mode M, class E>
  auto apply(const E& x) const {
    return map(op, x);
  }
};

using relu = activation<ops::relu>;
using gelu = activation<ops::gelu>;
using gelu_tanh = activation<ops::gelu_tanh>;
using silu = activation<ops::silu>;
using tanh = activation<ops::tanh>;
using sigmoid = activation<ops::sigmoid>;
using elu = activation<ops::elu>;
using leaky_relu = activation<ops::leaky_relu>;
using softplus = activation<ops::softplus>;

/// Training: y = x * keep / (1 - P), keep drawn per element from Philox (never stored);
/// evaluation: y = x. Each training forward draws a fresh mask (the stream offset advances);
/// the backward regenerates the mask of the last forward.
template <float P, class Space = host>
struct dropout {
  static_assert(P >= 0.0f && P < 1.0f, "solder::nn::dropout: the drop probability must be in [0, 1)");
  /// The memory space of the tensors it is applied to in a chain (the mask lives in none).
  using space = Space;
  template <class S>
  using in_space = dropout<P, S>;
  static constexpr float p = P;
  static constexpr const char* name = "dropout";
  philox_state rng{0x5eed, 0};
  struct planner_traits {
    static constexpr layer_kind kind = layer_kind::elementwise;
    static constexpr std::size_t in = 0, out = 0;
    static constexpr std::size_t parameters = 0;
    // The keep mask's compare, then ops::dropout's multiply.
    static constexpr double forward_flops(std::size_t f) { return double(1 + ops::dropout::flops) * double(f); }
    static constexpr double backward_flops(std::size_t f) { return double(1 + ops::dropout::flops) * double(f); }
    static constexpr std::size_t saved_floats(std::size_t) { return 0; }  // the mask is regenerated
  };

  auto params() { return std::tuple<>{}; }
  auto grads() { return std::tuple<>{}; }
  /// The factor kept elements are multiplied by: 1 / (1 - P) at the generator's 16-bit resolution.
  float scale() const { return float(dropout_mask<shape<1>>::with_p(P, rng).scale()); }
  /// Moves to a fresh mask; called by the owner once per training forward.
  void advance() { ++rng.offset; }
  template <mode M, class E>
  auto apply(const E& x) const {
    if constexpr (M == mode::eval || P == 0.0f)
      return x;
    else
      return solder::dropout(x, P, rng);
  }
};

}  // namespace solder::nn
