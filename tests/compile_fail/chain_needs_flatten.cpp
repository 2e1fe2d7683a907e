// A linear<60, 10> after images of [3, 4, 5]: a linear layer takes features, so the chain
// says which shape reached it and that a flatten belongs between them.
// MESSAGE[solder::chain: layer 1 \(linear\) takes 60 features, but layer 0 \(relu\) gives \[3, 4, 5\]; put a flatten between them]
#include "solder/nn/chain.hpp"

int main() {
  solder::nn::chain<solder::nn::input<3, 4, 5>, solder::nn::relu, solder::nn::linear<60, 10>> model;
  (void)model;
}
