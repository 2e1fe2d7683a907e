// The gradient of a batch's image patches written on the CPU from a product that is not g W
// (g a convolution's output gradient as pixel rows, W its weight): here x W'.
// MESSAGE[the gradient of a batch.*s image patches is written from g W]
#include "solder/assign.hpp"
#include "solder/ops/conv2d.hpp"

int main() {
  using G = solder::ops::conv2d_geometry<8, 8, 3, 3, 1, 1, 1>;
  solder::tensor<float, solder::shape<solder::dyn, 4, 8, 8>> dx(2);
  solder::tensor<float, solder::shape<solder::dyn, 6>> g(2 * G::out_plane);
  solder::tensor<float, solder::shape<6, 36>> w;
  solder::executor<solder::cpu>::run(
      solder::write(solder::image_patches_grad<G, 4>{dx.data(), 2}, solder::matmul(g, w)));
}
