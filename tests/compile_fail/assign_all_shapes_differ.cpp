// One pass runs over one shape: [4, 8] and [4, 9] cannot share it.
// MESSAGE[solder::assign_all: every write must run over the same shape]
#include "solder/assign.hpp"
#include "solder/expr/operators.hpp"

int main() {
  solder::tensor<float, solder::shape<4, 8>> a, b;
  solder::tensor<float, solder::shape<4, 9>> c, d;
  solder::assign_all(solder::write(b, a * 2.f), solder::write(d, c * 2.f));
}
