// tests/cuda/image.cu: the CUDA backend's batch normalization and pooling kernels
// (eval/cuda/image_kernels.hpp) on the device, against the same bodies run on the host (an
// emulated warp per channel; every index): pooling bit for bit; batch norm within a few
// roundings (nvcc contracts a product and a sum into one fma where the host rounds twice).
// Exits 77 (ctest's skip code) where no CUDA device is present.
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../support/data.hpp"
#include "../support/device_vector.hpp"
#include "../support/gpu_program.hpp"
#include "../support/warp_emulation.hpp"
#include "solder/eval/cuda/image_kernels.hpp"

namespace {

namespace cu = solder::eval::cuda;
using solder::test::fill_uniform;
using solder::test::gpu::device_vector;
using solder::test::gpu::expect;

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0 && !(std::isnan(double(a[i])) && std::isnan(double(b[i])))) return false;
  return true;
}

/// |a - b| <= tol (scale + |b|) everywhere.
bool close_to(const std::vector<float>& a, const std::vector<float>& b, double tol, double scale) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!(std::fabs(double(a[i]) - double(b[i])) <= tol * (scale + std::fabs(double(b[i]))))) return false;
  return true;
}

void batch_norm() {
  constexpr std::size_t C = 24, HW = 14 * 14;
  const std::size_t batch = 16;
  std::vector<float> x(batch * C * HW), dy(x.size()), w(C), b(C), rm(C, 0.0f), rv(C, 1.0f);
  fill_uniform(x, -2, 3, 1);
  fill_uniform(dy, -1, 1, 2);
  fill_uniform(w, 0.5, 1.5, 3);
  fill_uniform(b, -0.5, 0.5, 4);
  std::vector<float> y(x.size()), dx(x.size()), mean(C), rstd(C), dw(C), db(C), hrm = rm, hrv = rv;
  solder::test::run_warp(C, cu::batch_norm_train_forward_body<HW>{x.data(), y.data(), w.data(), b.data(), hrm.data(), hrv.data(),
                                                                  mean.data(), rstd.data(), batch, C, 1e-5, 0.1});
  solder::test::run_warp(C, cu::batch_norm_train_backward_body<HW>{x.data(), dy.data(), dx.data(), w.data(), mean.data(), rstd.data(),
                                                                   dw.data(), db.data(), batch, C});
  device_vector<float> dxs(x), ddy(dy), dws(w), dbs(b), drm(rm), drv(rv), dyo(x.size()), ddx(x.size()), dmean(C), drstd(C),
      ddw(C), ddb(C);
  cu::batch_norm_train_forward(cu::batch_norm_train_forward_body<HW>{dxs.get(), dyo.get(), dws.get(), dbs.get(), drm.get(), drv.get(),
                                                                     dmean.get(), drstd.get(), batch, C, 1e-5, 0.1},
                               nullptr);
  cu::batch_norm_train_backward(cu::batch_norm_train_backward_body<HW>{dxs.get(), ddy.get(), ddx.get(), dws.get(), dmean.get(),
                                                                       drstd.get(), ddw.get(), ddb.get(), batch, C},
                                nullptr);
  expect(close_to(dyo.read(), y, 1e-5, 1.0), "batch_norm forward: device and host differ");
  expect(close_to(drm.read(), hrm, 1e-5, 1.0) && close_to(drv.read(), hrv, 1e-5, 1.0), "batch_norm running statistics differ");
  expect(close_to(ddx.read(), dx, 1e-4, 1.0), "batch_norm dx: device and host differ");
  expect(close_to(ddw.read(), dw, 1e-5, double(batch * HW)) && close_to(ddb.read(), db, 1e-5, double(batch * HW)),
         "batch_norm dweight, dbias: device and host differ");
}

template <cu::pool_kind Kind>
void pooling(const solder::ops::pool2d::geometry& g, bool count_include_pad) {
  const std::size_t batch = 4, in = batch * std::size_t(g.channels * g.h * g.w), out = batch * std::size_t(g.channels * g.ho * g.wo);
  std::vector<float> x(in), dy(out), y(out), dx(in);
  std::vector<std::int32_t> argmax(out);
  fill_uniform(x, -1, 1, 5);
  fill_uniform(dy, -1, 1, 6);
  const cu::pool_forward_body<Kind> hf{x.data(), y.data(), argmax.data(), g, count_include_pad};
  for (std::size_t k = 0; k < out; ++k) hf(k);
  const cu::pool_backward_body<Kind> hb{dy.data(), argmax.data(), dx.data(), g, count_include_pad};
  for (std::size_t k = 0; k < in; ++k) hb(k);
  device_vector<float> dxs(x), ddy(dy), dyo(out), ddx(in);
  device_vector<std::int32_t> darg(out);
  cu::pool_forward(cu::pool_forward_body<Kind>{dxs.get(), dyo.get(), darg.get(), g, count_include_pad}, batch, nullptr);
  cu::pool_backward(cu::pool_backward_body<Kind>{ddy.get(), darg.get(), ddx.get(), g, count_include_pad}, batch, nullptr);
  expect(same_bits(dyo.read(), y), "pooling forward: device and host differ");
  expect(same_bits(ddx.read(), dx), "pooling backward: device and host differ");
}

}  // namespace

int main() {
  return solder::test::gpu::run("solder_cuda_image", "cuda:image: batch norm and pooling on the device agree with the host", [] {
    batch_norm();
    pooling<cu::pool_kind::max>({8, 15, 13, 8, 7, 3, 2, 1}, true);
    pooling<cu::pool_kind::avg>({8, 15, 13, 8, 7, 3, 2, 1}, false);
    pooling<cu::pool_kind::adaptive_avg>({8, 15, 13, 4, 5, 1, 1, 0}, true);
  });
}
