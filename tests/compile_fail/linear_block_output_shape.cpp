// A linear<64, 10> layer given an output of 11 features.
// MESSAGE[solder::nn::linear_block: the output of a layer with input \[\?, 64\] must have shape \[\?, 10\], not \[\?, 11\]]
#include "solder/nn/linear_block.hpp"

int main() {
  solder::nn::linear_block<solder::nn::linear<64, 10>, solder::nn::relu> layer;
  solder::tensor<float, solder::shape<solder::dyn, 64>> x(4);
  solder::tensor<float, solder::shape<solder::dyn, 11>> y(4);
  layer.forward(x, y);
}
