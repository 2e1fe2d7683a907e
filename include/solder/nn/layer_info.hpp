// nn/layer_info.hpp: what a layer is to the planner and to the cost model (read from the layer's
// own planner_traits): its kind, features
// per sample in and out, parameters, FLOPs and saved floats (layer_info); a planned kernel
// (group); the widths through a chain of layers and their checks. Below both cost.hpp and the
// planner (nn/plan.hpp), which read it.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>

#include "solder/diagnostic.hpp"
#include "solder/ops.hpp"
#include "solder/nn/elementwise.hpp"
#include "solder/nn/layer_kind.hpp"

namespace solder::nn {

/// What the planner and the cost model know of a layer: its kind, its features per sample in
/// and out (0: shape-preserving, it takes what it is given), parameters and FLOPs per sample
/// (elementwise layers count per feature; `features` is the width they run at).
///
/// A layer says this beside itself in a nested `planner_traits` with the members below (linear,
/// sketched_linear, bias, the activations, dropout); a layer without one is a block of its own,
/// described by its in_features, out_features, parameter_count, forward_flops, backward_flops
/// and saved_floats.
template <class L>
struct layer_info {
  static constexpr layer_kind kind = layer_kind::block;
  static constexpr std::size_t in = L::in_features, out = L::out_features;
  static constexpr std::size_t parameters = L::parameter_count;
  static constexpr double forward_flops(std::size_t) { return L::forward_flops; }
  static constexpr double backward_flops(std::size_t) { return L::backward_flops; }
  static constexpr std::size_t saved_floats(std::size_t) { return L::saved_floats; }
};
template <class L>
  requires requires { typename L::planner_traits; }
struct layer_info<L> : L::planner_traits {};
/// A planned kernel: layers [First, First + sizeof...(Ls)) of the chain, of kind Kind.
template <layer_kind Kind, std::size_t First, class... Ls>
struct group {
  static constexpr layer_kind kind = Kind;
  static constexpr std::size_t first = First;
  static constexpr std::size_t size = sizeof...(Ls);
};

/// The name of the kernel a group runs as, its layers' names joined: "linear+relu+dropout".
template <class G>
std::string group_name() {
  std::string s;
  [&]<layer_kind K, std::size_t F, class... Ls>(std::type_identity<group<K, F, Ls...>>) {
    ((s += (s.empty() ? "" : "+"), s += Ls::name), ...);
  }(std::type_identity<G>{});
  return s;
}

// ---------------------------------------------------------------------------------------------
// Shapes through the chain
// ---------------------------------------------------------------------------------------------

/// Features per sample after each layer, checked at compile time: a layer with a known input
/// width must be given that width. widths[i] is the width after layer i; widths[-1] (input)
/// is the first known input width.
template <class... Layers>
struct chain_widths {
  static constexpr std::size_t count = sizeof...(Layers);
  static constexpr std::size_t input = [] {
    std::size_t w = 0;
    ((w == 0 ? (w = layer_info<Layers>::in, 0) : 0), ...);
    return w;
  }();
  static constexpr std::array<std::size_t, count> after = [] {
    std::array<std::size_t, count> a{};
    std::size_t w = input, i = 0;
    ((w = layer_info<Layers>::out ? layer_info<Layers>::out : w, a[i++] = w), ...);
    return a;
  }();
  static constexpr std::size_t output = count ? after[count - 1] : 0;

  /// The first layer whose known input width differs from what reaches it (count if none).
  static constexpr std::size_t mismatch = [] {
    std::size_t w = input, i = 0, bad = count;
    ((bad == count && layer_info<Layers>::in != 0 && layer_info<Layers>::in != w ? bad = i : 0,
      w = layer_info<Layers>::out ? layer_info<Layers>::out : w, ++i),
     ...);
    return bad;
  }();
};

/// FLOPs per sample of the kernel group G of a chain of Layers, forward or backward: the sum of
/// its layers' counts at the widths they run at.
template <class G, class... Layers>
constexpr double group_flops(bool forward) {
  return [&]<layer_kind K, std::size_t F, class... Ls>(std::type_identity<group<K, F, Ls...>>) {
    double f = 0;
    std::size_t i = F;
    ((f += forward ? layer_info<Ls>::forward_flops(chain_widths<Layers...>::after[i])
                   : layer_info<Ls>::backward_flops(chain_widths<Layers...>::after[i]),
      ++i),
     ...);
    return f;
  }(std::type_identity<G>{});
}

template <class... Layers>
constexpr bool check_chain() {
  using W = chain_widths<Layers...>;
  if constexpr (W::input == 0) {
    return diagnostic<"solder::chain: no layer fixes the input width; start the chain with a linear (or another "
                      "layer with a width)",
                      Layers...>::reported;
  } else if constexpr (W::mismatch == W::count) {
    return true;
  } else {
    using L = std::tuple_element_t<W::mismatch, std::tuple<Layers...>>;
    constexpr std::size_t given = W::mismatch == 0 ? W::input : W::after[W::mismatch - 1];
    constexpr fixed_string m = [] {
      fixed_string s("solder::chain: layer ");
      s.append(W::mismatch).append(" (").append(L::name).append(") takes ").append(layer_info<L>::in);
      s.append(" features, but ");
      if constexpr (W::mismatch == 0) {
        s.append("the input has ");
      } else {
        using Prev = std::tuple_element_t<W::mismatch - 1, std::tuple<Layers...>>;
        s.append("layer ").append(W::mismatch - 1).append(" (").append(Prev::name).append(") gives ");
      }
      s.append(given);
      return s;
    }();
    return diagnostic<m>::reported;
  }
}

}  // namespace solder::nn
