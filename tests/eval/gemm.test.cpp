// tests/eval/gemm.test.cpp: solder::eval::cpu::gemm (static K) and gemm_dyn_k (runtime K) against a
// double-precision triple loop, for all four transpose variants, edge tiles in every dimension,
// the three epilogues, pre-packed and per-call B, padded leading dimensions, and bit-for-bit
// equality between the two paths and across thread counts and cache blockings.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/eval/cpu/gemm.hpp"
#include "support/gemm_epilogues.hpp"
#include "support/data.hpp"

namespace {

using namespace solder;
using Catch::Matchers::WithinAbs;

/// Unit roundoff of float (2^-24).
constexpr double float_u = 0x1p-24;

/// Error bound of one element of C: a float dot product of length K accumulated by FMAs, in
/// any fixed order, is within gamma_K sum_k |a_k b_k| of the exact value, gamma_K = K u / (1 - K u)
/// (Higham, Accuracy and Stability of Numerical Algorithms, 3.1); the epilogue's bias add rounds
/// once more and relu is 1-Lipschitz. (K + 2) u covers both and gamma's higher-order term for
/// the K used here. The inputs are floats, so the double reference sees them exactly.
double error_bound(std::size_t K, double abs_dot, double abs_bias) {
  return double(K + 2) * float_u * (abs_dot + abs_bias) + std::numeric_limits<float>::denorm_min();
}

/// Logical matrices of one problem, stored as the variant asks, with leading dimensions
/// larger than the logical width (by an odd amount, so rows are not vector-aligned). Not a
/// template: only the gemm calls depend on the static shape (compile time).
struct problem {
  static constexpr std::size_t pad = 3;
  static constexpr float sentinel = -12345.0f;  // no product gives it
  std::size_t M, N, K;
  bool trans_a, trans_b;
  std::size_t lda = (trans_a ? M : K) + pad;  // A stored [K, M] or [M, K]
  std::size_t ldb = (trans_b ? K : N) + pad;  // B stored [N, K] or [K, N]
  std::size_t ldc = N + 5;
  std::vector<float> A, B, bias;

  problem(std::size_t m, std::size_t n, std::size_t k, bool ta, bool tb, std::uint32_t seed)
      : M(m), N(n), K(k), trans_a(ta), trans_b(tb) {
    A.resize((trans_a ? K : M) * lda);
    B.resize((trans_b ? N : K) * ldb);
    bias.resize(N);
    test::fill_uniform(A, -1.0, 1.0, seed);
    test::fill_uniform(B, -1.0, 1.0, seed + 1);
    test::fill_uniform(bias, -0.5, 0.5, seed + 2);
  }
  float a(std::size_t m, std::size_t k) const { return trans_a ? A[k * lda + m] : A[m * lda + k]; }
  float b(std::size_t k, std::size_t n) const { return trans_b ? B[n * ldb + k] : B[k * ldb + n]; }
  /// C padded to ldc, every element (padding too) set to the sentinel.
  std::vector<float> output() const { return std::vector<float>(M * ldc, sentinel); }
};

/// Checks C against the double reference (with bias and relu when `with_bias`), and that the
/// padding columns of C were not written. Reports the worst element.
void check_against_reference(const problem& p, const std::vector<float>& C, bool with_bias) {
  double worst_ratio = -1, worst_ref = 0, worst_bound = 0;
  float worst_got = 0;
  std::size_t worst_m = 0, worst_n = 0, padding_written = 0;
  for (std::size_t m = 0; m < p.M; ++m) {
    for (std::size_t n = 0; n < p.N; ++n) {
      double dot = 0, abs_dot = 0;
      for (std::size_t k = 0; k < p.K; ++k) {
        const double t = double(p.a(m, k)) * double(p.b(k, n));
        dot += t;
        abs_dot += std::fabs(t);
      }
      double ref = dot;
      double bound = error_bound(p.K, abs_dot, 0);
      if (with_bias) {
        ref = std::max(dot + double(p.bias[n]), 0.0);
        bound = error_bound(p.K, abs_dot, std::fabs(p.bias[n]));
      }
      const float got = C[m * p.ldc + n];
      const double ratio = std::isnan(got) ? std::numeric_limits<double>::infinity() : std::fabs(got - ref) / bound;
      if (ratio > worst_ratio) {
        worst_ratio = ratio, worst_ref = ref, worst_bound = bound, worst_got = got, worst_m = m, worst_n = n;
      }
    }
    for (std::size_t n = p.N; n < p.ldc; ++n) padding_written += C[m * p.ldc + n] != problem::sentinel;
  }
  INFO("M " << p.M << ", N " << p.N << ", K " << p.K << ", TransA " << p.trans_a << ", TransB " << p.trans_b
            << ", worst at (" << worst_m << ", " << worst_n << ")");
  CHECK_THAT(worst_got, WithinAbs(worst_ref, worst_bound));
  CHECK(padding_written == 0);
}

bool bitwise_equal(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

/// Runs one transpose variant with both epilogues, per-call and pre-packed B, and the
/// runtime-K path on the same inputs, which must give the same bits.
template <std::size_t N, std::size_t K, bool TA, bool TB>
void check_variant(std::size_t M) {
  const problem p(M, N, K, TA, TB, 17u + std::uint32_t(M));
  auto C = p.output();
  eval::cpu::gemm<N, K, TA, TB>(M, p.A.data(), p.lda, p.B.data(), p.ldb, solder::test::store_epilogue{C.data(), p.ldc}, 1);
  check_against_reference(p, C, false);

  const solder::packed_matrix<N, K, TB> packed(p.B.data(), p.ldb);
  auto Cb = p.output();
  eval::cpu::gemm<N, K, TA, TB>(M, p.A.data(), p.lda, packed, solder::test::bias_relu_epilogue{p.bias.data(), Cb.data(), p.ldc}, 1);
  check_against_reference(p, Cb, true);

  auto dyn = p.output(), dyn_b = p.output();
  eval::cpu::gemm_dyn_k<N, TA, TB>(M, K, p.A.data(), p.lda, p.B.data(), p.ldb, solder::test::store_epilogue{dyn.data(), p.ldc}, 1);
  eval::cpu::gemm_dyn_k<N, TA, TB>(M, K, p.A.data(), p.lda, p.B.data(), p.ldb,
                             solder::test::bias_relu_epilogue{p.bias.data(), dyn_b.data(), p.ldc}, 1);
  INFO("runtime K against static K: M " << M << ", N " << N << ", K " << K << ", TransA " << TA << ", TransB "
                                        << TB);
  CHECK(bitwise_equal(C, dyn));
  CHECK(bitwise_equal(Cb, dyn_b));
}

template <std::size_t N, std::size_t K>
void check_all_variants(std::size_t M) {
  check_variant<N, K, false, false>(M);
  check_variant<N, K, false, true>(M);
  check_variant<N, K, true, false>(M);
  check_variant<N, K, true, true>(M);
}

/// A cache blocking far smaller than any real one, so small problems cross every loop of the
/// driver: K blocks of 5, N blocks of 2 panels, M blocks of 2 tiles, and the L2 prefetch
/// between them.
constexpr eval::cpu::gemm_blocking tiny_blocking{5, 2, 2};

/// gemm_blocking::for_k(K) against its formulas written out: K blocks of equal length at most
/// the host's gemm_kc_max (512, or 1024 on AMD Zen 5), an N block of B filling the L2 budget, an
/// M block of A within 16 MiB.
TEST_CASE("gemm_blocking::for_k cuts K into equal blocks of at most gemm_kc_max", "[gemm]") {
  using B = eval::cpu::gemm_blocking;
  for (const std::size_t K : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{255}, std::size_t{512},
                              std::size_t{513}, std::size_t{1031}, std::size_t{4096}, std::size_t{100000}}) {
    const B b = B::for_k(K);
    const std::size_t most = eval::cpu::tuning().gemm_kc_max;
    const std::size_t k = std::max<std::size_t>(K, 1), blocks = (k + most - 1) / most;
    INFO("K " << K);
    CHECK((most == 512 || most == 1024));
    CHECK(b.kc == (k + blocks - 1) / blocks);
    CHECK(b.kc <= most);
    CHECK(b.kc * blocks >= k);
    CHECK((b.kc - 1) * blocks < k);
    CHECK(b.nc == std::max<std::size_t>(1, eval::cpu::tuning().gemm_l2_b_bytes / (b.kc * B::nr * sizeof(float))));
    CHECK(b.mc_max == std::max<std::size_t>(1, (std::size_t{16} << 20) / (B::mr * k * sizeof(float))));
  }
}

/// C of one problem after an accumulating call: the valid part holds `before` values (any
/// finite floats), the padding the sentinel.
std::vector<float> accumulator(const problem& p, std::uint32_t seed) {
  auto C = p.output();
  std::vector<float> valid(p.M * p.N);
  test::fill_uniform(valid, -4.0, 4.0, seed);
  for (std::size_t m = 0; m < p.M; ++m)
    for (std::size_t n = 0; n < p.N; ++n) C[m * p.ldc + n] = valid[m * p.N + n];
  return C;
}

/// Runs one transpose variant of the runtime-K path: the product against the double reference,
/// then accumulate_epilogue on the same product P: beta = 1 gives before + P and beta = 0.5
/// fma(0.5, before, P), both rounded once (so exactly those floats), beta = 0 gives P whatever C
/// held (NaN here), and the padding of C is never touched.
template <std::size_t N, bool TA, bool TB>
void check_dyn_k_variant(std::size_t M, std::size_t K) {
  const problem p(M, N, K, TA, TB, 101u + std::uint32_t(M * 7 + K));
  auto P = p.output();
  eval::cpu::gemm_dyn_k<N, TA, TB>(M, K, p.A.data(), p.lda, p.B.data(), p.ldb, solder::test::store_epilogue{P.data(), p.ldc}, 1);
  check_against_reference(p, P, false);

  const auto before = accumulator(p, 7u + std::uint32_t(K));
  auto added = before, scaled = before;
  eval::cpu::gemm_dyn_k<N, TA, TB>(M, K, p.A.data(), p.lda, p.B.data(), p.ldb,
                             solder::test::accumulate_epilogue{added.data(), p.ldc, 1.0f}, 1);
  eval::cpu::gemm_dyn_k<N, TA, TB>(M, K, p.A.data(), p.lda, p.B.data(), p.ldb,
                             solder::test::accumulate_epilogue{scaled.data(), p.ldc, 0.5f}, 1);
  auto overwritten = p.output();
  for (std::size_t m = 0; m < M; ++m)
    for (std::size_t n = 0; n < N; ++n) overwritten[m * p.ldc + n] = std::numeric_limits<float>::quiet_NaN();
  eval::cpu::gemm_dyn_k<N, TA, TB>(M, K, p.A.data(), p.lda, p.B.data(), p.ldb,
                             solder::test::accumulate_epilogue{overwritten.data(), p.ldc, 0.0f}, 1);

  auto expect_added = before, expect_scaled = before;
  for (std::size_t m = 0; m < M; ++m)
    for (std::size_t n = 0; n < N; ++n) {
      const std::size_t i = m * p.ldc + n;
      expect_added[i] = before[i] + P[i];
      expect_scaled[i] = std::fma(0.5f, before[i], P[i]);
    }
  INFO("accumulate_epilogue: M " << M << ", N " << N << ", K " << K << ", TransA " << TA << ", TransB " << TB);
  CHECK(bitwise_equal(added, expect_added));
  CHECK(bitwise_equal(scaled, expect_scaled));
  CHECK(bitwise_equal(overwritten, P));
}

template <std::size_t N>
void check_all_dyn_k_variants(std::size_t M, std::size_t K) {
  check_dyn_k_variant<N, false, false>(M, K);
  check_dyn_k_variant<N, false, true>(M, K);
  check_dyn_k_variant<N, true, false>(M, K);
  check_dyn_k_variant<N, true, true>(M, K);
}

}  // namespace

// (N, K): 1 and primes below and above a vector (16) and a register tile's rows (14), around a
// panel (32), and K longer than one K block (256), so that partial sums are kept between blocks.
TEMPLATE_TEST_CASE_SIG("gemm equals the double reference in every transpose variant", "[gemm]",
                       ((std::size_t N, std::size_t K), N, K), (1, 1), (17, 3), (3, 257), (255, 17), (257, 255),
                       (37, 1031)) {
  const std::size_t M = GENERATE(1, 3, 13, 17, 29, 255, 257);
  check_all_variants<N, K>(M);
}

TEST_CASE("row tiles: pairs of rows over ceil(M / MR) tiles, each with a compiled kernel", "[gemm]") {
  namespace gd = eval::cpu::gemm_detail;
  CHECK(gd::kernel_count(14) == 10);  // 1 to 6 rows, then 8, 10, 12, 14
  CHECK(gd::kernel_count(6) == 6);
  for (std::size_t i = 0; i < gd::kernel_count(14); ++i) CHECK(gd::kernel_index(gd::rows_of_kernel(i)) == i);
  for (const std::size_t MR : {std::size_t{6}, std::size_t{14}})
    for (std::size_t M = 1; M <= 400; ++M) {
      const gd::row_tiles tiling(M, MR);
      INFO("MR " << MR << ", M " << M);
      REQUIRE(tiling.count == (M + MR - 1) / MR);
      CHECK(tiling.begin(0) == 0);
      CHECK(tiling.begin(tiling.count) == M);
      std::size_t lowest = MR, highest = 0;
      for (std::size_t t = 0; t < tiling.count; ++t) {
        const std::size_t r = tiling.rows(t);
        CHECK(r >= 1);
        CHECK(gd::kernel_rows(r) <= MR);
        CHECK(gd::rows_of_kernel(gd::kernel_index(r)) == gd::kernel_rows(r));
        if (t + 1 < tiling.count) CHECK(r % 2 == 0);  // only the last tile of an odd M is odd
        lowest = std::min(lowest, r), highest = std::max(highest, r);
      }
      CHECK(highest - lowest <= (M % 2 == 0 ? 2u : 3u));  // nearly equal
      if (M <= 6) CHECK(gd::kernel_rows(M) == M);          // no extra row for small batches
    }
}

TEST_CASE("gemm: an odd tile's kernel row past M is neither read from A in place nor written", "[gemm]") {
  constexpr std::size_t N = 37, K = 23;
  const std::size_t M = GENERATE(7, 9, 13, 15, 29, 31);
  const problem p(M, N, K, false, false, 21u + std::uint32_t(M));
  const solder::packed_matrix<N, K, false> packed(p.B.data(), p.ldb);
  // A as exactly M rows of K floats: a kernel reading row M where A lies would read past it
  // (which the sanitized build reports).
  std::vector<float> A(M * K);
  for (std::size_t m = 0; m < M; ++m)
    for (std::size_t k = 0; k < K; ++k) A[m * K + k] = p.a(m, k);
  namespace gd = eval::cpu::gemm_detail;
  for (const eval::cpu::gemm_blocking& blocking : {eval::cpu::gemm_blocking::for_k(K), tiny_blocking}) {
    // C with a row of sentinels below its M rows.
    std::vector<float> in_place((M + 1) * p.ldc, problem::sentinel), packed_a = in_place;
    solder::test::store_epilogue e1{in_place.data(), p.ldc}, e2{packed_a.data(), p.ldc};
    gd::gemm_packed_from(M, gd::b_panels(N), K, blocking, gd::a_rows<K>(A.data()), gd::b_packed_whole{packed.data()},
                         e1, 1);
    gd::gemm_packed_from(M, gd::b_panels(N), K, blocking, gd::a_strided{A.data(), K, false},
                         gd::b_packed_whole{packed.data()}, e2, 2);
    CHECK(bitwise_equal(in_place, packed_a));
    CHECK(std::all_of(in_place.begin() + std::ptrdiff_t(M * p.ldc), in_place.end(),
                      [](float c) { return c == problem::sentinel; }));
    in_place.resize(M * p.ldc);
    check_against_reference(p, in_place, false);
  }
}

TEST_CASE("gemm with a pre-packed B equals gemm packing B per call, bit for bit", "[gemm]") {
  constexpr std::size_t N = 257, K = 255;
  const std::size_t M = GENERATE(1, 17, 257);
  const problem p(M, N, K, false, true, 5);
  const solder::packed_matrix<N, K, true> packed(p.B.data(), p.ldb);
  auto per_call = p.output(), prepacked = p.output();
  eval::cpu::gemm<N, K, false, true>(M, p.A.data(), p.lda, p.B.data(), p.ldb,
                               solder::test::bias_relu_epilogue{p.bias.data(), per_call.data(), p.ldc}, 2);
  eval::cpu::gemm<N, K, false, true>(M, p.A.data(), p.lda, packed,
                               solder::test::bias_relu_epilogue{p.bias.data(), prepacked.data(), p.ldc}, 2);
  CHECK(bitwise_equal(per_call, prepacked));
}

TEST_CASE("gemm gives the same bits for 1 and 2 threads and for any cache blocking", "[gemm]") {
  // Large enough that 2 threads are used (above parallel_min_flops) and split M or N.
  constexpr std::size_t N = 257, K = 1031;
  const std::size_t M = GENERATE(17, 100, 257);
  const problem p(M, N, K, false, false, 9);
  const solder::packed_matrix<N, K, false> packed(p.B.data(), p.ldb);
  auto one = p.output(), two = p.output(), tiny_one = p.output(), tiny_two = p.output();
  eval::cpu::gemm<N, K, false, false>(M, p.A.data(), p.lda, packed, solder::test::store_epilogue{one.data(), p.ldc}, 1);
  eval::cpu::gemm<N, K, false, false>(M, p.A.data(), p.lda, packed, solder::test::store_epilogue{two.data(), p.ldc}, 2);
  // Every element is one FMA chain in increasing k whatever the blocking (partial sums are
  // stored as the floats they are), so even a different K block length gives the same bits.
  solder::test::store_epilogue e1{tiny_one.data(), p.ldc}, e2{tiny_two.data(), p.ldc};
  namespace gd = eval::cpu::gemm_detail;
  const gd::a_strided a{p.A.data(), p.lda, false};
  gd::gemm_packed_from(M, gd::b_panels(N), K, tiny_blocking, a, gd::b_packed_whole{packed.data()}, e1, 1);
  gd::gemm_packed_from(M, gd::b_panels(N), K, tiny_blocking, a, gd::b_packed_whole{packed.data()}, e2, 2);
  CHECK(bitwise_equal(one, two));
  CHECK(bitwise_equal(one, tiny_one));
  CHECK(bitwise_equal(one, tiny_two));
  check_against_reference(p, one, false);
}

TEST_CASE("gemm's N split with A packed once for the team gives the bits of one thread", "[gemm]") {
  // Few rows and many columns: the threads split N, each part runs several N blocks, and A' is
  // packed tile by tile by whichever thread claims it (shares_a).
  constexpr std::size_t N = 1000, K = 1031;
  const std::size_t M = GENERATE(2, 6, 29);  // 2 x 1000 x 1031 is above parallel_min_flops
  const problem p(M, N, K, false, false, 31u + std::uint32_t(M));
  const solder::packed_matrix<N, K, false> packed(p.B.data(), p.ldb);
  namespace gd = eval::cpu::gemm_detail;
  const gd::b_panels L(N);
  const gd::a_strided a{p.A.data(), p.lda, false};
  // Small K and N blocks: many blocks per part and partial sums between them.
  const eval::cpu::gemm_blocking small{7, 3, 64};
  for (const eval::cpu::gemm_blocking& blocking : {eval::cpu::gemm_blocking::for_k(K), small}) {
    const gd::row_tiles tiling(M, eval::cpu::gemm_blocking::mr);
    const auto [tm, tn] = gd::choose_split(tiling, L, 2);
    REQUIRE(gd::shares_a(tiling, L, K, blocking, tm, tn));
    auto one = p.output(), two = p.output();
    solder::test::store_epilogue e1{one.data(), p.ldc}, e2{two.data(), p.ldc};
    gd::gemm_packed_from(M, L, K, blocking, a, gd::b_packed_whole{packed.data()}, e1, 1);
    gd::gemm_packed_from(M, L, K, blocking, a, gd::b_packed_whole{packed.data()}, e2, 2);
    CHECK(bitwise_equal(one, two));
    check_against_reference(p, two, false);
  }
}

TEST_CASE("gemm crosses every block of the driver with a tiny cache blocking", "[gemm]") {
  constexpr std::size_t N = 37, K = 23;
  const std::size_t M = GENERATE(1, 29, 257);
  const problem p(M, N, K, true, true, 11);
  const solder::packed_matrix<N, K, true> packed(p.B.data(), p.ldb);
  auto C = p.output();
  solder::test::bias_relu_epilogue e{p.bias.data(), C.data(), p.ldc};
  namespace gd = eval::cpu::gemm_detail;
  gd::gemm_packed_from(M, gd::b_panels(N), K, tiny_blocking, gd::a_strided{p.A.data(), p.lda, true},
                       gd::b_packed_whole{packed.data()}, e, 2);
  check_against_reference(p, C, true);
}

TEST_CASE("gemm's bias_relu epilogue keeps NaN and clamps negatives to +0", "[gemm]") {
  constexpr std::size_t N = 17, K = 3;
  const std::size_t M = 3;
  std::vector<float> A(M * K, -1.0f), B(K * N, 1.0f), bias(N, 0.5f), C(M * N, 1.0f);
  A[1 * K + 2] = std::numeric_limits<float>::quiet_NaN();  // row 1 of C is NaN
  eval::cpu::gemm<N, K, false, false>(M, A.data(), K, B.data(), N, solder::test::bias_relu_epilogue{bias.data(), C.data(), N}, 1);
  for (std::size_t n = 0; n < N; ++n) {
    CHECK(std::isnan(C[1 * N + n]));
    CHECK(C[0 * N + n] == 0.0f);  // relu(-3 + 0.5)
    CHECK_FALSE(std::signbit(C[0 * N + n]));
  }
}

TEST_CASE("gemm with M = 0 writes nothing", "[gemm]") {
  constexpr std::size_t N = 3, K = 3;
  std::vector<float> A(K, 1.0f), B(K * N, 1.0f), C(N, 7.0f);
  eval::cpu::gemm<N, K, false, false>(0, A.data(), K, B.data(), N, solder::test::store_epilogue{C.data(), N}, 2);
  CHECK(C == std::vector<float>(N, 7.0f));
}

// ---------------------------------------------------------------------------------------------
// Runtime K: gemm_dyn_k and accumulate_epilogue
// ---------------------------------------------------------------------------------------------

// N: 1 and primes around a vector (16), a panel (32, AVX2: 16) and 256. K from 0 (an empty sum)
// through a vector and the 512-long K block, the largest two crossing K blocks.
TEMPLATE_TEST_CASE_SIG("gemm_dyn_k equals the double reference in every transpose variant", "[gemm][dyn_k]",
                       ((std::size_t N), N), 1, 3, 17, 37, 255, 257) {
  const std::size_t M = GENERATE(1, 3, 17, 29, 257);
  const std::size_t K = GENERATE(0, 1, 3, 17, 255, 257);
  check_all_dyn_k_variants<N>(M, K);
}

TEMPLATE_TEST_CASE_SIG("gemm_dyn_k with K longer than a K block equals the double reference", "[gemm][dyn_k]",
                       ((std::size_t N), N), 1, 17, 37, 257) {
  const std::size_t M = GENERATE(3, 29);
  const std::size_t K = GENERATE(513, 1031, 4096);
  check_all_dyn_k_variants<N>(M, K);
}

TEST_CASE("gemm_dyn_k gives the same bits for 1 and 2 threads, any blocking, and static K", "[gemm][dyn_k]") {
  // Large enough that 2 threads are used (above parallel_min_flops) and split M or N.
  constexpr std::size_t N = 257, K = 1031;
  const std::size_t M = GENERATE(17, 100, 257);
  const problem p(M, N, K, true, false, 13);
  auto fixed = p.output(), one = p.output(), two = p.output(), tiny_one = p.output(), tiny_two = p.output();
  eval::cpu::gemm<N, K, true, false>(M, p.A.data(), p.lda, p.B.data(), p.ldb, solder::test::store_epilogue{fixed.data(), p.ldc}, 2);
  solder::test::store_epilogue e1{one.data(), p.ldc}, e2{two.data(), p.ldc}, e3{tiny_one.data(), p.ldc},
      e4{tiny_two.data(), p.ldc};
  eval::cpu::gemm_dyn_k<N, true, false>(M, K, p.A.data(), p.lda, p.B.data(), p.ldb, e1, 1);
  eval::cpu::gemm_dyn_k<N, true, false>(M, K, p.A.data(), p.lda, p.B.data(), p.ldb, e2, 2);
  namespace gd = eval::cpu::gemm_detail;
  gd::gemm_stored(M, N, K, gd::a_strided{p.A.data(), p.lda, true}, p.B.data(), p.ldb, false, e3, 1, tiny_blocking);
  gd::gemm_stored(M, N, K, gd::a_strided{p.A.data(), p.lda, true}, p.B.data(), p.ldb, false, e4, 2, tiny_blocking);
  CHECK(bitwise_equal(one, fixed));
  CHECK(bitwise_equal(one, two));
  CHECK(bitwise_equal(one, tiny_one));
  CHECK(bitwise_equal(one, tiny_two));
  check_against_reference(p, one, false);
}

TEST_CASE("gemm_dyn_k accumulates over micro-batches on 2 threads as one product over the whole batch",
          "[gemm][dyn_k]") {
  // dW [Out, In] = dy^T x summed over a batch of 4096 split into micro-batches of 1000, 3000 and
  // 96: the sum of the parts is within the bound of the whole product; beta = 0 starts it.
  constexpr std::size_t In = 37;
  const std::size_t Out = 257, batch = 4096;
  const problem p(Out, In, batch, true, false, 21);  // A = dy stored [batch, Out], B = x [batch, In]
  auto dW = p.output();
  std::fill(dW.begin(), dW.end(), std::numeric_limits<float>::quiet_NaN());  // garbage, overwritten
  for (std::size_t n = In; n < p.ldc; ++n)
    for (std::size_t m = 0; m < Out; ++m) dW[m * p.ldc + n] = problem::sentinel;
  std::size_t k0 = 0;
  float beta = 0.0f;
  for (const std::size_t part : {1000, 3000, 96}) {
    eval::cpu::gemm_dyn_k<In, true, false>(Out, part, p.A.data() + k0 * p.lda, p.lda, p.B.data() + k0 * p.ldb, p.ldb,
                                     solder::test::accumulate_epilogue{dW.data(), p.ldc, beta}, 2);
    k0 += part, beta = 1.0f;
  }
  // Three sums of at most 3000 terms, then two adds: within the (K + 2) u bound of the whole.
  check_against_reference(p, dW, false);
}

TEST_CASE("gemm_dyn_k crosses every block of the driver with a tiny cache blocking", "[gemm][dyn_k]") {
  constexpr std::size_t N = 37;
  const std::size_t M = GENERATE(1, 29, 257);
  const std::size_t K = GENERATE(0, 3, 23);
  const bool trans_b = GENERATE(false, true);
  const problem p(M, N, K, false, trans_b, 11);
  auto C = p.output();
  solder::test::bias_relu_epilogue e{p.bias.data(), C.data(), p.ldc};
  namespace gd = eval::cpu::gemm_detail;
  gd::gemm_stored(M, N, K, gd::a_strided{p.A.data(), p.lda, false}, p.B.data(), p.ldb, trans_b, e, 2, tiny_blocking);
  check_against_reference(p, C, true);
}

TEST_CASE("gemm_dyn_k with K = 0 hands the epilogue a zero sum and reads neither A nor B", "[gemm][dyn_k]") {
  constexpr std::size_t N = 37;
  const std::size_t M = GENERATE(1, 17, 257);
  std::vector<float> bias(N), C(M * N, 7.0f), acc(M * N);
  test::fill_uniform(bias, -0.5, 0.5, 3);
  test::fill_uniform(acc, -2.0, 2.0, 4);
  const auto before = acc;
  eval::cpu::gemm_dyn_k<N, false, false>(M, 0, nullptr, 0, nullptr, N, solder::test::bias_relu_epilogue{bias.data(), C.data(), N}, 2);
  eval::cpu::gemm_dyn_k<N, true, true>(M, 0, nullptr, M, nullptr, 0, solder::test::accumulate_epilogue{acc.data(), N, 1.0f}, 2);
  for (std::size_t m = 0; m < M; ++m)
    for (std::size_t n = 0; n < N; ++n) {
      INFO("m " << m << ", n " << n);
      REQUIRE(C[m * N + n] == std::max(bias[n], 0.0f));  // relu(0 + bias)
    }
  CHECK(bitwise_equal(acc, before));  // before + 0 (no -0 among them)
}

TEST_CASE("gemm_dyn_k with M = 0 writes nothing", "[gemm][dyn_k]") {
  constexpr std::size_t N = 3;
  const std::size_t K = 5;
  std::vector<float> A(K, 1.0f), B(K * N, 1.0f), C(N, 7.0f);
  eval::cpu::gemm_dyn_k<N, false, false>(0, K, A.data(), K, B.data(), N, solder::test::store_epilogue{C.data(), N}, 2);
  CHECK(C == std::vector<float>(N, 7.0f));
}

TEST_CASE("accumulate_epilogue: beta = 1 keeps Inf and NaN in C, beta = 0 replaces them", "[gemm][dyn_k]") {
  constexpr std::size_t N = 17;
  const std::size_t M = 3, K = 2;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> A(M * K, 1.0f), B(K * N, 0.5f);  // every product is 1
  std::vector<float> C(M * N, 2.0f);
  C[0] = inf, C[N + 16] = -inf, C[2 * N + 5] = nan;
  auto D = C;
  eval::cpu::gemm_dyn_k<N, false, false>(M, K, A.data(), K, B.data(), N, solder::test::accumulate_epilogue{C.data(), N, 1.0f}, 1);
  eval::cpu::gemm_dyn_k<N, false, false>(M, K, A.data(), K, B.data(), N, solder::test::accumulate_epilogue{D.data(), N, 0.0f}, 1);
  CHECK(C[0] == inf);
  CHECK(C[N + 16] == -inf);
  CHECK(std::isnan(C[2 * N + 5]));
  CHECK(C[1] == 3.0f);
  CHECK(D == std::vector<float>(M * N, 1.0f));
}

TEST_CASE("gemm_dyn_k rejects leading dimensions shorter than a row", "[gemm][dyn_k]") {
  constexpr std::size_t N = 17;
  const std::size_t M = 4, K = 9;
  std::vector<float> A(M * K), B(K * N), C(M * N);
  solder::test::store_epilogue e{C.data(), N};
  CHECK_THROWS_WITH((eval::cpu::gemm_dyn_k<N, false, false>(M, K, A.data(), K - 1, B.data(), N, e, 1)),
                    "solder::eval::cpu::gemm_dyn_k: lda is smaller than a row of A");
  CHECK_THROWS_WITH((eval::cpu::gemm_dyn_k<N, true, false>(M, K, A.data(), M - 1, B.data(), N, e, 1)),
                    "solder::eval::cpu::gemm_dyn_k: lda is smaller than a row of A");
  CHECK_THROWS_WITH((eval::cpu::gemm_dyn_k<N, false, false>(M, K, A.data(), K, B.data(), N - 1, e, 1)),
                    "solder::eval::cpu::gemm_dyn_k: ldb is smaller than a row of B");
  CHECK_THROWS_WITH((eval::cpu::gemm_dyn_k<N, false, true>(M, K, A.data(), K, B.data(), K - 1, e, 1)),
                    "solder::eval::cpu::gemm_dyn_k: ldb is smaller than a row of B");
  CHECK_THROWS_AS((eval::cpu::gemm_dyn_k<N, false, false>(M, K, A.data(), 0, B.data(), N, e, 1)), solder::error);
}
