// Channels-last images given to a convolution as if they were NCHW: the channels must be the
// last extent, and the message says so with the shape it got.
// MESSAGE[solder::nn::conv2d::forward_channels_last: x must be \[batch, H, W, 3\]; got x \[\?, 3, 8, 8\]]
#include <utility>

#include "solder/nn/conv2d.hpp"

int main() {
  solder::nn::conv2d<3, 4, 3, 3, 1, 1> conv;
  solder::tensor<float, solder::shape<solder::dyn, 3, 8, 8>> x(2);
  solder::tensor<float, solder::shape<solder::dyn, 8, 8, 4>> y(2);
  conv.forward_channels_last(std::as_const(x).ref(), y.ref());
}
