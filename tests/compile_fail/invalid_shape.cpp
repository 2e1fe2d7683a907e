// Only the leading extent may be the runtime batch.
// MESSAGE[solder::tensor: extents must be >= 1, and `dyn` may only be the leading extent]
#include "solder/tensor.hpp"

int main() {
  solder::tensor<float, solder::shape<4, solder::dyn>> t(3);
  (void)t;
}
