// nn/layer_kind.hpp: how the planner treats a layer; each layer names its kind in its
// planner_traits (nn/layer_info.hpp reads them).
#pragma once

namespace solder::nn {

/// How the planner treats a layer.
enum class layer_kind {
  product,      // a matrix product (linear, sketched_linear): opens a kernel that later elementwise layers join
  elementwise,  // bias, activations, dropout: join the open kernel or form one
  block,        // anything else (layer_norm, softmax, ...): a kernel of its own
};

}  // namespace solder::nn
