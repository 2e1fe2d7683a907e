// A copy between spaces moves the same elements: the shapes must be the same.
// MESSAGE[solder::copy]
// MESSAGE[\[4, 8\]]
// MESSAGE[\[8, 4\]]
#include "solder/device.hpp"

int main() {
  solder::tensor<float, solder::shape<4, 8>> h;
  solder::tensor_ref<float, solder::shape<8, 4>, solder::device> d(nullptr);
  solder::copy(h, d);
}
