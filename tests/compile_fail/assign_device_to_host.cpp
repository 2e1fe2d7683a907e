// A host tensor cannot receive an expression over device memory.
// MESSAGE[solder: an expression mixes host and device tensors]
#include "solder/solder.hpp"

int main() {
  solder::tensor<float, solder::shape<4, 8>> x;
  solder::tensor_ref<const float, solder::shape<4, 8>, solder::device> d(nullptr);
  x = d * 2.0f;
}
