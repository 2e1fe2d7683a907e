// A chain of 3 layers has no layer 3.
// MESSAGE[solder::chain::layer: index 3 is out of range; the chain has 3 layers \(0 to 2\)]
#include "solder/solder.hpp"

int main() {
  solder::nn::chain<solder::nn::linear<4, 8>, solder::nn::relu, solder::nn::linear<8, 2>> model(1);
  model.layer<3>();
}
