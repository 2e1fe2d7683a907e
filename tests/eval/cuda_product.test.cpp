// tests/eval/cuda_product.test.cpp: the CUDA backend's matrix product with its epilogue
// (eval/cuda/product.hpp), run over whole grids on the host (support/grid.hpp) as the kernel
// runs it: against double references, with tails in every extent, for the operand forms
// (stored, transposed, generated signs) and the tilings (fp32 per thread; TF32 and BF16 on
// emulated tensor-core warps, against references of the rounded inputs); the fused epilogue
// against the unfused composition (the product stored, then the CPU's elementwise pass) bit
// for bit, the dropout mask included; the same bits for every fp32 tiling.
#include <catch2/catch.hpp>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "solder/assign.hpp"
#include "solder/eval/cuda/col2im.hpp"
#include "solder/eval/cuda/product.hpp"
#include "solder/expr/operators.hpp"
#include "solder/nn/conv2d.hpp"
#include "solder/random/philox.hpp"
#include "solder/random/sketch.hpp"
#include "support/data.hpp"
#include "support/device_view.hpp"
#include "support/grid.hpp"

namespace {

using namespace solder;
namespace cu = solder::eval::cuda;
using solder::test::bit_differences;

using solder::test::dev;
using solder::test::dev_out;

using small_tiles = cu::product_tiling<64, 64, 16, 4, 4>;
using large_tiles = cu::product_tiling<128, 128, 8, 8, 8>;
template <cu::product_math Math>
using small_mma = cu::mma_tiling<64, 64, 32, 32, 32, Math>;
template <cu::product_math Math>
using large_mma = cu::mma_tiling<128, 128, 32, 64, 32, Math>;

/// c[m][n] = sum_k a(m, k) b(k, n) in double, and sum_k |a b| (the scale of its rounding).
template <class A, class B>
void reference(const A& a, const B& b, std::size_t M, std::size_t N, std::size_t K, std::vector<double>& c,
               std::vector<double>& mag) {
  c.assign(M * N, 0.0);
  mag.assign(M * N, 0.0);
  for (std::size_t m = 0; m < M; ++m)
    for (std::size_t n = 0; n < N; ++n)
      for (std::size_t k = 0; k < K; ++k) {
        const double p = double(a(m, k)) * double(b(k, n));
        c[m * N + n] += p;
        mag[m * N + n] += std::abs(p);
      }
}

/// Elements of got farther from want than K float roundings of the magnitude allow.
std::size_t far_from(const float* got, const std::vector<double>& want, const std::vector<double>& mag, std::size_t K) {
  std::size_t bad = 0;
  const double tol = double(K + 2) * 0x1p-24;
  for (std::size_t i = 0; i < want.size(); ++i)
    if (!(std::abs(double(got[i]) - want[i]) <= tol * mag[i] + 1e-30)) ++bad;
  return bad;
}

constexpr philox_state rng{0x5eed5eedULL, 3};

}  // namespace

TEST_CASE("cuda product: x W^T with tails in M, N and K, both tilings, the same bits", "[cuda][product]") {
  constexpr std::size_t N = 150, K = 37;  // 150: two 64-column tiles and a tail, one 128 and a tail
  const std::size_t M = 131;
  tensor<float, shape<dyn, K>> x(M);
  tensor<float, shape<N, K>> w;
  test::fill_uniform(x, -1, 1, 11);
  test::fill_uniform(w, -1, 1, 12);
  using S = shape<dyn, N>;
  tensor<float, S> y_small(M), y_large(M);
  const cu::matrix_operand<false> a{x.data(), K};
  const cu::matrix_operand<true> b{w.data(), K};  // W [N, K] read as W^T
  test::run_product(cu::product<small_tiles>(a, b, M, K, write(dev_out(y_small), cu::product_value<S>(M))));
  test::run_product(cu::product<large_tiles>(a, b, M, K, write(dev_out(y_large), cu::product_value<S>(M))));

  std::vector<double> c, mag;
  reference([&](std::size_t m, std::size_t k) { return x.data()[m * K + k]; },
            [&](std::size_t k, std::size_t n) { return w.data()[n * K + k]; }, M, N, K, c, mag);
  CHECK(far_from(y_small.data(), c, mag, K) == 0);
  // Each element is the same fma chain over ascending k whatever the tiling.
  CHECK(bit_differences(y_small.data(), y_large.data(), M * N) == 0);
}

namespace {

/// An fp32 product pass run as product_kernel runs it, block by block of its launch grid
/// (grid(), tile_of): each block's tile staged, accumulated and finished by its threads.
/// Returns how many blocks computed each tile, row tile by row tile.
template <class P>
std::vector<int> run_on_launch_grid(const P& p) {
  std::vector<int> blocks(p.grid_rows() * p.grid_cols(), 0);
  std::vector<float> shared(P::shared_floats);
  const cu::product_grid g = p.grid();
  for (std::size_t y = 0; y < g.y; ++y)
    for (std::size_t x = 0; x < g.x; ++x) {
      const cu::product_tile tile = P::tile_of(unsigned(x), unsigned(y));
      ++blocks[tile.by * p.grid_cols() + tile.bx];
      std::vector<P> threads(P::threads, p);
      std::vector<typename P::accumulators> acc;
      for (unsigned t = 0; t < P::threads; ++t) acc.push_back(threads[t].start());
      for (std::size_t s = 0; s < p.slices(); ++s) {
        for (unsigned t = 0; t < P::threads; ++t) threads[t].stage(tile.bx, tile.by, t, s, shared.data());
        for (unsigned t = 0; t < P::threads; ++t) threads[t].accumulate(t, shared.data(), acc[t]);
      }
      for (unsigned t = 0; t < P::threads; ++t) threads[t].finish(tile.bx, tile.by, t, acc[t]);
    }
  return blocks;
}

/// How many blocks of p's launch grid fall on each tile, row tile by row tile.
template <class P>
std::vector<int> tiles_covered(const P& p) {
  std::vector<int> blocks(p.grid_rows() * p.grid_cols(), 0);
  const cu::product_grid g = p.grid();
  for (std::size_t y = 0; y < g.y; ++y)
    for (std::size_t x = 0; x < g.x; ++x) {
      const cu::product_tile tile = P::tile_of(unsigned(x), unsigned(y));
      if (tile.by < p.grid_rows() && tile.bx < p.grid_cols()) ++blocks[tile.by * p.grid_cols() + tile.bx];
    }
  return blocks;
}

}  // namespace

TEST_CASE("cuda product: more than 65,535 row tiles fit the launch grid, every tile once", "[cuda][product]") {
  // Row tiles on the grid's x (up to 2^31 - 1 blocks), column tiles on y (up to 65,535): M one
  // row past 65,536 tiles of 64 rows. No memory is touched: only the grid is computed.
  constexpr std::size_t N = 150, K = 37;
  const std::size_t M = 65536 * small_tiles::bm + 1;
  using S = shape<dyn, N>;
  const tensor_ref<float, S, device> y(nullptr, M);
  const auto p = cu::product<small_tiles>(cu::matrix_operand<false>{nullptr, K}, cu::matrix_operand<true>{nullptr, K}, M, K,
                                          write(y, cu::product_value<S>(M)));
  const cu::product_grid g = p.grid();
  CHECK(g.x == 65537);
  CHECK(g.x <= cu::max_grid_x);
  CHECK(g.y == 3);
  CHECK(g.y <= cu::max_grid_y);
  const std::vector<int> blocks = tiles_covered(p);
  CHECK(std::count(blocks.begin(), blocks.end(), 1) == std::ptrdiff_t(blocks.size()));
  // The last row tile holds row M - 1.
  CHECK((p.grid_rows() - 1) * small_tiles::bm <= M - 1);
  CHECK(M - 1 < p.grid_rows() * small_tiles::bm);
}

TEST_CASE("cuda product: run block by block of its launch grid, a product gives the grid emulation's bits",
          "[cuda][product]") {
  constexpr std::size_t N = 150, K = 37;
  const std::size_t M = 200;  // four row tiles of 64, the last a tail
  tensor<float, shape<dyn, K>> x(M);
  tensor<float, shape<N, K>> w;
  test::fill_uniform(x, -1, 1, 13);
  test::fill_uniform(w, -1, 1, 14);
  using S = shape<dyn, N>;
  tensor<float, S> y_grid(M), y_launch(M);
  const cu::matrix_operand<false> a{x.data(), K};
  const cu::matrix_operand<true> b{w.data(), K};
  test::run_product(cu::product<small_tiles>(a, b, M, K, write(dev_out(y_grid), cu::product_value<S>(M))));
  const std::vector<int> blocks =
      run_on_launch_grid(cu::product<small_tiles>(a, b, M, K, write(dev_out(y_launch), cu::product_value<S>(M))));
  CHECK(std::count(blocks.begin(), blocks.end(), 1) == std::ptrdiff_t(blocks.size()));
  CHECK(bit_differences(y_grid.data(), y_launch.data(), M * N) == 0);
}

TEST_CASE("cuda product: the bias + ReLU + dropout epilogue equals the product then the CPU's pass, bit for bit",
          "[cuda][product]") {
  constexpr std::size_t N = 200, K = 50;
  const std::size_t M = 77;
  using S = shape<dyn, N>;
  tensor<float, shape<dyn, K>> x(M);
  tensor<float, shape<N, K>> w;
  tensor<float, shape<N>> bias;
  test::fill_uniform(x, -1, 1, 21);
  test::fill_uniform(w, -1, 1, 22);
  test::fill_uniform(bias, -0.5, 0.5, 23);
  const cu::matrix_operand<false> a{x.data(), K};
  const cu::matrix_operand<true> b{w.data(), K};

  // The default stream (7 Philox rounds) and a 10-round one.
  const std::uint32_t rounds = GENERATE(7u, 10u);
  const philox_state stream{rng.seed, rng.offset, 0, rounds};
  CAPTURE(rounds);
  tensor<float, S> fused(M), product(M);
  test::run_product(cu::product<large_tiles>(
      a, b, M, K, write(dev_out(fused), dropout(relu(cu::product_value<S>(M) + dev(bias)), 0.25f, stream))));
  test::run_product(cu::product<large_tiles>(a, b, M, K, write(dev_out(product), cu::product_value<S>(M))));
  // The unfused composition on the CPU: the same op definitions and the same mask.
  tensor<float, S> unfused = dropout(relu(product + bias), 0.25f, stream);
  CHECK(bit_differences(fused.data(), unfused.data(), M * N) == 0);

  // The mask is random::bits16 at the flat output index: dropped elements are zero, kept ones
  // the scaled ReLU, and about a quarter are dropped.
  const std::uint32_t t = random::threshold16(0.25f);
  std::size_t dropped = 0, wrong = 0;
  for (std::size_t i = 0; i < M * N; ++i) {
    const bool keep = random::bits16(stream.seed, stream.offset, i, stream.rounds) >= t;
    dropped += !keep;
    if (!keep && fused.data()[i] != 0.0f) ++wrong;
    if (keep && product.data()[i] + bias.data()[i % N] > 0.0f && fused.data()[i] == 0.0f) ++wrong;
  }
  CHECK(wrong == 0);
  CHECK(std::abs(double(dropped) / double(M * N) - 0.25) < 0.02);
}

TEST_CASE("cuda product: g^T x, the batch as the inner extent (a weight gradient)", "[cuda][product]") {
  constexpr std::size_t Out = 70, In = 90;
  const std::size_t batch = 45;
  tensor<float, shape<dyn, Out>> g(batch);
  tensor<float, shape<dyn, In>> x(batch);
  test::fill_uniform(g, -1, 1, 31);
  test::fill_uniform(x, -1, 1, 32);
  using S = shape<Out, In>;
  tensor<float, S> dw;
  const cu::matrix_operand<true> a{g.data(), Out};   // g [batch, Out] read as g^T [Out, batch]
  const cu::matrix_operand<false> b{x.data(), In};   // x [batch, In]
  test::run_product(cu::product<small_tiles>(a, b, Out, batch, write(dev_out(dw), cu::product_value<S>())));
  std::vector<double> c, mag;
  reference([&](std::size_t m, std::size_t k) { return g.data()[k * Out + m]; },
            [&](std::size_t k, std::size_t n) { return x.data()[k * In + n]; }, Out, In, batch, c, mag);
  CHECK(far_from(dw.data(), c, mag, batch) == 0);
}

TEST_CASE("cuda product: a sign sketch as the right operand, its signs regenerated from Philox", "[cuda][product]") {
  // x [M, 40] times a [40, 24] term of random signs (scale 1/sqrt(24)), read as stored and as
  // the transpose of a [24, 40] term.
  constexpr std::size_t K = 40, N = 24;
  const std::size_t M = 19;
  tensor<float, shape<dyn, K>> x(M);
  test::fill_uniform(x, -1, 1, 41);
  using S = shape<dyn, N>;
  const float scale = 1.0f / std::sqrt(float(N));
  const cu::matrix_operand<false> a{x.data(), K};

  const std::uint32_t rounds = GENERATE(7u, 10u);
  CAPTURE(rounds);
  tensor<float, S> y(M), yt(M);
  test::run_product(cu::product<small_tiles>(a, cu::sign_operand<K, N, false>{99, 2, scale, rounds}, M, K,
                                             write(dev_out(y), cu::product_value<S>(M))));
  test::run_product(cu::product<small_tiles>(a, cu::sign_operand<N, K, true>{99, 2, scale, rounds}, M, K,
                                             write(dev_out(yt), cu::product_value<S>(M))));
  std::vector<double> c, mag, ct, magt;
  reference([&](std::size_t m, std::size_t k) { return x.data()[m * K + k]; },
            [&](std::size_t k, std::size_t n) { return scale * random::sketch_sign(99, 2, k * N + n, rounds); }, M, N, K,
            c, mag);
  reference([&](std::size_t m, std::size_t k) { return x.data()[m * K + k]; },
            [&](std::size_t k, std::size_t n) { return scale * random::sketch_sign(99, 2, n * K + k, rounds); }, M, N, K,
            ct, magt);
  CHECK(far_from(y.data(), c, mag, K) == 0);
  CHECK(far_from(yt.data(), ct, magt, K) == 0);
  // Both signs occur, so a constant sign would fail the references above.
  std::size_t negative = 0;
  for (std::size_t e = 0; e < K * N; ++e) negative += random::sketch_sign(99, 2, e) < 0;
  CHECK(negative > K * N / 4);
  CHECK(negative < 3 * K * N / 4);
}

namespace {

/// The operand op [KR, NC] as a dense host matrix, made by the CPU's product I op with the
/// identity I: each entry is one term, so exactly the operand's values.
template <std::size_t KR, std::size_t NC, class Op>
tensor<float, shape<KR, NC>> dense_operand(const Op& op) {
  tensor<float, shape<KR, KR>> identity;
  for (std::size_t i = 0; i < KR; ++i) identity.data()[i * KR + i] = 1.0f;
  tensor<float, shape<KR, NC>> d;
  assign(d, matmul(identity, op));
  return d;
}

/// y = x op on the device path (cu::product_of of the expression over device views, run over
/// the grid on the host) against the double reference of x and the CPU's dense form of op.
template <std::size_t KR, std::size_t NC, class X, class DeviceOp, class HostOp>
std::size_t device_product_off(const X& x, std::size_t M, const DeviceOp& dop, const HostOp& hop) {
  tensor<float, shape<dyn, NC>> y(M);
  test::run_product(cu::product_of(write(dev_out(y), matmul(dev(x), dop))));
  const auto d = dense_operand<KR, NC>(hop);
  std::vector<double> c, mag;
  reference([&](std::size_t m, std::size_t k) { return x.data()[m * KR + k]; },
            [&](std::size_t k, std::size_t n) { return d.data()[k * NC + n]; }, M, NC, KR, c, mag);
  return far_from(y.data(), c, mag, KR);
}

}  // namespace

TEST_CASE("cuda product: the sketched layer's operands from expressions, hcat and vcat of a device matrix and "
          "stacked sign sketches, their transposes, and column blocks of the batch", "[cuda][product]") {
  // The factors of a sketched layer of In 24, Out 20, 2 terms of rank 3 (L k = 6):
  // [S1 | U2] [24, 12] and [U1; S2] [12, 20], as device_operand stages them from the expression.
  constexpr std::size_t In = 24, Out = 20, R = 3, T = 2, Lk = T * R, H = 2 * Lk;
  const std::size_t M = 37;
  tensor<float, shape<In, Lk>> s1;
  tensor<float, shape<Lk, Out>> s2;
  test::fill_uniform(s1, -1, 1, 51);
  test::fill_uniform(s2, -1, 1, 52);
  const float scale = 1.0f / std::sqrt(float(R));
  const sign_sketch<R, Out, T, sketch_stack::rows> u1{0x51, scale};
  const sign_sketch<In, R, T, sketch_stack::columns> u2{0x52, scale};
  tensor<float, shape<dyn, In>> x(M);
  tensor<float, shape<dyn, H>> h(M);
  tensor<float, shape<dyn, Out>> g(M);
  test::fill_uniform(x, -1, 1, 53);
  test::fill_uniform(h, -1, 1, 54);
  test::fill_uniform(g, -1, 1, 55);

  // Forward: h = x [S1 | U2], y = h [U1; S2]; backward: dh = g [U1; S2]^T, dx = dh [S1 | U2]^T.
  CHECK(device_product_off<In, H>(x, M, hcat(dev(s1), u2), hcat(s1, u2)) == 0);
  CHECK(device_product_off<H, Out>(h, M, vcat(u1, dev(s2)), vcat(u1, s2)) == 0);
  CHECK(device_product_off<Out, H>(g, M, transpose(vcat(u1, dev(s2))), transpose(vcat(u1, s2))) == 0);
  CHECK(device_product_off<H, In>(h, M, transpose(hcat(dev(s1), u2)), transpose(hcat(s1, u2))) == 0);
  // A stacked sketch alone, as stored and transposed.
  CHECK(device_product_off<In, Lk>(x, M, u2, u2) == 0);
  CHECK(device_product_off<Out, Lk>(g, M, transpose(u1), transpose(u1)) == 0);

  // dS2 = h[:, Lk:]^T g: a transposed column block of the batch as the left operand, the batch
  // as the inner extent; and x^T h[:, :Lk] with a column block on the right.
  tensor<float, shape<Lk, Out>> ds2;
  test::run_product(cu::product_of(write(dev_out(ds2), matmul(transpose(columns<Lk, H>(dev(h))), dev(g)))));
  std::vector<double> c, mag;
  reference([&](std::size_t m, std::size_t k) { return h.data()[k * H + Lk + m]; },
            [&](std::size_t k, std::size_t n) { return g.data()[k * Out + n]; }, Lk, Out, M, c, mag);
  CHECK(far_from(ds2.data(), c, mag, M) == 0);
  tensor<float, shape<In, Lk>> ds1;
  test::run_product(cu::product_of(write(dev_out(ds1), matmul(transpose(dev(x)), columns<0, Lk>(dev(h))))));
  reference([&](std::size_t m, std::size_t k) { return x.data()[k * In + m]; },
            [&](std::size_t k, std::size_t n) { return h.data()[k * H + n]; }, In, Lk, M, c, mag);
  CHECK(far_from(ds1.data(), c, mag, M) == 0);
}

TEST_CASE("cuda product: an output whose rows differ from the product's is refused, naming both", "[cuda][product]") {
  constexpr std::size_t N = 8, K = 4;
  tensor<float, shape<dyn, K>> x(5);
  tensor<float, shape<N, K>> w;
  using S = shape<dyn, N>;
  tensor<float, S> y(6);
  const cu::matrix_operand<false> a{x.data(), K};
  const cu::matrix_operand<true> b{w.data(), K};
  REQUIRE_THROWS_WITH(cu::product<small_tiles>(a, b, 5, K, write(dev_out(y), cu::product_value<S>(5))),
                      Catch::Contains("6 rows") && Catch::Contains("product 5"));
}

TEST_CASE("cuda product: TF32 and BF16 rounding, to nearest (TF32 ties away, BF16 ties to even)", "[cuda][product]") {
  const float one = 1.0f;
  CHECK(cu::round_tf32(one + 0x1p-11f) == one + 0x1p-10f);          // a tie: away from zero
  CHECK(cu::round_tf32(-(one + 0x1p-11f)) == -(one + 0x1p-10f));
  CHECK(cu::round_tf32(one + 0x1p-12f) == one);
  CHECK(cu::round_bf16(one + 0x1p-8f) == one);                      // a tie: to the even 1
  CHECK(cu::round_bf16(one + 0x1p-7f + 0x1p-8f) == one + 0x1p-6f);  // a tie: to the even 1 + 2^-6
  CHECK(cu::round_bf16(one + 0x1p-7f + 0x1p-9f) == one + 0x1p-7f);
  CHECK(cu::round_bf16(std::numeric_limits<float>::max()) == INFINITY);  // past BF16's largest
  CHECK(cu::round_tf32(INFINITY) == INFINITY);
  CHECK(std::isnan(cu::round_tf32(NAN)));
  CHECK(std::isnan(cu::round_bf16(NAN)));
  CHECK(std::isnan(cu::round_bf16(-NAN)));
}

TEST_CASE("cuda product: TF32 rounding makes every NaN the canonical NaN, never an infinity", "[cuda][product]") {
  // The tensor cores read a TF32 operand's top 19 bits only. A NaN whose payload lies in the
  // low 13 bits alone would read as an infinity if the rounding kept it; cvt.rna.tf32.f32
  // returns the canonical NaN instead. Every NaN of both signs, those payloads first.
  const auto bits = [](float x) {
    std::uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    return u;
  };
  const auto as_float = [](std::uint32_t u) {
    float x;
    std::memcpy(&x, &u, sizeof x);
    return x;
  };
  std::size_t low_payload_bad = 0, other_bad = 0;
  for (std::uint32_t sign = 0; sign < 2; ++sign)
    for (std::uint32_t payload = 1; payload < (1u << 23); ++payload) {
      const float r = cu::round_tf32(as_float(sign << 31 | 0x7F800000u | payload));
      const std::uint32_t read = bits(r) & 0xFFFFE000u;  // what a tensor core reads
      const bool ok = bits(r) == cu::tf32_canonical_nan && std::isnan(as_float(read));
      (payload < (1u << 13) ? low_payload_bad : other_bad) += !ok;
    }
  CHECK(low_payload_bad == 0);
  CHECK(other_bad == 0);
  CHECK((cu::tf32_canonical_nan & 0x1FFFu) == 0);  // a TF32 value: nothing below its 10 fraction bits
  CHECK(bits(cu::round_tf32(INFINITY)) == 0x7F800000u);
  CHECK(bits(cu::round_tf32(-INFINITY)) == 0xFF800000u);
}

namespace {

/// x W^T on an mma tiling, against the double product of the rounded inputs; returns the
/// largest difference from the unrounded product relative to its magnitude.
template <class Tiling, std::size_t N, std::size_t K>
double mma_linear(std::size_t M, std::uint32_t seed) {
  tensor<float, shape<dyn, K>> x(M);
  tensor<float, shape<N, K>> w;
  test::fill_uniform(x, -1, 1, seed);
  test::fill_uniform(w, -1, 1, seed + 1);
  using S = shape<dyn, N>;
  tensor<float, S> y(M);
  test::run_product(cu::product<Tiling>(cu::matrix_operand<false>{x.data(), K}, cu::matrix_operand<true>{w.data(), K}, M, K,
                                        write(dev_out(y), cu::product_value<S>(M))));
  std::vector<double> c, mag, exact, exact_mag;
  reference([&](std::size_t m, std::size_t k) { return Tiling::round(x.data()[m * K + k]); },
            [&](std::size_t k, std::size_t n) { return Tiling::round(w.data()[n * K + k]); }, M, N, K, c, mag);
  CHECK(far_from(y.data(), c, mag, K) == 0);
  reference([&](std::size_t m, std::size_t k) { return x.data()[m * K + k]; },
            [&](std::size_t k, std::size_t n) { return w.data()[n * K + k]; }, M, N, K, exact, exact_mag);
  double worst = 0;
  for (std::size_t i = 0; i < exact.size(); ++i) worst = std::max(worst, std::abs(double(y.data()[i]) - exact[i]) / exact_mag[i]);
  return worst;
}

}  // namespace

TEST_CASE("cuda product: TF32 tensor-core warps, tails in M, N and K, both tilings", "[cuda][product][mma]") {
  const double small = mma_linear<small_mma<cu::product_math::tf32>, 72, 40>(37, 51);
  const double large = mma_linear<large_mma<cu::product_math::tf32>, 150, 70>(131, 52);
  // The inputs were rounded to 10 fraction bits: the result is off the exact product by about
  // 2^-11 of the magnitude, far more than fp32's rounding, and never more than 2 roundings.
  CHECK(small > 0x1p-16);
  CHECK(large > 0x1p-16);
  CHECK(small < 0x1p-9);
  CHECK(large < 0x1p-9);
}

TEST_CASE("cuda product: BF16 tensor-core warps with the bias + ReLU + dropout epilogue, fused equal to unfused",
          "[cuda][product][mma]") {
  const double err = mma_linear<small_mma<cu::product_math::bf16>, 40, 48>(21, 61);
  CHECK(err > 0x1p-13);  // 7 fraction bits
  CHECK(err < 0x1p-6);

  constexpr std::size_t N = 136, K = 64;
  const std::size_t M = 70;
  using S = shape<dyn, N>;
  using Tiles = large_mma<cu::product_math::bf16>;
  tensor<float, shape<dyn, K>> x(M);
  tensor<float, shape<N, K>> w;
  tensor<float, shape<N>> bias;
  test::fill_uniform(x, -1, 1, 62);
  test::fill_uniform(w, -1, 1, 63);
  test::fill_uniform(bias, -0.5, 0.5, 64);
  const cu::matrix_operand<false> a{x.data(), K};
  const cu::matrix_operand<true> b{w.data(), K};
  tensor<float, S> fused(M), product(M);
  test::run_product(
      cu::product<Tiles>(a, b, M, K, write(dev_out(fused), dropout(relu(cu::product_value<S>(M) + dev(bias)), 0.5f, rng))));
  test::run_product(cu::product<Tiles>(a, b, M, K, write(dev_out(product), cu::product_value<S>(M))));
  tensor<float, S> unfused = dropout(relu(product + bias), 0.5f, rng);
  CHECK(bit_differences(fused.data(), unfused.data(), M * N) == 0);
}

TEST_CASE("cuda product: matmul expressions on device tensors run as one product, the rest as its epilogue",
          "[cuda][product][matmul]") {
  constexpr std::size_t In = 48, Out = 80;
  const std::size_t batch = 66;
  tensor<float, shape<dyn, In>> x(batch);
  tensor<float, shape<Out, In>> w;
  tensor<float, shape<Out>> b;
  test::fill_uniform(x, -1, 1, 71);
  test::fill_uniform(w, -1, 1, 72);
  test::fill_uniform(b, -0.5, 0.5, 73);
  using S = shape<dyn, Out>;

  // y = dropout(relu(x W^T + b)): the CPU's product, then the same epilogue; the device form
  // as a product pass from the expression alone.
  tensor<float, S> cpu = dropout(relu(matmul(x, transpose(w)) + b), 0.3f, rng);
  tensor<float, S> gpu(batch), product_only(batch);
  const auto w_fused = write(dev_out(gpu), dropout(relu(matmul(dev(x), transpose(dev(w))) + dev(b)), 0.3f, rng));
  STATIC_REQUIRE(cu::holds_product<decltype(w_fused)>);
  test::run_product(cu::product_of(w_fused));
  test::run_product(cu::product_of(write(dev_out(product_only), matmul(dev(x), transpose(dev(w))))));
  // The epilogue equals the CPU's elementwise pass over the device's product, bit for bit.
  tensor<float, S> unfused = dropout(relu(product_only + b), 0.3f, rng);
  CHECK(bit_differences(gpu.data(), unfused.data(), batch * Out) == 0);
  // And the CPU's fused result within the products' rounding: the same elements dropped.
  std::size_t bad = 0;
  for (std::size_t i = 0; i < batch * Out; ++i) {
    if ((cpu.data()[i] == 0.0f) != (gpu.data()[i] == 0.0f) && std::abs(cpu.data()[i] - gpu.data()[i]) > 1e-4f) ++bad;
    if (std::abs(cpu.data()[i] - gpu.data()[i]) > 1e-4f * (1.0f + std::abs(cpu.data()[i]))) ++bad;
  }
  CHECK(bad == 0);

  // dW = g^T x: the batch as the inner extent; a batch mismatch is refused, naming both.
  tensor<float, shape<dyn, Out>> g(batch);
  test::fill_uniform(g, -1, 1, 74);
  tensor<float, shape<Out, In>> dw, dw_cpu = matmul(transpose(g), x);
  test::run_product(cu::product_of(write(dev_out(dw), matmul(transpose(dev(g)), dev(x)))));
  std::vector<double> c, mag;
  reference([&](std::size_t m, std::size_t k) { return g.data()[k * Out + m]; },
            [&](std::size_t k, std::size_t n) { return x.data()[k * In + n]; }, Out, In, batch, c, mag);
  CHECK(far_from(dw.data(), c, mag, batch) == 0);
  tensor<float, shape<dyn, In>> x_short(batch - 1);
  REQUIRE_THROWS_WITH(cu::product_of(write(dev_out(dw), matmul(transpose(dev(g)), dev(x_short)))),
                      Catch::Contains("66") && Catch::Contains("65"));

  // A tensor-core tiling named for the same expression.
  tensor<float, S> tf(batch);
  test::run_product(cu::product_of<large_mma<cu::product_math::tf32>>(write(dev_out(tf), matmul(dev(x), transpose(dev(w))))));
  std::size_t far = 0;
  for (std::size_t i = 0; i < batch * Out; ++i)
    far += std::abs(tf.data()[i] - product_only.data()[i]) > 0x1p-9f * float(In);
  CHECK(far == 0);
}

TEST_CASE("cuda product: a convolution as a product over implicit im2col, NCHW and NHWC inputs, BN folded into it",
          "[cuda][product][conv]") {
  // conv2d<5, 12, 3, 3, stride 2, padding 1> on [3, 5, 9, 11]: windows off every edge.
  constexpr std::size_t Cin = 5, Cout = 12, Kh = 3, Kw = 3, H = 9, W = 11, Batch = 3;
  using Conv = nn::conv2d<Cin, Cout, Kh, Kw, 2, 1>;
  using G = ops::conv2d_geometry<H, W, Kh, Kw, 2, 1, 1>;
  constexpr std::size_t Ho = G::out_height, Wo = G::out_width, K = Cin * Kh * Kw;
  Conv conv(7);
  tensor<float, shape<dyn, Cin, H, W>> x(Batch);
  test::fill_uniform(x, -1, 1, 81);
  tensor<float, shape<dyn, H, W, Cin>> x_last(Batch);  // the same images channels-last
  for (std::size_t n = 0; n < Batch; ++n)
    for (std::size_t c = 0; c < Cin; ++c)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t w = 0; w < W; ++w) x_last.data()[((n * H + h) * W + w) * Cin + c] = x.data()[((n * Cin + c) * H + h) * W + w];

  // The CPU layer's output, NCHW, as the reference of the plain convolution.
  tensor<float, shape<dyn, Cout, Ho, Wo>> y_cpu(Batch);
  conv.forward(x, y_cpu);

  using S = shape<dyn, Cout>;  // [batch Ho Wo, Cout]: NHWC
  const std::size_t M = Batch * Ho * Wo;
  const cu::matrix_operand<true> wt{conv.weight.data(), K};
  tensor<float, S> y_nchw_in(M), y_nhwc_in(M);
  test::run_product(cu::product<small_tiles>(cu::im2col_operand<G, Cin, Kh, Kw, false>{x.data()}, wt, M, K,
                                             write(dev_out(y_nchw_in), cu::product_value<S>(M) + dev(conv.bias))));
  test::run_product(cu::product<small_tiles>(cu::im2col_operand<G, Cin, Kh, Kw, true>{x_last.data()}, wt, M, K,
                                             write(dev_out(y_nhwc_in), cu::product_value<S>(M) + dev(conv.bias))));
  // Both layouts stage the same values in the same order: the same bits.
  CHECK(bit_differences(y_nchw_in.data(), y_nhwc_in.data(), M * Cout) == 0);
  std::size_t bad = 0;
  for (std::size_t n = 0; n < Batch; ++n)
    for (std::size_t c = 0; c < Cout; ++c)
      for (std::size_t p = 0; p < Ho * Wo; ++p) {
        const float want = y_cpu.data()[(n * Cout + c) * Ho * Wo + p], got = y_nchw_in.data()[(n * Ho * Wo + p) * Cout + c];
        bad += !(std::abs(got - want) <= 1e-5f * float(K));
      }
  CHECK(bad == 0);

  // Evaluation-mode batch norm and ReLU after the convolution, folded into its weights and bias
  // (W' = W g / sqrt(var + eps), b' = (b - mean) g / sqrt(var + eps) + beta): one product with
  // a bias + ReLU epilogue, against the unfolded composition in double.
  tensor<float, shape<Cout>> gamma, beta, mean, var, b_folded;
  test::fill_uniform(gamma, 0.5, 1.5, 82);
  test::fill_uniform(beta, -0.5, 0.5, 83);
  test::fill_uniform(mean, -0.2, 0.2, 84);
  test::fill_uniform(var, 0.5, 2.0, 85);
  const double eps = 1e-5;
  tensor<float, shape<Cout, Cin, Kh, Kw>> w_folded;
  for (std::size_t c = 0; c < Cout; ++c) {
    const double s = double(gamma[c]) / std::sqrt(double(var[c]) + eps);
    for (std::size_t k = 0; k < K; ++k) w_folded.data()[c * K + k] = float(double(conv.weight.data()[c * K + k]) * s);
    b_folded[c] = float((double(conv.bias[c]) - double(mean[c])) * s + double(beta[c]));
  }
  tensor<float, S> y_bn(M);
  test::run_product(cu::product<small_tiles>(cu::im2col_operand<G, Cin, Kh, Kw, false>{x.data()},
                                             cu::matrix_operand<true>{w_folded.data(), K}, M, K,
                                             write(dev_out(y_bn), relu(cu::product_value<S>(M) + dev(b_folded)))));
  std::size_t far = 0, zeros = 0;
  for (std::size_t n = 0; n < Batch; ++n)
    for (std::size_t c = 0; c < Cout; ++c)
      for (std::size_t ho = 0; ho < Ho; ++ho)
        for (std::size_t wo = 0; wo < Wo; ++wo) {
          double z = conv.bias[c], mag = std::abs(double(conv.bias[c]));
          for (std::size_t ci = 0; ci < Cin; ++ci)
            for (std::size_t kh = 0; kh < Kh; ++kh)
              for (std::size_t kw = 0; kw < Kw; ++kw) {
                const std::size_t hi = ho * 2 + kh - 1, wi = wo * 2 + kw - 1;  // wraps past the top or left edge
                if (hi >= H || wi >= W) continue;
                const double t = double(conv.weight.data()[c * K + (ci * Kh + kh) * Kw + kw]) * double(x.data()[((n * Cin + ci) * H + hi) * W + wi]);
                z += t;
                mag += std::abs(t);
              }
          const double s = double(gamma[c]) / std::sqrt(double(var[c]) + eps);
          const double want = std::max(0.0, (z - double(mean[c])) * s + double(beta[c]));
          const float got = y_bn.data()[((n * Ho + ho) * Wo + wo) * Cout + c];
          zeros += got == 0.0f;
          far += !(std::abs(double(got) - want) <= 1e-5 * (mag * s + std::abs(double(beta[c])) + 1.0));
        }
  CHECK(far == 0);
  CHECK(zeros > 0);          // the ReLU cut some
  CHECK(zeros < M * Cout);   // and kept others
}

TEST_CASE("cuda product: a convolution's backward, dW = g^T im2col(x) and dx gathered from g W, against the CPU layer",
          "[cuda][product][conv]") {
  constexpr std::size_t Cin = 4, Cout = 6, Kh = 3, Kw = 2, H = 8, W = 9, Batch = 2;
  using Conv = nn::conv2d<Cin, Cout, Kh, Kw, 2, 1, 2>;  // stride 2, padding 1, dilation 2
  using G = ops::conv2d_geometry<H, W, Kh, Kw, 2, 1, 2>;
  constexpr std::size_t Ho = G::out_height, Wo = G::out_width, K = Cin * Kh * Kw, P = Ho * Wo;
  Conv conv(9);
  tensor<float, shape<dyn, Cin, H, W>> x(Batch), dx_cpu(Batch), dx(Batch);
  tensor<float, shape<dyn, Cout, Ho, Wo>> y(Batch), dy(Batch);
  test::fill_uniform(x, -1, 1, 91);
  test::fill_uniform(dy, -1, 1, 92);
  conv.forward(x, y);
  conv.backward(x, y, dy, dx_cpu);

  // g: dy channels-last, [batch Ho Wo, Cout], as the forward product leaves its output.
  using Rows = shape<dyn, Cout>;
  const std::size_t M = Batch * P;
  tensor<float, Rows> g(M);
  for (std::size_t n = 0; n < Batch; ++n)
    for (std::size_t c = 0; c < Cout; ++c)
      for (std::size_t p = 0; p < P; ++p) g.data()[(n * P + p) * Cout + c] = dy.data()[(n * Cout + c) * P + p];

  // dW [Cout, Cin Kh Kw] = g^T im2col(x): the im2col operand as the right operand, the pixels
  // of the batch the inner extent.
  using WS = shape<Cout, K>;
  tensor<float, WS> dw;
  test::run_product(cu::product<small_tiles>(cu::matrix_operand<true>{g.data(), Cout}, cu::im2col_operand<G, Cin, Kh, Kw, false>{x.data()},
                                             Cout, M, write(dev_out(dw), cu::product_value<WS>())));
  // dcol [batch Ho Wo, Cin Kh Kw] = g W, then dx gathered per input element.
  using CS = shape<dyn, K>;
  tensor<float, CS> dcol(M);
  test::run_product(cu::product<small_tiles>(cu::matrix_operand<false>{g.data(), Cout}, cu::matrix_operand<false>{conv.weight.data(), K},
                                             M, Cout, write(dev_out(dcol), cu::product_value<CS>(M))));
  const cu::col2im_pass<G, Cin, Kh, Kw> gather{dcol.data(), dx.data(), Batch};
  for (std::size_t i = 0; i < gather.elements(); ++i) gather.element(i);

  std::size_t bad_w = 0, bad_x = 0;
  for (std::size_t i = 0; i < Cout * K; ++i) bad_w += !(std::abs(dw.data()[i] - conv.weight_grad.data()[i]) <= 1e-5f * float(M));
  for (std::size_t i = 0; i < x.size(); ++i) bad_x += !(std::abs(dx.data()[i] - dx_cpu.data()[i]) <= 1e-5f * float(Cout * Kh * Kw));
  CHECK(bad_w == 0);
  CHECK(bad_x == 0);
  // Some inputs are read by no window (stride 2, dilation 2): their gradient is exactly zero.
  std::size_t unread = 0;
  for (std::size_t i = 0; i < x.size(); ++i) unread += dx.data()[i] == 0.0f && dx_cpu.data()[i] == 0.0f;
  CHECK(unread > 0);
  CHECK(unread < x.size());
}
