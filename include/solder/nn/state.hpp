// nn/state.hpp: a model's parameters in and out of a safetensors file (io/safetensors.hpp),
// named as PyTorch's nn.Sequential names them ("0.weight", "0.bias", "3.weight", ...), with
// PyTorch's shapes (a linear weight [Out, In]): a state_dict exported from PyTorch
// (examples/export_torch.py) loads as is.
#pragma once

#include <filesystem>
#include <vector>

#include "solder/io/safetensors.hpp"
#include "solder/nn/chain.hpp"

namespace solder::nn {

/// Writes every parameter of `model` and its other state (batch_norm's running statistics) to
/// `path` (atomically: a temporary file, then a rename).
template <class Model>
void save(Model& model, const std::filesystem::path& path) {
  std::vector<io::named_tensor> tensors;
  for (const optim::param& p : model.params()) tensors.push_back({p.name, p.dims, p.value.data()});
  for (const buffer& b : model.buffers()) tensors.push_back({b.name, b.dims, b.value.data()});
  io::save_safetensors(path, tensors);
}

/// Reads every parameter of `model` (and its other state) from `path`. All or nothing: a missing tensor, a wrong
/// shape or dtype, a truncated or malformed file throws solder::error naming the problem, and
/// the model is left unchanged. Tensors in the file the model does not have are ignored.
template <class Model>
void load(Model& model, const std::filesystem::path& path) {
  std::vector<io::named_tensor_ref> tensors;
  for (const optim::param& p : model.params()) tensors.push_back({p.name, p.dims, p.value.data()});
  for (const buffer& b : model.buffers()) tensors.push_back({b.name, b.dims, b.value.data()});
  io::load_safetensors(path, tensors);
  model.parameters_changed();
}

}  // namespace solder::nn
