// sum over axis 0 of [4, 8] has shape [8], not [4].
// MESSAGE[solder: cannot assign a reduction of shape \[8\] to a tensor of shape \[4\]]
#include "solder/assign.hpp"
#include "solder/expr/reduce.hpp"

int main() {
  solder::tensor<float, solder::shape<4, 8>> x;
  solder::tensor<float, solder::shape<4>> s;
  s = solder::sum<0>(x);
}
