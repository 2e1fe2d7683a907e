// A convolution's forward product patches(x) W^T assigned on the CPU: the CPU multiplies a
// batch's images only in a convolution's gradients (its forward runs nn::conv2d).
// MESSAGE[on the CPU a product over a batch.*s images is a convolution.*s gradient]
#include "solder/assign.hpp"
#include "solder/ops/conv2d.hpp"

int main() {
  using G = solder::ops::conv2d_geometry<8, 8, 3, 3, 1, 1, 1>;
  solder::tensor<float, solder::shape<solder::dyn, 4, 8, 8>> x(2);
  solder::tensor<float, solder::shape<6, 36>> w;
  solder::tensor<float, solder::shape<solder::dyn, 6>> c(2 * G::out_plane);
  c = solder::matmul(solder::image_patches<G, 4, solder::host>{x.data(), 2}, solder::transpose(w));
}
