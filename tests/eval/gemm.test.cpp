// tests/eval/gemm.test.cpp: solder::cpu::gemm against a double-precision triple loop, for all
// four transpose variants, edge tiles in every dimension, both epilogues, pre-packed and
// per-call B, padded leading dimensions, and bit-for-bit equality across thread counts and
// cache blockings.
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/eval/cpu/gemm.hpp"
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

/// Runs one transpose variant with both epilogues, per-call and pre-packed B.
template <std::size_t N, std::size_t K, bool TA, bool TB>
void check_variant(std::size_t M) {
  const problem p(M, N, K, TA, TB, 17u + std::uint32_t(M));
  auto C = p.output();
  cpu::gemm<N, K, TA, TB>(M, p.A.data(), p.lda, p.B.data(), p.ldb, cpu::store_epilogue{C.data(), p.ldc}, 1);
  check_against_reference(p, C, false);

  const cpu::packed_b<N, K, TB> packed(p.B.data(), p.ldb);
  auto Cb = p.output();
  cpu::gemm<N, K, TA, TB>(M, p.A.data(), p.lda, packed, cpu::bias_relu_epilogue{p.bias.data(), Cb.data(), p.ldc}, 1);
  check_against_reference(p, Cb, true);
}

template <std::size_t N, std::size_t K>
void check_all_variants(std::size_t M) {
  check_variant<N, K, false, false>(M);
  check_variant<N, K, false, true>(M);
  check_variant<N, K, true, false>(M);
  check_variant<N, K, true, true>(M);
}

/// A cache blocking far smaller than any real one, so small problems cross every loop of the
/// driver: several M blocks, N blocks and K blocks, and the L2 prefetch between them.
template <std::size_t N, std::size_t K>
struct tiny_blocking : cpu::gemm_blocking<N, K> {
  static constexpr std::size_t kc = 5;
  static constexpr std::size_t nc = 2;
  static constexpr std::size_t mc_max = 2;
};

bool bitwise_equal(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

}  // namespace

// (N, K): 1 and primes below and above a vector (16) and a register tile's rows (14), around a
// panel (32), and K longer than one K block (256), so that partial sums are kept between blocks.
TEMPLATE_TEST_CASE_SIG("gemm equals the double reference in every transpose variant", "[gemm]",
                       ((std::size_t N, std::size_t K), N, K), (1, 1), (17, 3), (3, 257), (255, 17), (257, 255),
                       (37, 1031)) {
  const std::size_t M = GENERATE(1, 3, 17, 29, 255, 257);
  check_all_variants<N, K>(M);
}

TEST_CASE("gemm with a pre-packed B equals gemm packing B per call, bit for bit", "[gemm]") {
  constexpr std::size_t N = 257, K = 255;
  const std::size_t M = GENERATE(1, 17, 257);
  const problem p(M, N, K, false, true, 5);
  const cpu::packed_b<N, K, true> packed(p.B.data(), p.ldb);
  auto per_call = p.output(), prepacked = p.output();
  cpu::gemm<N, K, false, true>(M, p.A.data(), p.lda, p.B.data(), p.ldb,
                               cpu::bias_relu_epilogue{p.bias.data(), per_call.data(), p.ldc}, 2);
  cpu::gemm<N, K, false, true>(M, p.A.data(), p.lda, packed,
                               cpu::bias_relu_epilogue{p.bias.data(), prepacked.data(), p.ldc}, 2);
  CHECK(bitwise_equal(per_call, prepacked));
}

TEST_CASE("gemm gives the same bits for 1 and 2 threads and for any cache blocking", "[gemm]") {
  // Large enough that 2 threads are used (above parallel_min_flops) and split M or N.
  constexpr std::size_t N = 257, K = 1031;
  const std::size_t M = GENERATE(17, 100, 257);
  const problem p(M, N, K, false, false, 9);
  const cpu::packed_b<N, K, false> packed(p.B.data(), p.ldb);
  auto one = p.output(), two = p.output(), tiny_one = p.output(), tiny_two = p.output();
  cpu::gemm<N, K, false, false>(M, p.A.data(), p.lda, packed, cpu::store_epilogue{one.data(), p.ldc}, 1);
  cpu::gemm<N, K, false, false>(M, p.A.data(), p.lda, packed, cpu::store_epilogue{two.data(), p.ldc}, 2);
  // Every element is one FMA chain in increasing k whatever the blocking (partial sums are
  // stored as the floats they are), so even a different K block length gives the same bits.
  cpu::store_epilogue e1{tiny_one.data(), p.ldc}, e2{tiny_two.data(), p.ldc};
  cpu::gemm_detail::gemm_packed<N, K, false, tiny_blocking<N, K>>(M, p.A.data(), p.lda, packed.data(), e1, 1);
  cpu::gemm_detail::gemm_packed<N, K, false, tiny_blocking<N, K>>(M, p.A.data(), p.lda, packed.data(), e2, 2);
  CHECK(bitwise_equal(one, two));
  CHECK(bitwise_equal(one, tiny_one));
  CHECK(bitwise_equal(one, tiny_two));
  check_against_reference(p, one, false);
}

TEST_CASE("gemm crosses every block of the driver with a tiny cache blocking", "[gemm]") {
  constexpr std::size_t N = 37, K = 23;
  const std::size_t M = GENERATE(1, 29, 257);
  const problem p(M, N, K, true, true, 11);
  const cpu::packed_b<N, K, true> packed(p.B.data(), p.ldb);
  auto C = p.output();
  cpu::bias_relu_epilogue e{p.bias.data(), C.data(), p.ldc};
  cpu::gemm_detail::gemm_packed<N, K, true, tiny_blocking<N, K>>(M, p.A.data(), p.lda, packed.data(), e, 2);
  check_against_reference(p, C, true);
}

TEST_CASE("gemm's bias_relu epilogue keeps NaN and clamps negatives to +0", "[gemm]") {
  constexpr std::size_t N = 17, K = 3;
  const std::size_t M = 3;
  std::vector<float> A(M * K, -1.0f), B(K * N, 1.0f), bias(N, 0.5f), C(M * N, 1.0f);
  A[1 * K + 2] = std::numeric_limits<float>::quiet_NaN();  // row 1 of C is NaN
  cpu::gemm<N, K, false, false>(M, A.data(), K, B.data(), N, cpu::bias_relu_epilogue{bias.data(), C.data(), N}, 1);
  for (std::size_t n = 0; n < N; ++n) {
    CHECK(std::isnan(C[1 * N + n]));
    CHECK(C[0 * N + n] == 0.0f);  // relu(-3 + 0.5)
    CHECK_FALSE(std::signbit(C[0 * N + n]));
  }
}

TEST_CASE("gemm with M = 0 writes nothing", "[gemm]") {
  constexpr std::size_t N = 3, K = 3;
  std::vector<float> A(K, 1.0f), B(K * N, 1.0f), C(N, 7.0f);
  cpu::gemm<N, K, false, false>(0, A.data(), K, B.data(), N, cpu::store_epilogue{C.data(), N}, 2);
  CHECK(C == std::vector<float>(N, 7.0f));
}
