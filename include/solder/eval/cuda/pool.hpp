// eval/cuda/pool.hpp: max, average and adaptive average pooling over NCHW images on the CUDA
// backend, one thread per output element forward and per input element backward (a gather
// over the windows that hold it: no atomics): the per-element bodies of ops/pool.hpp, which the
// CPU layers run too, as functions of a flat index. Host+device code without CUDA headers; the
// host suite runs them over every index, eval/cuda/image_kernels.hpp launches them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "solder/config.hpp"
#include "solder/ops/pool.hpp"

namespace solder::eval::cuda {

/// The coordinates (n, c, i, j) of flat index k of [batch, C, rows, cols].
struct plane_index {
  ops::pool2d::index n, c, i, j;
  SOLDER_HD plane_index(std::size_t k, ops::pool2d::index channels, ops::pool2d::index rows, ops::pool2d::index cols) {
    const auto q = ops::pool2d::index(k);
    j = q % cols;
    i = (q / cols) % rows;
    c = (q / (cols * rows)) % channels;
    n = q / (cols * rows * channels);
  }
};

using pool_kind = ops::pool2d::pool_kind;

/// Pooling forward, element k of y [batch, C, Ho, Wo] (max: its argmax too): the plane body of
/// ops/pool.hpp at k's plane and coordinates.
template <pool_kind Kind>
struct pool_forward_body {
  const float* x;
  float* y;
  std::int32_t* argmax;  // max only
  ops::pool2d::geometry g;
  bool count_include_pad;  // avg only
  SOLDER_HD void operator()(std::size_t k) const {
    const plane_index p(k, g.channels, g.ho, g.wo);
    ops::pool2d::forward_planes<Kind>{x, y, argmax, g, count_include_pad}(std::size_t(p.n * g.channels + p.c),
                                                                           std::size_t(p.i), std::size_t(p.j));
  }
};

/// Pooling backward, element k of dx [batch, C, H, W]: the windows that hold it, in row-major
/// output order.
template <pool_kind Kind>
struct pool_backward_body {
  const float* dy;
  const std::int32_t* argmax;  // max only
  float* dx;
  ops::pool2d::geometry g;
  bool count_include_pad;  // avg only
  SOLDER_HD void operator()(std::size_t k) const {
    const plane_index p(k, g.channels, g.h, g.w);
    ops::pool2d::backward_planes<Kind>{dy, argmax, dx, g, count_include_pad}(std::size_t(p.n * g.channels + p.c),
                                                                             std::size_t(p.i), std::size_t(p.j));
  }
};

}  // namespace solder::eval::cuda
