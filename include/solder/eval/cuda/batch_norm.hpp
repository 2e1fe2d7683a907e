// eval/cuda/batch_norm.hpp: batch normalization over NCHW images on the CUDA backend, a warp per
// channel: the row bodies of ops/batch_norm.hpp (the CPU layer's math) walked along each
// sample's plane of the channel, the planes' sums added in sample order, so the order of every
// sum is fixed by the sizes. Host+device code without CUDA headers: the host suite runs the
// bodies on an emulated warp; eval/cuda/image_kernels.hpp launches them.
#pragma once

#include <cstddef>

#include "solder/config.hpp"
#include "solder/eval/cuda/row.hpp"
#include "solder/ops/batch_norm.hpp"
#include "solder/simd.hpp"

namespace solder::eval::cuda {

// The per-channel statistics below are promised equal to the CPU layer's bits: they are
// ops::batch_norm's moments, running statistics and fold, whose multiply-adds are written as
// simd::fma (nvcc contracts a * b + c into one fma by default and a host compiler may or may
// not), so both backends round them alike.

/// Training forward of channel c of x [batch, C, HW]: the batch's mean and biased variance
/// (the planes' shifted sums, shift = the channel's first value, as the CPU layer), saved mean
/// and rstd, the running statistics moved (torch's momentum, the unbiased variance), then
/// y = (x - mean) k + b with k = weight rstd along every plane. batch HW >= 2 (the launcher
/// checks).
template <std::size_t HW>
struct batch_norm_train_forward_body {
  const float* x;
  float* y;
  const float* weight;
  const float* bias;
  float* running_mean;
  float* running_var;
  float* saved_mean;
  float* saved_rstd;
  std::size_t batch, channels;
  double eps, momentum;

  SOLDER_EXEC_CHECK_OFF
  template <class Team>
  SOLDER_HD void operator()(std::size_t c, const Team& team) const {
    using op = ops::batch_norm;
    const auto plane = make_warp_row<HW>(HW, team);
    const float shift = x[c * HW];
    double s1 = 0.0, s2 = 0.0;
    for (std::size_t n = 0; n < batch; ++n) {
      const auto s = op{}.statistics_sums(plane, x + (n * channels + c) * HW, shift);
      s1 += s[0];
      s2 += s[1];
    }
    const auto m = op::moments(double(batch * HW), double(shift), s1, s2);
    const double rstd = op::rstd(m.var, eps);
    const float mean = float(m.mean), k = float(double(weight[c]) * rstd);
    plane.once([&]() SOLDER_INLINE_LAMBDA {
      saved_mean[c] = mean;
      saved_rstd[c] = float(rstd);
      running_mean[c] = float(op::running(double(running_mean[c]), m.mean, momentum));
      running_var[c] = float(op::running(double(running_var[c]), m.var_unbiased, momentum));
    });
    for (std::size_t n = 0; n < batch; ++n) {
      const std::size_t at = (n * channels + c) * HW;
      op{}.forward(plane, x + at, y + at, mean, k, bias[c]);
    }
  }
};

/// Training backward of channel c from the forward's saved mean and rstd: dbias = sum dy and
/// dweight = sum dy xhat over the batch's planes, then dx = k (dy - xhat dweight / n - dbias / n)
/// along every plane (n = batch HW).
template <std::size_t HW>
struct batch_norm_train_backward_body {
  const float* x;
  const float* dy;
  float* dx;
  const float* weight;
  const float* saved_mean;
  const float* saved_rstd;
  float* weight_grad;
  float* bias_grad;
  std::size_t batch, channels;

  SOLDER_EXEC_CHECK_OFF
  template <class Team>
  SOLDER_HD void operator()(std::size_t c, const Team& team) const {
    using op = ops::batch_norm;
    const auto plane = make_warp_row<HW>(HW, team);
    const float mean = saved_mean[c], rstd = saved_rstd[c];
    double sdy = 0.0, sdyx = 0.0;
    for (std::size_t n = 0; n < batch; ++n) {
      const std::size_t at = (n * channels + c) * HW;
      const auto s = op{}.grad_sums(plane, x + at, dy + at, mean, rstd);
      sdy += s[0];
      sdyx += s[1];
    }
    const double count = double(batch * HW);
    const float k = float(double(weight[c]) * double(rstd)), gw = float(sdyx / count), gb = float(sdy / count);
    plane.once([&]() SOLDER_INLINE_LAMBDA {
      weight_grad[c] = float(sdyx);
      bias_grad[c] = float(sdy);
    });
    for (std::size_t n = 0; n < batch; ++n) {
      const std::size_t at = (n * channels + c) * HW;
      op{}.backward(plane, x + at, dy + at, dx + at, mean, rstd, k, gw, gb);
    }
  }
};

/// Evaluation mode's normalization folded into the convolution before it, per output channel c
/// by ops::batch_norm_fold, as nn::conv_block::fold (the same bits): s = weight[c] /
/// sqrt(running_var[c] + eps), W'[c] = W[c] s and b'[c] = fma(b[c] - running_mean[c], s,
/// bias[c]), in double and rounded once (b = 0 where the convolution has no bias: conv_bias
/// null). A thread per element of W' [C, PerChannel]; each channel's first also writes b'.
template <std::size_t PerChannel>
struct batch_norm_fold_body {
  const float* conv_weight;
  const float* conv_bias;
  const float* weight;
  const float* bias;
  const float* running_mean;
  const float* running_var;
  float* folded_weight;
  float* folded_bias;
  std::size_t channels;
  double eps;

  SOLDER_HD std::size_t elements() const { return channels * PerChannel; }
  SOLDER_HD SOLDER_INLINE void operator()(std::size_t i) const {
    ops::batch_norm_fold_elements{conv_weight, conv_bias, weight, bias, running_mean, running_var, folded_weight,
                                  folded_bias, PerChannel, eps}
        .element(i);
  }
};

}  // namespace solder::eval::cuda
