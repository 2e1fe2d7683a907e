// An expression of shape [4, 9] cannot be stored into a [4, 8] tensor.
// MESSAGE[solder: cannot assign an expression of shape \[4, 9\] to a tensor of shape \[4, 8\]]
#include "solder/assign.hpp"
#include "solder/expr/operators.hpp"

int main() {
  solder::tensor<float, solder::shape<4, 9>> x;
  solder::tensor<float, solder::shape<4, 8>> y;
  y = relu(x);
}
