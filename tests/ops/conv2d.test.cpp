// tests/ops/conv2d.test.cpp: ops/conv2d.hpp's geometry and index maps against a naive reading
// of torch's definition in signed arithmetic: output sizes (with windows that do not fit, and
// padding wider than the kernel), every im2col entry element by element and by row, part of a
// row and span across rows, the inverse map (for_each_reader) entry by entry and in order,
// col2im and the depthwise dx gather against a scatter, and a convolution computed as
// W x im2col against the direct sum; strides 1 to 4, dilations 1 to 3, non-square kernels,
// 1 x 1 images.
#include <cstddef>
#include <cstdint>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/ops/conv2d.hpp"
#include "support/reference.hpp"

namespace {

using solder::ops::conv2d_geometry;
using solder::ops::conv2d_output_size;
using solder::test::for_each_conv_tap;

/// The naive output size: how many window starts ho S (ho = 0, 1, ...) leave the dilated
/// kernel inside the padded input.
std::size_t naive_output_size(long in, long k, long s, long p, long d) {
  std::size_t n = 0;
  for (long start = 0; start + d * (k - 1) < in + 2 * p; start += s) ++n;
  return n;
}

/// x[ci][r][c] read at signed coordinates, 0 outside: torch's zero padding.
float naive_read(const std::vector<float>& x, std::size_t H, std::size_t W, std::size_t ci, long r, long c) {
  return r >= 0 && c >= 0 && r < long(H) && c < long(W) ? x[(ci * H + std::size_t(r)) * W + std::size_t(c)] : 0.0f;
}

/// Small integers, so that every sum below is exact in float and the gathers can be compared
/// bit for bit with the scatters whatever the order.
std::vector<float> integers(std::size_t n, std::uint32_t seed) {
  std::vector<float> v(n);
  for (auto& e : v) {
    seed = seed * 1664525u + 1013904223u;
    e = float(int(seed >> 24) % 17 - 8);
  }
  return v;
}

template <std::size_t H, std::size_t W, std::size_t Kh, std::size_t Kw, std::size_t S, std::size_t P, std::size_t D>
void check_geometry() {
  using G = conv2d_geometry<H, W, Kh, Kw, S, P, D>;
  INFO("H " << H << " W " << W << " K " << Kh << "x" << Kw << " S " << S << " P " << P << " D " << D);
  constexpr std::size_t C = 2, Ho = G::out_height, Wo = G::out_width;
  STATIC_REQUIRE(G::out_height == conv2d_output_size(H, Kh, S, P, D));
  STATIC_REQUIRE(G::out_width == conv2d_output_size(W, Kw, S, P, D));
  REQUIRE(Ho == naive_output_size(long(H), long(Kh), long(S), long(P), long(D)));
  REQUIRE(Wo == naive_output_size(long(W), long(Kw), long(S), long(P), long(D)));

  const std::vector<float> x = integers(C * H * W, 1);
  // The column matrix [C Kh Kw, Ho Wo] from the definition.
  std::vector<float> col(C * Kh * Kw * Ho * Wo);
  for_each_conv_tap(C, Kh, Kw, Ho, Wo, S, P, D, [&](auto ci, auto kh, auto kw, auto ho, auto wo, long r, long c) {
    col[((ci * Kh + kh) * Kw + kw) * Ho * Wo + ho * Wo + wo] = naive_read(x, H, W, ci, r, c);
  });

  std::size_t wrong_at = 0, wrong_row = 0, wrong_part = 0, wrong_span = 0;
  std::vector<float> row(Wo), span(Ho * Wo);
  for (std::size_t ci = 0; ci < C; ++ci)
    for (std::size_t kh = 0; kh < Kh; ++kh)
      for (std::size_t kw = 0; kw < Kw; ++kw) {
        const float* want = col.data() + ((ci * Kh + kh) * Kw + kw) * Ho * Wo;
        const float* plane = x.data() + ci * H * W;
        for (std::size_t ho = 0; ho < Ho; ++ho) {
          for (std::size_t wo = 0; wo < Wo; ++wo) wrong_at += G::im2col_at(x.data(), ci, kh, kw, ho, wo) != want[ho * Wo + wo];
          G::im2col_row(plane, kh, kw, ho, row.data());
          for (std::size_t wo = 0; wo < Wo; ++wo) wrong_row += row[wo] != want[ho * Wo + wo];
          for (std::size_t wo0 = 0; wo0 <= Wo; ++wo0)
            for (std::size_t wo1 = wo0; wo1 <= Wo; ++wo1) {
              std::vector<float> part(wo1 - wo0 + 1, 99.0f);  // one past the end must stay untouched
              G::im2col_row_part(plane, kh, kw, ho, wo0, wo1, part.data());
              for (std::size_t wo = wo0; wo < wo1; ++wo) wrong_part += part[wo - wo0] != want[ho * Wo + wo];
              wrong_part += part[wo1 - wo0] != 99.0f;
            }
        }
        // Spans across output rows: every start, and ends at 1, 3, a row's length and the end.
        for (std::size_t n0 = 0; n0 < Ho * Wo; ++n0)
          for (std::size_t len : {std::size_t(1), std::size_t(3), Wo, Ho * Wo}) {
            const std::size_t n1 = n0 + len < Ho * Wo ? n0 + len : Ho * Wo;
            G::im2col_span(plane, kh, kw, n0, n1, span.data());
            for (std::size_t n = n0; n < n1; ++n) wrong_span += span[n - n0] != want[n];
          }
      }
  CHECK(wrong_at == 0);
  CHECK(wrong_row == 0);
  CHECK(wrong_part == 0);
  CHECK(wrong_span == 0);

  // The inverse map: the entries (kh, kw, ho, wo) reading each input element, from the
  // definition, in (kh, kw) order; for_each_reader must give exactly those, in that order.
  std::vector<std::vector<std::size_t>> readers(H * W);
  for_each_conv_tap(1, Kh, Kw, Ho, Wo, S, P, D, [&](auto, auto kh, auto kw, auto ho, auto wo, long r, long c) {
    if (r >= 0 && c >= 0 && r < long(H) && c < long(W))
      readers[std::size_t(r) * W + std::size_t(c)].push_back(((kh * Kw + kw) * Ho + ho) * Wo + wo);
  });
  std::size_t wrong_readers = 0;
  for (std::size_t hi = 0; hi < H; ++hi)
    for (std::size_t wi = 0; wi < W; ++wi) {
      std::vector<std::size_t> seen;
      G::for_each_reader(hi, wi, [&](std::size_t kh, std::size_t kw, std::size_t ho, std::size_t wo) {
        seen.push_back(((kh * Kw + kw) * Ho + ho) * Wo + wo);
      });
      wrong_readers += seen != readers[hi * W + wi];
    }
  CHECK(wrong_readers == 0);

  // col2im: the gather against a scatter-add of dcol into the image (integers: exact sums).
  const std::vector<float> dcol = integers(col.size(), 2);
  std::vector<float> scattered(C * H * W, 0.0f);
  for_each_conv_tap(C, Kh, Kw, Ho, Wo, S, P, D, [&](auto ci, auto kh, auto kw, auto ho, auto wo, long r, long c) {
    if (r >= 0 && c >= 0 && r < long(H) && c < long(W))
      scattered[(ci * H + std::size_t(r)) * W + std::size_t(c)] += dcol[((ci * Kh + kh) * Kw + kw) * Ho * Wo + ho * Wo + wo];
  });
  std::size_t wrong_col2im = 0;
  for (std::size_t ci = 0; ci < C; ++ci)
    for (std::size_t hi = 0; hi < H; ++hi)
      for (std::size_t wi = 0; wi < W; ++wi)
        wrong_col2im += G::col2im_at(dcol.data(), ci, hi, wi) != scattered[(ci * H + hi) * W + wi];
  CHECK(wrong_col2im == 0);

  // A depthwise layer's dx with 3 output planes per input plane: the gather against the
  // scatter of w_j[kh][kw] dy_j[ho][wo].
  constexpr std::size_t mult = 3;
  const std::vector<float> dy = integers(mult * Ho * Wo, 3), w = integers(mult * Kh * Kw, 4);
  std::vector<float> dx(H * W, 0.0f);
  for_each_conv_tap(mult, Kh, Kw, Ho, Wo, S, P, D, [&](auto j, auto kh, auto kw, auto ho, auto wo, long r, long c) {
    if (r >= 0 && c >= 0 && r < long(H) && c < long(W))
      dx[std::size_t(r) * W + std::size_t(c)] += w[j * Kh * Kw + kh * Kw + kw] * dy[j * Ho * Wo + ho * Wo + wo];
  });
  std::size_t wrong_depthwise = 0;
  for (std::size_t hi = 0; hi < H; ++hi)
    for (std::size_t wi = 0; wi < W; ++wi)
      wrong_depthwise += G::depthwise_dx_at(dy.data(), w.data(), mult, hi, wi) != dx[hi * W + wi];
  CHECK(wrong_depthwise == 0);

  // The convolution as a product over the columns: y [Cout, Ho Wo] = W [Cout, C Kh Kw] col
  // equals the direct sum over (ci, kh, kw) of W x[ci][ho S + kh D - P][wo S + kw D - P].
  constexpr std::size_t Cout = 2, K = C * Kh * Kw;
  const std::vector<float> weights = integers(Cout * K, 5);
  std::size_t wrong_product = 0;
  for (std::size_t co = 0; co < Cout; ++co)
    for (std::size_t ho = 0; ho < Ho; ++ho)
      for (std::size_t wo = 0; wo < Wo; ++wo) {
        float product = 0.0f, direct = 0.0f;
        for (std::size_t k = 0; k < K; ++k)
          product += weights[co * K + k] * G::im2col_at(x.data(), k / (Kh * Kw), k / Kw % Kh, k % Kw, ho, wo);
        for (std::size_t ci = 0; ci < C; ++ci)
          for (std::size_t kh = 0; kh < Kh; ++kh)
            for (std::size_t kw = 0; kw < Kw; ++kw)
              direct += weights[co * K + (ci * Kh + kh) * Kw + kw] *
                        naive_read(x, H, W, ci, long(ho * S + kh * D) - long(P), long(wo * S + kw * D) - long(P));
        wrong_product += product != direct;
      }
  CHECK(wrong_product == 0);
}

}  // namespace

TEST_CASE("ops::conv2d_output_size: torch's formula, 0 when the kernel does not fit", "[ops][conv2d]") {
  for (std::size_t in = 1; in <= 12; ++in)
    for (std::size_t k = 1; k <= 5; ++k)
      for (std::size_t s = 1; s <= 4; ++s)
        for (std::size_t p = 0; p <= 3; ++p)
          for (std::size_t d = 1; d <= 3; ++d) {
            INFO("in " << in << " k " << k << " s " << s << " p " << p << " d " << d);
            CHECK(conv2d_output_size(in, k, s, p, d) == naive_output_size(long(in), long(k), long(s), long(p), long(d)));
          }
  STATIC_REQUIRE(conv2d_output_size(2, 5, 1, 0, 1) == 0);   // a 5-tap kernel on 2 elements
  STATIC_REQUIRE(conv2d_output_size(32, 3, 1, 1, 1) == 32);  // "same" padding
  STATIC_REQUIRE(conv2d_output_size(32, 3, 2, 1, 1) == 16);
}

TEST_CASE("ops::conv2d_geometry: im2col, its inverse, col2im and the product against the definition",
          "[ops][conv2d]") {
  check_geometry<7, 5, 3, 3, 2, 1, 1>();
  check_geometry<6, 5, 3, 3, 2, 1, 1>();
  check_geometry<9, 8, 5, 5, 1, 0, 1>();
  check_geometry<8, 7, 3, 3, 1, 1, 2>();
  check_geometry<5, 6, 3, 3, 1, 2, 2>();
  check_geometry<3, 3, 2, 2, 2, 1, 1>();
  check_geometry<4, 9, 1, 3, 3, 0, 1>();
  check_geometry<2, 2, 3, 3, 1, 3, 1>();  // padding wider than the kernel: windows of padding only
  check_geometry<7, 8, 2, 3, 3, 2, 1>();
  check_geometry<1, 1, 1, 1, 1, 0, 1>();
  check_geometry<10, 11, 3, 3, 4, 1, 3>();
  check_geometry<17, 3, 1, 1, 1, 0, 1>();  // pointwise: the columns are the image
  check_geometry<12, 13, 3, 5, 2, 2, 1>();
}

TEST_CASE("ops::conv2d_spec: group sizes, fan_in, depthwise and the geometry", "[ops][conv2d]") {
  using spec = solder::ops::conv2d_spec<6, 4, 3, 5, 2, 1, 1, 2, true>;
  STATIC_REQUIRE(spec::group_in == 3);
  STATIC_REQUIRE(spec::group_out == 2);
  STATIC_REQUIRE(spec::fan_in == 3 * 3 * 5);
  STATIC_REQUIRE(!spec::depthwise);
  STATIC_REQUIRE(solder::ops::conv2d_spec<4, 8, 3, 3, 1, 1, 1, 4, false>::depthwise);
  STATIC_REQUIRE(!solder::ops::conv2d_spec<1, 8, 3, 3, 1, 0, 1, 1, true>::depthwise);  // one channel, one group
  using G = spec::geometry<9, 10>;
  STATIC_REQUIRE(G::out_height == 5 && G::out_width == 4);
}
