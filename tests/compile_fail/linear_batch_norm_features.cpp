// A batch_norm after a linear layer normalizes that layer's outputs: batch_norm<5> after
// linear<4, 8> has the wrong number of channels.
// MESSAGE[solder::nn::linear_block: the batch_norm after a linear layer must have the layer's output features as its channels; use batch_norm<Out> for a linear<In, Out>]
#include "solder/nn/linear_block.hpp"

int main() {
  solder::nn::linear_block<solder::nn::linear<4, 8>, solder::nn::batch_norm<5>, solder::nn::relu> block;
  (void)block;
}
