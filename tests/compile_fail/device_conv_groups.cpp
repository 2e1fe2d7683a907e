// A convolution in device memory runs as products over image patches, which take one group: a
// grouped one is refused, saying what to do.
// MESSAGE[runs convolutions with one group; set Groups = 1, or run the layer in host memory]
#include "solder/device.hpp"
#include "solder/solder.hpp"

int main() {
  solder::nn::conv2d<4, 8, 3, 3, 1, 1, 1, 2, true, solder::device> conv;
  solder::tensor<float, solder::shape<solder::dyn, 4, 6, 6>, solder::device> x(2);
  solder::tensor<float, solder::shape<solder::dyn, 8, 6, 6>, solder::device> y(2);
  conv.forward(x, y);
}
