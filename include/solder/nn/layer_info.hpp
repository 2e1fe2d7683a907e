// nn/layer_info.hpp: what a layer is to the planner and to the cost model (read from the layer's
// own planner_traits): its kind, the sample shapes it takes and gives, parameters, FLOPs and
// saved floats (layer_info, shape_rules); a planned kernel (group); the shapes through a chain
// of layers and their checks. Below both cost.hpp and the
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
#include "solder/nn/sample_shape.hpp"

namespace solder::nn {

/// What the planner and the cost model know of a layer: its kind, its features per sample in
/// and out (0: not fixed), parameters, and FLOPs and saved floats per sample as functions of
/// the elements of one sample after the layer (the width an elementwise layer runs at, the
/// output pixels of a convolution).
///
/// A layer says this beside itself in a nested `planner_traits` with the members below (linear,
/// sketched_linear, bias, the activations, dropout); one that works on images adds takes(s),
/// gives(s) and append_takes(m) (see shape_rules). A layer without planner_traits is a block
/// of its own, described by its in_features, out_features, parameter_count, forward_flops,
/// backward_flops and saved_floats.
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

/// FLOPs per sample of a product layer's gradient for its input (dx), part of its
/// backward_flops; 0 for a layer that does not say (input_grad_flops in its planner_traits).
template <class L>
constexpr double input_grad_flops(std::size_t out_features) {
  if constexpr (requires { layer_info<L>::input_grad_flops(out_features); })
    return layer_info<L>::input_grad_flops(out_features);
  else
    return 0;
}
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

/// The shape rules of layer L: what samples it takes and what it gives. A layer that works on
/// images says so in its planner_traits (takes, gives, append_takes); any other layer takes
/// [in] features and gives [out] (in == 0: any shape; out == 0: the shape it is given).
template <class L>
struct shape_rules {
  using info = layer_info<L>;
  static constexpr bool takes(sample_shape s) {
    if constexpr (requires { info::takes(s); })
      return info::takes(s);
    else
      return info::in == 0 || s == sample_shape(info::in);
  }
  static constexpr sample_shape gives(sample_shape s) {
    if constexpr (requires { info::gives(s); })
      return info::gives(s);
    else
      return info::out == 0 ? s : sample_shape(info::out);
  }
  /// The input shape the layer fixes by itself (rank 0: none; only [in] for a layer of in features).
  static constexpr sample_shape fixed_input() {
    if constexpr (requires { info::takes(sample_shape{}); })
      return {};
    else
      return info::in == 0 ? sample_shape{} : sample_shape(info::in);
  }
  /// Whether it gives what it is given whatever that is (an activation, dropout).
  static constexpr bool preserves() {
    if constexpr (requires { info::gives(sample_shape{}); })
      return false;
    else
      return info::in == 0 && info::out == 0;
  }
  static constexpr void append_takes(fixed_string& m) {
    if constexpr (requires { info::append_takes(m); }) {
      info::append_takes(m);
    } else {
      m.append(info::in).append(" features");
    }
  }
};

/// The input of a chain that does not say its shape: its first layers fix it.
struct unstated_input {
  static constexpr sample_shape shape{};
};

/// The sample shape after each layer of a chain that takes samples of shape Given::shape (rank
/// 0: fixed by the first layer that fixes its input, when only shape-preserving layers precede
/// it). shapes[i] is the shape after layer i, after[i] its elements (the features a kernel
/// writes per sample); mismatch is the first layer that cannot take what reaches it.
template <class Given, class... Layers>
struct chain_shapes {
  static constexpr std::size_t count = sizeof...(Layers);
  static constexpr sample_shape input_shape = [] {
    if constexpr (Given::shape.fixed()) {
      return Given::shape;
    } else {
      sample_shape s;
      bool open = true;
      ((open && !s.fixed() ? (s = shape_rules<Layers>::fixed_input(), open = shape_rules<Layers>::preserves()) : false), ...);
      return s;
    }
  }();
  static constexpr std::size_t input = input_shape.size();
  /// The first layer that cannot take what reaches it (count if none).
  static constexpr std::size_t mismatch = [] {
    sample_shape s = input_shape;
    std::size_t i = 0, bad = count;
    ((bad != count                          ? 0
      : !shape_rules<Layers>::takes(s) ? (bad = i, 0)
                                       : (s = shape_rules<Layers>::gives(s), 0),
      ++i),
     ...);
    return bad;
  }();
  /// Shapes after each layer, up to the first mismatch (later ones repeat the last good one).
  static constexpr std::array<sample_shape, count> shapes = [] {
    std::array<sample_shape, count> a{};
    sample_shape s = input_shape;
    std::size_t i = 0;
    ((i < mismatch ? s = shape_rules<Layers>::gives(s) : s, a[i++] = s), ...);
    return a;
  }();
  static constexpr std::array<std::size_t, count> after = [] {
    std::array<std::size_t, count> a{};
    for (std::size_t i = 0; i < count; ++i) a[i] = shapes[i].size();
    return a;
  }();
  static constexpr sample_shape output_shape = count ? shapes[count - 1] : input_shape;
  static constexpr std::size_t output = output_shape.size();

  /// The tensor shapes of a batch: of the input, after layer I, of the output.
  using input_batch = detail::batched<input_shape.rank, input_shape.dims[0], input_shape.dims[1], input_shape.dims[2],
                                      input_shape.dims[3]>::type;
  template <std::size_t I>
  using batch_after = detail::batched<shapes[I].rank, shapes[I].dims[0], shapes[I].dims[1], shapes[I].dims[2],
                                      shapes[I].dims[3]>::type;
  using output_batch = detail::batched<output_shape.rank, output_shape.dims[0], output_shape.dims[1],
                                       output_shape.dims[2], output_shape.dims[3]>::type;
};

/// The shapes of a chain of Layers whose input the layers fix themselves.
template <class... Layers>
using chain_widths = chain_shapes<unstated_input, Layers...>;

/// FLOPs per sample of the kernel group G of a chain of Layers, forward or backward: the sum of
/// its layers' counts at the widths they run at.
template <class G, class W>
constexpr double group_flops(bool forward) {
  return [&]<layer_kind K, std::size_t F, class... Ls>(std::type_identity<group<K, F, Ls...>>) {
    double f = 0;
    std::size_t i = F;
    ((f += forward ? layer_info<Ls>::forward_flops(W::after[i]) : layer_info<Ls>::backward_flops(W::after[i]),
      ++i),
     ...);
    return f;
  }(std::type_identity<G>{});
}

/// The chain's shapes W checked: an input shape is known, and every layer takes what reaches it.
/// A mismatch is a compile error naming both layers and both shapes.
template <class W, class... Layers>
constexpr bool check_chain() {
  if constexpr (!W::input_shape.fixed()) {
    return diagnostic<"solder::chain: no layer fixes the input shape; start the chain with a linear (or another "
                      "layer with a width), or with nn::input<C, H, W>",
                      Layers...>::reported;
  } else if constexpr (W::mismatch == W::count) {
    return true;
  } else {
    using L = std::tuple_element_t<W::mismatch, std::tuple<Layers...>>;
    constexpr fixed_string m = [] {
      const sample_shape given = W::mismatch == 0 ? W::input_shape : W::shapes[W::mismatch == 0 ? 0 : W::mismatch - 1];
      fixed_string s("solder::chain: layer ");
      s.append(W::mismatch).append(" (").append(L::name).append(") takes ");
      shape_rules<L>::append_takes(s);
      s.append(", but ");
      if constexpr (W::mismatch == 0) {
        s.append("the input has ");
      } else {
        using Prev = std::tuple_element_t<W::mismatch - 1, std::tuple<Layers...>>;
        s.append("layer ").append(W::mismatch - 1).append(" (").append(Prev::name).append(") gives ");
      }
      if (given.rank == 1)
        s.append(given[0]);
      else
        append_sample_shape(s, given);
      if (given.rank > 1 && shape_rules<L>::fixed_input().rank == 1) s.append("; put a flatten between them");
      return s;
    }();
    return diagnostic<m>::reported;
  }
}

}  // namespace solder::nn
