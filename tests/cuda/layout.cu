// tests/cuda/layout.cu: the CUDA conv path's layout kernels (eval/cuda/layout_kernels.hpp) on
// the device against the same bodies run on the host (every index; an emulated warp per
// channel), all bit for bit: the NHWC <-> NCHW reorders (with and without the bias), their round
// trip, and the per-channel sums from either layout, twice (the same bits every run).
// Exits 77 (ctest's skip code) where no CUDA device is present.
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <vector>

#include "../support/data.hpp"
#include "../support/device_vector.hpp"
#include "../support/gpu_program.hpp"
#include "../support/warp_emulation.hpp"
#include "solder/eval/cuda/layout_kernels.hpp"

namespace {

namespace cu = solder::eval::cuda;
using solder::test::fill_uniform;
using solder::test::gpu::device_vector;
using solder::test::gpu::expect;

/// Equal bits, except that any two NaNs are equal (x + b with x NaN: the payload is the
/// hardware's choice).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0 && !(std::isnan(a[i]) && std::isnan(b[i]))) return false;
  return true;
}

/// Equal bits, NaN payloads included (the copies move bits).
bool exact_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

template <std::size_t C, std::size_t H, std::size_t W>
void layouts(std::size_t batch) {
  const std::size_t n = batch * C * H * W;
  std::vector<float> x(n), bias(C);
  fill_uniform(x, -2, 3, 11 + n);
  fill_uniform(bias, -1, 1, 12);
  x[n / 3] = std::numeric_limits<float>::quiet_NaN();
  x[n - 1] = std::numeric_limits<float>::infinity();

  // The host's run of every body.
  std::vector<float> nchw(n), nhwc(n), back(n), biased(n), sums_nchw(C), sums_nhwc(C);
  const auto each = [](const auto& body) {
    for (std::size_t i = 0; i < body.elements(); ++i) body(i);
  };
  each(cu::nhwc_to_nchw_body<C, H, W>{x.data(), nchw.data(), batch});
  each(cu::nchw_to_nhwc_body<C, H, W>{x.data(), nhwc.data(), batch});
  each(cu::nchw_to_nhwc_body<C, H, W>{nchw.data(), back.data(), batch});
  each(cu::nhwc_to_nchw_body<C, H, W>{x.data(), biased.data(), batch, bias.data()});
  std::vector<float> g(n);  // a gradient without NaN for the sums
  fill_uniform(g, -1, 2, 13 + n);
  std::vector<float> g_last(n);
  each(cu::nchw_to_nhwc_body<C, H, W>{g.data(), g_last.data(), batch});
  solder::test::run_warp(C, cu::channel_sums_body<C, H, W, false>{g.data(), sums_nchw.data(), batch});
  solder::test::run_warp(C, cu::channel_sums_body<C, H, W, true>{g_last.data(), sums_nhwc.data(), batch});

  device_vector<float> dx(x), dbias(bias), dg(g), dg_last(g_last), dnchw(n), dnhwc(n), dback(n), dbiased(n), dsums_nchw(C),
      dsums_nhwc(C), dsums_again(C);
  cu::nhwc_to_nchw(cu::nhwc_to_nchw_body<C, H, W>{dx.get(), dnchw.get(), batch}, nullptr);
  cu::nchw_to_nhwc(cu::nchw_to_nhwc_body<C, H, W>{dx.get(), dnhwc.get(), batch}, nullptr);
  cu::nchw_to_nhwc(cu::nchw_to_nhwc_body<C, H, W>{dnchw.get(), dback.get(), batch}, nullptr);
  cu::nhwc_to_nchw(cu::nhwc_to_nchw_body<C, H, W>{dx.get(), dbiased.get(), batch, dbias.get()}, nullptr);
  cu::channel_sums(cu::channel_sums_body<C, H, W, false>{dg.get(), dsums_nchw.get(), batch}, nullptr);
  cu::channel_sums(cu::channel_sums_body<C, H, W, true>{dg_last.get(), dsums_nhwc.get(), batch}, nullptr);
  cu::channel_sums(cu::channel_sums_body<C, H, W, true>{dg_last.get(), dsums_again.get(), batch}, nullptr);

  expect(exact_bits(dnchw.read(), nchw), "nhwc_to_nchw: device and host differ");
  expect(exact_bits(dnhwc.read(), nhwc), "nchw_to_nhwc: device and host differ");
  expect(exact_bits(dback.read(), x), "nhwc_to_nchw then nchw_to_nhwc: not the identity on the device");
  expect(same_bits(dbiased.read(), biased), "nhwc_to_nchw with a bias: device and host differ");
  expect(exact_bits(sums_nchw, sums_nhwc), "channel sums: the host's NCHW and NHWC sums differ");
  expect(exact_bits(dsums_nchw.read(), sums_nchw), "channel sums of NCHW: device and host differ");
  expect(exact_bits(dsums_nhwc.read(), sums_nhwc), "channel sums of NHWC: device and host differ");
  expect(exact_bits(dsums_again.read(), sums_nhwc), "channel sums: two device runs differ");
}

}  // namespace

int main() {
  return solder::test::gpu::run("solder_cuda_layout", "cuda:layout: the layout kernels on the device agree with the host bit for bit",
                                [] {
                                  layouts<1, 1, 1>(1);
                                  layouts<3, 5, 7>(2);
                                  layouts<17, 7, 5>(3);
                                  layouts<64, 28, 28>(8);
                                  layouts<32, 14, 14>(64);
                                });
}
