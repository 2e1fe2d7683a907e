// x [256, 4096] + b [1024]: the extents differ and neither is 1.
// MESSAGE[solder: cannot broadcast \[256, 4096\] with \[1024\]]
#include "solder/assign.hpp"
#include "solder/expr/operators.hpp"

int main() {
  solder::tensor<float, solder::shape<256, 4096>> x;
  solder::tensor<float, solder::shape<1024>> b;
  auto e = x + b;
  (void)e;
}
