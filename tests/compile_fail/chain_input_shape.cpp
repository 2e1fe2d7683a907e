// flatten<4, 3, 5> given samples of [3, 4, 5]: the same elements in another shape is a mismatch.
// MESSAGE[solder::chain: layer 0 \(flatten\) takes \[4, 3, 5\] or \[60\], but the input has \[3, 4, 5\]]
#include "solder/nn/chain.hpp"
#include "solder/nn/flatten.hpp"

int main() {
  solder::nn::chain<solder::nn::input<3, 4, 5>, solder::nn::flatten<4, 3, 5>, solder::nn::linear<60, 10>> model;
  (void)model;
}
