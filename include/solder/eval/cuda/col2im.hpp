// eval/cuda/col2im.hpp: the input gradient of a convolution on the CUDA backend, gathered: the
// product dcol = g W gives each window's gradient per tap, and dx at an input element is the
// sum of the entries of the windows that read it, in a fixed order (taps kh then kw ascending),
// with no atomics: each run gives the same bits. A host+device body of the element's index
// (ops/conv2d.hpp's conv2d_col2im, the gather every backend's planes verb runs);
// eval/cuda/image_kernels.hpp runs it on the GPU, the tests over every element on the host.
#pragma once

#include <cstddef>

#include "solder/config.hpp"
#include "solder/ops/conv2d.hpp"

namespace solder::eval::cuda {

/// dx [batch, Cin, H, W] (NCHW) from dcol [batch Ho Wo, Cin Kh Kw] (the rows of the output
/// pixels, the columns in PyTorch's weight order, as im2col_operand reads them). G: the
/// convolution's geometry (ops::conv2d_geometry).
template <class G, std::size_t Cin, std::size_t Kh, std::size_t Kw>
struct col2im_pass {
  static_assert(Kh == G::kernel_height && Kw == G::kernel_width,
                "solder::eval::cuda::col2im_pass: Kh and Kw must be the geometry's kernel");
  static constexpr std::size_t taps = Cin * Kh * Kw;
  const float* dcol;
  float* dx;
  std::size_t batch;

  SOLDER_HD std::size_t elements() const { return batch * Cin * G::in_plane; }

  /// dx[i], i = ((n Cin + ci) H + hi) W + wi.
  SOLDER_HD SOLDER_INLINE void element(std::size_t i) const {
    const std::size_t wi = i % G::width, hi = (i / G::width) % G::height;
    ops::conv2d_col2im<G, Cin>{dcol, dx}(i / G::in_plane, hi, wi);
  }
  SOLDER_HD SOLDER_INLINE void operator()(std::size_t i) const { element(i); }
};

}  // namespace solder::eval::cuda
