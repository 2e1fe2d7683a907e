// tests/eval/conv_im2col.test.cpp: the im2col operand (expr/operand.hpp) as the CPU packs it
// (eval/cpu/operand_packing.hpp): every block of panels [p0, p1) x [k0, k1) packed from the
// image holds the same bits as that block packed from the column matrix written out from the
// definition, padding columns of the last panel zero; a product over it (gemm_from) equals the
// product over the stored columns bit for bit and the convolution summed in double within
// float rounding; image_columns picks a sample and a group's channels of a batch. Geometries
// with strides, dilation, padding wider than the kernel, non-square kernels and output planes
// wider than a panel.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/eval/cpu/conv2d.hpp"
#include "solder/eval/cpu/operand_packing.hpp"
#include "solder/expr/operand.hpp"
#include "solder/ops/conv2d.hpp"
#include "support/data.hpp"
#include "support/reference.hpp"

namespace {

using namespace solder;
using solder::test::bit_differences;

/// Float's unit roundoff; a sum of K products in float errs by at most about K u times the sum
/// of |terms| (the bound the comparison with the double sum uses, with K = the row's length).
constexpr double u = 0x1p-24;

std::vector<float> values(std::size_t n, std::uint32_t seed) {
  std::vector<float> v(n);
  for (auto& e : v) {
    seed = seed * 1664525u + 1013904223u;
    e = float(int(seed >> 8) % 2001 - 1000) / 1000.0f;
  }
  return v;
}

template <std::size_t H, std::size_t W, std::size_t Kh, std::size_t Kw, std::size_t S, std::size_t P, std::size_t D,
          std::size_t C>
void check_operand() {
  using G = ops::conv2d_geometry<H, W, Kh, Kw, S, P, D>;
  constexpr std::size_t K = C * Kh * Kw, N = G::out_plane, Ho = G::out_height, Wo = G::out_width;
  INFO("H " << H << " W " << W << " K " << Kh << "x" << Kw << " S " << S << " P " << P << " D " << D << " C " << C);
  using X = im2col<G, C>;
  STATIC_REQUIRE(detail::operand_traits<X>::rows == K);
  STATIC_REQUIRE(detail::operand_traits<X>::cols == N);
  const std::vector<float> x = values(C * H * W, 1);
  // The columns from the definition, stored [K, N].
  tensor<float, shape<K, N>> col;
  test::for_each_conv_tap(C, Kh, Kw, Ho, Wo, S, P, D, [&](auto c, auto kh, auto kw, auto ho, auto wo, long r, long s) {
    col.data()[((c * Kh + kh) * Kw + kw) * N + ho * Wo + wo] =
        r >= 0 && s >= 0 && r < long(H) && s < long(W) ? x[(c * H + std::size_t(r)) * W + std::size_t(s)] : 0.0f;
  });
  const X operand{x.data()};
  const auto stored = std::as_const(col).ref();

  // Every block of panels over a few K ranges, against the same block packed from the stored
  // columns (packing is exact: the same bits).
  constexpr eval::cpu::gemm_detail::b_panels L(N);
  const std::size_t panels = L.panels;
  std::size_t wrong = 0;
  for (std::size_t p0 = 0; p0 < panels; ++p0)
    for (std::size_t p1 = p0 + 1; p1 <= panels; ++p1)
      for (const auto& [k0, k1] : {std::pair<std::size_t, std::size_t>{0, K}, {K / 3, K - K / 4}, {K - 1, K}}) {
        std::vector<float> a((p1 - p0) * (k1 - k0) * L.nr, 7.0f), b(a.size(), 7.0f);
        eval::cpu::pack_b_block_of<N>(operand, a.data(), p0, p1, k0, k1);
        eval::cpu::pack_b_block_of<N>(stored, b.data(), p0, p1, k0, k1);
        wrong += bit_differences(a.data(), b.data(), a.size());
      }
  CHECK(wrong == 0);

  // y [M, N] = w [M, K] col as a product over the operand: the product over the stored columns
  // bit for bit, and the convolution in double within K u of the sum of |terms|.
  constexpr std::size_t M = 5;
  const std::vector<float> w = values(M * K, 2);
  std::vector<float> y(M * N), y_stored(M * N);
  using epilogue = eval::cpu::conv_detail::conv2d_store_epilogue<false>;
  eval::cpu::gemm_from<N>(M, K, eval::cpu::gemm_detail::a_strided{w.data(), K, false},
                          eval::cpu::b_block_packer<N, X>{operand}, epilogue{nullptr, y.data(), N}, 1);
  eval::cpu::gemm_from<N>(M, K, eval::cpu::gemm_detail::a_strided{w.data(), K, false},
                          eval::cpu::b_block_packer<N, decltype(stored)>{stored}, epilogue{nullptr, y_stored.data(), N}, 1);
  CHECK(bit_differences(y.data(), y_stored.data(), y.size()) == 0);
  std::size_t far = 0;
  for (std::size_t m = 0; m < M; ++m)
    for (std::size_t n = 0; n < N; ++n) {
      double sum = 0, magnitude = 0;
      for (std::size_t k = 0; k < K; ++k) {
        const double t = double(w[m * K + k]) * double(G::im2col_at(x.data(), k / (Kh * Kw), k / Kw % Kh, k % Kw, n / Wo, n % Wo));
        sum += t;
        magnitude += std::fabs(t);
      }
      far += std::fabs(double(y[m * N + n]) - sum) > double(K) * u * magnitude + 1e-30;
    }
  CHECK(far == 0);
}

}  // namespace

TEST_CASE("eval::im2col operand: packed panels and products against the stored columns", "[eval][conv]") {
  check_operand<9, 10, 3, 3, 1, 1, 1, 3>();
  check_operand<13, 11, 3, 3, 2, 1, 2, 2>();
  check_operand<12, 12, 3, 3, 1, 1, 1, 4>();  // 144 output positions: several panels
  check_operand<7, 8, 2, 3, 3, 2, 1, 5>();
  check_operand<2, 2, 3, 3, 1, 3, 1, 1>();  // padding wider than the kernel
  check_operand<6, 9, 1, 1, 1, 1, 1, 3>();  // pointwise with padding: a ring of zeros
  check_operand<17, 19, 5, 3, 2, 2, 1, 2>();
}

TEST_CASE("eval::im2col operand: image_columns picks a sample and a group's channels", "[eval][conv]") {
  using G = ops::conv2d_geometry<5, 6, 3, 3, 1, 1, 1>;
  tensor<float, shape<dyn, 4, 5, 6>> x(3);
  const auto cols = image_columns<G, 2>(std::as_const(x).ref(), 2, 1);
  CHECK(cols.image == x.data() + (2 * 4 + 1) * 30);
  STATIC_REQUIRE(decltype(cols)::rows == 2 * 9);
  STATIC_REQUIRE(decltype(cols)::cols == 30);
}
