// Device memory is evaluated by the CUDA backend, which this translation unit does not include.
// MESSAGE[no evaluator for this backend is included; include solder/solder.hpp for host tensors, or solder/cuda.hpp]
#include "solder/solder.hpp"

int main() {
  solder::tensor_ref<const float, solder::shape<4, 8>, solder::device> a(nullptr);
  solder::tensor_ref<float, solder::shape<4, 8>, solder::device> b(nullptr);
  b = a * 2.0f;
}
