// A bias of 16 features on rows of 8.
// MESSAGE[solder::nn::bias: a bias of 16 features cannot be added to an input of shape \[4, 8\]; its last extent must be 16]
#include "solder/nn/elementwise_block.hpp"

int main() {
  solder::nn::elementwise_block<solder::nn::bias<16>, solder::nn::relu> layer;
  solder::tensor<float, solder::shape<4, 8>> x, y;
  layer.forward(x, y);
}
