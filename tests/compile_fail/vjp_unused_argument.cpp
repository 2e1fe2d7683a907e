// The function never reads its second argument, so it has no gradient.
// MESSAGE[solder::vjp: the function does not depend \(differentiably\) on this argument]
#include "solder/autodiff/vjp.hpp"
#include "solder/assign.hpp"

int main() {
  solder::tensor<float, solder::shape<4, 8>> x, y, dy;
  auto g = solder::vjp([](auto a, auto) { return relu(a); }, dy, x, y);
  (void)g;
}
