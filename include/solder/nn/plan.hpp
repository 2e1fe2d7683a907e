// nn/plan.hpp: what each layer is to the planner (layer_info), and the planner itself: the
// layer list of a chain is grouped into kernels at compile time with Boost.Hana. A linear layer
// and the parameter-free elementwise layers after it become one nn::dense (one GEMM forward);
// any other run of elementwise layers becomes one nn::fuse (one pass); every other layer is a
// block of its own. The unfused policy makes every layer its own block (one kernel per op), as
// an eager framework runs the model: the comparison the flagship example prints.
#pragma once

#include <boost/hana/append.hpp>
#include <boost/hana/back.hpp>
#include <boost/hana/drop_back.hpp>
#include <boost/hana/fold_left.hpp>
#include <boost/hana/length.hpp>
#include <boost/hana/tuple.hpp>
#include <boost/hana/type.hpp>
#include <boost/hana/unpack.hpp>

#include <cstddef>
#include <tuple>
#include <type_traits>

#include "solder/diagnostic.hpp"
#include "solder/nn/dense.hpp"
#include "solder/nn/elementwise.hpp"
#include "solder/nn/fuse.hpp"
#include "solder/nn/linear.hpp"

namespace solder::nn {

/// How the planner treats a layer.
enum class layer_kind {
  product,      // a matrix product (linear): opens a kernel that later elementwise layers join
  elementwise,  // bias, activations, dropout: join the open kernel or form one
  block,        // anything else (layer_norm, softmax, ...): a kernel of its own
};

/// What the planner and the cost model know of a layer: its kind, its features per sample in
/// and out (0: shape-preserving, it takes what it is given), parameters and FLOPs per sample
/// (elementwise layers count per feature; `features` is the width they run at).
template <class L>
struct layer_info {
  static constexpr layer_kind kind = layer_kind::block;
  static constexpr std::size_t in = L::in_features, out = L::out_features;
  static constexpr std::size_t parameters = L::parameter_count;
  static constexpr double forward_flops(std::size_t) { return L::forward_flops; }
  static constexpr double backward_flops(std::size_t) { return L::backward_flops; }
  static constexpr std::size_t saved_floats(std::size_t) { return L::saved_floats; }
};
template <std::size_t In, std::size_t Out, bool B>
struct layer_info<linear<In, Out, B>> {
  static constexpr layer_kind kind = layer_kind::product;
  static constexpr std::size_t in = In, out = Out;
  static constexpr std::size_t parameters = In * Out + (B ? Out : 0);
  static constexpr double forward_flops(std::size_t) { return 2.0 * In * Out + (B ? Out : 0); }
  static constexpr double backward_flops(std::size_t) { return 4.0 * In * Out + (B ? Out : 0); }
  static constexpr std::size_t saved_floats(std::size_t) { return 0; }
};
template <std::size_t N>
struct layer_info<bias<N>> {
  static constexpr layer_kind kind = layer_kind::elementwise;
  static constexpr std::size_t in = N, out = N;
  static constexpr std::size_t parameters = N;
  static constexpr double forward_flops(std::size_t) { return N; }
  static constexpr double backward_flops(std::size_t) { return N; }
  static constexpr std::size_t saved_floats(std::size_t) { return 0; }
};
template <class Op>
struct layer_info<activation<Op>> {
  static constexpr layer_kind kind = layer_kind::elementwise;
  static constexpr std::size_t in = 0, out = 0;
  static constexpr std::size_t parameters = 0;
  static constexpr double forward_flops(std::size_t f) { return double(Op::flops) * double(f); }
  static constexpr double backward_flops(std::size_t f) { return 2.0 * double(Op::flops) * double(f); }
  static constexpr std::size_t saved_floats(std::size_t) { return 0; }
};
template <float P>
struct layer_info<dropout<P>> {
  static constexpr layer_kind kind = layer_kind::elementwise;
  static constexpr std::size_t in = 0, out = 0;
  static constexpr std::size_t parameters = 0;
  static constexpr double forward_flops(std::size_t f) { return 2.0 * double(f); }  // compare, multiply
  static constexpr double backward_flops(std::size_t f) { return 2.0 * double(f); }
  static constexpr std::size_t saved_floats(std::size_t) { return 0; }  // the mask is regenerated
};

/// A planned kernel: layers [First, First + sizeof...(Ls)) of the chain, of kind Kind.
template <layer_kind Kind, std::size_t First, class... Ls>
struct group {
  static constexpr layer_kind kind = Kind;
  static constexpr std::size_t first = First;
  static constexpr std::size_t size = sizeof...(Ls);
};

namespace detail {

template <class G, class L>
struct group_append;
template <layer_kind K, std::size_t F, class... Ls, class L>
struct group_append<group<K, F, Ls...>, L> {
  using type = group<K, F, Ls..., L>;
};

/// The block type a group runs as.
template <class G>
struct block_of;
template <std::size_t F, class Lin, class... Tail>
struct block_of<group<layer_kind::product, F, Lin, Tail...>> {
  using type = dense<Lin, Tail...>;
};
template <std::size_t F, class... Ls>
struct block_of<group<layer_kind::elementwise, F, Ls...>> {
  using type = fuse<Ls...>;
};
template <std::size_t F, class L>
struct block_of<group<layer_kind::block, F, L>> {
  using type = L;
};

template <class L>
constexpr bool parameter_free = layer_info<L>::parameters == 0;

/// Whether layer L joins the group G before it (fused policy): elementwise parameter-free
/// layers join a product's group; elementwise layers join an elementwise group.
template <class G, class L>
constexpr bool joins() {
  if constexpr (layer_info<L>::kind != layer_kind::elementwise)
    return false;
  else if constexpr (G::kind == layer_kind::product)
    return parameter_free<L>;
  else
    return G::kind == layer_kind::elementwise;
}

}  // namespace detail

/// The groups of Layers, as a std::tuple of group<...> types.
template <bool Fused, class... Layers>
struct plan_groups {
  static constexpr auto compute() {
    namespace hana = boost::hana;
    constexpr auto indexed = [] {
      return []<std::size_t... I>(std::index_sequence<I...>) {
        return hana::make_tuple(hana::type_c<std::pair<std::integral_constant<std::size_t, I>, Layers>>...);
      }(std::index_sequence_for<Layers...>{});
    }();
    return hana::fold_left(indexed, hana::make_tuple(), [](auto acc, auto t) {
      using P = typename decltype(t)::type;
      using L = typename P::second_type;
      constexpr std::size_t index = P::first_type::value;
      using fresh = group<layer_info<L>::kind, index, L>;
      if constexpr (decltype(hana::length(acc))::value == 0) {
        return hana::append(acc, hana::type_c<fresh>);
      } else {
        using G = typename decltype(+hana::back(acc))::type;
        if constexpr (Fused && detail::joins<G, L>())
          return hana::append(hana::drop_back(acc), hana::type_c<typename detail::group_append<G, L>::type>);
        else
          return hana::append(acc, hana::type_c<fresh>);
      }
    });
  }
  using type = typename decltype(boost::hana::unpack(compute(), [](auto... g) {
    return boost::hana::type_c<std::tuple<typename decltype(g)::type...>>;
  }))::type;
};

template <class Groups>
struct blocks_of;
template <class... Gs>
struct blocks_of<std::tuple<Gs...>> {
  using type = std::tuple<typename detail::block_of<Gs>::type...>;
};

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
