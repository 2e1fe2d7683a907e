// A sketched layer of rank 0.
// MESSAGE[solder::nn::sketched_linear: Terms and Rank must be at least 1]
#include "solder/nn/sketched_linear.hpp"

int main() {
  solder::nn::sketched_linear<64, 32, 2, 0> layer;
  (void)layer;
}
