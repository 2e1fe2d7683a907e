// A sketched layer whose factors hold more values than the dense layer it replaces:
// 2 L k (In + Out) = 2 * 8 * 128 * 3072 >= 2048 * 1024.
// MESSAGE[solder::nn::sketched_linear: 2 L k \(In \+ Out\) = 6291456 >= In Out = 2097152: larger and slower than a dense layer]
#include "solder/nn/sketched_linear.hpp"

int main() {
  solder::nn::sketched_linear<2048, 1024, 8, 128> layer;
  (void)layer;
}
