// A drop probability of 1 or more leaves nothing to scale.
// MESSAGE[solder::nn::dropout: the drop probability must be in \[0, 1\)]
#include "solder/nn/elementwise.hpp"

int main() {
  solder::nn::dropout<1.5f> d;
  (void)d;
}
