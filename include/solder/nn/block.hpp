// nn/block.hpp: what a block provides. A block is a planned group of layers that runs as one
// kernel each way (nn/plan.hpp: a product layer with the elementwise layers after it, a run of
// elementwise layers, or one layer of its own); a chain holds its blocks and asks each for
// exactly the members of the Block concept below, with no other member probed.
//
//   member                                what it does
//   forward(x, y)                         y = the block's layers applied to x
//   backward(x, y, dy, dx)                every parameter's gradient (overwritten) and dx, from
//                                         the last forward's input x and output y
//   backward_params(x, y, dy)             the same without dx (a first block's input needs none),
//                                         where input_grad_optional says it saves work
//   reset(seed, first)                    parameters as PyTorch initializes them, the block's layer
//                                         k drawing from random::derive_seed(seed, first + k)
//   train(), eval()                       the mode (dropout on or off, batch statistics or running)
//   weights_changed(), pack_weights()     packed or folded weights made stale, or made again
//   params_from(first)                    every parameter with its gradient, named as PyTorch's
//                                         nn.Sequential names them from layer index `first`
//   buffers_from(first)                   the state that is not trained (running statistics), named so
//   for_each_dropout(f)                   f(k, d) for every dropout layer d, k its index in the block
//   channels_last_capable                 whether it has forward_layouts (images kept channels-last)
//   input_grad_optional                   whether it has backward_params
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "solder/nn/buffer.hpp"
#include "solder/ops/rows.hpp"
#include "solder/optim/optimizer.hpp"
#include "solder/tensor.hpp"

namespace solder::nn {

/// The members of the block contract for a layer that is a block of its own and has no
/// parameters, no state besides its output, no modes and no dropout: each does nothing. Such a
/// layer derives from it and defines forward and backward; a layer with some of these defines
/// them itself (its own hide these). Space: where its (absent) parameters would live.
template <class Space = host>
struct block_defaults {
  static constexpr bool channels_last_capable = false;
  static constexpr bool input_grad_optional = false;
  void reset(std::uint64_t /*seed*/, std::size_t /*first*/) {}
  void train() {}
  void eval() {}
  void weights_changed() {}
  void pack_weights() {}
  std::vector<optim::basic_param<Space>> params_from(std::size_t /*first*/) { return {}; }
  std::vector<basic_buffer<Space>> buffers_from(std::size_t /*first*/) { return {}; }
  template <class F>
  void for_each_dropout(F&& /*f*/) {}
};

/// A product layer's parameters with their gradients (layer.params(), layer.grads()), named by
/// its param_names after `prefix`: "0." + "weight", "0." + "bias" for a linear layer; in the
/// memory space of its tensors.
template <class L>
auto named_params(const std::string& prefix, L& layer) {
  auto ps = layer.params();
  auto gs = layer.grads();
  using space = memory_space_t<std::remove_cvref_t<std::tuple_element_t<0, decltype(ps)>>>;
  std::vector<optim::basic_param<space>> out;
  [&]<std::size_t... K>(std::index_sequence<K...>) {
    (out.push_back(optim::make_param(prefix + L::param_names[K], std::get<K>(ps), std::get<K>(gs))), ...);
  }(std::make_index_sequence<std::tuple_size_v<decltype(ps)>>{});
  return out;
}

namespace detail {
/// The producer epilogue of executor E (a row_epilogue a walk calls on the rows it has
/// written, so writes that follow run while those rows are in cache), or ops::no_row_epilogue
/// where the backend has none.
template <class E>
inline constexpr bool has_row_epilogue = requires { typename E::row_epilogue; };
template <class E>
struct row_epilogue_of {
  using type = ops::no_row_epilogue;
};
template <class E>
  requires has_row_epilogue<E>
struct row_epilogue_of<E> {
  using type = typename E::row_epilogue;
};
}  // namespace detail

namespace detail {
/// A visitor of the shape for_each_dropout takes: for the concept's check only.
struct dropout_visitor_probe {
  template <class D>
  void operator()(std::size_t, D&) const {}
};
}  // namespace detail

/// B is a block from x [batch, ...] of shape SX to y of shape SY, both in memory of Space.
template <class B, class SX, class SY, class Space = host>
concept Block = requires(B& b, std::uint64_t seed, std::size_t first, tensor_ref<const float, SX, Space> x,
                         tensor_ref<const float, SY, Space> y, tensor_ref<const float, SY, Space> dy,
                         tensor_ref<float, SX, Space> dx, tensor_ref<float, SY, Space> out) {
  { B::channels_last_capable } -> std::convertible_to<bool>;
  { B::input_grad_optional } -> std::convertible_to<bool>;
  b.forward(x, out);
  b.backward(x, y, dy, dx);
  b.reset(seed, first);
  b.train();
  b.eval();
  b.weights_changed();
  b.pack_weights();
  { b.params_from(first) } -> std::same_as<std::vector<optim::basic_param<Space>>>;
  { b.buffers_from(first) } -> std::same_as<std::vector<basic_buffer<Space>>>;
  b.for_each_dropout(detail::dropout_visitor_probe{});
} && (!B::input_grad_optional || requires(B& b, tensor_ref<const float, SX, Space> x,
                                           tensor_ref<const float, SY, Space> y) {
  b.backward_params(x, y, y);
}) && (!B::channels_last_capable || requires(B& b, tensor_ref<const float, SX, Space> x,
                                              tensor_ref<float, SY, Space> out) {
  b.forward_layouts(x, out, true, true);
  { b.channels_last_ready() } -> std::convertible_to<bool>;
});

}  // namespace solder::nn
