// backward reads the batch after forward_into returns: a temporary batch would be gone by then.
// MESSAGE[solder::chain::forward_into: the batch is a temporary tensor, but backward reads it after forward]
#include "solder/solder.hpp"

int main() {
  solder::nn::chain<solder::nn::linear<4, 8>, solder::nn::relu, solder::nn::linear<8, 2>> model(1);
  solder::tensor<float, solder::shape<solder::dyn, 2>> out(3);
  model.forward_into(solder::tensor<float, solder::shape<solder::dyn, 4>>(3), out.ref());
}
