// One expression reads a host tensor and a device tensor: no backend can evaluate it.
// MESSAGE[solder: an expression mixes host and device tensors; one backend evaluates one memory space]
#include "solder/solder.hpp"

int main() {
  solder::tensor<float, solder::shape<4, 8>> x;
  solder::tensor_ref<const float, solder::shape<4, 8>, solder::device> d(nullptr);
  auto e = x + d;
  (void)e;
}
