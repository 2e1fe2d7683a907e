// generators/describe.hpp: what solder-gen knows of a chain, as plain data: read from the chain's
// type and from one instance of it in host memory (its parameters' names and shapes, its buffers,
// its dropouts). Nothing here knows a layer kind: a chain says all of it through nn::basic_chain.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "solder/nn/chain.hpp"

namespace solder::gen {

/// A parameter or buffer of the chain: its state_dict name ("0.weight"), its shape and floats.
struct tensor_desc {
  std::string name;
  std::vector<std::size_t> dims;
  std::size_t floats = 0;
};

/// A chain as the generated files describe it.
struct chain_desc {
  std::string name;           // as C++ names the type after including the header: "models::mlp"
  std::string stem;           // the file stem and C prefix: "models_mlp"
  std::size_t in_floats = 0;  // floats of one input sample
  std::size_t out_floats = 0;
  std::string input_shape, output_shape;  // "[1, 8, 8]"
  bool flat_output = false;               // one feature vector per sample: a loss over classes applies
  std::vector<std::string> layers;        // "0 conv2d -> [16, 8, 8]", one per layer
  std::size_t kernels = 0;                // the planner's groups
  std::vector<tensor_desc> params, buffers;
  std::size_t dropouts = 0;
};

namespace detail {

/// "models::mlp" -> "models_mlp".
inline std::string stem_of(std::string_view name) {
  std::string s;
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (name.substr(i, 2) == "::") {
      s += '_';
      ++i;
    } else {
      s += name[i];
    }
  }
  return s;
}

inline std::string shape_text(const nn::sample_shape& s) {
  std::string out = "[";
  for (std::size_t d = 0; d < s.rank; ++d) out += (d ? ", " : "") + std::to_string(s[d]);
  return out + "]";
}

template <class List>
std::vector<tensor_desc> tensors_of(const List& list) {
  std::vector<tensor_desc> out;
  for (const auto& t : list) out.push_back({t.name, t.dims, t.value.size()});
  return out;
}

}  // namespace detail

/// The description of Chain (an nn::chain in host memory) under its C++ name `name`.
template <class Chain>
chain_desc describe(std::string_view name) {
  chain_desc c;
  c.name = std::string(name);
  c.stem = detail::stem_of(name);
  c.in_floats = Chain::in_features;
  c.out_floats = Chain::out_features;
  c.input_shape = detail::shape_text(Chain::input_shape);
  c.output_shape = detail::shape_text(Chain::output_shape);
  c.flat_output = Chain::output_shape.rank == 1;
  c.kernels = Chain::kernels;
  [&]<class... Ls>(std::type_identity<std::tuple<Ls...>>) {
    std::size_t i = 0;
    ((c.layers.push_back(std::to_string(i) + " " + Ls::name + " -> " +
                         detail::shape_text(Chain::widths::shapes[i])),
      ++i),
     ...);
  }(std::type_identity<typename Chain::layer_list>{});
  Chain model(0);
  c.params = detail::tensors_of(model.params());
  c.buffers = detail::tensors_of(model.buffers());
  c.dropouts = model.dropout_streams().size();
  return c;
}

}  // namespace solder::gen
