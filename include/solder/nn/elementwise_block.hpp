// nn/elementwise_block.hpp: a run of elementwise layers as ONE pass forward and ONE pass backward.
// elementwise_block<bias<N>, relu, dropout<0.1f>>: y = dropout(relu(x + b)) in one loop; backward gives dx
// and db (the column sums of the gated gradient) together in one loop, the dropout mask
// regenerated from its counter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "solder/autodiff/vjp.hpp"
#include "solder/assign.hpp"
#include "solder/nn/block.hpp"
#include "solder/nn/elementwise.hpp"
#include "solder/ops/activations.hpp"

namespace solder::nn {

namespace detail {
template <class L>
inline constexpr bool is_bias = false;
template <std::size_t N, class S>
inline constexpr bool is_bias<bias<N, S>> = true;
template <class L>
inline constexpr bool is_dropout = false;
template <float P, class S>
inline constexpr bool is_dropout<dropout<P, S>> = true;
/// The memory space of the first of the layers that says one, host where none does.
template <class... Layers>
struct space_of_layers {
  using type = host;
};
template <class L, class... Rest>
struct space_of_layers<L, Rest...> {
  using type = typename space_of_layers<Rest...>::type;
};
template <class L, class... Rest>
  requires requires { typename L::space; }
struct space_of_layers<L, Rest...> {
  using type = typename L::space;
};

template <class L>
struct activation_of {
  using type = void;
};
template <class Op, class S>
struct activation_of<activation<Op, S>> {
  using type = Op;
};

/// How many bias layers lead the list.
template <class... Layers>
constexpr std::size_t leading_biases() {
  std::size_t n = 0;
  bool leading = true;
  ((leading = leading && is_bias<Layers>, n += leading), ...);
  return n;
}

/// Index of the first activation among the layers (sizeof...(Layers) if none).
template <class... Layers>
constexpr std::size_t first_activation() {
  std::size_t i = 0;
  bool found = false;
  ((found = found || !std::is_void_v<typename activation_of<Layers>::type>, i += !found), ...);
  return i;
}

/// Whether the layers' backward follows from their output alone: biases, then at most one
/// activation whose op differentiates from its output (ops::DifferentiableFromOutput), then at
/// most one dropout if that op's derivative is zero wherever its output is (ops::ZeroAtZero).
template <class... Layers>
constexpr bool output_backward() {
  using L = std::tuple<Layers...>;
  constexpr std::size_t nb = leading_biases<Layers...>();
  constexpr std::size_t rest = sizeof...(Layers) - nb;
  if constexpr (rest == 0) {
    return true;
  } else if constexpr (rest > 2) {
    return false;
  } else {
    using Op = typename activation_of<std::tuple_element_t<nb, L>>::type;
    if constexpr (std::is_void_v<Op>) {
      return false;
    } else if constexpr (!ops::DifferentiableFromOutput<Op>) {
      return false;
    } else if constexpr (rest == 1) {
      return true;
    } else {
      return is_dropout<std::tuple_element_t<nb + 1, L>> && ops::ZeroAtZero<Op>;
    }
  }
}
/// output_backward of the layers without their dropouts (identities in evaluation mode).
template <class... Layers>
constexpr bool output_backward_eval() {
  using kept = decltype(std::tuple_cat(std::conditional_t<is_dropout<Layers>, std::tuple<>, std::tuple<Layers>>{}...));
  return []<class... K>(std::type_identity<std::tuple<K...>>) { return output_backward<K...>(); }(std::type_identity<kept>{});
}
}  // namespace detail

template <class... Layers>
class elementwise_block {
 public:
  /// Whether backward_from_output is available: the gradient follows from the saved output y
  /// alone (no x, no regenerated dropout mask). True for bias, relu/sigmoid, dropout chains.
  static constexpr bool output_backward = detail::output_backward<Layers...>();
  /// The same in evaluation mode, where dropouts are identities (tanh then dropout qualifies).
  static constexpr bool output_backward_eval = detail::output_backward_eval<Layers...>();
  template <mode M>
  static constexpr bool output_backward_in = M == mode::train ? output_backward : output_backward_eval;

  /// Where its parameters (biases) live: its layers' space. (Its forward and backward take
  /// tensors of any space its parameters can join.)
  using space = typename detail::space_of_layers<Layers...>::type;

  std::tuple<Layers...> layers;
  mode current = mode::train;

  void train() { current = mode::train; }
  void eval() { current = mode::eval; }

  // The block contract (nn/block.hpp). A bias starts at zero and keeps its values on a reset, as
  // the chain always did; dropouts take their streams from the chain (for_each_dropout).
  static constexpr bool channels_last_capable = false;
  static constexpr bool input_grad_optional = false;
  void reset(std::uint64_t /*seed*/, std::size_t /*first*/) {}
  void weights_changed() {}
  void pack_weights() {}
  /// Every bias of the run, named "<first + k>.bias" for the block's layer k.
  std::vector<optim::basic_param<space>> params_from(std::size_t first) {
    std::vector<optim::basic_param<space>> out;
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      (
          [&] {
            if constexpr (detail::is_bias<std::tuple_element_t<K, std::tuple<Layers...>>>) {
              auto& l = std::get<K>(layers);
              out.push_back(optim::make_param(std::to_string(first + K) + ".bias", l.value, l.grad));
            }
          }(),
          ...);
    }(std::index_sequence_for<Layers...>{});
    return out;
  }
  std::vector<basic_buffer<space>> buffers_from(std::size_t /*first*/) { return {}; }
  /// f(k, d) for every dropout d of the run, k its index in the block.
  template <class F>
  void for_each_dropout(F&& f) {
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      (
          [&] {
            if constexpr (detail::is_dropout<std::tuple_element_t<K, std::tuple<Layers...>>>) f(K, std::get<K>(layers));
          }(),
          ...);
    }(std::index_sequence_for<Layers...>{});
  }

  template <std::size_t I>
  auto& layer() {
    return std::get<I>(layers);
  }
  template <std::size_t I>
  const auto& layer() const {
    return std::get<I>(layers);
  }

  /// y = layers(x), one pass. In training mode each call draws fresh dropout masks.
  template <class S, class Space>
  void forward(tensor_ref<const float, S, Space> x, tensor_ref<float, S, Space> y) {
    if (current == mode::train) {
      advance();
      forward_as<mode::train>(x, y);
    } else {
      forward_as<mode::eval>(x, y);
    }
  }
  template <class S, class Space>
  void forward(const tensor<float, S, Space>& x, tensor<float, S, Space>& y) {
    forward(x.ref(), y.ref());
  }

  /// dx = dL/dx and every parameter's gradient (accumulated into nothing: overwritten), one
  /// pass over x and dy. x is the input of the last forward; the masks are that forward's.
  template <class S, class Space>
  void backward(tensor_ref<const float, S, Space> x, tensor_ref<const float, S, Space> dy, tensor_ref<float, S, Space> dx) {
    if (current == mode::train)
      backward_as<mode::train>(x, dy, dx);
    else
      backward_as<mode::eval>(x, dy, dx);
  }
  template <class S, class Space>
  void backward(const tensor<float, S, Space>& x, const tensor<float, S, Space>& dy, tensor<float, S, Space>& dx) {
    backward(x.ref(), dy.ref(), dx.ref());
  }

  /// The gradients of the last forward from whichever of its input x and output y the layers
  /// need (y when output_backward): the form a network calls, keeping both anyway.
  template <class S, class Space>
  void backward(tensor_ref<const float, S, Space> x, tensor_ref<const float, S, Space> y, tensor_ref<const float, S, Space> dy,
                tensor_ref<float, S, Space> dx) {
    if (current == mode::eval && output_backward_eval) {
      if constexpr (output_backward_eval) return write_gate(dx, gate_from_output<mode::eval>(y, dy));
    }
    if constexpr (output_backward)
      backward_from_output(y, dy, dx);
    else
      backward(x, dy, dx);
  }

  /// The same gradients as backward, read from y = forward(x) instead of x: one pass over y and
  /// dy, no random bits drawn. A chain keeps y anyway (the next layer's input), so this form
  /// needs no saved tensor of its own. (A NaN input dropped by a dropout gives a NaN gradient
  /// from x, where relu's gate meets it, and +0 from y.)
  template <class S, class Space>
  void backward_from_output(tensor_ref<const float, S, Space> y, tensor_ref<const float, S, Space> dy, tensor_ref<float, S, Space> dx)
    requires output_backward
  {
    if (current == mode::train)
      backward_from_output_as<mode::train>(y, dy, dx);
    else
      backward_from_output_as<mode::eval>(y, dy, dx);
  }
  template <class S, class Space>
  void backward_from_output(const tensor<float, S, Space>& y, const tensor<float, S, Space>& dy, tensor<float, S, Space>& dx)
    requires output_backward
  {
    backward_from_output(y.ref(), dy.ref(), dx.ref());
  }

  /// dL/dx as an expression of the saved output y and dy (see backward_from_output): the
  /// gradient every bias of the run receives too, a map node over ops::gradient_from_output. For
  /// a layer that fuses this run into the epilogue of its product (nn::linear_block).
  template <mode M, class Y, class G>
  auto gate_from_output(const Y& y, const G& dy) const
    requires output_backward_in<M>
  {
    constexpr std::size_t na = detail::first_activation<Layers...>();
    if constexpr (na == sizeof...(Layers)) {
      return as_expr(dy);  // biases, and in evaluation mode dropouts: the gradient passes through
    } else {
      using Op = typename detail::activation_of<std::tuple_element_t<na, std::tuple<Layers...>>>::type;
      const Op& op = std::get<na>(layers).op;
      if constexpr (M == mode::train && na + 1 < sizeof...(Layers)) {
        // output_backward admits one layer after the activation: a dropout, whose scale is in y.
        const auto& drop = std::get<na + 1>(layers);
        if constexpr (std::remove_cvref_t<decltype(drop)>::p > 0.0f)
          return map(ops::gradient_from_output<Op, true>{op, drop.scale()}, y, dy);
        else
          return map(ops::gradient_from_output<Op>{op}, y, dy);
      } else {
        return map(ops::gradient_from_output<Op>{op}, y, dy);
      }
    }
  }

  /// Moves every dropout of the run to a fresh mask (what a training forward does first).
  void advance() {
    std::apply([](auto&... l) { (advance(l), ...); }, layers);
  }

  /// The fused expression of the layers applied to `x` with parameter leaves `params...`.
  template <mode M, class X, class... P>
  auto expression(const X& x, const P&... params) const {
    return apply_from<M, 0>(x, std::forward_as_tuple(params...));
  }

 private:
  template <class L>
  static void advance(L& l) {
    if constexpr (requires { l.advance(); }) l.advance();
  }

  template <class L>
  static constexpr std::size_t n_params = std::tuple_size_v<decltype(std::declval<L&>().params())>;
  /// Index of layer I's first parameter in the flattened parameter list.
  template <std::size_t I>
  static constexpr std::size_t param_offset = [] {
    std::size_t off = 0;
    std::size_t k = 0;
    ((k++ < I ? off += n_params<Layers> : 0), ...);
    return off;
  }();

  template <mode M, std::size_t I, class X, class Params>
  auto apply_from(const X& x, const Params& params) const {
    if constexpr (I == sizeof...(Layers)) {
      return x;
    } else {
      const auto& l = std::get<I>(layers);
      using L = std::remove_cvref_t<decltype(l)>;
      auto y = [&]<std::size_t... K>(std::index_sequence<K...>) {
        return l.template apply<M>(x, std::get<param_offset<I> + K>(params)...);
      }(std::make_index_sequence<n_params<L>>{});
      return apply_from<M, I + 1>(y, params);
    }
  }

  auto all_params() {
    return std::apply([](auto&... l) { return std::tuple_cat(l.params()...); }, layers);
  }
  auto all_grads() {
    return std::apply([](auto&... l) { return std::tuple_cat(l.grads()...); }, layers);
  }

  template <mode M, class S, class Space>
  void forward_as(tensor_ref<const float, S, Space> x, tensor_ref<float, S, Space> y) {
    std::apply([&](auto&... p) { assign(y, expression<M>(x, p.ref()...)); }, all_params());
  }

  template <mode M, class S, class Space>
  void backward_from_output_as(tensor_ref<const float, S, Space> y, tensor_ref<const float, S, Space> dy, tensor_ref<float, S, Space> dx) {
    write_gate(dx, gate_from_output<M>(y, dy));
  }
  /// dx = g and every bias gradient (the column sums of g) in one pass.
  template <class S, class Space, class G>
  void write_gate(tensor_ref<float, S, Space> dx, const G& g) {
    std::apply([&](auto&... db) { assign_all(write(dx, g), write(db, sum_to<typename std::remove_cvref_t<decltype(db)>::shape_type>(g))...); },
               all_grads());
  }

  template <mode M, class S, class Space>
  void backward_as(tensor_ref<const float, S, Space> x, tensor_ref<const float, S, Space> dy, tensor_ref<float, S, Space> dx) {
    auto params = all_params();
    auto grads = all_grads();
    std::apply(
        [&](auto&... p) {
          auto g = vjp([&](const auto& xv, const auto&... pv) { return expression<M>(xv, pv...); }, dy, x, p.ref()...);
          std::apply(
              [&](const auto& gx, const auto&... gp) {
                std::apply([&](auto&... dp) { assign_all(write(dx, gx), write(dp, gp)...); }, grads);
              },
              g);
        },
        params);
  }
};

/// The named fusion: y = dropout(relu(x + b)), one pass each way.
template <std::size_t N, float P>
using bias_relu_dropout = elementwise_block<bias<N>, relu, dropout<P>>;

}  // namespace solder::nn
