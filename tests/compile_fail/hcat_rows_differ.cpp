// Operands side by side with different numbers of rows.
// MESSAGE[solder::hcat: operands side by side must have the same number of rows]
#include "solder/expr/contract.hpp"

int main() {
  solder::tensor<float, solder::shape<8, 4>> a;
  solder::tensor<float, solder::shape<9, 4>> b;
  auto c = solder::hcat(a, b);
  (void)c;
}
