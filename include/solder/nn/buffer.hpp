// nn/buffer.hpp: a float tensor of a layer's state that is not trained (torch's buffers), as
// saving and loading a model see it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "solder/shape.hpp"
#include "solder/tensor.hpp"

namespace solder::nn {

/// A float tensor of a layer's state_dict that is not trained (torch's buffers: running_mean,
/// running_var): its name, a flat view (in memory of Space) and its shape. An optim::param
/// without the gradient, so an optimizer cannot be handed one, and saving or loading reads the
/// same fields.
template <class Space = host>
struct basic_buffer {
  std::string name;
  tensor_ref<float, shape<dyn>, Space> value;
  std::vector<std::size_t> dims{};
};
/// A buffer in host memory, as saving and loading take it.
using buffer = basic_buffer<host>;

}  // namespace solder::nn
