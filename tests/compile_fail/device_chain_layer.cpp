// A chain in device memory takes the layers that have a form there; the first that has none is
// named.
// MESSAGE[solder::chain_in: layer 1 \(batch_norm\) has no form in this memory space yet]
#include "solder/device.hpp"
#include "solder/solder.hpp"

int main() {
  using model = solder::nn::chain_in<solder::device, solder::nn::linear<8, 4>, solder::nn::batch_norm<4>, solder::nn::relu>;
  static_assert(model::kernels >= 1);
}
