// nn/fuse.hpp: a run of elementwise layers as ONE pass forward and ONE pass backward.
// fuse<bias<N>, relu, dropout<0.1f>>: y = dropout(relu(x + b)) in one loop; backward gives dx
// and db (the column sums of the gated gradient) together in one loop, the dropout mask
// regenerated from its counter.
#pragma once

#include <tuple>
#include <utility>

#include "solder/autodiff/vjp.hpp"
#include "solder/eval/cpu/assign.hpp"
#include "solder/nn/elementwise.hpp"

namespace solder::nn {

template <class... Layers>
class fuse {
 public:
  std::tuple<Layers...> layers;
  mode current = mode::train;

  void train() { current = mode::train; }
  void eval() { current = mode::eval; }

  template <std::size_t I>
  auto& layer() {
    return std::get<I>(layers);
  }

  /// y = layers(x), one pass. In training mode each call draws fresh dropout masks.
  template <class S>
  void forward(tensor_ref<const float, S> x, tensor_ref<float, S> y) {
    if (current == mode::train) {
      std::apply([](auto&... l) { (advance(l), ...); }, layers);
      forward_as<mode::train>(x, y);
    } else {
      forward_as<mode::eval>(x, y);
    }
  }
  template <class S>
  void forward(const tensor<float, S>& x, tensor<float, S>& y) {
    forward(x.ref(), y.ref());
  }

  /// dx = dL/dx and every parameter's gradient (accumulated into nothing: overwritten), one
  /// pass over x and dy. x is the input of the last forward; the masks are that forward's.
  template <class S>
  void backward(tensor_ref<const float, S> x, tensor_ref<const float, S> dy, tensor_ref<float, S> dx) {
    if (current == mode::train)
      backward_as<mode::train>(x, dy, dx);
    else
      backward_as<mode::eval>(x, dy, dx);
  }
  template <class S>
  void backward(const tensor<float, S>& x, const tensor<float, S>& dy, tensor<float, S>& dx) {
    backward(x.ref(), dy.ref(), dx.ref());
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

  template <mode M, class S>
  void forward_as(tensor_ref<const float, S> x, tensor_ref<float, S> y) {
    std::apply([&](auto&... p) { assign(y, expression<M>(x, p.ref()...)); }, all_params());
  }

  template <mode M, class S>
  void backward_as(tensor_ref<const float, S> x, tensor_ref<const float, S> dy, tensor_ref<float, S> dx) {
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
using bias_relu_dropout = fuse<bias<N>, relu, dropout<P>>;

}  // namespace solder::nn
