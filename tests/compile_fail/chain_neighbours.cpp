// A linear<256, 128> after a linear<64, 100>: the widths of neighbours differ.
// MESSAGE[solder::chain: layer 2 \(linear\) takes 256 features, but layer 1 \(relu\) gives 100]
#include "solder/nn/chain.hpp"

int main() {
  solder::nn::chain<solder::nn::linear<64, 100>, solder::nn::relu, solder::nn::linear<256, 128>> model;
  (void)model;
}
