// x [batch, 64] times w^T for w [10, 32]: the inner extents differ.
// MESSAGE[solder::matmul: cannot multiply \[\?, 64\] by \[32, 10\]: inner extents 64 and 32 differ]
#include "solder/assign.hpp"

int main() {
  solder::tensor<float, solder::shape<solder::dyn, 64>> x(4);
  solder::tensor<float, solder::shape<10, 32>> w;
  solder::tensor<float, solder::shape<solder::dyn, 10>> y(4);
  y = solder::matmul(x, solder::transpose(w));
}
