// generators/solder_gen.hpp: solder-gen, which writes a CUDA translation unit and a C header of launchers for each chain type it is given.
//
// A chain's type is its whole specification. The planner (nn/plan.hpp) groups its layers; for
// every group the .cu instantiates the kernel templates of eval/cuda/ on exactly the expression
// the CPU block evaluates, and defines extern "C" launchers that code built by any C or C++
// compiler can call; a chain of product groups also gets launchers of the whole chain (its
// forward, its backward, and a training step with the cross-entropy and an optimizer).
// solder_add_cuda_chains (solder_cuda_chains.cmake) compiles a small program around this header
// and runs it at build time; docs/cuda.md describes the files. The text depends on the types
// alone, so every run writes the same bytes.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "solder/autodiff/vjp.hpp"
#include "solder/backend.hpp"
#include "solder/diagnostic.hpp"
#include "solder/nn/batch_norm.hpp"
#include "solder/nn/chain.hpp"
#include "solder/nn/conv2d.hpp"
#include "solder/nn/elementwise.hpp"
#include "solder/nn/elementwise_block.hpp"
#include "solder/nn/flatten.hpp"
#include "solder/nn/layer_info.hpp"
#include "solder/nn/layer_norm.hpp"
#include "solder/nn/linear.hpp"
#include "solder/nn/plan.hpp"
#include "solder/nn/pool.hpp"
#include "solder/nn/sketched_linear.hpp"
#include "solder/nn/softmax.hpp"
#include "solder/ops/activations.hpp"

namespace solder::gen {

// ---------------------------------------------------------------------------------------------
// What the generator knows of a chain: plain data, taken from the types
// ---------------------------------------------------------------------------------------------

/// What a layer is to the generated code.
enum class role { linear, sketched_linear, conv2d, batch_norm, bias, activation, dropout, layer_norm, softmax, log_softmax, max_pool, avg_pool, flatten };

/// One layer of a chain: its type as C++ spells it, its name (PyTorch's) and its position.
struct layer_desc {
  role what;
  std::string type;   // "solder::nn::bias<4096>"
  std::string name;   // "bias"
  std::size_t index;  // 0-based position in the chain
};

/// One planned group of a chain, run by one forward and one backward launcher: an
/// nn::elementwise_block, one row layer, or an nn::linear_block (a product group: a linear
/// layer and the elementwise layers after it).
struct group_desc {
  std::size_t index;  // position among the chain's groups
  bool elementwise;
  std::size_t width;     // features per sample out (and in, but for a product group)
  bool output_backward;  // elementwise: the backward reads the output y instead of x
  std::vector<layer_desc> layers;
  bool product = false;       // a product group
  std::size_t in_width = 0;   // product: the linear layer's input features
  bool product_bias = false;  // product: whether the linear layer adds its bias
  /// A sketched product group (nn::sketched_block): its layer's Terms L and Rank k.
  bool sketched = false;
  std::size_t terms = 0, rank = 0;
  /// A convolution group (nn::conv_block: conv2d, its batch_norm if any, then elementwise
  /// layers), on NCHW images: the input [channels, height, cols] (below), the output
  /// [out_channels, out_height, out_cols], the kernel, stride, padding and dilation.
  bool conv = false;
  bool conv_bias = false;  // the convolution adds its bias
  bool norm = false;       // a batch_norm follows it
  std::size_t out_channels = 0, kernel_h = 0, kernel_w = 0, dilation = 1;
  /// Pooling: the sample [channels, height, cols] in and [channels, out_height, out_cols] out
  /// (NCHW, as the CPU layers and eval/cuda/pool.hpp keep images), the window and its padding
  /// rule. Flatten keeps the bytes: width features in and out.
  std::size_t channels = 0, height = 0, cols = 0, out_height = 0, out_cols = 0;
  std::size_t kernel = 1, stride = 1, pad = 0;
  bool count_include_pad = true;
};

/// How a chain was given: an nn::chain, an nn::elementwise_block, or one row layer.
enum class spec_kind { chain, block, layer };

/// A chain to generate: its C++ name in the user's header, how it was given, its groups.
struct chain_desc {
  std::string name;  // "bias_relu_dropout", or qualified: "models::mlp"
  spec_kind kind;
  std::vector<layer_desc> layers;
  std::vector<group_desc> groups;
  std::string input;  // the chain's nn::input<...> ("" when its first layer fixes the input)
};

// ---------------------------------------------------------------------------------------------
// From types to descriptions
// ---------------------------------------------------------------------------------------------

namespace detail {

/// "1, 8, 8".
inline std::string join_ints(const std::vector<std::string>& e) {
  std::string s;
  for (std::size_t k = 0; k < e.size(); ++k) s += (k ? ", " : "") + e[k];
  return s;
}

/// The shortest C++ literal that reads back as the same float: 0.1f -> "0.1f".
inline std::string float_literal(float v) {
  char buf[64];
  const auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
  std::string s(buf, end);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s + "f";
}

/// The ops the generator spells as solder::nn::<name> (activation<solder::ops::<name>>).
template <class Op>
inline constexpr bool known_op =
    std::is_same_v<Op, ops::relu> || std::is_same_v<Op, ops::gelu> || std::is_same_v<Op, ops::gelu_tanh> ||
    std::is_same_v<Op, ops::silu> || std::is_same_v<Op, ops::tanh> || std::is_same_v<Op, ops::sigmoid> ||
    std::is_same_v<Op, ops::elu> || std::is_same_v<Op, ops::leaky_relu> || std::is_same_v<Op, ops::softplus>;

/// How the generator spells layer L; `known` is false for a layer it has no kernel for.
template <class L>
struct layer_traits {
  static constexpr bool known = false;
};
template <std::size_t In, std::size_t Out, bool Bias>
struct layer_traits<nn::linear<In, Out, Bias>> {
  static constexpr bool known = true;
  static layer_desc describe(std::size_t i) {
    return {role::linear,
            "solder::nn::linear<" + std::to_string(In) + ", " + std::to_string(Out) + (Bias ? "" : ", false") + ">",
            "linear", i};
  }
};
template <std::size_t In, std::size_t Out, std::size_t Terms, std::size_t Rank, bool Bias, nn::sketch_strategy Strategy,
          bool AllowLarger>
struct layer_traits<nn::sketched_linear<In, Out, Terms, Rank, Bias, Strategy, AllowLarger>> {
  static constexpr bool known = true;
  static constexpr bool sketched = true;
  static layer_desc describe(std::size_t i) {
    std::string args = std::to_string(In) + ", " + std::to_string(Out) + ", " + std::to_string(Terms) + ", " +
                       std::to_string(Rank);
    // The defaults are left out, as a user writes the type; the rest is spelled in full.
    const char* strategy = Strategy == nn::sketch_strategy::automatic      ? "automatic"
                           : Strategy == nn::sketch_strategy::two_products ? "two_products"
                                                                           : "folded";
    if (!Bias || Strategy != nn::sketch_strategy::automatic || AllowLarger) args += Bias ? ", true" : ", false";
    if (Strategy != nn::sketch_strategy::automatic || AllowLarger)
      args += std::string(", solder::nn::sketch_strategy::") + strategy;
    if (AllowLarger) args += ", true";
    return {role::sketched_linear, "solder::nn::sketched_linear<" + args + ">", "sketched_linear", i};
  }
};
template <std::size_t Cin, std::size_t Cout, std::size_t Kh, std::size_t Kw, std::size_t S, std::size_t P, std::size_t D,
          std::size_t G, bool B>
struct layer_traits<nn::conv2d<Cin, Cout, Kh, Kw, S, P, D, G, B>> {
  static constexpr bool known = G == 1;  // grouped and depthwise convolutions: no product form yet
  static constexpr bool convolution = true;
  static layer_desc describe(std::size_t i) {
    // The arguments up to the last that differs from its default, as a user writes the type.
    const std::size_t given[] = {Cin, Cout, Kh, Kw, S, P, D, G, B ? 1u : 0u};
    const std::size_t defaults[] = {0, 0, 0, 0, 1, 0, 1, 1, 1};
    std::size_t n = 4;
    for (std::size_t k = 4; k < 9; ++k)
      if (given[k] != defaults[k]) n = k + 1;
    std::vector<std::string> args;
    for (std::size_t k = 0; k < n; ++k) args.push_back(k == 8 ? (B ? "true" : "false") : std::to_string(given[k]));
    return {role::conv2d, "solder::nn::conv2d<" + join_ints(args) + ">", "conv2d", i};
  }
};
template <std::size_t C>
struct layer_traits<nn::batch_norm<C>> {
  static constexpr bool known = true;
  static constexpr bool normalization = true;
  static layer_desc describe(std::size_t i) {
    return {role::batch_norm, "solder::nn::batch_norm<" + std::to_string(C) + ">", "batch_norm", i};
  }
};
template <std::size_t N>
struct layer_traits<nn::bias<N>> {
  static constexpr bool known = true;
  static layer_desc describe(std::size_t i) { return {role::bias, "solder::nn::bias<" + std::to_string(N) + ">", "bias", i}; }
};
template <class Op>
struct layer_traits<nn::activation<Op>> {
  static constexpr bool known = known_op<Op>;
  static layer_desc describe(std::size_t i) { return {role::activation, "solder::nn::" + std::string(Op::name), Op::name, i}; }
};
template <float P>
struct layer_traits<nn::dropout<P>> {
  static constexpr bool known = true;
  static layer_desc describe(std::size_t i) {
    return {role::dropout, "solder::nn::dropout<" + float_literal(P) + ">", "dropout", i};
  }
};
template <std::size_t N>
struct layer_traits<nn::layer_norm<N>> {
  static constexpr bool known = true;
  static layer_desc describe(std::size_t i) {
    return {role::layer_norm, "solder::nn::layer_norm<" + std::to_string(N) + ">", "layer_norm", i};
  }
};
template <std::size_t N>
struct layer_traits<nn::softmax<N>> {
  static constexpr bool known = true;
  static layer_desc describe(std::size_t i) {
    return {role::softmax, "solder::nn::softmax<" + std::to_string(N) + ">", "softmax", i};
  }
};
template <std::size_t N>
struct layer_traits<nn::log_softmax<N>> {
  static constexpr bool known = true;
  static layer_desc describe(std::size_t i) {
    return {role::log_softmax, "solder::nn::log_softmax<" + std::to_string(N) + ">", "log_softmax", i};
  }
};

template <std::size_t K, std::size_t S, std::size_t P>
struct layer_traits<nn::max_pool2d<K, S, P>> {
  static constexpr bool known = true;
  static constexpr std::size_t kernel = K, stride = S, pad = P;
  static constexpr bool count_include_pad = true;
  static layer_desc describe(std::size_t i) {
    return {role::max_pool,
            "solder::nn::max_pool2d<" + std::to_string(K) + ", " + std::to_string(S) + ", " + std::to_string(P) + ">",
            "max_pool2d", i};
  }
};
template <std::size_t K, std::size_t S, std::size_t P, bool CountIncludePad>
struct layer_traits<nn::avg_pool2d<K, S, P, CountIncludePad>> {
  static constexpr bool known = true;
  static constexpr std::size_t kernel = K, stride = S, pad = P;
  static constexpr bool count_include_pad = CountIncludePad;
  static layer_desc describe(std::size_t i) {
    return {role::avg_pool,
            "solder::nn::avg_pool2d<" + std::to_string(K) + ", " + std::to_string(S) + ", " + std::to_string(P) +
                (CountIncludePad ? "" : ", false") + ">",
            "avg_pool2d", i};
  }
};
template <std::size_t... Extents>
struct layer_traits<nn::flatten<Extents...>> {
  static constexpr bool known = true;
  static layer_desc describe(std::size_t i) {
    std::vector<std::string> e;
    (e.push_back(std::to_string(Extents)), ...);
    std::string args;
    for (std::size_t k = 0; k < e.size(); ++k) args += (k ? ", " : "") + e[k];
    return {role::flatten, "solder::nn::flatten<" + args + ">", "flatten", i};
  }
};

/// One error per layer the CUDA backend cannot run, naming the layer.
template <class L>
constexpr bool check_layer() {
  if constexpr (nn::layer_info<L>::kind == nn::layer_kind::product && !layer_traits<L>::known) {
    return diagnostic<"solder::gen: the CUDA backend's products run nn::linear, nn::sketched_linear and nn::conv2d "
                      "(Groups = 1) layers only; this product layer has no CUDA kernel yet",
                      L>::reported;
  } else if constexpr (!layer_traits<L>::known) {
    return diagnostic<"solder::gen: no CUDA kernel for this layer; a generated chain holds linear, bias, activations "
                      "of solder::ops, dropout, layer_norm, softmax, log_softmax, max_pool2d, avg_pool2d and flatten",
                      L>::reported;
  } else {
    return true;
  }
}

/// The layers of a chain as given, and how it was given.
template <class Spec>
struct spec_traits {
  static constexpr bool known = false;
};
template <class Config, class... Ls>
struct spec_traits<nn::basic_chain<Config, Ls...>> {
  static constexpr bool known = true;
  static constexpr spec_kind kind = spec_kind::chain;
  static constexpr bool fused = Config::fused;
  using layers = std::tuple<Ls...>;
  using input = typename Config::input;
};
template <class... Ls>
struct spec_traits<nn::elementwise_block<Ls...>> {
  static constexpr bool known = true;
  static constexpr spec_kind kind = spec_kind::block;
  static constexpr bool fused = true;
  using layers = std::tuple<Ls...>;
  using input = nn::unstated_input;
};
template <class L>
  requires(layer_traits<L>::known && nn::layer_info<L>::kind == nn::layer_kind::block)
struct spec_traits<L> {
  static constexpr bool known = true;
  static constexpr spec_kind kind = spec_kind::layer;
  static constexpr bool fused = true;
  using layers = std::tuple<L>;
  using input = nn::unstated_input;
};

/// One error for a type that is not a chain the generator takes.
template <class Spec>
constexpr bool check_spec() {
  if constexpr (spec_traits<Spec>::known)
    return true;
  else
    return diagnostic<"solder::gen: a generated chain is an nn::chain, an nn::elementwise_block or one row layer "
                      "(nn::layer_norm, nn::softmax, nn::log_softmax)",
                      Spec>::reported;
}

/// The layers of a planned group, as a std::tuple.
template <class G>
struct group_layers;
template <nn::layer_kind K, std::size_t F, class... Ls>
struct group_layers<nn::group<K, F, Ls...>> {
  using type = std::tuple<Ls...>;
};

/// nn::elementwise_block<Ls...>::output_backward for a std::tuple<Ls...>.
template <class Tuple>
struct output_backward_of;
template <class... Ls>
struct output_backward_of<std::tuple<Ls...>> {
  static constexpr bool value = nn::elementwise_block<Ls...>::output_backward;
};

/// The elementwise layers after the head of a product group, as a std::tuple.
template <class Tuple>
struct product_tail_of;
template <class Head, class... Tail>
struct product_tail_of<std::tuple<Head, Tail...>> {
  using type = std::tuple<Tail...>;
};

/// The layers of a convolution group after the convolution and its batch_norm, as a std::tuple.
template <class Tuple>
struct conv_tail_of;
template <class Conv>
struct conv_tail_of<std::tuple<Conv>> {
  using type = std::tuple<>;
};
template <class Conv, class Next, class... Rest>
struct conv_tail_of<std::tuple<Conv, Next, Rest...>> {
  using type = std::conditional_t<requires { layer_traits<Next>::normalization; }, std::tuple<Rest...>,
                                  std::tuple<Next, Rest...>>;
};

/// One error for a batch_norm that no convolution precedes (the device runs it in a conv group).
template <class G, class Head>
constexpr bool check_block_group() {
  if constexpr (requires { layer_traits<Head>::normalization; })
    return diagnostic<"solder::gen: a generated chain runs nn::batch_norm right after an nn::conv2d only (in its "
                      "group); put the convolution before it",
                      Head>::reported;
  else
    return true;
}

/// One error for a product group whose backward would need its pre-activation: the generated
/// backward reads the gate from the output y, and the forward writes y alone.
template <class Tail>
constexpr bool check_product_tail() {
  if constexpr (std::tuple_size_v<Tail> == 0)
    return true;
  else if constexpr (output_backward_of<Tail>::value)
    return true;
  else
    return diagnostic<"solder::gen: after an nn::linear or nn::sketched_linear a generated chain takes layers whose gradient follows from the "
                      "output (relu or sigmoid, then dropout)",
                      Tail>::reported;
}

/// The planner's groups of Ls as descriptions.
template <bool Fused, class Widths, class... Ls>
std::vector<group_desc> describe_groups(const std::vector<layer_desc>& layers) {
  using groups = typename nn::plan_groups<Fused, Ls...>::type;
  using widths = Widths;
  std::vector<group_desc> out;
  [&]<std::size_t... G>(std::index_sequence<G...>) {
    (
        [&] {
          using group = std::tuple_element_t<G, groups>;
          using layers_of = typename group_layers<group>::type;
          constexpr bool elementwise = group::kind == nn::layer_kind::elementwise;
          group_desc d{G, elementwise, widths::after[group::first], false, {}};
          if constexpr (elementwise) d.output_backward = output_backward_of<layers_of>::value;
          if constexpr (group::kind == nn::layer_kind::product &&
                        requires { layer_traits<std::tuple_element_t<0, layers_of>>::convolution; }) {
            using head = std::tuple_element_t<0, layers_of>;
            constexpr nn::sample_shape in = group::first == 0 ? widths::input_shape : widths::shapes[group::first - 1];
            constexpr nn::sample_shape out = widths::shapes[group::first];
            if constexpr (check_product_tail<typename conv_tail_of<layers_of>::type>()) d.output_backward = true;
            d.conv = true;
            d.conv_bias = head::has_bias;
            d.norm = group::size > 1 && requires { layer_traits<std::tuple_element_t<1, layers_of>>::normalization; };
            d.channels = in[0], d.height = in[1], d.cols = in[2];
            d.out_channels = out[0], d.out_height = out[1], d.out_cols = out[2];
            d.kernel_h = head::kernel_height, d.kernel_w = head::kernel_width;
            d.stride = head::stride, d.pad = head::padding, d.dilation = head::dilation;
          } else if constexpr (group::kind == nn::layer_kind::product) {
            using head = std::tuple_element_t<0, layers_of>;
            if constexpr (check_product_tail<typename product_tail_of<layers_of>::type>()) d.output_backward = true;
            d.product = true;
            d.in_width = head::in_features;
            d.product_bias = head::has_bias;
            if constexpr (requires { layer_traits<head>::sketched; }) {
              d.sketched = true;
              d.terms = head::terms;
              d.rank = head::rank;
            }
          }
          if constexpr (group::kind == nn::layer_kind::block) {
            using head = std::tuple_element_t<0, layers_of>;
            static_assert(check_block_group<group, head>());
            constexpr nn::sample_shape in = group::first == 0 ? widths::input_shape : widths::shapes[group::first - 1];
            constexpr nn::sample_shape out = widths::shapes[group::first];
            if constexpr (requires { layer_traits<head>::kernel; }) {
              d.channels = in[0], d.height = in[1], d.cols = in[2], d.out_height = out[1], d.out_cols = out[2];
              d.kernel = layer_traits<head>::kernel, d.stride = layer_traits<head>::stride;
              d.pad = layer_traits<head>::pad, d.count_include_pad = layer_traits<head>::count_include_pad;
            }
          }
          for (std::size_t i = group::first; i < group::first + group::size; ++i) d.layers.push_back(layers[i]);
          out.push_back(std::move(d));
        }(),
        ...);
  }(std::make_index_sequence<std::tuple_size_v<groups>>{});
  return out;
}

/// The description of Spec from its layers, after one check per layer and the chain's widths.
template <class Spec, class... Ls>
chain_desc describe_layers(std::string_view name, std::type_identity<std::tuple<Ls...>>) {
  chain_desc c{std::string(name), spec_traits<Spec>::kind, {}, {}, {}};
  if constexpr ((check_layer<Ls>() && ...)) {
    using widths = nn::chain_shapes<typename spec_traits<Spec>::input, Ls...>;
    if constexpr (nn::check_chain<widths, Ls...>()) {
      std::size_t i = 0;
      (c.layers.push_back(layer_traits<Ls>::describe(i++)), ...);
      c.groups = describe_groups<spec_traits<Spec>::fused, widths, Ls...>(c.layers);
      using input = typename spec_traits<Spec>::input;
      if constexpr (input::shape.fixed()) {
        std::vector<std::string> e;
        for (std::size_t k = 0; k < input::shape.rank; ++k) e.push_back(std::to_string(input::shape[k]));
        c.input = "solder::nn::input<" + join_ints(e) + ">";
      }
    }
  }
  return c;
}

}  // namespace detail

/// The description of chain type Spec (an nn::chain, an nn::elementwise_block or one row
/// layer), which the user's header names `name`: a C++ name that refers to Spec at global scope
/// after the header is included ("bias_relu_dropout", "models::mlp").
template <class Spec>
chain_desc describe(std::string_view name) {
  if constexpr (detail::check_spec<Spec>())
    return detail::describe_layers<Spec>(name, std::type_identity<typename detail::spec_traits<Spec>::layers>{});
  else
    return {};
}

// ---------------------------------------------------------------------------------------------
// From descriptions to text
// ---------------------------------------------------------------------------------------------

namespace detail {

/// The parts with `sep` between them.
inline std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string s;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i) s += sep;
    s += parts[i];
  }
  return s;
}

/// The file stem and C identifier of a chain's C++ name: "models::mlp" -> "models_mlp".
inline std::string stem_of(const std::string& name) {
  std::string s;
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (name.compare(i, 2, "::") == 0) {
      s += '_';
      ++i;
    } else {
      s += name[i];
    }
  }
  return s;
}

/// `head` + open + the items joined by ", " + close + `tail`, wrapped after commas before column
/// `limit`, continuation lines aligned after `open` (or 4 past the line's indent where that is
/// too far right).
inline std::string wrap_list(const std::string& head, char open, const std::vector<std::string>& items, char close,
                             const std::string& tail, std::size_t limit = 110) {
  const std::size_t lead = head.find_first_not_of(' ');
  std::size_t align = head.size() + 1;
  if (align > 60) align = (lead == std::string::npos ? 0 : lead) + 4;
  const std::string indent(align, ' ');
  std::string out = head + open;
  std::size_t column = out.size();
  if (align < out.size() && !items.empty()) {
    out += "\n" + indent;
    column = indent.size();
  }
  for (std::size_t i = 0; i < items.size(); ++i) {
    const std::string piece = items[i] + (i + 1 < items.size() ? std::string(",") : close + tail);
    if (i > 0) {
      if (column + 1 + piece.size() > limit) {
        out += "\n" + indent;
        column = indent.size();
      } else {
        out += " ";
        ++column;
      }
    }
    out += piece;
    column += piece.size();
  }
  if (items.empty()) out += close + tail;
  return out;
}

/// `head(a, b, ...)tail`, wrapped as wrap_list does.
inline std::string wrap_call(const std::string& head, const std::vector<std::string>& args, const std::string& tail,
                             std::size_t limit = 110) {
  return wrap_list(head, '(', args, ')', tail, limit);
}

/// A section title line of a generated file: "// ---- title -----".
inline std::string rule(const std::string& title) {
  std::string s = "// ---- " + title + " ";
  while (s.size() < 100) s += '-';
  return s + "\n";
}

/// `text` as comment lines starting with `lead` ("// ", "/// "), words wrapped before `limit`.
inline std::string comment(const std::string& lead, const std::string& text, std::size_t limit = 100) {
  std::string out, line;
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t end = std::min(text.find(' ', i), text.size());
    const std::string word = text.substr(i, end - i);
    if (!line.empty() && lead.size() + line.size() + 1 + word.size() > limit) {
      out += lead + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    i = end + 1;
  }
  return out + lead + line + "\n";
}

/// A launcher parameter: its C declaration and its name.
struct param {
  std::string decl;
  std::string name;
};

/// One group as the text needs it: its description and its names.
struct group_text {
  const chain_desc& chain;
  const group_desc& g;
  std::string prefix;    // "g0_": the group's names in the .cu
  std::string launcher;  // "solder_bias_relu_dropout_f32_4096": the launchers' common name

  /// The group's layers of one role.
  std::vector<const layer_desc*> of(role r) const {
    std::vector<const layer_desc*> v;
    for (const auto& l : g.layers)
      if (l.what == r) v.push_back(&l);
    return v;
  }
  role row_role() const { return g.layers.front().what; }
  /// A pooling group (nn::max_pool2d, nn::avg_pool2d) or a flatten: launches of eval/cuda/pool.hpp's bodies, a copy.
  bool pool() const { return !g.elementwise && !g.product && (row_role() == role::max_pool || row_role() == role::avg_pool); }
  bool flatten() const { return !g.elementwise && !g.product && row_role() == role::flatten; }
  std::string image_in() const {
    return "[batch, " + std::to_string(g.channels) + ", " + std::to_string(g.height) + ", " + std::to_string(g.cols) + "]";
  }
  std::string image_out() const {
    return "[batch, " + std::to_string(g.channels) + ", " + std::to_string(g.out_height) + ", " +
           std::to_string(g.out_cols) + "]";
  }
  std::string width() const { return std::to_string(g.width); }
  std::string rows() const { return "[batch, " + width() + "]"; }
  /// A convolution group (nn::conv_block) and its extents: the output image, its pixels per
  /// sample, the columns of im2col (Cin Kh Kw), whether it has a tail after the normalization.
  bool conv() const { return g.conv; }
  std::string conv_out() const {
    return "[batch, " + std::to_string(g.out_channels) + ", " + std::to_string(g.out_height) + ", " +
           std::to_string(g.out_cols) + "]";
  }
  std::size_t out_plane() const { return g.out_height * g.out_cols; }
  std::size_t taps() const { return g.channels * g.kernel_h * g.kernel_w; }
  std::size_t conv_tail_size() const { return g.layers.size() - (g.norm ? 2 : 1); }
  std::string conv_weight_shape() const {
    return "[" + std::to_string(g.out_channels) + ", " + std::to_string(g.channels) + ", " + std::to_string(g.kernel_h) +
           ", " + std::to_string(g.kernel_w) + "]";
  }
  /// A sketched group's L k (S1's columns, S2's rows) and its h = x [S1 | U2] per row (2 L k).
  std::string lk() const { return std::to_string(g.terms * g.rank); }
  std::string h_width() const { return std::to_string(2 * g.terms * g.rank); }
  /// A product group's input features, input rows and weight: "256", "[batch, 256]", "[512, 256]".
  std::string in_width() const { return std::to_string(g.in_width); }
  std::string in_rows() const { return "[batch, " + in_width() + "]"; }
  std::string weight_shape() const { return "[" + width() + ", " + in_width() + "]"; }
  /// The group's rows for titles: "[batch, 4096]", or a product's "[batch, 256] -> [batch, 512]".
  std::string extent() const {
    return g.product ? in_rows() + " -> " + rows()
           : g.conv  ? image_in() + " -> " + conv_out()
           : pool()  ? image_in() + " -> " + image_out()
                     : rows();
  }
  /// The position of a layer in the tuple of layers that holds it in the .cu: the block's, or a
  /// product group's tail (after the linear layer).
  std::size_t held_at(const layer_desc& l) const {
    return l.index - g.layers.front().index - (g.product ? 1 : g.conv ? (g.norm ? 2 : 1) : 0);
  }
  /// A bias's parameter: "b", or "b<layer index>" where the group has several.
  std::string bias(const layer_desc& l) const { return of(role::bias).size() == 1 ? "b" : "b" + std::to_string(l.index); }
  std::string seed(const layer_desc& l) const {
    return of(role::dropout).size() == 1 ? "seed" : "seed" + std::to_string(l.index);
  }
  std::string offset(const layer_desc& l) const {
    return of(role::dropout).size() == 1 ? "offset" : "offset" + std::to_string(l.index);
  }
  std::vector<std::string> biases() const {
    std::vector<std::string> v;
    for (const auto* l : of(role::bias)) v.push_back(bias(*l));
    return v;
  }
  /// The type the group runs as.
  std::string block_type() const {
    if (!g.elementwise && !g.product && !g.conv) return g.layers.front().type;
    std::vector<std::string> types;
    for (const auto& l : g.layers) types.push_back(l.type);
    return std::string(g.conv        ? "solder::nn::conv_block<"
                       : g.sketched  ? "solder::nn::sketched_block<"
                       : g.product ? "solder::nn::linear_block<"
                                   : "solder::nn::elementwise_block<") +
           join(types, ", ") + ">";
  }
  /// A product group's tail type: "solder::nn::elementwise_block<solder::nn::relu, ...>".
  std::string tail_type() const {
    std::vector<std::string> types;
    for (std::size_t i = 1; i < g.layers.size(); ++i) types.push_back(g.layers[i].type);
    return "solder::nn::elementwise_block<" + join(types, ", ") + ">";
  }
  /// The layers for comments: "bias<4096>, relu, dropout<0.1f>".
  std::string layer_list() const {
    std::vector<std::string> v;
    for (const auto& l : g.layers) v.push_back(l.type.substr(std::string_view("solder::nn::").size()));
    return join(v, ", ");
  }
  /// The forward's formula: "dropout(relu(x + b))", "dropout(relu(x W^T + b))".
  std::string formula() const {
    std::string e = "x";
    for (const auto& l : g.layers) {
      if (l.what == role::linear)
        e = g.product_bias ? "x W^T + b" : "x W^T";
      else if (l.what == role::conv2d)
        e = g.conv_bias ? "conv2d(x) + b" : "conv2d(x)";
      else if (l.what == role::sketched_linear)
        e = g.product_bias ? "(x [S1 | U2]) [U1; S2] / (2L) + b" : "(x [S1 | U2]) [U1; S2] / (2L)";
      else
        e = l.what == role::bias ? e + " + " + bias(l) : l.name + "(" + e + ")";
    }
    return e;
  }
  /// "layer 3" or "layers 0-2": the group's place in the chain.
  std::string layer_range() const {
    const std::size_t a = g.layers.front().index, b = g.layers.back().index;
    return a == b ? "layer " + std::to_string(a) : "layers " + std::to_string(a) + "-" + std::to_string(b);
  }
  /// Whether dispatch (eval/cuda/pass.hpp) may take the 16-byte path: rows of whole vectors, or
  /// no broadcast operand (a bias) and no column sums.
  bool vector_path() const { return g.width % 4 == 0 || (of(role::bias).empty() && !g.product_bias); }
};

/// The launchers' common name: "solder_" + the layers' names + element type + width.
inline std::string launcher_name(const group_desc& g) {
  std::vector<std::string> names;
  for (const auto& l : g.layers) names.push_back(l.name);
  // A product group's width is In x Out, as its weight's transpose.
  std::string in = g.product ? std::to_string(g.in_width) + "x" : "";
  // A sketched group's also holds its terms L and rank k: "_64x256_l2k8".
  if (g.sketched)
    return "solder_" + join(names, "_") + "_f32_" + in + std::to_string(g.width) + "_l" + std::to_string(g.terms) + "k" +
           std::to_string(g.rank);
  // A convolution group's: its input image C x H x W, then Cout, the kernel, stride, padding
  // (and dilation where it is not 1): "_1x8x8_16k3x3s1p1".
  if (g.conv)
    return "solder_" + join(names, "_") + "_f32_" + std::to_string(g.channels) + "x" + std::to_string(g.height) + "x" +
           std::to_string(g.cols) + "_" + std::to_string(g.out_channels) + "k" + std::to_string(g.kernel_h) + "x" +
           std::to_string(g.kernel_w) + "s" + std::to_string(g.stride) + "p" + std::to_string(g.pad) +
           (g.dilation != 1 ? "d" + std::to_string(g.dilation) : "");
  // A pooling group's width is its input image C x H x W.
  if (!g.elementwise && !g.product && g.channels > 0)
    return "solder_" + join(names, "_") + "_f32_" + std::to_string(g.channels) + "x" + std::to_string(g.height) + "x" +
           std::to_string(g.cols);
  return "solder_" + join(names, "_") + "_f32_" + in + std::to_string(g.width);
}

// ---- the launchers' parameters and summaries -------------------------------------------------

/// ", then relu (one elementwise pass)": a convolution group's tail in words ("" without one).
inline std::string conv_tail_text(const group_text& t) {
  std::vector<std::string> names;
  for (std::size_t i = t.g.layers.size() - t.conv_tail_size(); i < t.g.layers.size(); ++i)
    names.push_back(t.g.layers[i].name);
  return names.empty() ? "" : ", then " + join(names, ", ") + " (one elementwise pass)";
}

/// The forward launcher's parameters, in order.
inline std::vector<param> forward_params(const group_text& t) {
  std::vector<param> p{{"const float* x", "x"}};
  if (t.g.conv) {
    p.push_back({"const float* w", "w"});
    if (t.g.conv_bias) p.push_back({"const float* b", "b"});
    if (t.g.norm)
      p.insert(p.end(), {{"const float* bn_weight", "bn_weight"},
                         {"const float* bn_bias", "bn_bias"},
                         {"float* running_mean", "running_mean"},
                         {"float* running_var", "running_var"},
                         {"float* z", "z"},
                         {"float* saved_mean", "saved_mean"},
                         {"float* saved_rstd", "saved_rstd"}});
    p.insert(p.end(), {{"float* y", "y"}, {"size_t batch", "batch"}});
    // As the CPU layer holds them (torch's floats are Python doubles): the same rstd bits.
    if (t.g.norm) p.insert(p.end(), {{"double eps", "eps"}, {"double momentum", "momentum"}});
    for (const auto* d : t.of(role::dropout)) {
      p.push_back({"uint64_t " + t.seed(*d), t.seed(*d)});
      p.push_back({"uint64_t " + t.offset(*d), t.offset(*d)});
    }
  } else if (t.g.sketched) {
    p.insert(p.end(), {{"const float* s1", "s1"}, {"const float* s2", "s2"}});
    if (t.g.product_bias) p.push_back({"const float* b", "b"});
    p.insert(p.end(), {{"float* h", "h"}, {"float* y", "y"}, {"size_t batch", "batch"}, {"uint64_t sketch_seed", "sketch_seed"}});
    for (const auto* d : t.of(role::dropout)) {
      p.push_back({"uint64_t " + t.seed(*d), t.seed(*d)});
      p.push_back({"uint64_t " + t.offset(*d), t.offset(*d)});
    }
  } else if (t.g.product) {
    p.push_back({"const float* w", "w"});
    if (t.g.product_bias) p.push_back({"const float* b", "b"});
    p.push_back({"float* y", "y"});
    p.push_back({"size_t batch", "batch"});
    for (const auto* d : t.of(role::dropout)) {
      p.push_back({"uint64_t " + t.seed(*d), t.seed(*d)});
      p.push_back({"uint64_t " + t.offset(*d), t.offset(*d)});
    }
  } else if (t.g.elementwise) {
    for (const auto& b : t.biases()) p.push_back({"const float* " + b, b});
    p.push_back({"float* y", "y"});
    p.push_back({"size_t batch", "batch"});
    for (const auto* d : t.of(role::dropout)) {
      p.push_back({"uint64_t " + t.seed(*d), t.seed(*d)});
      p.push_back({"uint64_t " + t.offset(*d), t.offset(*d)});
    }
  } else if (t.row_role() == role::layer_norm) {
    p.insert(p.end(), {{"const float* weight", "weight"},
                       {"const float* bias", "bias"},
                       {"float* y", "y"},
                       {"float* mean", "mean"},
                       {"float* rstd", "rstd"},
                       {"size_t batch", "batch"},
                       {"float eps", "eps"}});
  } else if (t.pool() && t.row_role() == role::max_pool) {
    p.insert(p.end(), {{"float* y", "y"}, {"int32_t* argmax", "argmax"}, {"size_t batch", "batch"}});
  } else {
    p.insert(p.end(), {{"float* y", "y"}, {"size_t batch", "batch"}});
  }
  p.push_back({"cudaStream_t stream", "stream"});
  return p;
}

/// The backward launcher's parameters, in order.
inline std::vector<param> backward_params(const group_text& t) {
  std::vector<param> p;
  if (t.g.conv) {
    p = {{"const float* x", "x"}, {"const float* w", "w"}};
    if (t.g.norm)
      p.insert(p.end(), {{"const float* bn_weight", "bn_weight"},
                         {"const float* z", "z"},
                         {"const float* saved_mean", "saved_mean"},
                         {"const float* saved_rstd", "saved_rstd"}});
    p.insert(p.end(), {{"const float* y", "y"}, {"const float* dy", "dy"}, {"float* dx", "dx"}, {"float* dw", "dw"}});
    if (t.g.conv_bias) p.push_back({"float* db", "db"});
    if (t.g.norm) p.insert(p.end(), {{"float* dbn_weight", "dbn_weight"}, {"float* dbn_bias", "dbn_bias"}});
    p.push_back({"size_t batch", "batch"});
  } else if (t.g.sketched) {
    p = {{"const float* x", "x"},   {"const float* s1", "s1"}, {"const float* s2", "s2"}, {"const float* h", "h"},
         {"const float* y", "y"},   {"const float* dy", "dy"}, {"float* dx", "dx"},       {"float* ds1", "ds1"},
         {"float* ds2", "ds2"}};
    if (t.g.product_bias) p.push_back({"float* db", "db"});
    p.insert(p.end(), {{"size_t batch", "batch"}, {"uint64_t sketch_seed", "sketch_seed"}});
  } else if (t.g.product) {
    p = {{"const float* x", "x"}, {"const float* w", "w"}, {"const float* y", "y"}, {"const float* dy", "dy"},
         {"float* dx", "dx"},     {"float* dw", "dw"}};
    if (t.g.product_bias) p.push_back({"float* db", "db"});
    p.push_back({"size_t batch", "batch"});
  } else if (t.g.elementwise) {
    if (t.g.output_backward) {
      p.push_back({"const float* y", "y"});
    } else {
      p.push_back({"const float* x", "x"});
      for (const auto& b : t.biases()) p.push_back({"const float* " + b, b});
    }
    p.push_back({"const float* dy", "dy"});
    p.push_back({"float* dx", "dx"});
    for (const auto& b : t.biases()) p.push_back({"float* d" + b, "d" + b});
    p.push_back({"size_t batch", "batch"});
    if (!t.g.output_backward)
      for (const auto* d : t.of(role::dropout)) {
        p.push_back({"uint64_t " + t.seed(*d), t.seed(*d)});
        p.push_back({"uint64_t " + t.offset(*d), t.offset(*d)});
      }
  } else if (t.row_role() == role::layer_norm) {
    p = {{"const float* x", "x"},       {"const float* dy", "dy"},     {"const float* weight", "weight"},
         {"const float* mean", "mean"}, {"const float* rstd", "rstd"}, {"float* dx", "dx"},
         {"float* dweight", "dweight"}, {"float* dbias", "dbias"},     {"size_t batch", "batch"}};
  } else if (t.pool() && t.row_role() == role::max_pool) {
    p = {{"const float* dy", "dy"}, {"const int32_t* argmax", "argmax"}, {"float* dx", "dx"}, {"size_t batch", "batch"}};
  } else if (t.pool() || t.flatten()) {
    p = {{"const float* dy", "dy"}, {"float* dx", "dx"}, {"size_t batch", "batch"}};
  } else {
    p = {{"const float* y", "y"}, {"const float* dy", "dy"}, {"float* dx", "dx"}, {"size_t batch", "batch"}};
  }
  p.push_back({"cudaStream_t stream", "stream"});
  return p;
}

/// A convolution group's evaluation launcher's parameters (groups with a batch_norm): the
/// normalization folded into the weights.
inline std::vector<param> eval_params(const group_text& t) {
  std::vector<param> p{{"const float* x", "x"}, {"const float* w", "w"}};
  if (t.g.conv_bias) p.push_back({"const float* b", "b"});
  p.insert(p.end(), {{"const float* bn_weight", "bn_weight"},
                     {"const float* bn_bias", "bn_bias"},
                     {"const float* running_mean", "running_mean"},
                     {"const float* running_var", "running_var"},
                     {"float* y", "y"},
                     {"size_t batch", "batch"},
                     {"double eps", "eps"},
                     {"cudaStream_t stream", "stream"}});
  return p;
}

/// The parameters' C declarations.
inline std::vector<std::string> decls(const std::vector<param>& ps) {
  std::vector<std::string> v;
  for (const auto& p : ps) v.push_back(p.decl);
  return v;
}

/// check_arguments' call: the batch and every pointer parameter, named.
inline std::string check_call(const std::vector<param>& ps) {
  std::vector<std::string> v{"batch"};
  for (const auto& p : ps)
    if (p.decl.find('*') != std::string::npos) v.push_back("{\"" + p.name + "\", " + p.name + "}");
  v[1] = "{" + v[1];
  v.back() += "}";
  return wrap_call("    check_arguments", v, ";") + "\n";
}

/// The header's summary of the forward launcher (one paragraph).
inline std::string forward_summary(const group_text& t) {
  if (t.g.conv) {
    std::string s = "y " + t.conv_out() + " = " + t.formula() + " in training mode, as nn::conv_block's forward: x " +
                    t.image_in() + " (NCHW), w " + t.conv_weight_shape() + " (torch's Conv2d.weight)" +
                    (t.g.conv_bias ? ", b [" + std::to_string(t.g.out_channels) + "]" : "") +
                    ". The convolution is one matrix product over the implicit im2col of x, its output channels-last, "
                    "reordered to NCHW" + (t.g.conv_bias ? " with the bias" : "");
    if (t.g.norm)
      s += " into z (which the backward reads); batch_norm in training mode (torch's BatchNorm2d: bn_weight, bn_bias "
           "[C]) normalizes z by the batch's statistics, writes saved_mean and saved_rstd [C] for the backward and moves "
           "running_mean and running_var by momentum (eps added to the variance)";
    s += conv_tail_text(t) + ".";
    for (const auto* d : t.of(role::dropout))
      s += " The mask of the dropout (layer " + std::to_string(d->index) + ") is Philox stream (" + t.seed(*d) + ", " +
           t.offset(*d) + "), as nn::dropout's rng.";
    return s;
  }
  if (t.g.sketched) {
    std::string s = "y = " + t.formula() + " in training mode, as nn::sketched_block's forward: x " + t.in_rows() +
                    ", s1 [" + t.in_width() + ", " + t.lk() + "] = [S1_1 | ... | S1_L], s2 [" + t.lk() + ", " +
                    t.width() + "] = [S2_1; ...; S2_L]" + (t.g.product_bias ? ", b [" + t.width() + "]" : "") +
                    " (the layer's s1, s2, bias), y " + t.rows() + "; L = " + std::to_string(t.g.terms) +
                    ", k = " + std::to_string(t.g.rank) + ". Two matrix products: h = x [S1 | U2] [batch, " +
                    t.h_width() + "] (written to h, which the backward reads), then y from h [U1; S2] with the scale" +
                    (t.g.product_bias ? ", the bias" : "") +
                    (t.g.layers.size() > 1 ? " and the layers after the sketched one" : "") +
                    " in its epilogue. The sign sketches U1, U2 (+-1/sqrt(k)) are regenerated from Philox under "
                    "sketch_seed (the layer's sketch_seed), never stored: the CPU layer's signs bit for bit.";
    for (const auto* d : t.of(role::dropout))
      s += " The mask of the dropout (layer " + std::to_string(d->index) + ") is Philox stream (" + t.seed(*d) + ", " +
           t.offset(*d) + "), as nn::dropout's rng.";
    return s;
  }
  if (t.g.product) {
    std::string s = "y = " + t.formula() + " in training mode: x " + t.in_rows() + ", w " + t.weight_shape() +
                    " (torch's Linear.weight, [out, in])" + (t.g.product_bias ? ", b [" + t.width() + "]" : "") +
                    ", y " + t.rows() + "; one matrix product, " +
                    (t.g.layers.size() > 1 ? "the layers after the linear one in its epilogue." : "y written once.");
    for (const auto* d : t.of(role::dropout))
      s += " The mask of the dropout (layer " + std::to_string(d->index) + ") is Philox stream (" + t.seed(*d) + ", " +
           t.offset(*d) + "), as nn::dropout's rng.";
    return s;
  }
  if (t.g.elementwise) {
    std::string s = "y = " + t.formula() + " in training mode: x, y " + t.rows();
    if (!t.biases().empty()) s += ", " + join(t.biases(), ", ") + " [" + t.width() + "]";
    s += ".";
    for (const auto* d : t.of(role::dropout)) {
      s += " The mask of the dropout (layer " + std::to_string(d->index) + ") is Philox stream (" + t.seed(*d) + ", " +
           t.offset(*d) + "), as nn::dropout's rng";
      s += t.g.output_backward ? "." : "; the backward takes the same pair.";
    }
    return s;
  }
  if (t.pool()) {
    const bool max = t.row_role() == role::max_pool;
    return "y " + t.image_out() + " = " + (max ? "the maximum" : "the mean") + " of x " + t.image_in() + " over " +
           std::to_string(t.g.kernel) + " x " + std::to_string(t.g.kernel) + " windows at stride " +
           std::to_string(t.g.stride) + ", padding " + std::to_string(t.g.pad) + " (NCHW, as torch's " +
           (max ? "MaxPool2d" : "AvgPool2d") + "); a thread per output" +
           (max ? "; writes argmax (the index in its plane of each output's input, as the CPU layer) for the backward."
                : ".");
  }
  if (t.flatten())
    return "y = x, " + t.rows() + ": torch's Flatten keeps the bytes of an NCHW batch; a device copy (none when x == y).";
  if (t.row_role() == role::layer_norm)
    return "y = (x - mean) rstd weight + bias along each row (torch's LayerNorm): x, y " + t.rows() +
           ", weight, bias [" + t.width() + "]; writes each row's mean and rstd = 1 / sqrt(Var + eps) [batch] for "
           "the backward.";
  return "y = " + t.g.layers.front().name + "(x) along each row: x, y " + t.rows() + ".";
}

/// The header's summary of a convolution group's evaluation launcher.
inline std::string eval_summary(const group_text& t) {
  return "y " + t.conv_out() + " in evaluation mode, as nn::conv_block's folded forward: batch_norm folded into the "
         "convolution (s = bn_weight / sqrt(running_var + eps), w' = w s, b' = (b - running_mean) s + bn_bias, in double "
         "and rounded once, as the CPU block folds them), then one matrix product with " +
         std::string(t.conv_tail_size() ? "the tail in its epilogue" : "b' in its epilogue") +
         ", its channels-last output reordered to NCHW. Scratch of the stream-ordered allocator.";
}

/// The header's summary of the backward launcher (one paragraph).
inline std::string backward_summary(const group_text& t) {
  if (t.g.conv) {
    const std::string c = std::to_string(t.g.out_channels);
    return "dx " + t.image_in() + ", dw " + t.conv_weight_shape() + (t.g.conv_bias ? ", db [" + c + "]" : "") +
           (t.g.norm ? ", dbn_weight and dbn_bias [" + c + "]" : "") + " (overwritten) from the forward's x" +
           (t.g.norm ? ", z, saved_mean, saved_rstd" : "") + ", its output y and dy " + t.conv_out() + ": " +
           (t.conv_tail_size() ? "the tail's gradient from y and dy (masks read from y), " : "") +
           (t.g.norm ? "batch_norm's backward (a warp per channel), " : "") +
           "the gradient g of the convolution's output reordered channels-last" +
           (t.g.conv_bias ? ", db its per-channel sums" : "") +
           ", dw = g^T im2col(x) and dcol = g w (a matrix product each), dx gathered from dcol (no atomics). Scratch "
           "of the stream-ordered allocator.";
  }
  if (t.g.sketched) {
    return "dx " + t.in_rows() + ", ds1 [" + t.in_width() + ", " + t.lk() + "], ds2 [" + t.lk() + ", " + t.width() +
           "]" + (t.g.product_bias ? " and db [" + t.width() + "]" : "") +
           " (overwritten) from the forward's x, h, y, the factors and dy " + t.rows() +
           ", as nn::sketched_block's backward: the gradient g of the second product's output" +
           (t.g.product_bias ? " with db, its column sums," : "") +
           " in one pass (masks read from y); then ds2 = h[:, Lk:]^T g / (2L) and dh = g [U1; S2]^T / (2L), "
           "ds1 = x^T dh[:, :Lk] and dx = dh [S1 | U2]^T, a matrix product each; g " + t.rows() + " and dh [batch, " +
           t.h_width() + "] are scratch of the stream-ordered allocator.";
  }
  if (t.g.product) {
    return "dx " + t.in_rows() + ", dw " + t.weight_shape() + (t.g.product_bias ? " and db [" + t.width() + "]" : "") +
           " (overwritten) from the forward's input x, w, its output y and dy " + t.rows() + ": the gradient g of x W^T" +
           (t.g.product_bias ? " + b" : "") + " from y and dy" + (t.g.product_bias ? " with db, its column sums," : "") +
           " in one pass (masks read from y), then dx = g w and dw = g^T x, a matrix product each; g " + t.rows() +
           " is scratch of the stream-ordered allocator.";
  }
  if (t.g.elementwise) {
    std::string grads = "dx " + t.rows();
    if (!t.biases().empty()) {
      std::vector<std::string> d;
      for (const auto& b : t.biases()) d.push_back("d" + b);
      grads += " and " + join(d, ", ") + " [" + t.width() + "] (overwritten)";
    }
    if (t.g.output_backward)
      return grads + " from the forward's output y and dy " + t.rows() + "; the mask is read from y.";
    return grads + " from the forward's input x and dy " + t.rows() +
           "; the mask is regenerated from the forward's (seed, offset).";
  }
  if (t.pool())
    return "dx " + t.image_in() + " (overwritten) from dy " + t.image_out() +
           (t.row_role() == role::max_pool ? " and the forward's argmax" : "") +
           ": a thread per input element gathers the windows that hold it (no atomics; zero where none does).";
  if (t.flatten()) return "dx = dy, " + t.rows() + ": a device copy (none when dx == dy).";
  if (t.row_role() == role::layer_norm)
    return "dx " + t.rows() + ", dweight and dbias [" + t.width() +
           "] (overwritten) from x, dy, weight and the forward's mean and rstd.";
  return "dx " + t.rows() + " from the forward's output y and dy.";
}

/// One line per launcher for the files' opening comments.
inline std::string group_overview(const group_text& t) {
  std::string s = "// group " + std::to_string(t.g.index) + ", " + t.layer_range() + ": " + t.layer_list() + " on " +
                  t.extent() + "\n";
  const std::string fwd = t.launcher + "_fwd", bwd = t.launcher + "_bwd";
  if (t.g.conv) {
    s += "//   " + fwd + "  the product over im2col, NHWC -> NCHW" + (t.g.norm ? ", batch_norm (training)" : "") +
         (t.conv_tail_size() ? ", the tail" : "") + "\n";
    s += "//   " + bwd + "  " + (t.conv_tail_size() ? "the tail's gate, " : "") +
         (t.g.norm ? "batch_norm's backward, " : "") + "NCHW -> NHWC" + (t.g.conv_bias ? ", db" : "") +
         ", dW and dcol as products, dx gathered\n";
    if (t.g.norm)
      s += "//   " + t.launcher + "_eval  batch_norm folded into the weights, one product + epilogue, NHWC -> NCHW\n";
  } else if (t.g.sketched) {
    s += "//   " + fwd + "  h = x [S1 | U2], then y: two products" +
         (t.g.layers.size() > 1 ? " + epilogue" : "") + "\n";
    s += "//   " + bwd + "  g" + (t.g.product_bias ? ", db" : "") + " in one pass; dS2, dh, dS1, dx\n";
  } else if (t.g.product) {
    s += "//   " + fwd + "  y = " + t.formula() + ", one product" + (t.g.layers.size() > 1 ? " + epilogue" : "") + "\n";
    s += "//   " + bwd + "  g" + (t.g.product_bias ? ", db" : "") + " from y and dy, one pass; dx, dW, a product each\n";
  } else if (t.g.elementwise) {
    s += "//   " + fwd + "  y = " + t.formula() + ", one pass\n";
    s += "//   " + bwd + "  dx" + (t.biases().empty() ? "" : ", d" + join(t.biases(), ", d")) + " from " +
         (t.g.output_backward ? "y" : "x") + " and dy, one pass\n";
  } else if (t.pool()) {
    s += "//   " + fwd + "  a thread per output element\n";
    s += "//   " + bwd + "  a thread per input element\n";
  } else if (t.flatten()) {
    s += "//   " + fwd + "  a device copy\n";
    s += "//   " + bwd + "  a device copy\n";
  } else {
    s += "//   " + fwd + "  one warp per row\n";
    s += "//   " + bwd + "  one warp per row" + (t.row_role() == role::layer_norm ? ", then dweight, dbias" : "") + "\n";
  }
  return s;
}

// ---- the .cu: definitions of one group --------------------------------------------------------

/// The static_assert that the user's header still plans the chain into this group's type.
inline std::string plan_check(const group_text& t, const std::string& header, const std::string& stem) {
  std::string planned;
  if (t.chain.kind == spec_kind::chain)
    planned = "std::tuple_element_t<" + std::to_string(t.g.index) + ", " + t.chain.name + "::blocks_type>";
  else
    planned = t.chain.name;
  const std::string type = t.prefix + (t.g.elementwise || t.g.product || t.g.conv ? "block" : "layer");
  return "static_assert(std::is_same_v<" + type + ", " + planned + ">,\n              \"solder::gen: " + t.chain.name +
         " in " + header + " has changed since \"\n              \"" + stem + ".cu was generated; regenerate it\");\n";
}

/// An elementwise group's types, its block, its forward and backward writes and their passes.
inline std::string elementwise_definitions(const group_text& t, const std::string& header, const std::string& stem) {
  const std::string p = t.prefix, w = t.width();
  const auto biases = t.biases();
  std::string s;
  std::vector<std::string> types;
  for (const auto& l : t.g.layers) types.push_back(l.type);
  s += wrap_list("using " + p + "block = solder::nn::elementwise_block", '<', types, '>', ";") + "\n";
  s += plan_check(t, header, stem);
  s += biases.empty() ? "/// Device views of " + t.rows() + " rows.\n"
                      : "/// Device views of " + t.rows() + " rows and of [" + w + "] parameters.\n";
  s += "using " + p + "rows = solder::tensor_ref<const float, solder::shape<solder::dyn, " + w + ">, solder::device>;\n";
  s += "using " + p + "rows_out = solder::tensor_ref<float, solder::shape<solder::dyn, " + w + ">, solder::device>;\n";
  if (!biases.empty()) {
    s += "using " + p + "features = solder::tensor_ref<const float, solder::shape<" + w + ">, solder::device>;\n";
    s += "using " + p + "features_out = solder::tensor_ref<float, solder::shape<" + w + ">, solder::device>;\n";
  }
  s += "\n/// This thread's block: the layers' ops and dropout streams (the caller passes the parameters).\n";
  s += p + "block& " + p + "layers() {\n  thread_local " + p + "block block;\n  return block;\n}\n\n";

  // The forward: the block's expression, as nn::elementwise_block::forward assigns it.
  std::vector<std::string> args{"const " + p + "block& block", p + "rows x"};
  for (const auto& b : biases) args.push_back(p + "features " + b);
  args.push_back(p + "rows_out y");
  std::vector<std::string> leaves{"x"};
  leaves.insert(leaves.end(), biases.begin(), biases.end());
  s += "/// y = " + t.formula() + " in training mode, as nn::elementwise_block::forward.\n";
  s += wrap_call("auto " + p + "forward", args, " {") + "\n";
  s += "  return std::make_tuple(solder::write(y, block.expression<solder::nn::mode::train>(" + join(leaves, ", ") +
       ")));\n}\n";

  // The backward, as nn::elementwise_block::backward_from_output or ::backward computes it.
  args = {"const " + p + "block& block"};
  if (t.g.output_backward) {
    args.push_back(p + "rows y");
  } else {
    args.push_back(p + "rows x");
    for (const auto& b : biases) args.push_back(p + "features " + b);
  }
  args.push_back(p + "rows dy");
  args.push_back(p + "rows_out dx");
  for (const auto& b : biases) args.push_back(p + "features_out d" + b);
  std::vector<std::string> writes;
  if (t.g.output_backward) {
    s += "/// dx from the output y, and each bias gradient (the column sums of dx), as\n"
         "/// nn::elementwise_block::backward_from_output.\n";
    s += wrap_call("auto " + p + "backward", args, " {") + "\n";
    s += "  const auto g = block.gate_from_output<solder::nn::mode::train>(y, dy);\n";
    writes.push_back("solder::write(dx, g)");
    for (const auto& b : biases) writes.push_back("solder::write(d" + b + ", solder::sum_to<solder::shape<" + w + ">>(g))");
  } else {
    s += biases.empty() ? "/// dx by the vjp of the forward from x, the mask regenerated, as nn::elementwise_block::backward.\n"
                        : "/// dx and each bias gradient by the vjp of the forward from x, the mask regenerated, as\n"
                          "/// nn::elementwise_block::backward.\n";
    s += wrap_call("auto " + p + "backward", args, " {") + "\n";
    std::vector<std::string> lambda_params, lambda_args;
    for (const auto& l : leaves) {
      lambda_params.push_back("const auto& " + l + "v");
      lambda_args.push_back(l + "v");
    }
    s += wrap_call("  const auto forward = [&]", lambda_params, " {") + "\n";
    s += wrap_call("    return block.expression<solder::nn::mode::train>", lambda_args, ";") + "\n  };\n";
    std::vector<std::string> vjp_args{"forward", "dy"};
    vjp_args.insert(vjp_args.end(), leaves.begin(), leaves.end());
    s += wrap_call("  const auto grads = solder::vjp", vjp_args, ";") + "\n";
    writes.push_back("solder::write(dx, std::get<0>(grads))");
    for (std::size_t i = 0; i < biases.size(); ++i)
      writes.push_back("solder::write(d" + biases[i] + ", std::get<" + std::to_string(i + 1) + ">(grads))");
  }
  s += wrap_call("  return std::make_tuple", writes, ";") + "\n}\n\n";

  s += "using " + p + "forward_writes = returned<decltype(" + p + "forward)>::type;\n";
  s += "using " + p + "backward_writes = returned<decltype(" + p + "backward)>::type;\n";
  s += t.vector_path() ? "/// The passes run_writes picks from: 16-byte accesses where every pointer is aligned, element\n"
                         "/// by element otherwise.\n"
                       : "/// The passes run_writes runs: element by element, as rows of " + w +
                             " are not whole 16-byte vectors.\n";
  for (const char* dir : {"forward", "backward"}) {
    if (t.vector_path())
      s += "using " + p + dir + "_pass = pass_of<true, " + p + dir + "_writes>::type;\n";
    s += "using " + p + dir + "_pass_unaligned = pass_of<false, " + p + dir + "_writes>::type;\n";
  }
  return s;
}

/// A product group's types, its tail, the forward product with the tail as its epilogue, the
/// backward's gate writes and its two products, and their passes.
inline std::string product_definitions(const group_text& t, const std::string& header, const std::string& stem,
                                       bool own_launchers = true) {
  const std::string p = t.prefix, w = t.width(), in = t.in_width();
  const bool bias = t.g.product_bias;
  std::string s;
  std::vector<std::string> types;
  for (const auto& l : t.g.layers) types.push_back(l.type);
  s += wrap_list("using " + p + "block = solder::nn::linear_block", '<', types, '>', ";") + "\n";
  s += plan_check(t, header, stem);
  s += "/// The layers after the linear one: the ops and dropout streams of the epilogue and the gate.\n";
  s += "using " + p + "tail_type = " + p + "block::tail_type;\n";
  s += comment("/// ", "Device views of " + t.in_rows() + " and " + t.rows() + " rows, of the " + t.weight_shape() +
                           " weight's gradient" + (bias ? " and of [" + w + "] parameters" : "") + ".");
  s += "using " + p + "in_rows = solder::tensor_ref<const float, solder::shape<solder::dyn, " + in + ">, solder::device>;\n";
  s += "using " + p + "in_rows_out = solder::tensor_ref<float, solder::shape<solder::dyn, " + in + ">, solder::device>;\n";
  s += "using " + p + "rows = solder::tensor_ref<const float, solder::shape<solder::dyn, " + w + ">, solder::device>;\n";
  s += "using " + p + "rows_out = solder::tensor_ref<float, solder::shape<solder::dyn, " + w + ">, solder::device>;\n";
  s += "using " + p + "weight_out = solder::tensor_ref<float, solder::shape<" + w + ", " + in + ">, solder::device>;\n";
  if (bias) {
    s += "using " + p + "features = solder::tensor_ref<const float, solder::shape<" + w + ">, solder::device>;\n";
    s += "using " + p + "features_out = solder::tensor_ref<float, solder::shape<" + w + ">, solder::device>;\n";
  }
  s += "/// The products' tilings, by their output columns: " + w + " for y, " + in + " for dx and dW.\n";
  s += "using " + p + "out_tiling = solder::eval::cuda::product_tiling_for<" + w + ">;\n";
  s += "using " + p + "in_tiling = solder::eval::cuda::product_tiling_for<" + in + ">;\n";
  if (own_launchers) {
    s += "\n/// This thread's tail (the caller passes the parameters and the dropout streams).\n";
    s += p + "tail_type& " + p + "tail() {\n  thread_local " + p + "tail_type tail;\n  return tail;\n}\n";
  }
  s += "\n";

  // The forward: nn::linear_block::expression with the product as the accumulator leaf.
  std::vector<std::string> args{"const " + p + "tail_type& tail", p + "in_rows x", "const float* w"};
  if (bias) args.push_back(p + "features b");
  args.push_back(p + "rows_out y");
  s += comment("/// ", "y = " + t.formula() + " in training mode, as nn::linear_block::forward: the block's expression "
                           "tail(x W^T" + (bias ? " + b" : "") + ") with the product x W^T as the epilogue's "
                           "accumulator, W [" + w + ", " + in + "] read transposed.");
  s += wrap_call("auto " + p + "forward", args, " {") + "\n";
  s += "  const std::size_t batch = x.batch();\n";
  s += "  const auto z = product_value<solder::shape<solder::dyn, " + w + ">>(batch)" + (bias ? " + b" : "") + ";\n";
  s += wrap_call("  return product<" + p + "out_tiling>",
                 {"matrix_operand<false>{x.data(), " + in + "}", "matrix_operand<true>{w, " + in + "}", "batch", in,
                  "solder::write(y, tail.expression<solder::nn::mode::train>(z))"},
                 ";") +
       "\n}\n";

  // The gate pass, as nn::product_tail::gate does it from the output.
  args = {"const " + p + "tail_type& tail", p + "rows y", p + "rows dy", p + "rows_out g"};
  if (bias) args.push_back(p + "features_out db");
  s += std::string("/// g = dL/d(x W^T") + (bias ? " + b" : "") + ") from the output y" +
       (bias ? ", and db = the column sums of g in the same pass," : "") + " as\n/// nn::product_tail::gate.\n";
  s += wrap_call("auto " + p + "gate", args, " {") + "\n";
  s += "  const auto ge = tail.gate_from_output<solder::nn::mode::train>(y, dy);\n";
  std::vector<std::string> writes{"solder::write(g, ge)"};
  if (bias) writes.push_back("solder::write(db, solder::sum_to<solder::shape<" + w + ">>(ge))");
  s += wrap_call("  return std::make_tuple", writes, ";") + "\n}\n";

  // The two products of the backward, nn::linear_block's left_grad and right_grads.
  s += "/// dx [batch, " + in + "] = g W, W [" + w + ", " + in + "] as stored.\n";
  s += wrap_call("auto " + p + "input_grad", {p + "rows g", "const float* w", p + "in_rows_out dx"}, " {") + "\n";
  s += "  const std::size_t batch = g.batch();\n";
  s += wrap_call("  return product<" + p + "in_tiling>",
                 {"matrix_operand<false>{g.data(), " + w + "}", "matrix_operand<false>{w, " + in + "}", "batch", w,
                  "solder::write(dx, product_value<solder::shape<solder::dyn, " + in + ">>(batch))"},
                 ";") +
       "\n}\n";
  s += "/// dW [" + w + ", " + in + "] = g^T x, summed over the batch (the inner extent).\n";
  s += wrap_call("auto " + p + "weight_grad", {p + "rows g", p + "in_rows x", p + "weight_out dw"}, " {") + "\n";
  s += wrap_call("  return product<" + p + "in_tiling>",
                 {"matrix_operand<true>{g.data(), " + w + "}", "matrix_operand<false>{x.data(), " + in + "}", w,
                  "g.batch()", "solder::write(dw, product_value<solder::shape<" + w + ", " + in + ">>())"},
                 ";") +
       "\n}\n\n";

  s += "using " + p + "forward_pass = product_pass_of<returned<decltype(" + p + "forward)>::type>::type;\n";
  s += "using " + p + "input_grad_pass = product_pass_of<returned<decltype(" + p + "input_grad)>::type>::type;\n";
  s += "using " + p + "weight_grad_pass = product_pass_of<returned<decltype(" + p + "weight_grad)>::type>::type;\n";
  s += "using " + p + "gate_writes = returned<decltype(" + p + "gate)>::type;\n";
  s += t.vector_path() ? "/// The gate passes run_writes picks from: 16-byte accesses where every pointer is aligned,\n"
                         "/// element by element otherwise.\n"
                       : "/// The gate pass run_writes runs: element by element, as rows of " + w +
                             " are not whole 16-byte vectors.\n";
  if (t.vector_path()) s += "using " + p + "gate_pass = pass_of<true, " + p + "gate_writes>::type;\n";
  s += "using " + p + "gate_pass_unaligned = pass_of<false, " + p + "gate_writes>::type;\n";
  return s;
}

/// A sketched group's types, its sign sketches, its two forward products (the tail in the
/// second's epilogue), the backward's gate writes and its four products, and their passes: the
/// math of nn::sketched_block, with the factors [S1 | U2] and [U1; S2] as concatenated operands.
inline std::string sketched_definitions(const group_text& t, const std::string& header, const std::string& stem,
                                        bool own_launchers = true) {
  const std::string p = t.prefix, w = t.width(), in = t.in_width(), lk = t.lk(), hw = t.h_width();
  const std::string k = std::to_string(t.g.rank), terms = std::to_string(t.g.terms);
  const bool bias = t.g.product_bias;
  std::string s;
  std::vector<std::string> types;
  for (const auto& l : t.g.layers) types.push_back(l.type);
  s += wrap_list("using " + p + "block = solder::nn::sketched_block", '<', types, '>', ";") + "\n";
  s += plan_check(t, header, stem);
  s += "/// The sketched layer (its scales), and the layers after it: the ops and dropout streams of the\n"
       "/// epilogue and the gate.\n";
  s += "using " + p + "layer = " + t.g.layers.front().type + ";\n";
  s += "using " + p + "tail_type = " + p + "block::tail_type;\n";
  s += comment("/// ", "Device views of " + t.in_rows() + ", " + t.rows() + " and [batch, " + hw +
                           "] rows (x, y and h = x [S1 | U2]), of the gradients of s1 [" + in + ", " + lk +
                           "] and s2 [" + lk + ", " + w + "]" + (bias ? " and of [" + w + "] parameters" : "") + ".");
  const auto view = [&](const std::string& name, bool out, const std::string& shape) {
    s += "using " + p + name + " = solder::tensor_ref<" + (out ? "float" : "const float") + ", solder::shape<" + shape +
         ">, solder::device>;\n";
  };
  view("in_rows", false, "solder::dyn, " + in);
  view("in_rows_out", true, "solder::dyn, " + in);
  view("rows", false, "solder::dyn, " + w);
  view("rows_out", true, "solder::dyn, " + w);
  view("h_rows", false, "solder::dyn, " + hw);
  view("h_rows_out", true, "solder::dyn, " + hw);
  view("s1_out", true, in + ", " + lk);
  view("s2_out", true, lk + ", " + w);
  if (bias) {
    view("features", false, w);
    view("features_out", true, w);
  }
  s += "/// The products' tilings, by their output columns: " + hw + " for h and dh, " + w + " for y and dS2, " + in +
       " for dx, " + lk + " for dS1.\n";
  s += "using " + p + "h_tiling = solder::eval::cuda::product_tiling_for<" + hw + ">;\n";
  s += "using " + p + "out_tiling = solder::eval::cuda::product_tiling_for<" + w + ">;\n";
  s += "using " + p + "in_tiling = solder::eval::cuda::product_tiling_for<" + in + ">;\n";
  s += "using " + p + "lk_tiling = solder::eval::cuda::product_tiling_for<" + lk + ">;\n";
  s += comment("/// ", "The sign sketches as the products stage them: U1 = [U1_1; ...; U1_L] [" + lk + ", " + w +
                           "] (sketched_linear::u1_type) and U2 = [U2_1 | ... | U2_L] [" + in + ", " + lk +
                           "] (u2_type), and their transposes.");
  s += "using " + p + "u1 = solder::eval::cuda::sketch_operand<" + k + ", " + w + ", " + terms +
       ", solder::sketch_stack::rows, false>;\n";
  s += "using " + p + "u1_t = solder::eval::cuda::sketch_operand<" + k + ", " + w + ", " + terms +
       ", solder::sketch_stack::rows, true>;\n";
  s += "using " + p + "u2 = solder::eval::cuda::sketch_operand<" + in + ", " + k + ", " + terms +
       ", solder::sketch_stack::columns, false>;\n";
  s += "using " + p + "u2_t = solder::eval::cuda::sketch_operand<" + in + ", " + k + ", " + terms +
       ", solder::sketch_stack::columns, true>;\n";
  s += comment("/// ", "The sketches' Philox keys under the layer's sketch_seed, as sketched_linear::u1() and u2() "
                       "derive them, and their entries' magnitude 1/sqrt(k).");
  s += "struct " + p + "sketches {\n  std::uint64_t u1_seed, u2_seed;\n  float scale;\n};\n";
  s += p + "sketches " + p + "sketches_of(std::uint64_t sketch_seed) {\n";
  s += "  return {solder::random::derive_seed(sketch_seed, 0), solder::random::derive_seed(sketch_seed, 1),\n          " +
       p + "layer::sign_scale};\n}\n\n";
  if (own_launchers) {
    s += "/// This thread's tail (the caller passes the parameters and the dropout streams).\n";
    s += p + "tail_type& " + p + "tail() {\n  thread_local " + p + "tail_type tail;\n  return tail;\n}\n\n";
  }

  const std::string left = p + "left", right = p + "right", left_t = p + "left_t", right_t = p + "right_t";
  s += comment("/// ", "The factors as the products stage them: [S1 | U2] [" + in + ", " + hw + "] and [U1; S2] [" + hw +
                           ", " + w + "] (sketched_linear::left_factor, right_factor), and the transposes the "
                           "backward reads, [S1^T; U2^T] and [U1^T | S2^T].");
  const auto concat = [&](const std::string& name, const std::string& a, const std::string& b, const char* axis) {
    s += wrap_list("using " + name + " = solder::eval::cuda::concat_operand", '<',
                   {a, b, std::string("solder::sketch_stack::") + axis, lk}, '>', ";") + "\n";
  };
  concat(left, "matrix_operand<false>", p + "u2", "columns");
  concat(right, p + "u1", "matrix_operand<false>", "rows");
  concat(left_t, "matrix_operand<true>", p + "u2_t", "rows");
  concat(right_t, p + "u1_t", "matrix_operand<true>", "columns");
  s += "\n";

  // The forward's two products, as sketched_block::forward in training mode.
  s += comment("/// ", "h [batch, " + hw + "] = x [S1 | U2], the first product (sketched_linear::first_product), kept "
                       "for the backward.");
  s += wrap_call("auto " + p + "first", {p + "in_rows x", "const float* s1", "const " + p + "sketches& u", p + "h_rows_out h"}, " {") + "\n";
  s += "  const std::size_t batch = x.batch();\n";
  s += wrap_call("  return product<" + p + "h_tiling>",
                 {"matrix_operand<false>{x.data(), " + in + "}",
                  left + "{{s1, " + lk + "}, {u.u2_seed, u.scale}}", "batch", in,
                  "solder::write(h, product_value<solder::shape<solder::dyn, " + hw + ">>(batch))"},
                 ";") +
       "\n}\n";
  s += comment("/// ", "y = tail(h [U1; S2] / (2L)" + std::string(bias ? " + b" : "") +
                           ") in training mode, the second product with the block's expression as its epilogue "
                           "(sketched_block::forward: the product scaled, then the bias, then the tail).");
  std::vector<std::string> args{"const " + p + "tail_type& tail", p + "h_rows h", "const float* s2", "const " + p + "sketches& u"};
  if (bias) args.push_back(p + "features b");
  args.push_back(p + "rows_out y");
  s += wrap_call("auto " + p + "forward", args, " {") + "\n";
  s += "  const std::size_t batch = h.batch();\n";
  s += "  const auto z = product_value<solder::shape<solder::dyn, " + w + ">>(batch) * " + p + "layer::scale" +
       (bias ? " + b" : "") + ";\n";
  s += wrap_call("  return product<" + p + "out_tiling>",
                 {"matrix_operand<false>{h.data(), " + hw + "}", right + "{{u.u1_seed, u.scale}, {s2, " + w + "}}",
                  "batch", hw, "solder::write(y, tail.expression<solder::nn::mode::train>(z))"},
                 ";") +
       "\n}\n";

  // The gate pass, as nn::product_tail::gate does it from the output.
  args = {"const " + p + "tail_type& tail", p + "rows y", p + "rows dy", p + "rows_out g"};
  if (bias) args.push_back(p + "features_out db");
  s += comment("/// ", std::string("g = dL/dz of the second product's output z from y") +
                           (bias ? ", and db = the column sums of g in the same pass," : "") +
                           " as nn::product_tail::gate.");
  s += wrap_call("auto " + p + "gate", args, " {") + "\n";
  s += "  const auto ge = tail.gate_from_output<solder::nn::mode::train>(y, dy);\n";
  std::vector<std::string> writes{"solder::write(g, ge)"};
  if (bias) writes.push_back("solder::write(db, solder::sum_to<solder::shape<" + w + ">>(ge))");
  s += wrap_call("  return std::make_tuple", writes, ";") + "\n}\n";

  // The backward's four products, sketched_block::gradients and its dx.
  s += "/// dS2 [" + lk + ", " + w + "] = h[:, " + lk + ":]^T g / (2L), summed over the batch (the inner extent).\n";
  s += wrap_call("auto " + p + "s2_grad", {p + "h_rows h", p + "rows g", p + "s2_out ds2"}, " {") + "\n";
  s += wrap_call("  return product<" + p + "out_tiling>",
                 {"matrix_operand<true>{h.data() + " + lk + ", " + hw + "}", "matrix_operand<false>{g.data(), " + w + "}",
                  lk, "g.batch()", "solder::write(ds2, product_value<solder::shape<" + lk + ", " + w + ">>() * " + p + "layer::scale)"},
                 ";") +
       "\n}\n";
  s += "/// dh [batch, " + hw + "] = g [U1; S2]^T / (2L) = g [U1^T | S2^T] / (2L).\n";
  s += wrap_call("auto " + p + "h_grad", {p + "rows g", "const float* s2", "const " + p + "sketches& u", p + "h_rows_out dh"}, " {") + "\n";
  s += "  const std::size_t batch = g.batch();\n";
  s += wrap_call("  return product<" + p + "h_tiling>",
                 {"matrix_operand<false>{g.data(), " + w + "}", right_t + "{{u.u1_seed, u.scale}, {s2, " + w + "}}",
                  "batch", w,
                  "solder::write(dh, product_value<solder::shape<solder::dyn, " + hw + ">>(batch) * " + p + "layer::scale)"},
                 ";") +
       "\n}\n";
  s += "/// dS1 [" + in + ", " + lk + "] = x^T dh[:, :" + lk + "], summed over the batch (the inner extent).\n";
  s += wrap_call("auto " + p + "s1_grad", {p + "in_rows x", p + "h_rows dh", p + "s1_out ds1"}, " {") + "\n";
  s += wrap_call("  return product<" + p + "lk_tiling>",
                 {"matrix_operand<true>{x.data(), " + in + "}", "matrix_operand<false>{dh.data(), " + hw + "}", in,
                  "x.batch()", "solder::write(ds1, product_value<solder::shape<" + in + ", " + lk + ">>())"},
                 ";") +
       "\n}\n";
  s += "/// dx [batch, " + in + "] = dh [S1 | U2]^T = dh [S1^T; U2^T].\n";
  s += wrap_call("auto " + p + "input_grad", {p + "h_rows dh", "const float* s1", "const " + p + "sketches& u", p + "in_rows_out dx"}, " {") + "\n";
  s += "  const std::size_t batch = dh.batch();\n";
  s += wrap_call("  return product<" + p + "in_tiling>",
                 {"matrix_operand<false>{dh.data(), " + hw + "}", left_t + "{{s1, " + lk + "}, {u.u2_seed, u.scale}}",
                  "batch", hw, "solder::write(dx, product_value<solder::shape<solder::dyn, " + in + ">>(batch))"},
                 ";") +
       "\n}\n\n";

  for (const char* pass : {"first", "forward", "s2_grad", "h_grad", "s1_grad", "input_grad"})
    s += "using " + p + pass + "_pass = product_pass_of<returned<decltype(" + p + pass + ")>::type>::type;\n";
  s += "using " + p + "gate_writes = returned<decltype(" + p + "gate)>::type;\n";
  s += t.vector_path() ? "/// The gate passes run_writes picks from: 16-byte accesses where every pointer is aligned,\n"
                         "/// element by element otherwise.\n"
                       : "/// The gate pass run_writes runs: element by element, as rows of " + w +
                             " are not whole 16-byte vectors.\n";
  if (t.vector_path()) s += "using " + p + "gate_pass = pass_of<true, " + p + "gate_writes>::type;\n";
  s += "using " + p + "gate_pass_unaligned = pass_of<false, " + p + "gate_writes>::type;\n";
  return s;
}

/// A convolution group's types and bodies: the product over im2col (and, with a batch_norm, the
/// folded one of evaluation mode), the reorders, the normalization's bodies, the tail's passes,
/// the backward's two products, the bias sums and the gather.
inline std::string conv_definitions(const group_text& t, const std::string& header, const std::string& stem,
                                    bool own_launchers = true) {
  const auto n = [](std::size_t v) { return std::to_string(v); };
  const std::string p = t.prefix, cin = n(t.g.channels), cout = n(t.g.out_channels), k = n(t.taps());
  const std::string kh = n(t.g.kernel_h), kw = n(t.g.kernel_w), plane = n(t.out_plane());
  const std::string ho = n(t.g.out_height), wo = n(t.g.out_cols);
  const bool tail = t.conv_tail_size() > 0;
  std::string s;
  std::vector<std::string> types;
  for (const auto& l : t.g.layers) types.push_back(l.type);
  s += wrap_list("using " + p + "block = solder::nn::conv_block", '<', types, '>', ";") + "\n";
  s += plan_check(t, header, stem);
  s += "/// The layers after the convolution" + std::string(t.g.norm ? " and its batch_norm" : "") +
       ": the tail's ops and dropout streams.\n";
  s += "using " + p + "tail_type = " + p + "block::tail_type;\n";
  s += "/// The convolution's geometry, as the CPU layer's, and its input as the product's A' = im2col(x).\n";
  s += "using " + p + "geometry = solder::ops::conv2d_geometry<" +
       join({n(t.g.height), n(t.g.cols), kh, kw, n(t.g.stride), n(t.g.pad), n(t.g.dilation)}, ", ") + ">;\n";
  s += "using " + p + "im2col = solder::eval::cuda::im2col_operand<" + p + "geometry, " + cin + ", " + kh + ", " + kw +
       ", false>;\n";
  s += comment("/// ", "Device views: the output images as rows of " + n(t.g.width) + " floats (NCHW), the product's "
                       "output channels-last [batch " + ho + " " + wo + ", " + cout + "], the columns of dcol [batch " +
                       ho + " " + wo + ", " + k + "], the weight's gradient [" + cout + ", " + k + "]" +
                       (t.g.norm ? " and the folded bias [" + cout + "]" : "") + ".");
  const auto view = [&](const std::string& name, bool out, const std::string& shape) {
    s += "using " + p + name + " = solder::tensor_ref<" + (out ? "float" : "const float") + ", solder::shape<" + shape +
         ">, solder::device>;\n";
  };
  if (tail) {
    view("rows", false, "solder::dyn, " + n(t.g.width));
    view("rows_out", true, "solder::dyn, " + n(t.g.width));
  }
  view("pixels", false, "solder::dyn, " + cout);
  view("pixels_out", true, "solder::dyn, " + cout);
  view("columns_out", true, "solder::dyn, " + k);
  view("weight_out", true, cout + ", " + k);
  if (t.g.norm) view("features", false, cout);
  s += "/// The products' tilings, by their output columns: " + cout + " for the convolution, " + k + " for dW and dcol.\n";
  s += "using " + p + "out_tiling = solder::eval::cuda::product_tiling_for<" + cout + ">;\n";
  s += "using " + p + "in_tiling = solder::eval::cuda::product_tiling_for<" + k + ">;\n";
  s += "/// The bodies of eval/cuda/layout.hpp, batch_norm.hpp and col2im.hpp on these extents.\n";
  s += "using " + p + "to_nchw = solder::eval::cuda::nhwc_to_nchw_body<" + cout + ", " + ho + ", " + wo + ">;\n";
  s += "using " + p + "to_nhwc = solder::eval::cuda::nchw_to_nhwc_body<" + cout + ", " + ho + ", " + wo + ">;\n";
  if (t.g.conv_bias)
    s += "using " + p + "bias_sums = solder::eval::cuda::channel_sums_body<" + cout + ", " + ho + ", " + wo + ", true>;\n";
  if (t.g.norm) {
    s += "using " + p + "norm_forward = solder::eval::cuda::batch_norm_train_forward_body<" + plane + ">;\n";
    s += "using " + p + "norm_backward = solder::eval::cuda::batch_norm_train_backward_body<" + plane + ">;\n";
    s += "using " + p + "fold = solder::eval::cuda::batch_norm_fold_body<" + k + ">;\n";
  }
  s += "using " + p + "col2im = solder::eval::cuda::col2im_pass<" + p + "geometry, " + cin + ", " + kh + ", " + kw + ">;\n";
  if (own_launchers && !t.of(role::dropout).empty()) {
    s += "\n/// This thread's tail (the caller passes the dropout streams).\n";
    s += p + "tail_type& " + p + "tail() {\n  thread_local " + p + "tail_type tail;\n  return tail;\n}\n";
  }
  s += "\n";

  s += comment("/// ", "c [batch " + ho + " " + wo + ", " + cout + "] = im2col(x) W^T: the convolution as one product, "
                       "W [" + cout + ", " + k + "] (torch's weight, flattened) read transposed; its output channels-last.");
  s += wrap_call("auto " + p + "conv", {"const float* x", "const float* w", p + "pixels_out c"}, " {") + "\n";
  s += "  const std::size_t m = c.batch();\n";
  s += wrap_call("  return product<" + p + "out_tiling>",
                 {p + "im2col{x}", "matrix_operand<true>{w, " + k + "}", "m", k,
                  "solder::write(c, product_value<solder::shape<solder::dyn, " + cout + ">>(m))"},
                 ";") +
       "\n}\n";
  if (t.g.norm) {
    s += comment("/// ", "c = tail(im2col(x) W'^T + b') in evaluation mode: the convolution with the normalization "
                         "folded into W' and b', the tail in the product's epilogue (conv_block's folded forward).");
    s += wrap_call("auto " + p + "folded",
                   {"const " + p + "tail_type& tail", "const float* x", "const float* wf", p + "features bf", p + "pixels_out c"},
                   " {") + "\n";
    s += "  const std::size_t m = c.batch();\n";
    s += "  const auto z = product_value<solder::shape<solder::dyn, " + cout + ">>(m) + bf;\n";
    s += wrap_call("  return product<" + p + "out_tiling>",
                   {p + "im2col{x}", "matrix_operand<true>{wf, " + k + "}", "m", k,
                    "solder::write(c, tail.expression<solder::nn::mode::eval>(z))"},
                   ";") +
         "\n}\n";
  }
  if (tail) {
    s += "/// y = tail(u) in training mode, one elementwise pass over the NCHW images.\n";
    s += wrap_call("auto " + p + "tail_forward", {"const " + p + "tail_type& tail", p + "rows u", p + "rows_out y"}, " {") + "\n";
    s += "  return std::make_tuple(solder::write(y, tail.expression<solder::nn::mode::train>(u)));\n}\n";
    s += "/// The tail's gradient from its output y, as nn::conv_block's backward reads it.\n";
    s += wrap_call("auto " + p + "gate", {"const " + p + "tail_type& tail", p + "rows y", p + "rows dy", p + "rows_out g"}, " {") + "\n";
    s += "  return std::make_tuple(solder::write(g, tail.gate_from_output<solder::nn::mode::train>(y, dy)));\n}\n";
  }
  s += "/// dW [" + cout + ", " + k + "] = g^T im2col(x), summed over the batch's output pixels (the inner extent).\n";
  s += wrap_call("auto " + p + "weight_grad", {p + "pixels g", "const float* x", p + "weight_out dw"}, " {") + "\n";
  s += wrap_call("  return product<" + p + "in_tiling>",
                 {"matrix_operand<true>{g.data(), " + cout + "}", p + "im2col{x}", cout, "g.batch()",
                  "solder::write(dw, product_value<solder::shape<" + cout + ", " + k + ">>())"},
                 ";") +
       "\n}\n";
  s += "/// dcol [batch " + ho + " " + wo + ", " + k + "] = g W, each window's gradient per tap (gathered into dx).\n";
  s += wrap_call("auto " + p + "input_grad", {p + "pixels g", "const float* w", p + "columns_out dcol"}, " {") + "\n";
  s += "  const std::size_t m = g.batch();\n";
  s += wrap_call("  return product<" + p + "in_tiling>",
                 {"matrix_operand<false>{g.data(), " + cout + "}", "matrix_operand<false>{w, " + k + "}", "m", cout,
                  "solder::write(dcol, product_value<solder::shape<solder::dyn, " + k + ">>(m))"},
                 ";") +
       "\n}\n\n";
  s += "using " + p + "conv_pass = product_pass_of<returned<decltype(" + p + "conv)>::type>::type;\n";
  if (t.g.norm) s += "using " + p + "folded_pass = product_pass_of<returned<decltype(" + p + "folded)>::type>::type;\n";
  s += "using " + p + "weight_grad_pass = product_pass_of<returned<decltype(" + p + "weight_grad)>::type>::type;\n";
  s += "using " + p + "input_grad_pass = product_pass_of<returned<decltype(" + p + "input_grad)>::type>::type;\n";
  if (tail) {
    for (const char* pass : {"tail_forward", "gate"}) {
      s += "using " + p + pass + "_writes = returned<decltype(" + p + pass + ")>::type;\n";
      if (t.vector_path()) s += "using " + p + pass + "_pass = pass_of<true, " + p + pass + "_writes>::type;\n";
      s += "using " + p + pass + "_pass_unaligned = pass_of<false, " + p + pass + "_writes>::type;\n";
    }
  }
  return s;
}

/// A row group's layer type and the row bodies of eval/cuda/row.hpp it runs.
inline std::string row_definitions(const group_text& t, const std::string& header, const std::string& stem) {
  const std::string p = t.prefix, w = t.width();
  std::string s = "using " + p + "layer = " + t.block_type() + ";\n";
  s += plan_check(t, header, stem);
  if (t.flatten()) return s;
  if (t.pool()) {
    const std::string kind = t.row_role() == role::max_pool ? "max" : "avg";
    const auto n = [](std::size_t v) { return std::to_string(v); };
    s += "/// The extents of one sample, as the CPU layer takes them from its shapes.\n";
    s += "constexpr solder::ops::pool2d::geometry " + p + "geometry{" +
         join({n(t.g.channels), n(t.g.height), n(t.g.cols), n(t.g.out_height), n(t.g.out_cols), n(t.g.kernel),
               n(t.g.stride), n(t.g.pad)}, ", ") + "};\n";
    s += "constexpr bool " + p + "count_include_pad = " + (t.g.count_include_pad ? "true" : "false") + ";\n";
    s += "using " + p + "forward_body = solder::eval::cuda::pool_forward_body<solder::eval::cuda::pool_kind::" + kind +
         ">;\n";
    s += "using " + p + "backward_body = solder::eval::cuda::pool_backward_body<solder::eval::cuda::pool_kind::" + kind +
         ">;\n";
    return s;
  }
  if (t.row_role() == role::layer_norm) {
    s += "using " + p + "forward_body = solder::eval::cuda::layer_norm_forward_body<" + w + ">;\n";
    s += "using " + p + "backward_body = solder::eval::cuda::layer_norm_backward_body<" + w + ">;\n";
  } else {
    const std::string op = t.row_role() == role::softmax ? "solder::ops::softmax" : "solder::ops::log_softmax";
    s += "using " + p + "forward_body = solder::eval::cuda::softmax_forward_body<" + op + ", " + w + ">;\n";
    s += "using " + p + "backward_body = solder::eval::cuda::softmax_backward_body<" + op + ", " + w + ">;\n";
  }
  return s;
}

/// The explicit instantiations of one group's kernels, each line once per file.
inline std::string instantiations(const group_text& t, const std::string& ns, std::set<std::string>& done) {
  std::string s;
  auto emit = [&](const std::string& kernel, const std::string& args, const std::string& param) {
    const std::string head = "template __global__ void solder::eval::cuda::" + kernel + "<";
    std::string line = head + args + ">(" + param + ");";
    if (line.size() > 110) line = head + args + ">(\n    " + param + ");";
    if (line.find('\n') > 110) line = head + "\n    " + args + ">(\n    " + param + ");";
    if (done.insert(line).second) s += line + "\n";
  };
  const std::string q = ns + "::" + t.prefix;
  // The kernels of one elementwise pass `name` (q + name + "_pass", "_pass_unaligned") with
  // `columns` column sums.
  auto pass_kernels = [&](const std::string& name, std::size_t columns) {
    for (const char* variant : {"_pass", "_pass_unaligned"}) {
      if (std::string_view(variant) == "_pass" && !t.vector_path()) continue;
      const std::string pass = q + name + variant;
      if (columns == 0) {
        emit("flat_kernel", pass, pass);
        continue;
      }
      std::vector<std::string> ws;
      for (std::size_t k = 1; k <= columns; ++k) ws.push_back(std::to_string(k));
      emit("column_kernel", pass + ", float, " + join(ws, ", "), pass);
      for (const auto& k : ws) emit("column_finish_kernel", pass + ", " + k, pass);
    }
  };
  if (t.g.conv) {
    const std::string g = "// group " + std::to_string(t.g.index) + ", ";
    const std::string plane = std::to_string(t.out_plane()), cout = std::to_string(t.g.out_channels);
    // The reorders run as tiles where both sides are at least 8 wide (batched_transpose::tiled).
    const bool tiled = t.out_plane() >= 8 && t.g.out_channels >= 8;
    // The bodies by their full types: two groups' aliases may name the same one, which must be
    // instantiated once.
    const auto n = [](std::size_t v) { return std::to_string(v); };
    const std::string ecu = "solder::eval::cuda::", image = cout + ", " + n(t.g.out_height) + ", " + n(t.g.out_cols);
    const std::string geometry = "solder::ops::conv2d_geometry<" +
                                 join({n(t.g.height), n(t.g.cols), n(t.g.kernel_h), n(t.g.kernel_w), n(t.g.stride),
                                       n(t.g.pad), n(t.g.dilation)}, ", ") + ">";
    const std::map<std::string, std::string> full{
        {"to_nchw", ecu + "nhwc_to_nchw_body<" + image + ">"},
        {"to_nhwc", ecu + "nchw_to_nhwc_body<" + image + ">"},
        {"bias_sums", ecu + "channel_sums_body<" + image + ", true>"},
        {"norm_forward", ecu + "batch_norm_train_forward_body<" + plane + ">"},
        {"norm_backward", ecu + "batch_norm_train_backward_body<" + plane + ">"},
        {"fold", ecu + "batch_norm_fold_body<" + n(t.taps()) + ">"},
        {"col2im", ecu + "col2im_pass<" + geometry + ", " + n(t.g.channels) + ", " + n(t.g.kernel_h) + ", " +
                       n(t.g.kernel_w) + ">"}};
    auto body_kernel = [&](const char* kernel, const std::string& body) {
      emit(kernel, full.at(body), full.at(body) + ", std::size_t");
    };
    auto reorder = [&](const std::string& body, const std::string& r, const std::string& c) {
      if (tiled)
        emit("transpose_kernel", r + ", " + c, "solder::eval::cuda::batched_transpose<" + r + ", " + c + ">");
      else
        body_kernel("elementwise_kernel", body);
    };
    s += g + "forward: the product over im2col, the reorder to NCHW" + (t.g.norm ? ", batch_norm" : "") +
         (t.conv_tail_size() ? ", the tail" : "") + "\n";
    emit("product_kernel", q + "conv_pass", q + "conv_pass");
    reorder("to_nchw", plane, cout);
    if (t.g.norm) body_kernel("row_kernel", "norm_forward");
    if (t.conv_tail_size()) pass_kernels("tail_forward", 0);
    if (t.g.norm) {
      s += g + "evaluation: the fold, the folded product with the tail in its epilogue, the reorder\n";
      body_kernel("elementwise_kernel", "fold");
      emit("product_kernel", q + "folded_pass", q + "folded_pass");
    }
    s += g + "backward: " + (t.conv_tail_size() ? "the tail's gate, " : "") +
         (t.g.norm ? "batch_norm's backward, " : "") + "the reorder to NHWC" + (t.g.conv_bias ? ", db" : "") +
         ", dW and dcol, the gather\n";
    if (t.conv_tail_size()) pass_kernels("gate", 0);
    if (t.g.norm) body_kernel("row_kernel", "norm_backward");
    reorder("to_nhwc", cout, plane);
    if (t.g.conv_bias) body_kernel("row_kernel", "bias_sums");
    emit("product_kernel", q + "weight_grad_pass", q + "weight_grad_pass");
    emit("product_kernel", q + "input_grad_pass", q + "input_grad_pass");
    body_kernel("elementwise_kernel", "col2im");
  } else if (t.g.sketched) {
    const std::string g = "// group " + std::to_string(t.g.index) + ", ";
    s += g + "forward: h = x [S1 | U2], then h [U1; S2] with the tail in its epilogue\n";
    emit("product_kernel", q + "first_pass", q + "first_pass");
    emit("product_kernel", q + "forward_pass", q + "forward_pass");
    s += g + "backward: the gate" + (t.g.product_bias ? "'s column walk, then db's finish" : "'s elementwise walk") +
         "; then the products dS2, dh, dS1 and dx\n";
    pass_kernels("gate", t.g.product_bias ? 1 : 0);
    for (const char* pass : {"s2_grad_pass", "h_grad_pass", "s1_grad_pass", "input_grad_pass"})
      emit("product_kernel", q + pass, q + pass);
  } else if (t.g.product) {
    const std::string g = "// group " + std::to_string(t.g.index) + ", ";
    s += g + "forward: one product, the tail in its epilogue\n";
    emit("product_kernel", q + "forward_pass", q + "forward_pass");
    s += g + "backward: the gate" + (t.g.product_bias ? "'s column walk, then db's finish" : "'s elementwise walk") +
         "; then the products dx = g W and dW = g^T x\n";
    pass_kernels("gate", t.g.product_bias ? 1 : 0);
    emit("product_kernel", q + "input_grad_pass", q + "input_grad_pass");
    emit("product_kernel", q + "weight_grad_pass", q + "weight_grad_pass");
  } else if (t.g.elementwise) {
    const std::size_t columns = t.biases().size();
    for (const char* dir : {"forward", "backward"}) {
      const bool column_walk = std::string_view(dir) == "backward" && columns > 0;
      s += "// group " + std::to_string(t.g.index) + ", " + dir + ": " +
           (column_walk ? "the column walk, then each column sum's finish" : "the elementwise walk") + "\n";
      pass_kernels(dir, column_walk ? columns : 0);
    }
  } else if (t.pool()) {
    s += "// group " + std::to_string(t.g.index) + ": a thread per output forward, per input backward\n";
    emit("elementwise_kernel", q + "forward_body", q + "forward_body, std::size_t");
    emit("elementwise_kernel", q + "backward_body", q + "backward_body, std::size_t");
  } else if (t.flatten()) {
    s += "// group " + std::to_string(t.g.index) + ": device copies, no kernel of its own\n";
  } else {
    s += "// group " + std::to_string(t.g.index) + ": one warp per row each way" +
         (t.row_role() == role::layer_norm ? ", then the parameter gradients' sums over the row chunks" : "") + "\n";
    emit("row_kernel", q + "forward_body", q + "forward_body, std::size_t");
    emit("row_kernel", q + "backward_body", q + "backward_body, std::size_t");
    if (t.row_role() == role::layer_norm)
      emit("elementwise_kernel", "solder::eval::cuda::layer_norm_param_grad_body",
           "solder::eval::cuda::layer_norm_param_grad_body, std::size_t");
  }
  return s;
}

/// The launchers of one group.
inline std::string launchers(const group_text& t) {
  const std::string p = t.prefix;
  std::string s;
  const auto fwd = forward_params(t), bwd = backward_params(t);
  auto open = [&](const std::string& name, const std::vector<param>& ps) {
    return wrap_call("extern \"C\" int " + name, decls(ps), " {") + "\n  return guarded(\"" + name + "\", [&] {\n" +
           check_call(ps);
  };
  const std::string close = "  });\n}\n";
  auto set_streams = [&] {
    std::string r;
    for (const auto* d : t.of(role::dropout))
      r += "    std::get<" + std::to_string(t.held_at(*d)) + ">(" + (t.g.product ? "tail" : "block") +
           ".layers).rng = {" + t.seed(*d) + ", " + t.offset(*d) + "};\n";
    return r;
  };
  const std::string w = t.width();
  if (t.g.conv) {
    const std::string m = "batch * " + std::to_string(t.out_plane()), cout = std::to_string(t.g.out_channels);
    const std::string k = std::to_string(t.taps()), rows = "batch * " + w;
    const bool tail = t.conv_tail_size() > 0;
    const std::string bias = t.g.conv_bias ? "b" : "nullptr";
    // Forward, training.
    s += open(t.launcher + "_fwd", fwd) + "    solder::eval::cuda::require_device_once();\n";
    if (!t.of(role::dropout).empty()) s += "    " + p + "tail_type& tail = " + p + "tail();\n" + set_streams();
    else if (tail) s += "    const " + p + "tail_type tail{};\n";
    s += "    // The product's channels-last output" + std::string(tail ? " and the tail's input" : "") +
         "; freed on the stream\n    // after the passes that read them.\n";
    s += "    const auto c = solder::eval::cuda::device_array<float>::allocate(" + m + " * " + cout + ", stream);\n";
    if (tail) s += "    const auto u = solder::eval::cuda::device_array<float>::allocate(" + rows + ", stream);\n";
    s += "    run_product(stream, " + p + "conv(x, w, " + p + "pixels_out(c.data(), " + m + ")));\n";
    const std::string conv_out = t.g.norm ? "z" : tail ? "u.data()" : "y";
    s += "    solder::eval::cuda::nhwc_to_nchw(" + p + "to_nchw{c.data(), " + conv_out + ", batch, " + bias + "}, stream);\n";
    if (t.g.norm) {
      s += wrap_list("    const " + p + "norm_forward norm", '{',
                     {"z", tail ? "u.data()" : "y", "bn_weight", "bn_bias", "running_mean", "running_var", "saved_mean",
                      "saved_rstd", "batch", cout, "eps", "momentum"},
                     '}', ";") + "\n";
      s += "    solder::eval::cuda::batch_norm_train_forward(norm, stream);\n";
    }
    if (tail) s += "    run(stream, " + p + "tail_forward(tail, " + p + "rows(u.data(), batch), " + p + "rows_out(y, batch)));\n";
    s += close + "\n";

    // Backward.
    s += open(t.launcher + "_bwd", bwd) + "    solder::eval::cuda::require_device_once();\n";
    s += "    // Scratch, freed on the stream after the passes that read it: the tail's gradient, the\n"
         "    // normalization's, the convolution output's gradient channels-last, dcol.\n";
    std::string grad = "dy";
    if (tail) {
      s += "    const " + p + "tail_type tail{};\n";
      s += "    const auto gu = solder::eval::cuda::device_array<float>::allocate(" + rows + ", stream);\n";
      s += "    run(stream, " + p + "gate(tail, " + p + "rows(y, batch), " + p + "rows(dy, batch), " + p +
           "rows_out(gu.data(), batch)));\n";
      grad = "gu.data()";
    }
    if (t.g.norm) {
      s += "    const auto gz = solder::eval::cuda::device_array<float>::allocate(" + rows + ", stream);\n";
      s += wrap_list("    const " + p + "norm_backward norm", '{',
                     {"z", grad, "gz.data()", "bn_weight", "saved_mean", "saved_rstd", "dbn_weight", "dbn_bias", "batch", cout},
                     '}', ";") + "\n";
      s += "    solder::eval::cuda::batch_norm_train_backward(norm, stream);\n";
      grad = "gz.data()";
    }
    s += "    const auto g = solder::eval::cuda::device_array<float>::allocate(" + m + " * " + cout + ", stream);\n";
    s += "    solder::eval::cuda::nchw_to_nhwc(" + p + "to_nhwc{" + grad + ", g.data(), batch}, stream);\n";
    if (t.g.conv_bias) s += "    solder::eval::cuda::channel_sums(" + p + "bias_sums{g.data(), db, batch}, stream);\n";
    s += "    run_product(stream, " + p + "weight_grad(" + p + "pixels(g.data(), " + m + "), x, " + p + "weight_out(dw)));\n";
    s += "    const auto dcol = solder::eval::cuda::device_array<float>::allocate(" + m + " * " + k + ", stream);\n";
    s += "    run_product(stream, " + p + "input_grad(" + p + "pixels(g.data(), " + m + "), w, " + p + "columns_out(dcol.data(), " +
         m + ")));\n";
    s += "    solder::eval::cuda::run_col2im(stream, " + p + "col2im{dcol.data(), dx, batch});\n" + close;

    if (t.g.norm) {
      // Evaluation: folded.
      s += "\n" + open(t.launcher + "_eval", eval_params(t)) + "    solder::eval::cuda::require_device_once();\n";
      s += "    const " + p + "tail_type tail{};\n";
      s += "    // W', b' and the product's channels-last output; freed on the stream after the passes that\n"
           "    // read them.\n";
      s += "    const auto wf = solder::eval::cuda::device_array<float>::allocate(" + cout + " * " + k + ", stream);\n";
      s += "    const auto bf = solder::eval::cuda::device_array<float>::allocate(" + cout + ", stream);\n";
      s += "    const auto c = solder::eval::cuda::device_array<float>::allocate(" + m + " * " + cout + ", stream);\n";
      s += wrap_list("    const " + p + "fold fold", '{',
                     {"w", bias, "bn_weight", "bn_bias", "running_mean", "running_var", "wf.data()", "bf.data()", cout, "eps"},
                     '}', ";") + "\n";
      s += "    solder::eval::cuda::batch_norm_fold(fold, stream);\n";
      s += "    run_product(stream, " + p + "folded(tail, x, wf.data(), " + p + "features(bf.data()), " + p +
           "pixels_out(c.data(), " + m + ")));\n";
      s += "    solder::eval::cuda::nhwc_to_nchw(" + p + "to_nchw{c.data(), y, batch}, stream);\n" + close;
    }
  } else if (t.g.sketched) {
    std::vector<std::string> args{"tail", p + "h_rows(h, batch)", "s2", "u"};
    if (t.g.product_bias) args.push_back(p + "features(b)");
    args.push_back(p + "rows_out(y, batch)");
    s += open(t.launcher + "_fwd", fwd) + "    solder::eval::cuda::require_device_once();\n    " + p +
         "tail_type& tail = " + p + "tail();\n" + set_streams();
    s += "    const " + p + "sketches u = " + p + "sketches_of(sketch_seed);\n";
    s += wrap_call("    run_product(stream, " + p + "first", {p + "in_rows(x, batch)", "s1", "u", p + "h_rows_out(h, batch)"},
                   ");") + "\n";
    s += wrap_call("    run_product(stream, " + p + "forward", args, ");") + "\n" + close + "\n";

    std::vector<std::string> gargs{"tail", p + "rows(y, batch)", p + "rows(dy, batch)", p + "rows_out(g.data(), batch)"};
    if (t.g.product_bias) gargs.push_back(p + "features_out(db)");
    s += open(t.launcher + "_bwd", bwd) + "    solder::eval::cuda::require_device_once();\n    const " + p +
         "tail_type& tail = " + p + "tail();\n";
    s += "    const " + p + "sketches u = " + p + "sketches_of(sketch_seed);\n";
    s += "    // Freed on the stream after the products that read them.\n";
    s += "    const auto g = solder::eval::cuda::device_array<float>::allocate(batch * " + w + ", stream);\n";
    s += "    const auto dh = solder::eval::cuda::device_array<float>::allocate(batch * " + t.h_width() + ", stream);\n";
    s += wrap_call("    run(stream, " + p + "gate", gargs, ");") + "\n";
    s += wrap_call("    run_product(stream, " + p + "s2_grad", {p + "h_rows(h, batch)", p + "rows(g.data(), batch)", p + "s2_out(ds2)"},
                   ");") + "\n";
    s += wrap_call("    run_product(stream, " + p + "h_grad",
                   {p + "rows(g.data(), batch)", "s2", "u", p + "h_rows_out(dh.data(), batch)"}, ");") + "\n";
    s += wrap_call("    run_product(stream, " + p + "s1_grad",
                   {p + "in_rows(x, batch)", p + "h_rows(dh.data(), batch)", p + "s1_out(ds1)"}, ");") + "\n";
    s += wrap_call("    run_product(stream, " + p + "input_grad",
                   {p + "h_rows(dh.data(), batch)", "s1", "u", p + "in_rows_out(dx, batch)"}, ");") + "\n" + close;
  } else if (t.g.product) {
    std::vector<std::string> args{"tail", p + "in_rows(x, batch)", "w"};
    if (t.g.product_bias) args.push_back(p + "features(b)");
    args.push_back(p + "rows_out(y, batch)");
    s += open(t.launcher + "_fwd", fwd) + "    solder::eval::cuda::require_device_once();\n    " + p +
         "tail_type& tail = " + p + "tail();\n" + set_streams();
    s += wrap_call("    run_product(stream, " + p + "forward", args, ");") + "\n" + close + "\n";

    std::vector<std::string> gargs{"tail", p + "rows(y, batch)", p + "rows(dy, batch)", p + "rows_out(g.data(), batch)"};
    if (t.g.product_bias) gargs.push_back(p + "features_out(db)");
    s += open(t.launcher + "_bwd", bwd) + "    const " + p + "tail_type& tail = " + p + "tail();\n";
    s += "    // Freed on the stream after the products that read it.\n";
    s += "    const auto g = solder::eval::cuda::device_array<float>::allocate(batch * " + w + ", stream);\n";
    s += wrap_call("    run(stream, " + p + "gate", gargs, ");") + "\n";
    s += wrap_call("    run_product(stream, " + p + "input_grad",
                   {p + "rows(g.data(), batch)", "w", p + "in_rows_out(dx, batch)"}, ");") +
         "\n";
    s += wrap_call("    run_product(stream, " + p + "weight_grad",
                   {p + "rows(g.data(), batch)", p + "in_rows(x, batch)", p + "weight_out(dw)"}, ");") +
         "\n" + close;
  } else if (t.g.elementwise) {
    std::vector<std::string> args{p + "rows(x, batch)"};
    for (const auto& b : t.biases()) args.push_back(p + "features(" + b + ")");
    args.push_back(p + "rows_out(y, batch)");
    s += open(t.launcher + "_fwd", fwd) + "    " + p + "block& block = " + p + "layers();\n" + set_streams();
    s += wrap_call("    run(stream, " + p + "forward", [&] {
           std::vector<std::string> a{"block"};
           a.insert(a.end(), args.begin(), args.end());
           return a;
         }(), ");") + "\n" + close + "\n";

    std::vector<std::string> bargs{"block"};
    if (t.g.output_backward) {
      bargs.push_back(p + "rows(y, batch)");
    } else {
      bargs.push_back(p + "rows(x, batch)");
      for (const auto& b : t.biases()) bargs.push_back(p + "features(" + b + ")");
    }
    bargs.push_back(p + "rows(dy, batch)");
    bargs.push_back(p + "rows_out(dx, batch)");
    for (const auto& b : t.biases()) bargs.push_back(p + "features_out(d" + b + ")");
    s += open(t.launcher + "_bwd", bwd) + "    " + (t.g.output_backward ? "const " : "") + p + "block& block = " + p +
         "layers();\n" + (t.g.output_backward ? "" : set_streams());
    s += wrap_call("    run(stream, " + p + "backward", bargs, ");") + "\n" + close;
  } else if (t.pool()) {
    const bool max = t.row_role() == role::max_pool;
    s += open(t.launcher + "_fwd", fwd) + "    solder::eval::cuda::require_device_once();\n";
    s += wrap_call("    solder::eval::cuda::pool_forward",
                   {p + "forward_body{x, y, " + std::string(max ? "argmax" : "nullptr") + ", " + p + "geometry, " + p +
                        "count_include_pad}",
                    "batch", "stream"},
                   ";") +
         "\n" + close + "\n";
    s += open(t.launcher + "_bwd", bwd) + "    solder::eval::cuda::require_device_once();\n";
    s += wrap_call("    solder::eval::cuda::pool_backward",
                   {p + "backward_body{dy, " + std::string(max ? "argmax" : "nullptr") + ", dx, " + p + "geometry, " +
                        p + "count_include_pad}",
                    "batch", "stream"},
                   ";") +
         "\n" + close;
  } else if (t.flatten()) {
    for (const auto& [dir, from, to] : {std::tuple{"_fwd", "x", "y"}, std::tuple{"_bwd", "dy", "dx"}}) {
      s += open(t.launcher + dir, std::string_view(dir) == "_fwd" ? fwd : bwd) +
           "    solder::eval::cuda::require_device_once();\n";
      s += std::string("    if (") + to + " != " + from + ")\n";
      s += std::string("      solder::eval::cuda::check(cudaMemcpyAsync(") + to + ", " + from + ", batch * " + w +
           " * sizeof(float), cudaMemcpyDeviceToDevice, stream),\n" + "                                \"" +
           t.launcher + dir + ": copying\");\n" + close + (std::string_view(dir) == "_fwd" ? "\n" : "");
    }
  } else if (t.row_role() == role::layer_norm) {
    s += open(t.launcher + "_fwd", fwd) + "    solder::eval::cuda::require_device_once();\n";
    s += wrap_call("    solder::eval::cuda::layer_norm_forward<" + w + ">",
                   {"x", "weight", "bias", "y", "mean", "rstd", "batch", "double(eps)", "stream"}, ";") +
         "\n" + close + "\n";
    s += open(t.launcher + "_bwd", bwd) + "    solder::eval::cuda::require_device_once();\n";
    s += wrap_call("    solder::eval::cuda::layer_norm_backward<" + w + ">",
                   {"x", "dy", "weight", "mean", "rstd", "dx", "dweight", "dbias", "batch", "stream"}, ";") +
         "\n" + close;
  } else {
    const std::string fn = t.row_role() == role::softmax ? "softmax" : "log_softmax";
    s += open(t.launcher + "_fwd", fwd) + "    solder::eval::cuda::require_device_once();\n";
    s += "    solder::eval::cuda::" + fn + "_forward<" + w + ">(x, y, batch, stream);\n" + close + "\n";
    s += open(t.launcher + "_bwd", bwd) + "    solder::eval::cuda::require_device_once();\n";
    s += "    solder::eval::cuda::" + fn + "_backward<" + w + ">(y, dy, dx, batch, stream);\n" + close;
  }
  return s;
}

/// What the .cu defines once, before the groups: the chain's own last-error message, and the
/// launcher support of eval/cuda/launcher.hpp under short names.
inline std::string common_definitions(bool elementwise, bool products) {
  std::string s = R"(/// The message of this thread's last call of this chain's launchers ("" after a success).
thread_local std::string last_error;

/// Runs a launcher's body, turning every exception into a status and last_error's message.
template <class Body>
int guarded(const char* launcher, Body&& body) noexcept {
  return solder::eval::cuda::guarded(last_error, launcher, std::forward<Body>(body));
}
using solder::eval::cuda::check_arguments;
)";
  if (elementwise)
    s += R"(using solder::eval::cuda::pass_of;
using solder::eval::cuda::returned;
using solder::eval::cuda::run;
)";
  if (products)
    s += R"(using solder::eval::cuda::matrix_operand;
using solder::eval::cuda::product;
using solder::eval::cuda::product_value;
using solder::eval::cuda::run_product;

/// A product pass's type rebuilt from its template arguments: nvcc's host side spells the
/// deduced return type of a function as `auto` in an explicit instantiation, this type in full.
template <class P>
struct product_pass_of;
template <class Tiling, class A, class B, class W>
struct product_pass_of<solder::eval::cuda::product_pass<Tiling, A, B, W>> {
  using type = solder::eval::cuda::product_pass<Tiling, A, B, W>;
};
)";
  return s;
}

/// The groups of a chain that get launchers: the first of several identical groups (same
/// launchers, same types) stands for all of them.
inline std::vector<group_text> distinct_groups(const chain_desc& c) {
  std::vector<group_text> out;
  for (const auto& g : c.groups) {
    group_text t{c, g, "g" + std::to_string(g.index) + "_", launcher_name(g)};
    bool seen = false;
    for (const auto& o : out) seen = seen || (o.launcher == t.launcher && o.block_type() == t.block_type());
    if (!seen) out.push_back(t);
  }
  return out;
}

// ---- the chain-level launchers: forward, backward and a training step of a whole chain --------

/// One group as the chain-level launchers run it: through its own definitions or those of an
/// identical earlier group, its parameters' places in the flat arrays, its output's place in
/// `hidden`, and its dropouts' places among the chain's streams.
struct chain_step {
  const group_desc* g = nullptr;
  std::string prefix;         // the definitions it runs through: "g0_"
  std::size_t weight_at = 0;  // its weight's first float in the flat parameter array (a sketched group's S1)
  std::size_t s2_at = 0;      // a sketched group's S2
  std::size_t bias_at = 0;    // its bias's (where it has one)
  std::size_t hidden_at = 0;  // its output's first float in a row of `hidden` (every group but the last)
  std::size_t h_at = 0;       // a sketched group's h = x [S1 | U2] in a row of `hidden`
  std::size_t sketch = 0;     // a sketched group's place among the chain's sketched layers
  /// A convolution group's batch_norm: its weight and bias in the parameters, its running
  /// statistics and the last forward's saved mean and rstd in `buffers`, and z (its input) in
  /// a row of `hidden`; a max pooling group's argmax (int32) in a row of `hidden`.
  std::size_t bn_weight_at = 0, bn_bias_at = 0, running_at = 0, saved_at = 0, z_at = 0, argmax_at = 0;
  std::string in, out;        // the group's input and output (a flatten's output is its input)
  std::vector<std::pair<std::size_t, std::size_t>> dropouts;  // (position in its tail, index among the chain's)
};

/// A chain of product groups as the chain-level launchers lay it out in flat device arrays.
struct chain_layout {
  std::vector<chain_step> steps;
  std::vector<const layer_desc*> dropouts;  // the chain's dropout layers, in order
  std::vector<const layer_desc*> sketches;  // the chain's sketched layers, in order
  std::size_t widest_h = 0;                 // per row of the backward's scratch: the widest dh
  std::vector<const layer_desc*> norms;     // the chain's batch_norm layers, in order
  std::size_t buffer_floats = 0;            // running statistics, then the saved ones, of every batch_norm
  /// Whether the chain holds groups besides products (convolutions, pooling, flatten,
  /// elementwise): its backward then passes gradients between two buffers.
  bool general = false;
  /// Whether the backward draws dropout masks again (an elementwise group's gradient from its
  /// input, as a dropout alone): it then takes the streams too.
  bool backward_streams = false;
  std::size_t param_floats = 0;             // the parameters (and gradients, and each optimizer state)
  std::size_t hidden_floats = 0;            // per row: the outputs of every group but the last
  std::size_t widest_out = 0;               // per row of the backward's scratch: the widest gate
  std::size_t widest_inner = 0;             // and the widest gradient of a hidden output
};

/// Whether a chain gets chain-level launchers: an nn::chain ending in a product group (a
/// classifier's logits) whose every group is a product group (nn::linear, nn::sketched_linear
/// with their elementwise tails), a convolution group, a pooling or flatten group, or an
/// elementwise group without parameters (a dropout).
inline bool has_chain_launchers(const chain_desc& c) {
  if (c.kind != spec_kind::chain || c.groups.empty() || !c.groups.back().product) return false;
  for (const auto& g : c.groups) {
    const group_text t{c, g, "", ""};
    const bool ok = g.product || g.conv || t.pool() || t.flatten() || (g.elementwise && t.of(role::bias).empty());
    if (!ok) return false;
  }
  return true;
}

/// `base`, or `base + batch * floats` (a block of rows `floats` floats into a row-blocked array).
inline std::string rows_at(const std::string& base, std::size_t floats) {
  return floats == 0 ? base : base + " + batch * " + std::to_string(floats);
}
/// `base`, or `base + at` (a parameter in a flat array).
inline std::string flat_at(const std::string& base, std::size_t at) {
  return at == 0 ? base : base + " + " + std::to_string(at);
}

/// The chain's layout; `distinct` are the groups that have definitions of their own.
inline chain_layout layout_of(const chain_desc& c, const std::vector<group_text>& distinct) {
  chain_layout l;
  for (std::size_t k = 0; k < c.groups.size(); ++k) {
    const group_desc& g = c.groups[k];
    const group_text t{c, g, "", launcher_name(g)};
    chain_step s{};
    s.g = &g;
    l.general = l.general || !g.product;
    l.backward_streams = l.backward_streams || (g.elementwise && !g.output_backward && !t.of(role::dropout).empty());
    for (const auto& d : distinct)
      if (s.prefix.empty() && d.launcher == t.launcher && d.block_type() == t.block_type()) s.prefix = d.prefix;
    // torch's named_parameters() order, which the CPU chain's params() keeps: weight, then bias;
    // a sketched layer's S1, S2, then bias.
    s.weight_at = l.param_floats;
    if (g.sketched) {
      const std::size_t lk = g.terms * g.rank;
      l.param_floats += g.in_width * lk;
      s.s2_at = l.param_floats;
      l.param_floats += lk * g.width;
      s.sketch = l.sketches.size();
      l.sketches.push_back(&g.layers.front());
      s.h_at = l.hidden_floats;
      l.hidden_floats += 2 * lk;
      l.widest_h = std::max(l.widest_h, 2 * lk);
    } else if (g.conv) {
      l.param_floats += g.out_channels * t.taps();
    } else if (g.product) {
      l.param_floats += g.width * g.in_width;
    }
    s.bias_at = l.param_floats;
    if (g.product_bias || g.conv_bias) l.param_floats += g.product ? g.width : g.out_channels;
    if (g.norm) {
      s.bn_weight_at = l.param_floats;
      s.bn_bias_at = l.param_floats + g.out_channels;
      l.param_floats += 2 * g.out_channels;
      s.running_at = l.buffer_floats;
      l.buffer_floats += 2 * g.out_channels;
      l.norms.push_back(&g.layers[1]);
      s.z_at = l.hidden_floats;
      l.hidden_floats += g.width;
    }
    for (const auto* d : t.of(role::dropout)) {
      s.dropouts.push_back({t.held_at(*d), l.dropouts.size()});
      l.dropouts.push_back(d);
    }
    s.in = k == 0 ? std::string("x") : l.steps.back().out;
    if (t.flatten()) {
      s.out = s.in;  // the same bytes
    } else if (k + 1 < c.groups.size()) {
      s.hidden_at = l.hidden_floats;
      l.hidden_floats += g.width;
      s.out = rows_at("hidden", s.hidden_at);
    } else {
      s.out = "y";
    }
    if (t.pool() && t.row_role() == role::max_pool) {
      s.argmax_at = l.hidden_floats;
      l.hidden_floats += g.width;
    }
    const std::size_t in_width = k == 0 ? g.in_width : c.groups[k - 1].width;
    if (k > 0) l.widest_inner = std::max(l.widest_inner, g.product ? g.in_width : in_width);
    l.widest_out = std::max(l.widest_out, g.width);
    l.steps.push_back(std::move(s));
  }
  // The saved statistics follow every batch_norm's running ones.
  for (auto& s : l.steps)
    if (s.g->norm) {
      s.saved_at = l.buffer_floats;
      l.buffer_floats += 2 * s.g->out_channels;
    }
  return l;
}


/// The chain-level launchers' parameters. first_sample: the index of the batch's first sample
/// in a global batch (a data-parallel shard), which every dropout's mask draws from.
inline const param first_sample_param{"uint64_t first_sample", "first_sample"};
inline std::vector<param> chain_forward_params(const chain_layout& l) {
  std::vector<param> p{{"const float* x", "x"}, {"const float* params", "params"}};
  if (l.buffer_floats) p.push_back({"float* buffers", "buffers"});
  if (l.hidden_floats) p.push_back({"float* hidden", "hidden"});
  p.insert(p.end(), {{"float* y", "y"}, {"size_t batch", "batch"}});
  if (!l.sketches.empty()) p.push_back({"const uint64_t* sketch_seeds", "sketch_seeds"});
  if (!l.dropouts.empty())
    p.insert(p.end(), {{"const uint64_t* seeds", "seeds"}, {"uint64_t* offsets", "offsets"}, first_sample_param});
  p.push_back({"cudaStream_t stream", "stream"});
  return p;
}
inline std::vector<param> chain_backward_params(const chain_layout& l) {
  std::vector<param> p{{"const float* x", "x"}, {"const float* params", "params"}};
  if (l.buffer_floats) p.push_back({"const float* buffers", "buffers"});
  if (l.hidden_floats) p.push_back({"const float* hidden", "hidden"});
  p.insert(p.end(), {{"const float* y", "y"}, {"const float* dy", "dy"}, {"float* grads", "grads"}, {"size_t batch", "batch"}});
  if (!l.sketches.empty()) p.push_back({"const uint64_t* sketch_seeds", "sketch_seeds"});
  if (l.backward_streams)
    p.insert(p.end(), {{"const uint64_t* seeds", "seeds"}, {"const uint64_t* offsets", "offsets"}, first_sample_param});
  p.push_back({"cudaStream_t stream", "stream"});
  return p;
}
/// The forward, loss and backward's parameters; train_step's are these with the optimizer's,
/// loss_and_backward's with a device loss and the labels' check.
inline std::vector<param> loss_pass_params(const chain_layout& l, bool writes_params) {
  std::vector<param> p{{"const float* x", "x"},
                       {"const int32_t* labels", "labels"},
                       {writes_params ? "float* params" : "const float* params", "params"},
                       {"float* grads", "grads"}};
  if (writes_params)
    p.insert(p.end(), {{"float* optimizer_state", "optimizer_state"}, {"solder_optimizer* optimizer", "optimizer"}});
  if (l.buffer_floats) p.push_back({"float* buffers", "buffers"});
  if (l.hidden_floats) p.push_back({"float* hidden", "hidden"});
  p.insert(p.end(), {{"float* y", "y"}, {"size_t batch", "batch"}});
  if (!l.sketches.empty()) p.push_back({"const uint64_t* sketch_seeds", "sketch_seeds"});
  if (!l.dropouts.empty())
    p.insert(p.end(), {{"const uint64_t* seeds", "seeds"}, {"uint64_t* offsets", "offsets"}, first_sample_param});
  p.push_back({"float label_smoothing", "label_smoothing"});
  return p;
}
inline std::vector<param> train_step_params(const chain_layout& l) {
  std::vector<param> p = loss_pass_params(l, true);
  p.insert(p.end(), {{"float* loss", "loss"}, {"cudaStream_t stream", "stream"}});
  return p;
}
inline std::vector<param> loss_and_backward_params(const chain_layout& l) {
  std::vector<param> p = loss_pass_params(l, false);
  p.insert(p.end(), {{"float* loss", "loss"}, {"uint64_t* bad_label_row", "bad_label_row"}, {"cudaStream_t stream", "stream"}});
  return p;
}
inline std::vector<param> optimizer_step_params() {
  return {{"float* params", "params"},
          {"const float* grads", "grads"},
          {"float* optimizer_state", "optimizer_state"},
          {"solder_optimizer* optimizer", "optimizer"},
          {"cudaStream_t stream", "stream"}};
}

/// The C header's optimizer settings, shared by every generated header (hence the guard).
inline std::string optimizer_declarations() {
  return R"(#ifndef SOLDER_GEN_OPTIMIZER
#define SOLDER_GEN_OPTIMIZER
/// The optimizers a chain's train_step runs: torch.optim.SGD, Adam and AdamW, with the math of
/// solder's optim::sgd, optim::adam and optim::adamw (the update functors of ops/optimizer.hpp).
typedef enum solder_optimizer_kind { solder_sgd = 0, solder_adam = 1, solder_adamw = 2 } solder_optimizer_kind;
/// An optimizer's settings, with PyTorch's names (its defaults: SGD momentum, dampening,
/// weight_decay 0, nesterov off; Adam beta1 0.9, beta2 0.999, eps 1e-8, weight_decay 0, AdamW
/// 1e-2), and the steps it has taken. train_step reads it and adds 1 to steps; the caller may
/// change lr between steps (a schedule).
typedef struct solder_optimizer {
  int kind;            /* a solder_optimizer_kind */
  float lr;
  float weight_decay;  /* SGD, Adam: L2 through the gradient; AdamW: decoupled, w *= 1 - lr weight_decay */
  float momentum;      /* SGD */
  float dampening;     /* SGD */
  int nesterov;        /* SGD: nonzero for Nesterov momentum */
  float beta1;         /* Adam, AdamW */
  float beta2;         /* Adam, AdamW */
  float eps;           /* Adam, AdamW */
  int64_t steps;       /* steps taken so far (torch's state['step']); 0 before the first */
} solder_optimizer;
#endif  // SOLDER_GEN_OPTIMIZER
)";
}

/// The chain's section of the .h: sizes, parameter places and the chain-level launchers.
inline std::string chain_header(const chain_desc& c, const chain_layout& l, const std::string& stem) {
  std::string upper = "SOLDER_";
  for (char ch : stem) upper += char(ch >= 'a' && ch <= 'z' ? ch - 'a' + 'A' : ch);
  const std::size_t in = c.groups.front().in_width, out = c.groups.back().width;
  std::string h = "\n" + rule("the chain: every group in order") + "\n" + optimizer_declarations() + "\n";
  h += comment("/// ", "Floats of the flat parameter array `params` (and of `grads`, and of each optimizer state array): "
                       "the parameters in the CPU chain's params() order, torch's named_parameters() order. Each "
                       "starts at the float its macro below names: a weight [out, in] (torch's Linear.weight), a "
                       "bias [out]" + std::string(l.sketches.empty() ? "" : "; a sketched layer's S1 [in, L k] and S2 "
                                                                           "[L k, out] (its s1, s2), then its bias") +
                       std::string(l.norms.empty() && !l.general ? "" : "; a convolution's weight [out, in, kh, kw] "
                                                                        "(torch's Conv2d.weight) and bias, then its "
                                                                        "batch_norm's weight and bias [out]") +
                       ".");
  h += "#define " + upper + "_PARAM_FLOATS " + std::to_string(l.param_floats) + "\n";
  for (const auto& s : l.steps) {
    const std::string at = std::to_string(s.g->layers.front().index);
    if (s.g->conv) {
      const group_text t{c, *s.g, "", ""};
      h += "#define " + upper + "_" + at + "_WEIGHT " + std::to_string(s.weight_at) + "  /* " + t.conv_weight_shape() +
           " */\n";
      if (s.g->conv_bias)
        h += "#define " + upper + "_" + at + "_BIAS " + std::to_string(s.bias_at) + "  /* [" +
             std::to_string(s.g->out_channels) + "] */\n";
      if (s.g->norm) {
        const std::string bn = std::to_string(s.g->layers[1].index), ch = "  /* [" + std::to_string(s.g->out_channels) + "] */\n";
        h += "#define " + upper + "_" + bn + "_WEIGHT " + std::to_string(s.bn_weight_at) + ch;
        h += "#define " + upper + "_" + bn + "_BIAS " + std::to_string(s.bn_bias_at) + ch;
      }
      continue;
    }
    if (!s.g->product) continue;
    if (s.g->sketched) {
      const std::string lk = std::to_string(s.g->terms * s.g->rank);
      h += "#define " + upper + "_" + at + "_S1 " + std::to_string(s.weight_at) + "  /* [" +
           std::to_string(s.g->in_width) + ", " + lk + "] */\n";
      h += "#define " + upper + "_" + at + "_S2 " + std::to_string(s.s2_at) + "  /* [" + lk + ", " +
           std::to_string(s.g->width) + "] */\n";
    } else {
      h += "#define " + upper + "_" + at + "_WEIGHT " + std::to_string(s.weight_at) + "  /* [" +
           std::to_string(s.g->width) + ", " + std::to_string(s.g->in_width) + "] */\n";
    }
    if (s.g->product_bias)
      h += "#define " + upper + "_" + at + "_BIAS " + std::to_string(s.bias_at) + "  /* [" + std::to_string(s.g->width) +
           "] */\n";
  }
  if (l.hidden_floats) {
    std::vector<std::string> parts;
    for (std::size_t k = 0; k < l.steps.size(); ++k) {
      const std::string group = "group " + std::to_string(k) + "'s ";
      if (l.steps[k].g->sketched)
        parts.push_back(group + "h [batch, " + std::to_string(2 * l.steps[k].g->terms * l.steps[k].g->rank) + "] at " +
                        rows_at("hidden", l.steps[k].h_at));
      if (l.steps[k].g->norm)
        parts.push_back(group + "z (its batch_norm's input) [batch, " + std::to_string(l.steps[k].g->width) + "] at " +
                        rows_at("hidden", l.steps[k].z_at));
      if (k + 1 < l.steps.size() && !(l.steps[k].g->layers.front().what == role::flatten))
        parts.push_back(group + "[batch, " + std::to_string(l.steps[k].g->width) + "] at " +
                        rows_at("hidden", l.steps[k].hidden_at));
      if (l.steps[k].g->layers.front().what == role::max_pool)
        parts.push_back(group + "argmax (int32) [batch, " + std::to_string(l.steps[k].g->width) + "] at " +
                        rows_at("hidden", l.steps[k].argmax_at));
    }
    h += comment("/// ", "Floats per row of `hidden`, the outputs of every group but the last" +
                             std::string(l.sketches.empty() ? "" : " and each sketched group's h = x [S1 | U2]") +
                             std::string(l.general ? ", and what each group's backward reads besides (a flatten's output "
                                                     "is its input)"
                                                   : "") +
                             ", which the backward reads: " + join(parts, ", ") + ".");
    h += "#define " + upper + "_HIDDEN_FLOATS " + std::to_string(l.hidden_floats) + "\n";
  }
  if (!l.dropouts.empty()) {
    std::vector<std::string> at;
    for (const auto* d : l.dropouts) at.push_back(std::to_string(d->index));
    h += comment("/// ", "Dropout streams: seeds[i], offsets[i] (host memory) are the Philox stream of the chain's i-th "
                         "dropout (" + std::string(at.size() == 1 ? "layer " : "layers ") + join(at, ", ") + "), as nn::dropout's rng.");
    h += "#define " + upper + "_DROPOUTS " + std::to_string(l.dropouts.size()) + "\n";
  }
  if (l.buffer_floats) {
    h += comment("/// ", "Floats of `buffers` (device): each batch_norm's running_mean and running_var [C] (torch's "
                         "state_dict buffers, in the CPU chain's buffers() order; the training forward moves them), "
                         "then each one's saved mean and rstd [C] of the last training forward (the backward reads "
                         "them).");
    h += "#define " + upper + "_BUFFER_FLOATS " + std::to_string(l.buffer_floats) + "\n";
    for (const auto& s : l.steps)
      if (s.g->norm) {
        const std::string bn = std::to_string(s.g->layers[1].index), c = std::to_string(s.g->out_channels);
        h += "#define " + upper + "_" + bn + "_RUNNING_MEAN " + std::to_string(s.running_at) + "  /* [" + c + "] */\n";
        h += "#define " + upper + "_" + bn + "_RUNNING_VAR " + std::to_string(s.running_at + s.g->out_channels) +
             "  /* [" + c + "] */\n";
        h += "#define " + upper + "_" + bn + "_SAVED_MEAN " + std::to_string(s.saved_at) + "  /* [" + c + "] */\n";
        h += "#define " + upper + "_" + bn + "_SAVED_RSTD " + std::to_string(s.saved_at + s.g->out_channels) +
             "  /* [" + c + "] */\n";
      }
  }
  if (!l.sketches.empty()) {
    std::vector<std::string> at;
    for (const auto* d : l.sketches) at.push_back(std::to_string(d->index));
    h += comment("/// ", "Sign sketches: sketch_seeds[i] (host memory) is the sketch_seed of the chain's i-th sketched "
                         "layer (" + std::string(at.size() == 1 ? "layer " : "layers ") + join(at, ", ") +
                         "), from which its U1 and U2 are regenerated.");
    h += "#define " + upper + "_SKETCHES " + std::to_string(l.sketches.size()) + "\n";
  }
  h += "\n";
  const std::string streams = l.dropouts.empty()
                                  ? ""
                                  : " Each dropout's offset first moves on by 1, then its mask is Philox stream "
                                    "(seeds[i], offsets[i]), as a training forward of the CPU chain moves and draws "
                                    "it. first_sample is the index of x's first row in a global batch (0 for a batch "
                                    "of its own): a data-parallel shard of rows [s, s + batch) passes s and draws the "
                                    "global batch's masks, as the CPU chain's set_first_sample(s).";
  const std::string kept = l.hidden_floats ? " Every group's output but the last goes to hidden, for the backward." : "";
  const std::string in_text = c.groups.front().conv ? std::to_string(c.groups.front().channels * c.groups.front().height *
                                                                                 c.groups.front().cols)
                                                    : std::to_string(in);
  h += comment("/// ", "y [batch, " + std::to_string(out) + "] = the chain on x [batch, " + in_text +
                           "] in training mode, as the CPU chain's forward: every group in order" +
                           std::string(l.general ? ", each as its own launcher runs it (every batch_norm normalizing by "
                                                   "the batch's statistics, saving them in buffers and moving the "
                                                   "running ones)"
                                                 : std::string(", one matrix product each") +
                                                       (l.sketches.empty() ? "" : " (two for a sketched group)") +
                                                       ", its tail in the epilogue") +
                           "." + kept + streams);
  h += wrap_call("int solder_" + stem + "_forward", decls(chain_forward_params(l)), ";") + "\n";
  h += comment("/// ", "grads (overwritten, laid out as params) from dy = dL/dy [batch, " + std::to_string(out) +
                           "], after the forward of x that wrote y" + (l.hidden_floats ? " and hidden" : "") +
                           ", as the CPU chain's backward: every group last to first, " +
                           std::string(l.general ? "each group's backward as its own launcher runs it, but the first "
                                                   "group's input gradient (the chain's input gets none)"
                                                 : std::string("its gate pass with the bias gradient, then dW = g^T x "
                                                               "and, but for the first group, dx = g W (the chain's "
                                                               "input gets no gradient)") +
                                                       (l.sketches.empty() ? "" : "; a sketched group's dS2, dh, dS1 "
                                                                                  "and (but for the first group) dx")) +
                           ". Scratch of the stream-ordered allocator: " +
                           std::to_string(l.widest_out + (l.general ? 2 : 1) * l.widest_inner + l.widest_h) +
                           " floats per row" + std::string(l.general ? " and each group's own scratch" : "") + "." +
                           std::string(l.backward_streams ? " seeds, offsets and first_sample are the streams the forward "
                                                            "drew (as it left them): a dropout whose gradient follows "
                                                            "from its input draws its mask again."
                                                          : ""));
  h += wrap_call("int solder_" + stem + "_backward", decls(chain_backward_params(l)), ";") + "\n";
  const std::string loss_text =
      "the forward (as solder_" + stem + "_forward), the softmax cross-entropy of y against labels [batch] (device "
      "int32 in [0, " + std::to_string(out) + ")) with torch's label_smoothing, mean over the batch, and its gradient; "
      "the backward (as solder_" + stem + "_backward)";
  const std::string state_text =
      "optimizer_state (device, zero before the first step) holds m then v for Adam and AdamW (2 * PARAM_FLOATS), "
      "the momentum buffer for SGD with momentum (PARAM_FLOATS), nothing for SGD without (it may be null).";
  h += comment("/// ", "The first part of a training step, for data-parallel training: " + loss_text +
                           ", grads overwritten. Nothing waits: the mean loss goes to *loss (device float, rounded as the "
                           "CPU loss rounds its double mean), and where bad_label_row (device) is not null the lowest "
                           "row whose label is outside [0, " + std::to_string(out) + ") to *bad_label_row, UINT64_MAX "
                           "where every label is in range (the loss is then NaN, and grads are not the gradient). "
                           "A caller reduces grads across its ranks (the mean of the shards' gradients, each weighted "
                           "by its rows over the global batch's), then calls solder_" + stem + "_optimizer_step.");
  h += wrap_call("int solder_" + stem + "_loss_and_backward", decls(loss_and_backward_params(l)), ";") + "\n";
  h += comment("/// ", "The last part of a training step: *optimizer's update of every parameter of params from grads "
                       "(device, laid out as params), its steps + 1, as the CPU optimizer's step. " + state_text +
                       " Queued on the stream; the optimizer struct is host memory.");
  h += wrap_call("int solder_" + stem + "_optimizer_step", decls(optimizer_step_params()), ";") + "\n";
  h += comment("/// ", "One training step, as the CPU chain's train_step with nn::cross_entropy_loss and the optimizer, "
                       "built from the two launchers above: solder_" + stem + "_loss_and_backward's passes (" +
                           loss_text + "), then solder_" + stem + "_optimizer_step's update of every parameter (its "
                           "steps + 1). " + state_text + " Writes the mean loss to *loss (host): the launcher waits "
                           "for the stream once, for the loss and the labels' check, after the backward is queued and "
                           "before the update is (a label outside the range leaves params and *optimizer as they were).");
  h += wrap_call("int solder_" + stem + "_train_step", decls(train_step_params(l)), ";") + "\n";
  if (!l.dropouts.empty()) {
    h += comment("/// ", "Writes seeds and offsets (host, " + upper + "_DROPOUTS each) as nn::chain(seed) and reseed(seed) "
                         "set the dropouts' streams: seeds[i] is derive_seed(seed, the dropout's layer index), "
                         "offsets[i] is 0.");
    h += "int solder_" + stem + "_dropout_streams(uint64_t seed, uint64_t* seeds, uint64_t* offsets);\n";
  }
  if (!l.sketches.empty()) {
    h += comment("/// ", "Writes sketch_seeds (host, " + upper + "_SKETCHES) as nn::chain(seed) and reseed(seed) set "
                         "the sketched layers' sketch_seed: derive_seed(derive_seed(seed, the layer's index), 2).");
    h += "int solder_" + stem + "_sketch_seeds(uint64_t seed, uint64_t* sketch_seeds);\n";
  }
  return h;
}

/// The chain's lines of the files' opening comments.
inline std::string chain_overview(const chain_desc& c, const chain_layout& l, const std::string& stem) {
  const std::string p = "solder_" + stem;
  std::string s = "// the chain, " + std::to_string(c.groups.size()) + (c.groups.size() == 1 ? " group" : " groups") + "\n";
  s += "//   " + p + "_forward  every group in order, training mode\n";
  s += "//   " + p + "_backward  every group last to first: every parameter's gradient\n";
  s += "//   " + p + "_loss_and_backward  forward, softmax cross-entropy, backward; the loss on the device\n";
  s += "//   " + p + "_optimizer_step  the optimizer's update of every parameter from grads\n";
  s += "//   " + p + "_train_step  loss_and_backward's passes, one wait for the loss, optimizer_step's update\n";
  if (!l.dropouts.empty()) s += "//   " + p + "_dropout_streams  the dropouts' streams as nn::chain(seed) sets them\n";
  if (!l.sketches.empty()) s += "//   " + p + "_sketch_seeds  the sketched layers' sketch seeds as nn::chain(seed) sets them\n";
  return s;
}

/// The stream of the chain's i-th dropout in the chain-level passes, over `width` features per
/// sample: the caller's seed and offset, element 0 drawing counter first_sample * width, as
/// basic_chain::set_first_sample sets philox_state::first, so a shard starting at sample s of a
/// global batch draws that batch's masks.
inline std::string chain_stream(std::size_t i, std::size_t width) {
  const std::string n = std::to_string(i);
  return "{seeds[" + n + "], offsets[" + n + "], first_sample * " + std::to_string(width) + "}";
}

/// The definitions the chain-level launchers share with no chain: the C optimizer struct read
/// as the library's settings (eval/cuda/optimizer_step.hpp checks them and runs the update).
inline std::string optimizer_definitions() {
  return R"(
/// The caller's optimizer as the library's settings; an unknown kind is refused.
solder::eval::cuda::optimizer_settings settings_of(const solder_optimizer& o) {
  using kind = solder::eval::cuda::optimizer_kind;
  if (o.kind != solder_sgd && o.kind != solder_adam && o.kind != solder_adamw)
    solder::detail::fail("optimizer->kind must be solder_sgd, solder_adam or solder_adamw, got " + std::to_string(o.kind));
  return {o.kind == solder_sgd ? kind::sgd : o.kind == solder_adam ? kind::adam : kind::adamw,
          o.lr, o.weight_decay, o.momentum, o.dampening, o.nesterov != 0, o.beta1, o.beta2, o.eps, o.steps};
}
)";
}

/// The chain's layout constants and its forward and backward over every group, in the .cu.
inline std::string chain_definitions(const chain_desc& c, const chain_layout& l) {
  const std::size_t n = l.steps.size();
  std::string s = "\n" + rule("the chain: the optimizer's update; forward and backward over every group") + optimizer_definitions() + "\n";
  const bool sketched = !l.sketches.empty();
  s += sketched ? "/// The flat parameter array: each linear layer's weight [out, in], each sketched layer's S1 [in, L k]\n"
                  "/// and S2 [L k, out], then its bias, in layer order.\n"
                : "/// The flat parameter array: each linear layer's weight [out, in], then its bias, in layer order.\n";
  s += "constexpr std::size_t param_floats = " + std::to_string(l.param_floats) + ";\n";
  if (sketched) {
    s += "/// The backward's scratch per row: the widest gate g, the widest gradient of a hidden output, and\n"
         "/// the widest dh of a sketched group.\n";
    s += "constexpr std::size_t gate_floats = " + std::to_string(l.widest_out) +
         ", inner_floats = " + std::to_string(l.widest_inner) + ", h_floats = " + std::to_string(l.widest_h) + ";\n";
  } else {
    s += "/// The backward's scratch per row: the widest gate g, then the widest gradient of a hidden output.\n";
    s += "constexpr std::size_t gate_floats = " + std::to_string(l.widest_out) +
         ", inner_floats = " + std::to_string(l.widest_inner) + ";\n";
  }

  auto input_of = [&](std::size_t k) { return k == 0 ? std::string("x") : rows_at("hidden", l.steps[k - 1].hidden_at); };
  auto output_of = [&](std::size_t k) { return k + 1 == n ? std::string("y") : rows_at("hidden", l.steps[k].hidden_at); };
  auto title = [&](std::size_t k) {
    const group_text t{c, *l.steps[k].g, "", ""};
    return "  // group " + std::to_string(k) + ": " + t.layer_list() + "\n";
  };

  // The forward.
  std::vector<std::string> args{"const float* x", "const float* params"};
  if (l.hidden_floats) args.push_back("float* hidden");
  args.insert(args.end(), {"float* y", "std::size_t batch"});
  if (sketched) args.push_back("const std::uint64_t* sketch_seeds");
  if (!l.dropouts.empty())
    args.insert(args.end(), {"const std::uint64_t* seeds", "std::uint64_t* offsets", "std::uint64_t first_sample"});
  args.push_back("cudaStream_t stream");
  s += "\n" + comment("/// ", "The chain's forward in training mode, as basic_chain::forward: every group in order, its "
                              "output in hidden (every group but the last) or y." +
                                  std::string(l.dropouts.empty() ? ""
                                                                 : " Each dropout's stream first moves on, as the "
                                                                   "CPU blocks' training forward moves it, then draws."));
  s += wrap_call("void chain_forward", args, " {") + "\n";
  if (!l.dropouts.empty())
    s += "  for (std::size_t i = 0; i < " + std::to_string(l.dropouts.size()) + "; ++i) ++offsets[i];\n";
  for (std::size_t k = 0; k < n; ++k) {
    const chain_step& st = l.steps[k];
    const std::string& p = st.prefix;
    s += title(k) + "  {\n";
    if (st.dropouts.empty()) {
      s += "    const " + p + "tail_type tail{};\n";
    } else {
      s += "    " + p + "tail_type tail;\n";
      for (const auto& [held, i] : st.dropouts)
        s += "    std::get<" + std::to_string(held) + ">(tail.layers).rng = " + chain_stream(i, st.g->width) + ";\n";
    }
    if (st.g->sketched) {
      const std::string h = rows_at("hidden", st.h_at);
      s += "    const " + p + "sketches u = " + p + "sketches_of(sketch_seeds[" + std::to_string(st.sketch) + "]);\n";
      s += wrap_call("    run_product(stream, " + p + "first",
                     {p + "in_rows(" + input_of(k) + ", batch)", flat_at("params", st.weight_at), "u",
                      p + "h_rows_out(" + h + ", batch)"},
                     ");") + "\n";
      std::vector<std::string> fargs{"tail", p + "h_rows(" + h + ", batch)", flat_at("params", st.s2_at), "u"};
      if (st.g->product_bias) fargs.push_back(p + "features(" + flat_at("params", st.bias_at) + ")");
      fargs.push_back(p + "rows_out(" + output_of(k) + ", batch)");
      s += wrap_call("    run_product(stream, " + p + "forward", fargs, ");") + "\n  }\n";
      continue;
    }
    std::vector<std::string> fargs{"tail", p + "in_rows(" + input_of(k) + ", batch)", flat_at("params", st.weight_at)};
    if (st.g->product_bias) fargs.push_back(p + "features(" + flat_at("params", st.bias_at) + ")");
    fargs.push_back(p + "rows_out(" + output_of(k) + ", batch)");
    s += wrap_call("    run_product(stream, " + p + "forward", fargs, ");") + "\n  }\n";
  }
  s += "}\n";

  // The backward.
  args = {"const float* x", "const float* params"};
  if (l.hidden_floats) args.push_back("const float* hidden");
  args.insert(args.end(), {"const float* y", "const float* dy", "float* grads", "std::size_t batch"});
  if (sketched) args.push_back("const std::uint64_t* sketch_seeds");
  args.push_back("cudaStream_t stream");
  s += "\n" + comment("/// ", "The chain's backward from dy = dL/dy, as basic_chain::backward: every group last to first, "
                              "its gate pass g = dL/dz with db, then dW = g^T x and, but for the first group (whose "
                              "input needs no gradient: backward_params), dx = g W, the dy of the group before" +
                                  std::string(sketched ? " (a sketched group: dS2 and dh from the second product, dS1 "
                                                         "and dx from the first, as sketched_block's backward)"
                                                       : "") +
                                  ". Gradients go to grads, laid out as the parameters.");
  s += wrap_call("void chain_backward", args, " {") + "\n";
  s += "  // g, and d: the gradient of a hidden output (written by a group's dx, read by the gate of the one\n"
       "  // before)" + std::string(sketched ? ", and dh: a sketched group's" : "") +
       ". Freed on the stream after the passes that read them.\n";
  s += sketched ? "  const auto scratch =\n      solder::eval::cuda::device_array<float>::allocate(batch * (gate_floats + "
                  "inner_floats + h_floats), stream);\n"
                : "  const auto scratch = solder::eval::cuda::device_array<float>::allocate(batch * (gate_floats + "
                  "inner_floats), stream);\n";
  s += "  float* const g = scratch.data();\n";
  if (l.widest_inner) s += "  float* const d = g + batch * gate_floats;\n";
  if (sketched) s += "  float* const dh = g + batch * (gate_floats + inner_floats);\n";
  for (std::size_t kk = n; kk-- > 0;) {
    const chain_step& st = l.steps[kk];
    const std::string& p = st.prefix;
    s += title(kk) + "  {\n    const " + p + "tail_type tail{};\n";
    std::vector<std::string> gargs{"tail", p + "rows(" + output_of(kk) + ", batch)",
                                   p + "rows(" + std::string(kk + 1 == n ? "dy" : "d") + ", batch)", p + "rows_out(g, batch)"};
    if (st.g->product_bias) gargs.push_back(p + "features_out(" + flat_at("grads", st.bias_at) + ")");
    s += wrap_call("    run(stream, " + p + "gate", gargs, ");") + "\n";
    if (st.g->sketched) {
      const std::string h = rows_at("hidden", st.h_at);
      s += "    const " + p + "sketches u = " + p + "sketches_of(sketch_seeds[" + std::to_string(st.sketch) + "]);\n";
      s += wrap_call("    run_product(stream, " + p + "s2_grad",
                     {p + "h_rows(" + h + ", batch)", p + "rows(g, batch)", p + "s2_out(" + flat_at("grads", st.s2_at) + ")"},
                     ");") + "\n";
      s += wrap_call("    run_product(stream, " + p + "h_grad",
                     {p + "rows(g, batch)", flat_at("params", st.s2_at), "u", p + "h_rows_out(dh, batch)"}, ");") + "\n";
      s += wrap_call("    run_product(stream, " + p + "s1_grad",
                     {p + "in_rows(" + input_of(kk) + ", batch)", p + "h_rows(dh, batch)",
                      p + "s1_out(" + flat_at("grads", st.weight_at) + ")"},
                     ");") + "\n";
      if (kk > 0)
        s += wrap_call("    run_product(stream, " + p + "input_grad",
                       {p + "h_rows(dh, batch)", flat_at("params", st.weight_at), "u", p + "in_rows_out(d, batch)"},
                       ");") + "\n";
      s += "  }\n";
      continue;
    }
    s += wrap_call("    run_product(stream, " + p + "weight_grad",
                   {p + "rows(g, batch)", p + "in_rows(" + input_of(kk) + ", batch)",
                    p + "weight_out(" + flat_at("grads", st.weight_at) + ")"},
                   ");") +
         "\n";
    if (kk > 0)
      s += wrap_call("    run_product(stream, " + p + "input_grad",
                     {p + "rows(g, batch)", flat_at("params", st.weight_at), p + "in_rows_out(d, batch)"}, ");") +
           "\n";
    s += "  }\n";
  }
  s += "}\n";
  return s;
}

/// The chain's forward and backward where it holds groups besides products (a CNN): each group
/// runs the passes of its own launchers, on its places in params, buffers and hidden; the
/// backward passes the gradient of each group's input to the one before through two buffers.
inline std::string general_chain_definitions(const chain_desc& c, const chain_layout& l) {
  const std::size_t n = l.steps.size();
  const auto num = [](std::size_t v) { return std::to_string(v); };
  std::string s = "\n" + rule("the chain: the optimizer's update; forward and backward over every group") + optimizer_definitions() + "\n";
  s += "/// The flat parameter array: every layer's parameters in the CPU chain's params() order.\n";
  s += "constexpr std::size_t param_floats = " + num(l.param_floats) + ";\n";
  s += "/// The backward's scratch per row: the widest gate g of a product group, two buffers of the widest\n"
       "/// gradient of a group's input" + std::string(l.widest_h ? ", and the widest dh of a sketched group" : "") + ".\n";
  s += "constexpr std::size_t gate_floats = " + num(l.widest_out) + ", inner_floats = " + num(l.widest_inner) +
       (l.widest_h ? ", h_floats = " + num(l.widest_h) : std::string()) + ";\n";
  if (!l.norms.empty())
    s += "/// Every batch_norm's eps and momentum: nn::batch_norm's defaults, torch's, which nn::chain constructs.\n"
         "constexpr double bn_eps = 1e-5, bn_momentum = 0.1;\n";
  auto title = [&](std::size_t k) {
    const group_text t{c, *l.steps[k].g, "", ""};
    return "  // group " + num(k) + ": " + t.layer_list() + "\n";
  };
  auto at = [&](const std::string& base, std::size_t a) { return flat_at(base, a); };

  // The forward.
  std::vector<std::string> args{"const float* x", "const float* params"};
  if (l.buffer_floats) args.push_back("float* buffers");
  if (l.hidden_floats) args.push_back("float* hidden");
  args.insert(args.end(), {"float* y", "std::size_t batch"});
  if (!l.sketches.empty()) args.push_back("const std::uint64_t* sketch_seeds");
  if (!l.dropouts.empty())
    args.insert(args.end(), {"const std::uint64_t* seeds", "std::uint64_t* offsets", "std::uint64_t first_sample"});
  args.push_back("cudaStream_t stream");
  s += "\n" + comment("/// ", "The chain's forward in training mode, as basic_chain::forward: every group in order, its "
                              "output in hidden (every group but the last) or y; each batch_norm normalizes by the "
                              "batch's statistics, saves them and moves its running ones." +
                                  std::string(l.dropouts.empty() ? ""
                                                                 : " Each dropout's stream first moves on, as the "
                                                                   "CPU blocks' training forward moves it, then draws."));
  s += wrap_call("void chain_forward", args, " {") + "\n";
  if (!l.dropouts.empty()) s += "  for (std::size_t i = 0; i < " + num(l.dropouts.size()) + "; ++i) ++offsets[i];\n";
  for (std::size_t k = 0; k < n; ++k) {
    const chain_step& st = l.steps[k];
    const group_desc& g = *st.g;
    const group_text t{c, g, st.prefix, ""};
    const std::string& p = st.prefix;
    auto set_streams = [&](const std::string& holder) {
      std::string r;
      for (const auto& [held, i] : st.dropouts)
        r += "    std::get<" + num(held) + ">(" + holder + ".layers).rng = " + chain_stream(i, g.width) + ";\n";
      return r;
    };
    s += title(k);
    if (t.flatten()) {
      s += "  // (the same bytes: its output is its input)\n";
      continue;
    }
    s += "  {\n";
    if (g.product || g.conv) {
      const bool tail = g.product || t.conv_tail_size() > 0;
      if (!st.dropouts.empty())
        s += "    " + p + "tail_type tail;\n" + set_streams("tail");
      else if (tail)
        s += "    const " + p + "tail_type tail{};\n";
    }
    if (g.sketched) {
      const std::string h = rows_at("hidden", st.h_at);
      s += "    const " + p + "sketches u = " + p + "sketches_of(sketch_seeds[" + num(st.sketch) + "]);\n";
      s += wrap_call("    run_product(stream, " + p + "first",
                     {p + "in_rows(" + st.in + ", batch)", at("params", st.weight_at), "u", p + "h_rows_out(" + h + ", batch)"},
                     ");") + "\n";
      std::vector<std::string> fargs{"tail", p + "h_rows(" + h + ", batch)", at("params", st.s2_at), "u"};
      if (g.product_bias) fargs.push_back(p + "features(" + at("params", st.bias_at) + ")");
      fargs.push_back(p + "rows_out(" + st.out + ", batch)");
      s += wrap_call("    run_product(stream, " + p + "forward", fargs, ");") + "\n";
    } else if (g.product) {
      std::vector<std::string> fargs{"tail", p + "in_rows(" + st.in + ", batch)", at("params", st.weight_at)};
      if (g.product_bias) fargs.push_back(p + "features(" + at("params", st.bias_at) + ")");
      fargs.push_back(p + "rows_out(" + st.out + ", batch)");
      s += wrap_call("    run_product(stream, " + p + "forward", fargs, ");") + "\n";
    } else if (g.conv) {
      const bool tail = t.conv_tail_size() > 0;
      const std::string m = "batch * " + num(t.out_plane()), cout = num(g.out_channels);
      s += "    const auto c = solder::eval::cuda::device_array<float>::allocate(" + m + " * " + cout + ", stream);\n";
      if (tail) s += "    const auto u = solder::eval::cuda::device_array<float>::allocate(batch * " + num(g.width) + ", stream);\n";
      s += wrap_call("    run_product(stream, " + p + "conv", {st.in, at("params", st.weight_at), p + "pixels_out(c.data(), " + m + ")"},
                     ");") + "\n";
      const std::string z = rows_at("hidden", st.z_at);
      const std::string conv_out = g.norm ? z : tail ? "u.data()" : st.out;
      s += wrap_call("    solder::eval::cuda::nhwc_to_nchw",
                     {p + "to_nchw{c.data(), " + conv_out + ", batch, " +
                          (g.conv_bias ? at("params", st.bias_at) : std::string("nullptr")) + "}",
                      "stream"},
                     ";") + "\n";
      if (g.norm) {
        s += wrap_list("    const " + p + "norm_forward norm", '{',
                       {z, tail ? "u.data()" : st.out, at("params", st.bn_weight_at), at("params", st.bn_bias_at),
                        at("buffers", st.running_at), at("buffers", st.running_at + g.out_channels), at("buffers", st.saved_at),
                        at("buffers", st.saved_at + g.out_channels), "batch", cout, "bn_eps", "bn_momentum"},
                       '}', ";") + "\n";
        s += "    solder::eval::cuda::batch_norm_train_forward(norm, stream);\n";
      }
      if (tail)
        s += wrap_call("    run(stream, " + p + "tail_forward",
                       {"tail", p + "rows(u.data(), batch)", p + "rows_out(" + st.out + ", batch)"}, ");") + "\n";
    } else if (t.pool()) {
      const bool max = t.row_role() == role::max_pool;
      const std::string argmax = max ? "reinterpret_cast<std::int32_t*>(" + rows_at("hidden", st.argmax_at) + ")" : "nullptr";
      s += wrap_list("    const " + p + "forward_body body", '{',
                     {st.in, st.out, argmax, p + "geometry", p + "count_include_pad"}, '}', ";") + "\n";
      s += "    solder::eval::cuda::pool_forward(body, batch, stream);\n";
    } else {  // elementwise, its gradient from its output
      s += "    " + std::string(st.dropouts.empty() ? "const " : "") + p + "block block{};\n" + set_streams("block");
      s += wrap_call("    run(stream, " + p + "forward", {"block", p + "rows(" + st.in + ", batch)", p + "rows_out(" + st.out + ", batch)"},
                     ");") + "\n";
    }
    s += "  }\n";
  }
  s += "}\n";

  // The backward: group k reads the gradient of its output from dy or the buffer the group
  // after it wrote, and writes that of its input to the other buffer (a flatten passes it on).
  std::vector<std::string> dy_of(n), dx_of(n);
  dy_of[n - 1] = "dy";
  for (std::size_t k = n; k-- > 0;) {
    dx_of[k] = group_text{c, *l.steps[k].g, "", ""}.flatten() ? dy_of[k] : dy_of[k] == "d0" ? "d1" : "d0";
    if (k > 0) dy_of[k - 1] = dx_of[k];
  }
  args = {"const float* x", "const float* params"};
  if (l.buffer_floats) args.push_back("const float* buffers");
  if (l.hidden_floats) args.push_back("const float* hidden");
  args.insert(args.end(), {"const float* y", "const float* dy", "float* grads", "std::size_t batch"});
  if (!l.sketches.empty()) args.push_back("const std::uint64_t* sketch_seeds");
  if (l.backward_streams)
    args.insert(args.end(), {"const std::uint64_t* seeds", "const std::uint64_t* offsets", "std::uint64_t first_sample"});
  args.push_back("cudaStream_t stream");
  s += "\n" + comment("/// ", "The chain's backward from dy = dL/dy, as basic_chain::backward: every group last to first, "
                              "each its own launcher's backward on its places in params, buffers and hidden, but the "
                              "first group's input gradient (backward_params). Gradients go to grads, laid out as the "
                              "parameters.");
  s += wrap_call("void chain_backward", args, " {") + "\n";
  s += "  // g (a product group's gate), d0 and d1 (the gradient of a group's input, written by one group and\n"
       "  // read by the one before)" + std::string(l.widest_h ? ", dh (a sketched group's)" : "") +
       ". Freed on the stream after the passes that read them.\n";
  s += "  const auto scratch = solder::eval::cuda::device_array<float>::allocate(\n      batch * (gate_floats + 2 * inner_floats" +
       std::string(l.widest_h ? " + h_floats" : "") + "), stream);\n";
  s += "  float* const g = scratch.data();\n";
  s += "  float* const d0 = g + batch * gate_floats;\n  float* const d1 = d0 + batch * inner_floats;\n";
  if (l.widest_h) s += "  float* const dh = d1 + batch * inner_floats;\n";
  bool any_product = false, uses_d1 = false;
  for (std::size_t k = 0; k < n; ++k) {
    any_product = any_product || l.steps[k].g->product;
    uses_d1 = uses_d1 || dx_of[k] == "d1";
  }
  if (!any_product) s += "  (void)g;  // no product group\n";
  if (!uses_d1) s += "  (void)d1;  // no second buffer needed\n";
  for (std::size_t kk = n; kk-- > 0;) {
    const chain_step& st = l.steps[kk];
    const group_desc& gd = *st.g;
    const group_text t{c, gd, st.prefix, ""};
    const std::string& p = st.prefix;
    s += title(kk);
    if (t.flatten() || (kk == 0 && !gd.product && !gd.conv)) {
      s += t.flatten() ? "  // (the gradient passes through)\n" : "  // (no parameters, and the chain's input needs no gradient)\n";
      continue;
    }
    s += "  {\n";
    const std::string dy = dy_of[kk], dx = dx_of[kk];
    if (gd.product) {
      s += "    const " + p + "tail_type tail{};\n";
      std::vector<std::string> gargs{"tail", p + "rows(" + st.out + ", batch)", p + "rows(" + dy + ", batch)", p + "rows_out(g, batch)"};
      if (gd.product_bias) gargs.push_back(p + "features_out(" + at("grads", st.bias_at) + ")");
      s += wrap_call("    run(stream, " + p + "gate", gargs, ");") + "\n";
      if (gd.sketched) {
        const std::string h = rows_at("hidden", st.h_at);
        s += "    const " + p + "sketches u = " + p + "sketches_of(sketch_seeds[" + num(st.sketch) + "]);\n";
        s += wrap_call("    run_product(stream, " + p + "s2_grad",
                       {p + "h_rows(" + h + ", batch)", p + "rows(g, batch)", p + "s2_out(" + at("grads", st.s2_at) + ")"}, ");") + "\n";
        s += wrap_call("    run_product(stream, " + p + "h_grad",
                       {p + "rows(g, batch)", at("params", st.s2_at), "u", p + "h_rows_out(dh, batch)"}, ");") + "\n";
        s += wrap_call("    run_product(stream, " + p + "s1_grad",
                       {p + "in_rows(" + st.in + ", batch)", p + "h_rows(dh, batch)", p + "s1_out(" + at("grads", st.weight_at) + ")"},
                       ");") + "\n";
        if (kk > 0)
          s += wrap_call("    run_product(stream, " + p + "input_grad",
                         {p + "h_rows(dh, batch)", at("params", st.weight_at), "u", p + "in_rows_out(" + dx + ", batch)"}, ");") + "\n";
      } else {
        s += wrap_call("    run_product(stream, " + p + "weight_grad",
                       {p + "rows(g, batch)", p + "in_rows(" + st.in + ", batch)", p + "weight_out(" + at("grads", st.weight_at) + ")"},
                       ");") + "\n";
        if (kk > 0)
          s += wrap_call("    run_product(stream, " + p + "input_grad",
                         {p + "rows(g, batch)", at("params", st.weight_at), p + "in_rows_out(" + dx + ", batch)"}, ");") + "\n";
      }
    } else if (gd.conv) {
      const bool tail = t.conv_tail_size() > 0;
      const std::string m = "batch * " + num(t.out_plane()), cout = num(gd.out_channels), rows = "batch * " + num(gd.width);
      std::string grad = dy;
      if (tail) {
        s += "    const " + p + "tail_type tail{};\n";
        s += "    const auto gu = solder::eval::cuda::device_array<float>::allocate(" + rows + ", stream);\n";
        s += wrap_call("    run(stream, " + p + "gate",
                       {"tail", p + "rows(" + st.out + ", batch)", p + "rows(" + dy + ", batch)", p + "rows_out(gu.data(), batch)"},
                       ");") + "\n";
        grad = "gu.data()";
      }
      if (gd.norm) {
        s += "    const auto gz = solder::eval::cuda::device_array<float>::allocate(" + rows + ", stream);\n";
        s += wrap_list("    const " + p + "norm_backward norm", '{',
                       {rows_at("hidden", st.z_at), grad, "gz.data()", at("params", st.bn_weight_at), at("buffers", st.saved_at),
                        at("buffers", st.saved_at + gd.out_channels), at("grads", st.bn_weight_at), at("grads", st.bn_bias_at),
                        "batch", cout},
                       '}', ";") + "\n";
        s += "    solder::eval::cuda::batch_norm_train_backward(norm, stream);\n";
        grad = "gz.data()";
      }
      s += "    const auto gc = solder::eval::cuda::device_array<float>::allocate(" + m + " * " + cout + ", stream);\n";
      s += "    solder::eval::cuda::nchw_to_nhwc(" + p + "to_nhwc{" + grad + ", gc.data(), batch}, stream);\n";
      if (gd.conv_bias)
        s += "    solder::eval::cuda::channel_sums(" + p + "bias_sums{gc.data(), " + at("grads", st.bias_at) + ", batch}, stream);\n";
      s += wrap_call("    run_product(stream, " + p + "weight_grad",
                     {p + "pixels(gc.data(), " + m + ")", st.in, p + "weight_out(" + at("grads", st.weight_at) + ")"}, ");") + "\n";
      if (kk > 0) {
        s += "    const auto dcol = solder::eval::cuda::device_array<float>::allocate(" + m + " * " + num(t.taps()) + ", stream);\n";
        s += wrap_call("    run_product(stream, " + p + "input_grad",
                       {p + "pixels(gc.data(), " + m + ")", at("params", st.weight_at), p + "columns_out(dcol.data(), " + m + ")"},
                       ");") + "\n";
        s += "    solder::eval::cuda::run_col2im(stream, " + p + "col2im{dcol.data(), " + dx + ", batch});\n";
      }
    } else if (t.pool()) {
      const bool max = t.row_role() == role::max_pool;
      const std::string argmax =
          max ? "reinterpret_cast<const std::int32_t*>(" + rows_at("hidden", st.argmax_at) + ")" : "nullptr";
      s += wrap_list("    const " + p + "backward_body body", '{',
                     {dy, argmax, dx, p + "geometry", p + "count_include_pad"}, '}', ";") + "\n";
      s += "    solder::eval::cuda::pool_backward(body, batch, stream);\n";
    } else if (gd.output_backward) {
      s += "    const " + p + "block block{};\n";
      s += wrap_call("    run(stream, " + p + "backward",
                     {"block", p + "rows(" + st.out + ", batch)", p + "rows(" + dy + ", batch)", p + "rows_out(" + dx + ", batch)"},
                     ");") + "\n";
    } else {
      // From the input, the masks drawn again from the streams the forward drew.
      s += "    " + std::string(st.dropouts.empty() ? "const " : "") + p + "block block{};\n";
      for (const auto& [held, i] : st.dropouts)
        s += "    std::get<" + num(held) + ">(block.layers).rng = " + chain_stream(i, gd.width) + ";\n";
      s += wrap_call("    run(stream, " + p + "backward",
                     {"block", p + "rows(" + st.in + ", batch)", p + "rows(" + dy + ", batch)", p + "rows_out(" + dx + ", batch)"},
                     ");") + "\n";
    }
    s += "  }\n";
  }
  s += "}\n";
  return s;
}

/// The names of parameters, for a call.
inline std::vector<std::string> names_of(const std::vector<param>& ps) {
  std::vector<std::string> v;
  for (const auto& q : ps) v.push_back(q.name);
  return v;
}
/// ps but the parameter named `name`.
inline std::vector<param> without(std::vector<param> ps, const std::string& name) {
  std::erase_if(ps, [&](const param& q) { return q.name == name; });
  return ps;
}

/// The pieces train_step is built from, which the data-parallel launchers run apart: the
/// forward, the loss and the backward queued without a wait, and the optimizer's update.
inline std::string loss_pass_definitions(const chain_desc& c, const chain_layout& l) {
  const std::string out = std::to_string(c.groups.back().width);
  auto internal = [](std::vector<param> ps) {
    std::vector<std::string> v;
    for (auto& q : ps) {
      std::string d = q.decl;
      for (const char* t : {"size_t", "uint64_t", "int32_t"})
        if (d.starts_with(t) || d.starts_with("const " + std::string(t)))
          d.insert(d.find(t), "std::");
      v.push_back(d);
    }
    return v;
  };
  std::vector<param> ps = without(loss_and_backward_params(l), "bad_label_row");
  ps.insert(ps.end() - 1, {"unsigned long long* first_bad", "first_bad"});
  std::string s = "\n" + comment("/// ", "The forward, the softmax cross-entropy of y against labels (its mean to *loss, device; the "
                                         "lowest row whose label is outside [0, " + out + ") to *first_bad where it is "
                                         "not null) and its gradient, and the backward, queued without a wait.");
  s += wrap_call("void chain_loss_and_backward", internal(ps), " {") + "\n";
  s += wrap_call("  chain_forward", names_of(chain_forward_params(l)), ";") + "\n";
  s += "  // The loss's gradient, the dy of the backward; freed on the stream after the backward.\n";
  s += "  const auto dy = solder::eval::cuda::device_array<float>::allocate(batch * " + out + ", stream);\n";
  s += wrap_call("  solder::eval::cuda::softmax_cross_entropy_async<" + out + ">",
                 {"y", "labels", "dy.data()", "batch", "label_smoothing", "loss", "first_bad", "stream"}, ";") + "\n";
  std::vector<std::string> bargs = names_of(chain_backward_params(l));
  for (auto& a : bargs)
    if (a == "dy") a = "dy.data()";
  s += wrap_call("  chain_backward", bargs, ";") + "\n}\n";
  s += "\n/// *optimizer's update of every parameter from grads (its steps + 1), its settings checked.\n";
  s += "void update(solder::eval::cuda::optimizer_settings& settings, solder_optimizer& optimizer, float* params,\n"
       "            const float* grads, float* optimizer_state, cudaStream_t stream) {\n";
  s += "  solder::eval::cuda::optimizer_step(settings, params, grads, optimizer_state, param_floats, stream);\n";
  s += "  optimizer.steps = settings.steps;\n}\n";
  return s;
}

/// The chain-level extern "C" launchers.
inline std::string chain_launchers(const chain_desc& c, const chain_layout& l, const std::string& stem) {
  const std::string p = "solder_" + stem;
  const std::string out = std::to_string(c.groups.back().width);
  auto open = [&](const std::string& name, const std::vector<param>& ps) {
    return wrap_call("extern \"C\" int " + name, decls(ps), " {") + "\n  return guarded(\"" + name + "\", [&] {\n" +
           check_call(ps) + "    solder::eval::cuda::require_device_once();\n";
  };
  const std::string close = "  });\n}\n";
  std::string s;
  const auto fwd = chain_forward_params(l);
  s += open(p + "_forward", fwd);
  s += wrap_call("    chain_forward", names_of(fwd), ";") + "\n" + close + "\n";

  const auto bwd = chain_backward_params(l);
  s += open(p + "_backward", bwd);
  s += wrap_call("    chain_backward", names_of(bwd), ";") + "\n" + close + "\n";

  // The pieces: the loss's passes, its check on the device (bad_label_row may be null).
  const auto lab = loss_and_backward_params(l);
  s += wrap_call("extern \"C\" int " + p + "_loss_and_backward", decls(lab), " {") + "\n  return guarded(\"" + p +
       "_loss_and_backward\", [&] {\n" + check_call(without(lab, "bad_label_row"));
  s += "    solder::eval::cuda::require_device_once();\n";
  std::vector<std::string> largs = names_of(without(lab, "bad_label_row"));
  largs.insert(largs.end() - 1, "reinterpret_cast<unsigned long long*>(bad_label_row)");
  s += wrap_call("    chain_loss_and_backward", largs, ";") + "\n" + close + "\n";

  const auto opt = optimizer_step_params();
  s += wrap_call("extern \"C\" int " + p + "_optimizer_step", decls(opt), " {") + "\n  return guarded(\"" + p +
       "_optimizer_step\", [&] {\n";
  s += "    if (!params || !grads || !optimizer) throw solder::error(\"params, grads and optimizer must not be null\");\n";
  s += "    auto settings = settings_of(*optimizer);\n";
  s += "    solder::eval::cuda::check_optimizer(settings, optimizer_state);\n";
  s += "    solder::eval::cuda::require_device_once();\n";
  s += "    update(settings, *optimizer, params, grads, optimizer_state, stream);\n" + close + "\n";

  // train_step: the same pieces, with one wait between them for the loss and the labels' check.
  const auto step = train_step_params(l);
  s += wrap_call("extern \"C\" int " + p + "_train_step", decls(step), " {") + "\n  return guarded(\"" + p +
       "_train_step\", [&] {\n" + check_call(without(step, "optimizer_state"));
  s += "    auto settings = settings_of(*optimizer);\n";
  s += "    solder::eval::cuda::check_optimizer(settings, optimizer_state);\n";
  s += "    solder::eval::cuda::require_device_once();\n";
  s += "    const auto mean = solder::eval::cuda::device_array<float>::allocate(1, stream);\n";
  s += "    const auto first_bad = solder::eval::cuda::device_array<unsigned long long>::allocate(1, stream);\n";
  std::vector<std::string> sargs = names_of(without(without(step, "optimizer_state"), "optimizer"));
  for (auto& a : sargs)
    if (a == "loss") a = "mean.data()";
  sargs.insert(sargs.end() - 1, "first_bad.data()");
  s += wrap_call("    chain_loss_and_backward", sargs, ";") + "\n";
  s += "    // The one wait: the loss and the labels' check, before the update is queued.\n";
  s += "    const float value = solder::eval::cuda::wait_for_loss<" + out + ">(mean.data(), first_bad.data(), labels, stream);\n";
  s += "    update(settings, *optimizer, params, grads, optimizer_state, stream);\n";
  s += "    *loss = value;\n" + close;

  if (!l.dropouts.empty()) {
    s += "\nextern \"C\" int " + p + "_dropout_streams(uint64_t seed, uint64_t* seeds, uint64_t* offsets) {\n";
    s += "  return guarded(\"" + p + "_dropout_streams\", [&] {\n";
    s += "    if (!seeds || !offsets) throw solder::error(\"seeds and offsets must not be null\");\n";
    for (std::size_t i = 0; i < l.dropouts.size(); ++i)
      s += "    seeds[" + std::to_string(i) + "] = solder::random::derive_seed(seed, " +
           std::to_string(l.dropouts[i]->index) + ");  // layer " + std::to_string(l.dropouts[i]->index) + "\n";
    s += "    for (std::size_t i = 0; i < " + std::to_string(l.dropouts.size()) + "; ++i) offsets[i] = 0;\n";
    s += close;
  }
  if (!l.sketches.empty()) {
    s += "\nextern \"C\" int " + p + "_sketch_seeds(uint64_t seed, uint64_t* sketch_seeds) {\n";
    s += "  return guarded(\"" + p + "_sketch_seeds\", [&] {\n";
    s += "    if (!sketch_seeds) throw solder::error(\"sketch_seeds must not be null\");\n";
    s += "    // As sketched_linear::reset_parameters(derive_seed(seed, layer index)) sets its sketch_seed.\n";
    for (std::size_t i = 0; i < l.sketches.size(); ++i)
      s += "    sketch_seeds[" + std::to_string(i) + "] = solder::random::derive_seed(solder::random::derive_seed(seed, " +
           std::to_string(l.sketches[i]->index) + "), 2);  // layer " + std::to_string(l.sketches[i]->index) + "\n";
    s += close;
  }
  return s;
}

}  // namespace detail

/// The two files of one chain.
struct files {
  std::string cu;
  std::string h;
};

/// The text of `<stem>.cu` and `<stem>.h` for chain c; `header` is how the .cu includes the
/// user's header ("chains.hpp"). `elsewhere` names the groups whose launchers another chain's
/// file of the same run defines (launcher name -> that chain's stem): c's file runs them in its
/// chain-level launchers through definitions of its own, and does not define their launchers.
inline files generate(const chain_desc& c, const std::string& header,
                      const std::map<std::string, std::string>& elsewhere = {}) {
  using namespace detail;
  const std::string stem = stem_of(c.name), ns = "solder_gen_" + stem;
  const auto groups = distinct_groups(c);
  bool any_elementwise = false, any_row = false, any_product = false, any_pool = false, any_linear = false,
       any_sketched = false, any_conv = false;
  for (const auto& t : groups) {
    (t.g.conv ? any_conv : t.g.product ? any_product : t.g.elementwise ? any_elementwise : t.pool() ? any_pool : any_row) = true;
    (t.g.sketched ? any_sketched : any_linear) |= t.g.product;
  }
  const bool whole_chain = has_chain_launchers(c);
  const chain_layout layout = whole_chain ? layout_of(c, groups) : chain_layout{};

  std::vector<std::string> layer_types;
  if (!c.input.empty()) layer_types.push_back(c.input);
  for (const auto& l : c.layers) layer_types.push_back(l.type);
  std::string overview;
  for (const auto& g : c.groups) {
    const group_text t{c, g, "", launcher_name(g)};
    bool first = true;
    for (const auto& d : groups) first = first && !(d.g.index < g.index && d.launcher == t.launcher);
    if (first && elsewhere.count(t.launcher))
      overview += "// group " + std::to_string(g.index) + ", " + t.layer_range() + ": " + t.layer_list() + " on " +
                  t.extent() + "\n//   " + t.launcher + "_fwd, _bwd  defined in " + elsewhere.at(t.launcher) + ".cu\n";
    else if (first)
      overview += group_overview(t);
    else
      overview += "// group " + std::to_string(g.index) + ", " + t.layer_range() + ": " + t.layer_list() +
                  ", the same as an earlier group: runs through its launchers\n";
  }
  const std::string chain_type = c.kind == spec_kind::chain ? "solder::nn::chain<" + join(layer_types, ", ") + ">"
                                                            : groups.front().block_type();

  files f;
  std::string& cu = f.cu;
  const std::string spec = comment("// ", "chain " + c.name + " (" + header + "):") + comment("//   ", chain_type);
  cu += "// " + stem + ".cu: CUDA kernels and extern \"C\" launchers of the chain " + c.name +
        "; generated by solder-gen, do not edit.\n//\n" + spec + "//\n" + overview;
  if (whole_chain) cu += chain_overview(c, layout, stem);
  cu += "//\n// The launchers are declared in " + stem + ".h (C types only); docs/cuda.md describes them.\n\n";
  cu += "#include <cuda_runtime.h>\n\n";
  for (const char* h : {"cstddef", "cstdint", "string", "tuple", "type_traits", "utility"})
    cu += "#include <" + std::string(h) + ">\n";
  cu += "\n#include \"" + header + "\"\n#include \"solder/device.hpp\"\n";
  cu += "#include \"solder/eval/cuda/launcher.hpp\"\n";
  if (any_pool || any_conv) cu += "#include \"solder/eval/cuda/image_kernels.hpp\"\n";
  if (any_conv) cu += "#include \"solder/eval/cuda/layout_kernels.hpp\"\n";
  if (any_product || any_conv)
    cu += "#include \"solder/eval/cuda/memory.hpp\"\n#include \"solder/eval/cuda/product_kernel.hpp\"\n";
  if (any_row || whole_chain) cu += "#include \"solder/eval/cuda/row_kernels.hpp\"\n";
  if (whole_chain) cu += "#include \"solder/eval/cuda/optimizer_step.hpp\"\n";
  if (any_conv) cu += "#include \"solder/nn/conv_block.hpp\"\n";
  if (any_elementwise || any_product || any_conv) cu += "#include \"solder/nn/elementwise_block.hpp\"\n";
  if (any_linear) cu += "#include \"solder/nn/linear_block.hpp\"\n";
  if (any_sketched) cu += "#include \"solder/nn/sketched_linear.hpp\"\n";
  if (whole_chain || any_sketched) cu += "#include \"solder/random/seed.hpp\"\n";
  cu += "#include \"" + stem + ".h\"\n\n";
  cu += "namespace " + ns + " {\nnamespace {\n\n" +
        common_definitions(any_elementwise || any_product || any_conv, any_product || any_conv);
  for (const auto& t : groups) {
    if (!whole_chain && elsewhere.count(t.launcher)) continue;  // nothing here runs it
    cu += "\n" + rule("group " + std::to_string(t.g.index) + ": " + t.layer_list() + " on " + t.extent()) + "\n";
    const bool own = !elsewhere.count(t.launcher);
    cu += t.g.conv          ? conv_definitions(t, header, stem, own)
          : t.g.sketched    ? sketched_definitions(t, header, stem, own)
          : t.g.product     ? product_definitions(t, header, stem, own)
          : t.g.elementwise ? elementwise_definitions(t, header, stem)
                            : row_definitions(t, header, stem);
  }
  if (whole_chain)
    cu += (layout.general ? general_chain_definitions(c, layout) : chain_definitions(c, layout)) +
          loss_pass_definitions(c, layout);
  cu += "\n}  // namespace\n}  // namespace " + ns + "\n\n";
  cu += rule("kernels: every __global__ function the launchers start, instantiated here") + "\n";
  std::set<std::string> done;
  for (const auto& t : groups)
    if (whole_chain || !elsewhere.count(t.launcher)) cu += instantiations(t, ns, done);
  if (whole_chain)
    cu += "// the chain's loss and optimizer update: started by the launchers of eval/cuda/row_kernels.hpp and\n"
          "// eval/cuda/optimizer_step.hpp, which instantiate their kernels\n";
  cu += "\n" + rule("launchers (C linkage: global names, whatever the namespace)") + "\n";
  cu += "namespace " + ns + " {\n\n";
  for (const auto& t : groups)
    if (!elsewhere.count(t.launcher)) cu += launchers(t) + "\n";
  if (whole_chain) cu += chain_launchers(c, layout, stem) + "\n";
  cu += "extern \"C\" const char* solder_" + stem + "_last_error(void) { return last_error.c_str(); }\n\n";
  cu += "}  // namespace " + ns + "\n";

  std::string guard = "SOLDER_GEN_";
  for (char ch : stem) guard += char(ch >= 'a' && ch <= 'z' ? ch - 'a' + 'A' : ch);
  guard += "_H";
  std::string& h = f.h;
  h += "// " + stem + ".h: the launchers of " + stem +
       ".cu for C and C++ code built without nvcc; generated by solder-gen, do not edit.\n";
  h += "//\n" + spec + "//\n";
  h += comment("// ", "Pointers are device memory, batch counts rows (at least 1). A launcher queues its kernels on "
                      "`stream` (0: the default stream) and returns 0 (cudaSuccess), or a cudaError_t value when it "
                      "could not: cudaErrorInvalidValue for a null pointer or an empty batch, the error of "
                      "cudaGetDeviceCount where no device can be used (cudaErrorNoDevice, "
                      "cudaErrorInsufficientDriver), or that of the CUDA call that failed; solder_" +
                          stem + "_last_error() then says why. Errors inside the kernels appear later, on the "
                                 "stream. Launchers never throw.");
  h += "#ifndef " + guard + "\n#define " + guard + "\n\n#include <stddef.h>\n#include <stdint.h>\n\n";
  h += "typedef struct CUstream_st* cudaStream_t;\n\n#ifdef __cplusplus\nextern \"C\" {\n#endif\n";
  for (const auto& t : groups) {
    h += "\n" + rule("group " + std::to_string(t.g.index) + ": " + t.layer_list() + " on " + t.extent()) + "\n";
    if (elsewhere.count(t.launcher)) {
      h += "/// " + t.launcher + "_fwd and _bwd: declared in " + elsewhere.at(t.launcher) + ".h.\n";
      continue;
    }
    h += comment("/// ", forward_summary(t)) + wrap_call("int " + t.launcher + "_fwd", decls(forward_params(t)), ";") +
         "\n";
    h += comment("/// ", backward_summary(t)) +
         wrap_call("int " + t.launcher + "_bwd", decls(backward_params(t)), ";") + "\n";
    if (t.g.conv && t.g.norm)
      h += comment("/// ", eval_summary(t)) + wrap_call("int " + t.launcher + "_eval", decls(eval_params(t)), ";") + "\n";
  }
  if (whole_chain) h += chain_header(c, layout, stem);
  h += "\n/// The message of this thread's last call of a launcher above; \"\" when it succeeded.\n";
  h += "const char* solder_" + stem + "_last_error(void);\n";
  h += "\n#ifdef __cplusplus\n}  // extern \"C\"\n#endif\n\n#endif  // " + guard + "\n";
  return f;
}

/// solder-gen's entry point: writes `<dir>/<stem>.cu` and `<stem>.h` for every chain, `<dir>`
/// being argv[1]; `header` is how the .cu include the chains' header. A group that several chains
/// hold (the same type) gets its launchers in the first one's file. Returns 0, or 1 after saying
/// why on stderr (two different groups would define the same launcher, a file cannot be written).
inline int main(int argc, char** argv, const std::string& header, std::initializer_list<chain_desc> chains) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <output directory>\n", argc ? argv[0] : "solder-gen");
    return 1;
  }
  const std::string dir = argv[1];
  std::map<std::string, std::pair<std::string, std::string>> defined;  // launcher -> (the chain defining it, block type)
  std::map<std::string, std::map<std::string, std::string>> elsewhere;  // chain -> launcher -> the stem defining it
  std::set<std::string> stems;
  for (const auto& c : chains) {
    if (!stems.insert(detail::stem_of(c.name)).second) {
      std::fprintf(stderr, "solder-gen: two chains would both be written to %s.cu; name them differently\n",
                   detail::stem_of(c.name).c_str());
      return 1;
    }
    std::map<std::string, std::string> own;  // launcher -> block type, within the chain
    for (const auto& g : c.groups) {
      const detail::group_text t{c, g, "", detail::launcher_name(g)};
      const auto [it, fresh] = own.emplace(t.launcher, t.block_type());
      if (!fresh && it->second != t.block_type()) {
        std::fprintf(stderr,
                     "solder-gen: %s: groups %s and an earlier one differ (%s) but would share the launchers "
                     "%s_fwd/_bwd; split the chain so that each goes to its own program\n",
                     c.name.c_str(), t.layer_range().c_str(), t.block_type().c_str(), t.launcher.c_str());
        return 1;
      }
      if (fresh) {
        const auto [other, added] = defined.emplace(t.launcher, std::pair{c.name, t.block_type()});
        if (!added && other->second.second != t.block_type()) {
          std::fprintf(stderr,
                       "solder-gen: %s and %s hold different groups whose launchers are both %s_fwd/_bwd; they "
                       "would be defined twice: generate them from separate programs\n",
                       other->second.first.c_str(), c.name.c_str(), t.launcher.c_str());
          return 1;
        }
        if (!added) elsewhere[c.name][t.launcher] = detail::stem_of(other->second.first);
      }
    }
  }
  for (const auto& c : chains) {
    const files f = generate(c, header, elsewhere[c.name]);
    const std::string stem = detail::stem_of(c.name);
    for (const auto& [name, text] : {std::pair{stem + ".cu", &f.cu}, std::pair{stem + ".h", &f.h}}) {
      const std::string path = dir + "/" + name;
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out << *text;
      out.close();
      if (!out) {
        std::fprintf(stderr, "solder-gen: cannot write %s\n", path.c_str());
        return 1;
      }
    }
  }
  return 0;
}

}  // namespace solder::gen
