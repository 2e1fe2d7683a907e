// support/device_view.hpp: device-space views of host tensors, for the host suite's runs of the
// CUDA backend's bodies (support/grid.hpp): what a device kernel would see, readable on the host.
#pragma once

#include "solder/tensor.hpp"

namespace solder::test {

template <class S>
tensor_ref<const float, S, device> dev(const tensor<float, S>& t) {
  return tensor_ref<const float, S, device>(t.data(), t.batch());
}
template <class S>
tensor_ref<float, S, device> dev_out(tensor<float, S>& t) {
  return tensor_ref<float, S, device>(t.data(), t.batch());
}

}  // namespace solder::test
