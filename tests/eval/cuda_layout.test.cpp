// tests/eval/cuda_layout.test.cpp: the CUDA conv path's layout bodies (eval/cuda/layout.hpp)
// run on the host as eval/cuda/layout_kernels.hpp runs them (every index, every tile's two
// phases; an emulated warp per channel): the reorders, as elements and as tiles, against naive
// loops bit for bit, the round trip the identity, the per-channel sums against a double
// reference within the bound of their float blocks, equal bits from either layout, and NaN and
// Inf carried through.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "solder/eval/cuda/layout.hpp"
#include "support/data.hpp"
#include "support/warp_emulation.hpp"

namespace {

namespace cu = solder::eval::cuda;
using solder::test::bit_differences;

/// Unit roundoff of float: 2^-24.
constexpr double float_u = std::numeric_limits<float>::epsilon() / 2;
/// A channel sum's error bound relative to the sum of its terms' magnitudes: each lane adds
/// blocks of 16 terms in float (at most 15 roundings of a partial sum no larger than the block's
/// magnitudes), then in double (2^-53 a step, nothing at this scale); 16 u covers both.
constexpr double sum_tolerance = 16 * float_u;

/// A reorder body over every element, as the launcher's grid runs it.
template <class Body>
void run_elements(const Body& body) {
  for (std::size_t i = 0; i < body.elements(); ++i) body(i);
}

/// A reorder's tiles over the whole grid, as transpose_kernel runs them: each block's threads
/// load, then store. The buffer starts as a value no input holds, so a store that read a slot
/// no load filled shows.
template <std::size_t R, std::size_t S>
void run_tiles(const cu::batched_transpose<R, S>& t) {
  for (std::size_t b = 0; b < t.blocks(); ++b) {
    cu::transpose_tile_buffer tile;
    for (auto& row : tile)
      for (float& v : row) v = 12345.0f;
    for (unsigned ty = 0; ty < cu::transpose_tile_rows; ++ty)
      for (unsigned tx = 0; tx < cu::transpose_tile; ++tx) t.load(b, tx, ty, tile);
    for (unsigned ty = 0; ty < cu::transpose_tile_rows; ++ty)
      for (unsigned tx = 0; tx < cu::transpose_tile; ++tx) t.store(b, tx, ty, tile);
  }
}

/// x NHWC [batch, H, W, C] -> NCHW by nested loops, + bias[c] where given.
std::vector<float> naive_to_nchw(const std::vector<float>& x, std::size_t batch, std::size_t C, std::size_t H, std::size_t W,
                                 const float* bias = nullptr) {
  std::vector<float> y(x.size());
  for (std::size_t n = 0; n < batch; ++n)
    for (std::size_t c = 0; c < C; ++c)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t w = 0; w < W; ++w) {
          const float v = x[((n * H + h) * W + w) * C + c];
          y[((n * C + c) * H + h) * W + w] = bias ? v + bias[c] : v;
        }
  return y;
}

/// x NCHW -> NHWC by nested loops.
std::vector<float> naive_to_nhwc(const std::vector<float>& x, std::size_t batch, std::size_t C, std::size_t H, std::size_t W) {
  std::vector<float> y(x.size());
  for (std::size_t n = 0; n < batch; ++n)
    for (std::size_t c = 0; c < C; ++c)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t w = 0; w < W; ++w) y[((n * H + h) * W + w) * C + c] = x[((n * C + c) * H + h) * W + w];
  return y;
}

/// Per channel of x NCHW: the sum in double and the sum of magnitudes.
struct channel_reference {
  std::vector<double> sum, magnitude;
};
channel_reference reference_sums(const std::vector<float>& x, std::size_t batch, std::size_t C, std::size_t HW) {
  channel_reference r{std::vector<double>(C, 0.0), std::vector<double>(C, 0.0)};
  for (std::size_t n = 0; n < batch; ++n)
    for (std::size_t c = 0; c < C; ++c)
      for (std::size_t p = 0; p < HW; ++p) {
        const double v = x[(n * C + c) * HW + p];
        r.sum[c] += v;
        r.magnitude[c] += std::abs(v);
      }
  return r;
}

/// The device's per-channel sums on the host: C rows of an emulated warp.
template <std::size_t C, std::size_t H, std::size_t W, bool ChannelsLast>
std::vector<float> emulated_sums(const std::vector<float>& g, std::size_t batch) {
  std::vector<float> sums(C, -1.0f);
  solder::test::run_warp(C, cu::channel_sums_body<C, H, W, ChannelsLast>{g.data(), sums.data(), batch});
  return sums;
}

}  // namespace

TEMPLATE_TEST_CASE_SIG("cuda layout: NHWC <-> NCHW reorders equal naive loops; the round trip is the identity",
                       "[cuda][layout]", ((std::size_t C, std::size_t H, std::size_t W), C, H, W), (1, 1, 1), (1, 5, 7),
                       (3, 7, 5), (3, 1, 7), (3, 5, 1), (17, 5, 5), (17, 7, 1), (17, 1, 5), (17, 7, 7), (40, 6, 7)) {
  const std::size_t batch = GENERATE(1, 2, 3);
  CAPTURE(C, H, W, batch);
  const std::size_t n = batch * C * H * W;
  std::vector<float> x(n), bias(C);
  solder::test::fill_uniform(x, -2, 2, 301 + n);
  solder::test::fill_uniform(bias, -1, 1, 302);
  x[n / 2] = std::numeric_limits<float>::quiet_NaN();
  x[n - 1] = -std::numeric_limits<float>::infinity();

  std::vector<float> nchw(n, -7.0f), nhwc(n, -7.0f), back(n, -7.0f), with_bias(n, -7.0f);
  run_elements(cu::nhwc_to_nchw_body<C, H, W>{x.data(), nchw.data(), batch});
  run_elements(cu::nchw_to_nhwc_body<C, H, W>{x.data(), nhwc.data(), batch});
  run_elements(cu::nchw_to_nhwc_body<C, H, W>{nchw.data(), back.data(), batch});
  run_elements(cu::nhwc_to_nchw_body<C, H, W>{x.data(), with_bias.data(), batch, bias.data()});
  // The same reorders as tiles: the same bits.
  std::vector<float> nchw_tiled(n, -7.0f), nhwc_tiled(n, -7.0f), with_bias_tiled(n, -7.0f);
  run_tiles(cu::nhwc_to_nchw_body<C, H, W>{x.data(), nchw_tiled.data(), batch}.tiles());
  run_tiles(cu::nchw_to_nhwc_body<C, H, W>{x.data(), nhwc_tiled.data(), batch}.tiles());
  run_tiles(cu::nhwc_to_nchw_body<C, H, W>{x.data(), with_bias_tiled.data(), batch, bias.data()}.tiles());

  // Copies are exact, NaN payloads included; the bias is one IEEE addition as in the loop.
  CHECK(bit_differences(nchw.data(), naive_to_nchw(x, batch, C, H, W).data(), n) == 0);
  CHECK(bit_differences(nhwc.data(), naive_to_nhwc(x, batch, C, H, W).data(), n) == 0);
  CHECK(bit_differences(back.data(), x.data(), n) == 0);
  CHECK(solder::test::bit_differences_any_nan(with_bias.data(), naive_to_nchw(x, batch, C, H, W, bias.data()).data(), n) == 0);
  CHECK(bit_differences(nchw_tiled.data(), nchw.data(), n) == 0);
  CHECK(bit_differences(nhwc_tiled.data(), nhwc.data(), n) == 0);
  CHECK(solder::test::bit_differences_any_nan(with_bias_tiled.data(), with_bias.data(), n) == 0);
  CHECK(cu::nhwc_to_nchw_body<C, H, W>{x.data(), nchw.data(), batch}.elements() == n);
  CHECK(cu::nchw_to_nhwc_body<C, H, W>{x.data(), nhwc.data(), batch}.elements() == n);
}

TEMPLATE_TEST_CASE_SIG("cuda layout: per-channel sums against a double reference, the same bits from NCHW and NHWC",
                       "[cuda][layout]", ((std::size_t C, std::size_t H, std::size_t W), C, H, W), (1, 1, 1), (1, 5, 7),
                       (3, 7, 5), (3, 1, 7), (17, 5, 5), (17, 7, 7), (5, 15, 15)) {
  const std::size_t batch = GENERATE(1, 2, 3);
  CAPTURE(C, H, W, batch);
  constexpr std::size_t HW = H * W;
  std::vector<float> nchw(batch * C * HW);
  solder::test::fill_uniform(nchw, -1, 3, 311 + nchw.size());  // an offset: the sums grow, so their rounding does
  std::vector<float> nhwc = naive_to_nhwc(nchw, batch, C, H, W);

  const std::vector<float> from_nchw = emulated_sums<C, H, W, false>(nchw, batch);
  const std::vector<float> from_nhwc = emulated_sums<C, H, W, true>(nhwc, batch);
  const channel_reference ref = reference_sums(nchw, batch, C, HW);
  CHECK(bit_differences(from_nchw.data(), from_nhwc.data(), C) == 0);
  for (std::size_t c = 0; c < C; ++c) {
    CAPTURE(c, ref.sum[c]);
    CHECK_THAT(double(from_nchw[c]), Catch::Matchers::WithinAbs(ref.sum[c], sum_tolerance * ref.magnitude[c] +
                                                                                 float_u * std::abs(ref.sum[c])));
  }
}

TEST_CASE("cuda layout: per-channel sums of many values per lane, against a double reference", "[cuda][layout]") {
  // 2 x 37 x 41 = 3034 values a channel: six blocks of 16 per lane, and a partial one.
  constexpr std::size_t C = 3, H = 37, W = 41, HW = H * W;
  const std::size_t batch = 2;
  std::vector<float> nchw(batch * C * HW);
  solder::test::fill_uniform(nchw, -1, 3, 321);
  const std::vector<float> sums = emulated_sums<C, H, W, false>(nchw, batch);
  const std::vector<float> last = emulated_sums<C, H, W, true>(naive_to_nhwc(nchw, batch, C, H, W), batch);
  const channel_reference ref = reference_sums(nchw, batch, C, HW);
  CHECK(bit_differences(sums.data(), last.data(), C) == 0);
  for (std::size_t c = 0; c < C; ++c)
    CHECK_THAT(double(sums[c]),
               Catch::Matchers::WithinAbs(ref.sum[c], sum_tolerance * ref.magnitude[c] + float_u * std::abs(ref.sum[c])));
}

TEST_CASE("cuda layout: per-channel sums carry NaN and Inf to their own channel only; a zero batch gives zeros",
          "[cuda][layout]") {
  constexpr std::size_t C = 4, H = 5, W = 7, HW = H * W;
  const std::size_t batch = 3;
  std::vector<float> nchw(batch * C * HW);
  solder::test::fill_uniform(nchw, -1, 1, 331);
  const float inf = std::numeric_limits<float>::infinity();
  nchw[(2 * C + 0) * HW + 3] = std::numeric_limits<float>::quiet_NaN();  // channel 0
  nchw[(1 * C + 1) * HW + 9] = inf;                                      // channel 1: +Inf
  nchw[(0 * C + 2) * HW + 0] = inf;                                      // channel 2: +Inf and -Inf
  nchw[(2 * C + 2) * HW + HW - 1] = -inf;
  for (const bool last : {false, true}) {
    CAPTURE(last);
    const std::vector<float> sums =
        last ? emulated_sums<C, H, W, true>(naive_to_nhwc(nchw, batch, C, H, W), batch) : emulated_sums<C, H, W, false>(nchw, batch);
    CHECK(std::isnan(sums[0]));
    CHECK(sums[1] == inf);
    CHECK(std::isnan(sums[2]));
    CHECK(std::isfinite(sums[3]));
  }
  const std::vector<float> none = emulated_sums<C, H, W, true>(nchw, 0);
  for (const float s : none) CHECK(s == 0.0f);
}
