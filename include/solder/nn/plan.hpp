// nn/plan.hpp: the planner: the layer list of a chain is grouped into kernels at compile time
// with Boost.Hana, from what each layer is (nn/layer_info.hpp, which cost.hpp reads too). A
// product layer and the parameter-free elementwise layers after it become one block of the
// product layer's own kind (`Layer::block<Tail...>`: nn::linear_block, one GEMM forward, for a
// linear layer; nn::sketched_block for a sketched one; nn::conv_block for a convolution; the
// linear and convolution blocks also take the batch_norm right after the layer and fold it in
// when the model is frozen); any other run of elementwise layers becomes one
// nn::elementwise_block (one pass); every other layer is a block of its own. The unfused
// policy makes every layer its own block (one kernel per op), as an eager framework runs the
// model: the comparison the flagship example prints.
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

#include "solder/nn/elementwise.hpp"
#include "solder/nn/elementwise_block.hpp"
#include "solder/nn/layer_info.hpp"
#include "solder/nn/linear.hpp"
#include "solder/nn/linear_block.hpp"

namespace solder::nn {

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
template <std::size_t F, class Head, class... Tail>
struct block_of<group<layer_kind::product, F, Head, Tail...>> {
  using type = typename Head::template block<Tail...>;  // the product layer says how it runs
};
template <std::size_t F, class... Ls>
struct block_of<group<layer_kind::elementwise, F, Ls...>> {
  using type = elementwise_block<Ls...>;
};
template <std::size_t F, class L>
struct block_of<group<layer_kind::block, F, L>> {
  using type = L;
};

template <class L>
constexpr bool parameter_free = layer_info<L>::parameters == 0;

/// The layer a group starts with.
template <class G>
struct head_of;
template <layer_kind K, std::size_t F, class Head, class... Ls>
struct head_of<group<K, F, Head, Ls...>> {
  using type = Head;
};

/// The rewrite of a product followed by a normalization that folds into it (conv2d or linear
/// -> batch_norm): the normalization joins the product's group, whose block folds it into the
/// product's weights when the model is frozen. Both layers say so in their planner_traits.
template <class G, class L>
constexpr bool folds_into() {
  if constexpr (G::kind != layer_kind::product || G::size != 1) {
    return false;
  } else {
    using Head = typename head_of<G>::type;
    if constexpr (requires { layer_info<L>::folds_into_product; layer_info<Head>::folds_normalization; })
      return layer_info<L>::folds_into_product && layer_info<Head>::folds_normalization;
    else
      return false;
  }
}

/// Whether layer L joins the group G before it (fused policy): a normalization that folds into
/// the product before it; elementwise parameter-free layers join a product's group;
/// elementwise layers join an elementwise group.
template <class G, class L>
constexpr bool joins() {
  if constexpr (folds_into<G, L>())
    return true;
  else if constexpr (layer_info<L>::kind != layer_kind::elementwise)
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

}  // namespace solder::nn
