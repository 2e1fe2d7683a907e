// cost.hpp: what a model costs, known at compile time from its types.
//
//   static_assert(solder::cost<Model>::params == 109386);
//   std::cout << solder::summary<Model>{};   // per-layer table, like torchinfo
//   std::cout << solder::plan_report<Model>{};  // the kernels the model compiles to
//
// FLOPs count one per add, multiply or compare (2 per FMA), per sample; bytes are the
// activations each kernel must read and write per sample (float32), and the weights it reads
// once per call. These are the numbers the planner's choices and the profiler's rates use.
#pragma once

#include <array>
#include <cstddef>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <string>
#include <tuple>

#include "solder/nn/layer_info.hpp"

namespace solder {

namespace detail {

/// Cost of one planned kernel (group G of a chain whose shapes are W, run as Block), per sample.
template <class G, class Block, class W>
struct kernel_cost;
template <nn::layer_kind K, std::size_t F, class... Ls, class Block, class W>
struct kernel_cost<nn::group<K, F, Ls...>, Block, W> {
  static constexpr std::size_t last = F + sizeof...(Ls) - 1;
  static constexpr std::size_t in = F == 0 ? W::input : W::after[F - 1];
  static constexpr std::size_t out = W::after[last];
  static constexpr std::size_t params = (nn::layer_info<Ls>::parameters + ... + 0);
  /// A chain's first product kernel computes no gradient for the chain's input: its block's
  /// backward_params forms dW (and db) only, so there is no dx product and the gate is read once.
  static constexpr bool computes_dx = !(F == 0 && K == nn::layer_kind::product);
  static constexpr double forward_flops = nn::group_flops<nn::group<K, F, Ls...>, W>(true);
  static constexpr double backward_flops =
      nn::group_flops<nn::group<K, F, Ls...>, W>(false) -
      (computes_dx ? 0.0 : nn::input_grad_flops<std::tuple_element_t<0, std::tuple<Ls...>>>(W::after[F]));
  /// Floats per sample the kernel keeps for backward beyond its input and output.
  static constexpr std::size_t saved = [] {
    if constexpr (requires { Block::kept_outputs; })
      return Block::kept_outputs * out;
    else if constexpr (requires { Block::keeps_preactivation; })
      return Block::keeps_preactivation ? out : std::size_t(0);
    else
      return (nn::layer_info<Ls>::saved_floats(out) + ... + 0);
  }();
  static constexpr double weight_bytes = 4.0 * double(params);
  /// Forward: read x, write y (and z when kept).
  static constexpr double forward_bytes = 4.0 * double(in + out + saved);
  /// Backward: an elementwise run reads x or y and dy, writes dx (a run that computes nothing,
  /// such as flatten, only copies dy to dx); a product also writes the gate, reads it twice
  /// (dW, dx) with x, and writes dx (once and none without dx).
  static constexpr double backward_bytes = [] {
    if constexpr (K != nn::layer_kind::product)
      return backward_flops == 0 ? 4.0 * double(2 * out) : 4.0 * double(3 * out + saved);
    else
      return computes_dx ? 4.0 * double(3 * out + 2 * out + 2 * in) : 4.0 * double(3 * out + out + in);
  }();
};

}  // namespace detail

namespace detail {
template <class Model, class LayerList = typename Model::layer_list>
struct model_cost;

/// The compile-time cost of a model, per sample unless the name says otherwise. Model is a
/// planned chain: its layer_list, groups (the kernels) and blocks_type.
template <class Model, class... Layers>
struct model_cost<Model, std::tuple<Layers...>> {
  using model = Model;
  using groups = typename model::groups;
  template <std::size_t I>
  using kernel = detail::kernel_cost<std::tuple_element_t<I, groups>, std::tuple_element_t<I, typename model::blocks_type>,
                                     typename model::widths>;
  static constexpr std::size_t kernels = model::kernels;

  template <class F>
  static constexpr double over_kernels(F f) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) { return (f(kernel<I>{}) + ... + 0.0); }(std::make_index_sequence<kernels>{});
  }

  /// Trainable parameters.
  static constexpr std::size_t params = (nn::layer_info<Layers>::parameters + ... + 0);
  static constexpr double forward_flops = over_kernels([](auto k) { return decltype(k)::forward_flops; });
  static constexpr double backward_flops = over_kernels([](auto k) { return decltype(k)::backward_flops; });
  /// Floats per sample kept between forward and backward: every kernel's output (the next
  /// kernel's input) and what kernels keep besides; the model input is the caller's.
  static constexpr std::size_t activation_floats = std::size_t(over_kernels([](auto k) {
    using K = decltype(k);
    return double(K::out + K::saved);
  }));
  static constexpr std::size_t activation_bytes = 4 * activation_floats;
  static constexpr double forward_bytes = over_kernels([](auto k) { return decltype(k)::forward_bytes; });
  static constexpr double backward_bytes = over_kernels([](auto k) { return decltype(k)::backward_bytes; });
  static constexpr double weight_bytes = 4.0 * double(params);
};
}  // namespace detail

/// The compile-time cost of a model (a chain), per sample unless the name says otherwise:
/// params, forward_flops, backward_flops, activation_floats and _bytes, forward_bytes,
/// backward_bytes, weight_bytes, and kernel<I> for each planned kernel.
template <class Model>
struct cost : detail::model_cost<Model> {};

// ---------------------------------------------------------------------------------------------
// Printable views
// ---------------------------------------------------------------------------------------------

namespace detail {
inline std::string human(double v) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(v >= 1e9 ? 2 : 1);
  if (v >= 1e9)
    s << v / 1e9 << " G";
  else if (v >= 1e6)
    s << v / 1e6 << " M";
  else if (v >= 1e3)
    s << v / 1e3 << " K";
  else
    s << std::setprecision(0) << v << " ";
  return s.str();
}
}  // namespace detail

/// The report of the kernels a model compiles to, forward and backward, with FLOPs and bytes
/// per sample (the planner itself is nn/plan.hpp).
template <class Model>
struct plan_report {
  friend std::ostream& operator<<(std::ostream& os, plan_report) {
    using C = cost<Model>;
    os << "plan: " << Model::kernels << " kernels forward (" << (Model::fused ? "fused" : "unfused, one per layer") << ")\n";
    os << "  " << std::left << std::setw(4) << "#" << std::setw(54) << "kernel" << std::setw(10) << "layers" << std::right
       << std::setw(14) << "fwd FLOPs" << std::setw(13) << "fwd bytes" << std::setw(14) << "bwd FLOPs" << std::setw(13)
       << "bwd bytes" << "   (per sample)\n";
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (print_kernel<I, typename C::template kernel<I>>(os), ...);
    }(std::make_index_sequence<Model::kernels>{});
    os << "  total: " << detail::human(C::forward_flops) << "FLOP forward, " << detail::human(C::backward_flops)
       << "FLOP backward per sample; weights " << detail::human(C::weight_bytes) << "B read by each call\n";
    return os;
  }

 private:
  template <std::size_t I, class K>
  static void print_kernel(std::ostream& os) {
    using G = std::tuple_element_t<I, typename Model::groups>;
    using Block = std::tuple_element_t<I, typename Model::blocks_type>;
    const std::string kind = [] {
      if constexpr (requires { Block::plan_kind(); }) return std::string(Block::plan_kind());
      else return std::string(G::kind == nn::layer_kind::product       ? "GEMM + epilogue"
                              : G::kind == nn::layer_kind::elementwise ? "elementwise pass"
                                                                        : "layer");
    }();
    std::ostringstream layers;
    layers << G::first;
    if (G::size > 1) layers << "-" << G::first + G::size - 1;
    os << "  " << std::left << std::setw(4) << I << std::setw(54) << (nn::group_name<G>() + " (" + kind + ")")
       << std::setw(10) << layers.str() << std::right << std::setw(14) << detail::human(K::forward_flops) << std::setw(13)
       << detail::human(K::forward_bytes) << std::setw(14) << detail::human(K::backward_flops) << std::setw(13)
       << detail::human(K::backward_bytes) << "\n";
    if constexpr (requires { Block::plan_note(); }) os << "      " << Block::plan_note() << "\n";
  }
};

/// A per-layer table of a model, like torchinfo's: name, output shape, parameters, forward
/// FLOPs per sample, and the activation memory each layer keeps (0 inside a fused kernel:
/// only a kernel's output is stored).
template <class Model, class LayerList = typename Model::layer_list>
struct summary;
template <class Model, class... Layers>
struct summary<Model, std::tuple<Layers...>> {
  using model = Model;
  friend std::ostream& operator<<(std::ostream& os, summary) {
    using W = typename model::widths;
    using C = cost<model>;
    os << "  " << std::left << std::setw(4) << "#" << std::setw(20) << "layer" << std::setw(20) << "output" << std::right
       << std::setw(12) << "params" << std::setw(14) << "FLOPs" << std::setw(16) << "activations" << "\n";
    std::size_t i = 0;
    (
        [&] {
          using L = Layers;
          const std::size_t width = W::after[i];
          const bool stored = ends_group(i);
          std::ostringstream shape_text;
          shape_text << "[-1";
          for (std::size_t d = 0; d < W::shapes[i].rank; ++d) shape_text << ", " << W::shapes[i][d];
          shape_text << "]";
          os << "  " << std::left << std::setw(4) << i << std::setw(20) << L::name << std::setw(20) << shape_text.str()
             << std::right << std::setw(12) << nn::layer_info<L>::parameters << std::setw(14)
             << detail::human(nn::layer_info<L>::forward_flops(width)) << std::setw(16)
             << (stored ? detail::human(4.0 * double(width)) + "B" : std::string("(fused)")) << "\n";
          ++i;
        }(),
        ...);
    os << "  total: " << C::params << " parameters (" << detail::human(C::weight_bytes) << "B), "
       << detail::human(C::forward_flops) << "FLOP forward per sample, " << detail::human(double(C::activation_bytes))
       << "B of activations kept per sample\n";
    return os;
  }

 private:
  static bool ends_group(std::size_t layer) {
    bool ends = false;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((ends = ends || std::tuple_element_t<I, typename model::groups>::first + std::tuple_element_t<I, typename model::groups>::size - 1 == layer), ...);
    }(std::make_index_sequence<model::kernels>{});
    return ends;
  }
};

}  // namespace solder
