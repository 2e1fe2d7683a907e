// A [4, 8] tensor has axes 0 and 1.
// MESSAGE[solder::reduce: axis 2 is out of range for shape \[4, 8\]]
#include "solder/assign.hpp"
#include "solder/expr/reduce.hpp"

int main() {
  solder::tensor<float, solder::shape<4, 8>> x;
  auto s = solder::sum<2>(x);
  (void)s;
}
