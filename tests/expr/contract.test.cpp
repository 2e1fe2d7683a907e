// tests/expr/contract.test.cpp: matmul as an expression node: the product against a double
// triple loop in every operand form (A or A^T, B, B^T or pre-packed), static and dynamic M,
// edge sizes in every dimension; epilogues (bias, activations, dropout, several outputs)
// against the unfused composition, bit for bit; thread-count independence; run-time errors.
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/assign.hpp"
#include "solder/expr/contract.hpp"
#include "solder/expr/operators.hpp"
#include "support/data.hpp"
#include "support/reference.hpp"

namespace {

using solder::test::bit_differences;
using solder::test::product_errors;

using solder::dyn;
using solder::matmul;
using solder::shape;
using solder::tensor;
using solder::transpose;


/// x [M, K] times w^T for w [N, K] (a linear layer), M dynamic, for several M.
template <std::size_t N, std::size_t K>
void check_linear_forms(std::uint32_t seed) {
  tensor<float, shape<N, K>> w;
  tensor<float, shape<K, N>> wt;  // the same matrix stored transposed
  solder::test::fill_uniform(w, -1, 1, seed);
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t k = 0; k < K; ++k) wt[k * N + n] = w[n * K + k];
  const solder::packed_matrix<N, K, true> packed(w.data(), K);
  for (std::size_t M : {std::size_t(1), std::size_t(3), std::size_t(17), std::size_t(255), std::size_t(257)}) {
    tensor<float, shape<dyn, K>> x(M);
    solder::test::fill_uniform(x, -1, 1, seed + std::uint32_t(M));
    tensor<float, shape<dyn, N>> y1(M), y2(M), y3(M);
    y1 = matmul(x, transpose(w));
    y2 = matmul(x, wt);
    y3 = matmul(x, packed);
    INFO("M = " << M << ", N = " << N << ", K = " << K);
    CHECK(product_errors(y1.data(), M, N, K, [&](auto m, auto k) { return x[m * K + k]; },
                         [&](auto k, auto n) { return w[n * K + k]; }) == 0);
    // The three forms pack the same B' and run the same kernel: equal bit for bit.
    CHECK(bit_differences(y1.data(), y2.data(), y1.size()) == 0);
    CHECK(bit_differences(y1.data(), y3.data(), y1.size()) == 0);
  }
}

}  // namespace

TEST_CASE("matmul: x w^T, x w and x packed(w) against a double loop", "[contract]") {
  check_linear_forms<1, 1>(10);
  check_linear_forms<3, 17>(20);
  check_linear_forms<17, 3>(30);
  check_linear_forms<257, 255>(40);
  check_linear_forms<31, 257>(50);
}

TEST_CASE("matmul: a transposed left operand and a static M", "[contract]") {
  constexpr std::size_t M = 19, N = 37, K = 13;
  tensor<float, shape<K, M>> at;  // A^T stored
  tensor<float, shape<K, N>> b;
  solder::test::fill_uniform(at, -1, 1, 61);
  solder::test::fill_uniform(b, -1, 1, 62);
  tensor<float, shape<M, N>> c, c2;
  c = matmul(transpose(at), b);
  CHECK(product_errors(c.data(), M, N, K, [&](auto m, auto k) { return at[k * M + m]; },
                       [&](auto k, auto n) { return b[k * N + n]; }) == 0);
  tensor<float, shape<M, K>> a;
  for (std::size_t m = 0; m < M; ++m)
    for (std::size_t k = 0; k < K; ++k) a[m * K + k] = at[k * M + m];
  c2 = matmul(a, b);
  CHECK(product_errors(c2.data(), M, N, K, [&](auto m, auto k) { return a[m * K + k]; },
                       [&](auto k, auto n) { return b[k * N + n]; }) == 0);
}

namespace {

/// Epilogue E(z, b) of the product z = x w^T fused, against z stored first and E run as its
/// own elementwise pass: the same float operations on the same values, so equal bit for bit.
template <std::size_t N, std::size_t K, class Epi>
void check_epilogue(std::size_t M, Epi epi, const std::string& what) {
  tensor<float, shape<N, K>> w;
  tensor<float, shape<N>> b;
  tensor<float, shape<dyn, K>> x(M);
  solder::test::fill_uniform(w, -1, 1, 71);
  solder::test::fill_uniform(b, -1, 1, 72);
  solder::test::fill_uniform(x, -1, 1, 73);
  tensor<float, shape<dyn, N>> fused(M), z(M), unfused(M);
  fused = epi(matmul(x, transpose(w)), b);
  z = matmul(x, transpose(w));
  unfused = epi(z, b);
  INFO(what << " on [" << M << ", " << N << "], K = " << K);
  CHECK(bit_differences(fused.data(), unfused.data(), fused.size()) == 0);
}

}  // namespace

TEST_CASE("matmul: every epilogue equals the product followed by its own pass", "[contract]") {
  const solder::philox_state rng{1234, 5};
  for (std::size_t M : {std::size_t(1), std::size_t(17), std::size_t(100)}) {
    check_epilogue<37, 29>(M, [](const auto& z, const auto& b) { return z + b; }, "z + b");
    check_epilogue<37, 29>(M, [](const auto& z, const auto& b) { return solder::relu(z + b); }, "relu");
    check_epilogue<37, 29>(M, [](const auto& z, const auto& b) { return solder::gelu(z + b); }, "gelu");
    check_epilogue<37, 29>(M, [](const auto& z, const auto& b) { return solder::silu(z + b); }, "silu");
    check_epilogue<37, 29>(M, [](const auto& z, const auto& b) { return solder::tanh(z + b); }, "tanh");
    check_epilogue<37, 29>(M, [](const auto& z, const auto& b) { return solder::sigmoid(z + b); }, "sigmoid");
    check_epilogue<37, 29>(
        M, [&](const auto& z, const auto& b) { return solder::dropout(solder::relu(z + b), 0.1f, rng); }, "dropout(relu)");
    check_epilogue<300, 64>(
        M, [&](const auto& z, const auto& b) { return solder::dropout(solder::relu(z + b), 0.5f, rng); }, "dropout(relu), wide");
    check_epilogue<37, 29>(M, [](const auto& z, const auto& b) { return z * 2.0f - b; }, "scale and shift");
  }
}

TEST_CASE("matmul: several outputs of one product in one pass", "[contract]") {
  constexpr std::size_t N = 45, K = 20;
  const std::size_t M = 33;
  tensor<float, shape<N, K>> w;
  tensor<float, shape<N>> b;
  tensor<float, shape<dyn, K>> x(M);
  solder::test::fill_uniform(w, -1, 1, 81);
  solder::test::fill_uniform(b, -1, 1, 82);
  solder::test::fill_uniform(x, -1, 1, 83);
  const solder::philox_state rng{99, 1};
  tensor<float, shape<dyn, N>> y(M), pre(M), z(M), y_ref(M), pre_ref(M);
  auto zb = matmul(x, transpose(w)) + b;
  solder::assign_all(solder::write(y, solder::dropout(solder::relu(zb), 0.2f, rng)), solder::write(pre, zb));
  z = matmul(x, transpose(w));
  pre_ref = z + b;
  y_ref = solder::dropout(solder::relu(pre_ref), 0.2f, rng);
  CHECK(bit_differences(pre.data(), pre_ref.data(), pre.size()) == 0);
  CHECK(bit_differences(y.data(), y_ref.data(), y.size()) == 0);
}

TEST_CASE("matmul: results do not depend on the thread count", "[contract]") {
  constexpr std::size_t N = 300, K = 200;
  const std::size_t M = 301;
  tensor<float, shape<N, K>> w;
  tensor<float, shape<N>> b;
  tensor<float, shape<dyn, K>> x(M);
  solder::test::fill_uniform(w, -1, 1, 91);
  solder::test::fill_uniform(b, -1, 1, 92);
  solder::test::fill_uniform(x, -1, 1, 93);
  const solder::philox_state rng{7, 7};
  tensor<float, shape<dyn, N>> one(M), two(M);
  const int before = solder::num_threads();
  solder::set_num_threads(1);
  one = solder::dropout(solder::relu(matmul(x, transpose(w)) + b), 0.1f, rng);
  solder::set_num_threads(2);
  two = solder::dropout(solder::relu(matmul(x, transpose(w)) + b), 0.1f, rng);
  solder::set_num_threads(before);
  CHECK(bit_differences(one.data(), two.data(), one.size()) == 0);
}

TEST_CASE("matmul: run-time errors name the problem", "[contract]") {
  tensor<float, shape<8, 8>> w;
  tensor<float, shape<dyn, 8>> x(4), y(5), x2(4);
  CHECK_THROWS_WITH(y = matmul(x, transpose(w)), Catch::Contains("batch size"));
  CHECK_THROWS_WITH(x = matmul(x, transpose(w)), Catch::Contains("overlaps one of its operands"));
  tensor<float, shape<dyn, 8>> y4(4);
  CHECK_THROWS_WITH(solder::assign_all(solder::write(y4, matmul(x, transpose(w))), solder::write(x2, matmul(y4, transpose(w)))),
                    Catch::Contains("different matrix products"));
}
