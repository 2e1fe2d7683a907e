// A chain in device memory takes the layers that have a form there; the first that has none is
// named.
// MESSAGE[solder::chain_in: layer 1 \(conv2d\) has no form in this memory space yet]
#include "solder/device.hpp"
#include "solder/solder.hpp"

int main() {
  using model = solder::nn::chain_in<solder::device, solder::nn::input<2, 6, 6>, solder::nn::max_pool2d<2>,
                                     solder::nn::conv2d<2, 4, 3, 3>, solder::nn::relu>;
  static_assert(model::kernels >= 1);
}
