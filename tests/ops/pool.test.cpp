// tests/ops/pool.test.cpp: the pooling windows of ops/pool.hpp against their definitions
// counted element by element: output extents, strided windows clipped to the input, the windows
// that hold an input (the gather of backward), avg_pool2d's divisor with and without the padding
// counted, and the adaptive windows (floor / ceil of torch); every kernel, stride and padding
// torch accepts up to K = 5 over inputs 1 to 11. Then the per-element bodies on raw arrays with
// known values: the max tie rule, a window of -inf, NaN, and the divisors both ways.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/ops/pool.hpp"

namespace {

namespace pool2d = solder::ops::pool2d;
using pool2d::index;

/// A square window over an n x n input (only the extents along one axis matter here).
pool2d::geometry line(index n, index n_out, index k, index s, index p) { return {1, n, n, n_out, n_out, k, s, p}; }

/// The first input element of strided window o, before clipping: o S - P.
index window_start(index o, const pool2d::geometry& g) { return o * g.stride - g.pad; }

}  // namespace

TEST_CASE("ops pool2d: strided windows, their inverse and the divisors against element counts", "[ops][pool]") {
  for (index k = 1; k <= 5; ++k)
    for (index s = 1; s <= 3; ++s)
      for (index p = 0; p <= k / 2; ++p)  // torch's rule: P <= K / 2
        for (index n = 1; n <= 11; ++n) {
          CAPTURE(k, s, p, n);
          // Windows that fit the padded input [-P, n + P): o S - P + K <= n + P.
          index fits = 0;
          while (window_start(fits, line(n, 0, k, s, p)) + k <= n + p) ++fits;
          REQUIRE(pool2d::out_extent(std::size_t(n), std::size_t(k), std::size_t(s), std::size_t(p)) == std::size_t(fits));
          const index n_out = fits;
          if (n_out == 0) continue;
          const pool2d::geometry g = line(n, n_out, k, s, p);
          for (index o = 0; o < n_out; ++o) {
            CAPTURE(o);
            // The input elements of window o: i in [0, n) with o S - P <= i < o S - P + K.
            index first = n, last = -1, inside_pad = 0;
            for (index i = -p; i < n + p; ++i) {
              const bool in_window = window_start(o, g) <= i && i < window_start(o, g) + k;
              if (!in_window) continue;
              ++inside_pad;
              if (i >= 0 && i < n) {
                first = std::min(first, i);
                last = std::max(last, i);
              }
            }
            const pool2d::interval r = pool2d::window(o, n, g);
            REQUIRE(last >= first);  // P <= K / 2: every window holds an input element
            CHECK(r.begin == first);
            CHECK(r.end == last + 1);
            // The divisor of output (o, o): the window's elements in the padded input, or in
            // the input only.
            CHECK(pool2d::avg_divisor(o, o, g, true) == inside_pad * inside_pad);
            CHECK(pool2d::avg_divisor(o, o, g, false) == (last + 1 - first) * (last + 1 - first));
          }
          // windows_over(i) is exactly the windows whose range holds i.
          for (index i = 0; i < n; ++i) {
            CAPTURE(i);
            const pool2d::interval w = pool2d::windows_over(i, n_out, g);
            for (index o = 0; o < n_out; ++o) {
              const pool2d::interval r = pool2d::window(o, n, g);
              CHECK((r.begin <= i && i < r.end) == (w.begin <= o && o < w.end));
            }
          }
        }
}

TEST_CASE("ops pool2d: the divisor counts the padding on each axis apart, as torch", "[ops][pool]") {
  // H = 4, W = 5, K = 3, S = 2, P = 1: Ho = 2, Wo = 3. Output (0, 2): rows [-1, 2) of which
  // [0, 2) are inputs; columns [3, 6) of which [3, 5) are inputs and 5 is padding.
  const pool2d::geometry g{1, 4, 5, 2, 3, 3, 2, 1};
  CHECK(pool2d::avg_divisor(0, 2, g, true) == 3 * 3);
  CHECK(pool2d::avg_divisor(0, 2, g, false) == 2 * 2);
  CHECK(pool2d::avg_divisor(1, 1, g, true) == 3 * 3);   // rows [1, 4), columns [1, 4): all inputs
  CHECK(pool2d::avg_divisor(1, 1, g, false) == 3 * 3);
  // H = W = 2, K = 3, S = 1, P = 1: output (1, 1) covers rows and columns [0, 3), of which
  // [0, 2) are inputs and 2 is padding.
  const pool2d::geometry h{1, 2, 2, 2, 2, 3, 1, 1};
  CHECK(pool2d::avg_divisor(1, 1, h, true) == 3 * 3);
  CHECK(pool2d::avg_divisor(1, 1, h, false) == 2 * 2);
}

TEST_CASE("ops pool2d: adaptive windows are torch's floor / ceil, and their inverse", "[ops][pool]") {
  for (index n = 1; n <= 11; ++n)
    for (index n_out = 1; n_out <= 11; ++n_out) {
      CAPTURE(n, n_out);
      for (index o = 0; o < n_out; ++o) {
        const pool2d::interval r = pool2d::adaptive_window(o, n_out, n);
        CHECK(r.begin == index(std::floor(double(o * n) / double(n_out))));
        CHECK(r.end == index(std::ceil(double((o + 1) * n) / double(n_out))));
        CHECK(r.begin < r.end);
      }
      // adaptive_window(i, n, n_out): the windows that hold input i.
      for (index i = 0; i < n; ++i) {
        const pool2d::interval w = pool2d::adaptive_window(i, n, n_out);
        for (index o = 0; o < n_out; ++o) {
          const pool2d::interval r = pool2d::adaptive_window(o, n_out, n);
          CHECK((r.begin <= i && i < r.end) == (w.begin <= o && o < w.end));
        }
      }
    }
}

TEST_CASE("ops pool2d: the per-element bodies on known values", "[ops][pool]") {
  constexpr float qnan = std::numeric_limits<float>::quiet_NaN();
  constexpr float inf = std::numeric_limits<float>::infinity();
  SECTION("max: ties go to the first maximal element, -inf windows to their first, NaN wins") {
    // One 3x4 plane, K = 2, S = 2: windows rows {0,1} x columns {0,1} and {2,3}; Ho = 1, Wo = 2.
    const pool2d::geometry g{1, 3, 4, 1, 2, 2, 2, 0};
    const std::vector<float> x = {5, 1, -inf, -inf,  //
                                  2, 5, -inf, -inf,  //
                                  9, 9, 9, 9};
    std::vector<float> y(2);
    std::vector<std::int32_t> argmax(2);
    for (index ow = 0; ow < 2; ++ow) pool2d::max_forward_at(x.data(), y.data(), argmax.data(), g, 0, 0, 0, ow);
    CHECK(y[0] == 5.0f);
    CHECK(argmax[0] == 0);  // (0, 0) and (1, 1) tie: the first in row-major order
    CHECK(y[1] == -inf);
    CHECK(argmax[1] == 2);  // all -inf: the window's first element, (0, 2)
    std::vector<float> xn = x;
    xn[1 * 4 + 0] = qnan;
    pool2d::max_forward_at(xn.data(), y.data(), argmax.data(), g, 0, 0, 0, 0);
    CHECK(std::isnan(y[0]));
    CHECK(argmax[0] == 4);
    // Backward routes each dy to its argmax; the other inputs get 0.
    const std::vector<float> dy = {3, 7};
    std::vector<float> dx(12, -1.0f);
    for (index ih = 0; ih < 3; ++ih)
      for (index iw = 0; iw < 4; ++iw) pool2d::max_backward_at(dy.data(), argmax.data(), dx.data(), g, 0, 0, ih, iw);
    CHECK(dx == std::vector<float>{0, 0, 7, 0, 3, 0, 0, 0, 0, 0, 0, 0});
  }
  SECTION("avg: the divisor with and without the padding, forward and backward") {
    // One 2x2 plane of ones, K = 3, S = 1, P = 1: Ho = Wo = 2, every window holds all four
    // inputs and 5 padding elements.
    const pool2d::geometry g{1, 2, 2, 2, 2, 3, 1, 1};
    const std::vector<float> x(4, 1.0f);
    std::vector<float> y(4), dx(4);
    for (index oh = 0; oh < 2; ++oh)
      for (index ow = 0; ow < 2; ++ow) pool2d::avg_forward_at(x.data(), y.data(), g, true, 0, 0, oh, ow);
    CHECK(y == std::vector<float>(4, 4.0f / 9.0f));
    for (index oh = 0; oh < 2; ++oh)
      for (index ow = 0; ow < 2; ++ow) pool2d::avg_forward_at(x.data(), y.data(), g, false, 0, 0, oh, ow);
    CHECK(y == std::vector<float>(4, 1.0f));
    const std::vector<float> dy = {1, 2, 3, 4};
    for (index ih = 0; ih < 2; ++ih)
      for (index iw = 0; iw < 2; ++iw) pool2d::avg_backward_at(dy.data(), dx.data(), g, false, 0, 0, ih, iw);
    // Each input is in all four windows, each dividing by 4, summed in row-major output order.
    const float each = 1.0f / 4 + 2.0f / 4 + 3.0f / 4 + 4.0f / 4;
    CHECK(dx == std::vector<float>(4, each));
  }
  SECTION("adaptive avg: overlapping windows of 3 inputs onto 2") {
    // One 1x3 plane onto 1x2: windows [0, 2) and [1, 3).
    const pool2d::geometry g{1, 1, 3, 1, 2};
    const std::vector<float> x = {1, 2, 4};
    std::vector<float> y(2), dx(3);
    for (index ow = 0; ow < 2; ++ow) pool2d::adaptive_avg_forward_at(x.data(), y.data(), g, 0, 0, 0, ow);
    CHECK(y == std::vector<float>{1.5f, 3.0f});
    const std::vector<float> dy = {2, 4};
    for (index iw = 0; iw < 3; ++iw) pool2d::adaptive_avg_backward_at(dy.data(), dx.data(), g, 0, 0, 0, iw);
    CHECK(dx == std::vector<float>{1.0f, 3.0f, 2.0f});
  }
}
