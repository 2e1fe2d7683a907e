// A view of const elements is read-only.
// MESSAGE[no match for .operator=|cannot assign to a view of const elements]
#include "solder/assign.hpp"
#include "solder/expr/operators.hpp"

int main() {
  solder::tensor<float, solder::shape<4, 8>> x;
  solder::tensor_ref<const float, solder::shape<4, 8>> v = x.ref();
  v = relu(x);
}
