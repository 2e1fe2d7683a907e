// tests/expr/operand.test.cpp: product operands beyond stored matrices: sign sketches generated
// while packing, column blocks, side-by-side and stacked concatenations, each read as it is or
// transposed, on either side of a product. Each product is checked against a double loop over
// the explicit matrices and, bit for bit, against the same product of materialized matrices
// (packing is exact); signs against their definition and their distribution; results against
// the thread count.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/assign.hpp"
#include "solder/eval/cpu/operand_packing.hpp"
#include "solder/eval/cpu/parallel.hpp"
#include "solder/expr/contract.hpp"
#include "solder/expr/operators.hpp"
#include "solder/random/sketch.hpp"
#include "support/data.hpp"
#include "support/reference.hpp"

namespace {

using solder::dyn;
using solder::hcat;
using solder::matmul;
using solder::shape;
using solder::sign_sketch;
using solder::sketch_stack;
using solder::tensor;
using solder::transpose;
using solder::vcat;
using solder::test::bit_differences;
using solder::test::product_errors;

/// The stacked sketch written out as a stored [rows, cols] matrix, from the definition: term t's
/// element (r, c) is scale * sketch_sign(seed, t, r * TC + c).
template <class U>
tensor<float, shape<U::stored_rows, U::stored_cols>> materialize(const U& u) {
  tensor<float, shape<U::stored_rows, U::stored_cols>> m;
  for (std::size_t r = 0; r < U::stored_rows; ++r)
    for (std::size_t c = 0; c < U::stored_cols; ++c) {
      const bool side = U::stack == sketch_stack::columns;
      const std::size_t t = side ? c / U::term_cols : r / U::term_rows;
      const std::size_t rr = side ? r : r % U::term_rows, cc = side ? c % U::term_cols : c;
      m[r * U::stored_cols + c] = u.scale * solder::random::sketch_sign(u.seed, t, rr * U::term_cols + cc);
    }
  return m;
}

}  // namespace

TEST_CASE("sign sketch: packed signs follow the definition, are +-scale and balanced", "[operand]") {
  // 8 terms of [96, 40] side by side: rows of 320 cross term and Philox block boundaries.
  using U = sign_sketch<96, 40, 8, sketch_stack::columns>;
  const U u{0x5eed, 0.125f};
  const auto stored = materialize(u);
  std::vector<float> packed(U::stored_rows * U::stored_cols), packed_t(U::stored_rows * U::stored_cols);
  solder::eval::cpu::pack_block(u, 0, U::stored_rows, 0, U::stored_cols, packed.data(), U::stored_cols);
  CHECK(bit_differences(packed.data(), stored.data(), packed.size()) == 0);
  // Read transposed: element (c, r) of u^T is element (r, c) of u.
  solder::eval::cpu::pack_block(transpose(u), 0, U::stored_cols, 0, U::stored_rows, packed_t.data(), U::stored_rows);
  std::size_t transposed_bad = 0;
  for (std::size_t r = 0; r < U::stored_rows; ++r)
    for (std::size_t c = 0; c < U::stored_cols; ++c)
      transposed_bad += packed_t[c * U::stored_rows + r] != stored[r * U::stored_cols + c];
  CHECK(transposed_bad == 0);

  // A large sketch: every entry is +-scale, and the signs are balanced within 5 standard
  // deviations of a fair coin (n = 2^20: 5 sigma = 2560 of 524288).
  using Big = sign_sketch<1024, 128, 8, sketch_stack::rows>;
  const Big big{42, 1.0f / std::sqrt(128.0f)};
  std::vector<float> all(Big::stored_rows * Big::stored_cols);
  solder::eval::cpu::pack_block(big, 0, Big::stored_rows, 0, Big::stored_cols, all.data(), Big::stored_cols);
  std::size_t negative = 0, other = 0;
  for (float v : all) {
    negative += v == -big.scale;
    other += v != big.scale && v != -big.scale;
  }
  CHECK(other == 0);
  CHECK(std::fabs(double(negative) - 0.5 * double(all.size())) < 2560.0);
  // Another seed or term gives other signs.
  const Big other_seed{43, big.scale};
  std::vector<float> again(all.size());
  solder::eval::cpu::pack_block(other_seed, 0, Big::stored_rows, 0, Big::stored_cols, again.data(), Big::stored_cols);
  CHECK(bit_differences(all.data(), again.data(), all.size()) > all.size() / 3);
}

namespace {

/// A product with each generated or concatenated operand, against a double loop over the
/// explicit matrices and bit for bit against the product of the materialized ones.
template <std::size_t In, std::size_t Out, std::size_t Terms, std::size_t Rank>
void check_sketch_products(std::size_t M) {
  constexpr std::size_t LK = Terms * Rank;
  using U1 = sign_sketch<Rank, Out, Terms, sketch_stack::rows>;     // [LK, Out]
  using U2 = sign_sketch<In, Rank, Terms, sketch_stack::columns>;  // [In, LK]
  const float scale = float(1.0 / std::sqrt(double(Rank)));
  const U1 u1{101, scale};
  const U2 u2{202, scale};
  const auto u1m = materialize(u1);
  const auto u2m = materialize(u2);
  tensor<float, shape<In, LK>> s1;
  tensor<float, shape<LK, Out>> s2;
  tensor<float, shape<dyn, In>> x(M);
  tensor<float, shape<dyn, Out>> g(M);
  solder::test::fill_uniform(s1, -1, 1, 1);
  solder::test::fill_uniform(s2, -1, 1, 2);
  solder::test::fill_uniform(x, -1, 1, 3);
  solder::test::fill_uniform(g, -1, 1, 4);
  INFO("M = " << M << ", In = " << In << ", Out = " << Out << ", L = " << Terms << ", k = " << Rank);

  // h = x [S1 | U2]: a stored part and a generated part side by side.
  tensor<float, shape<dyn, 2 * LK>> h(M), h_ref(M);
  tensor<float, shape<In, 2 * LK>> b1;
  for (std::size_t r = 0; r < In; ++r)
    for (std::size_t c = 0; c < 2 * LK; ++c) b1[r * 2 * LK + c] = c < LK ? s1[r * LK + c] : u2m[r * LK + c - LK];
  h = matmul(x, hcat(s1, u2));
  h_ref = matmul(x, b1);
  CHECK(product_errors(h.data(), M, 2 * LK, In, [&](auto m, auto k) { return x[m * In + k]; },
                       [&](auto k, auto n) { return b1[k * 2 * LK + n]; }) == 0);
  CHECK(bit_differences(h.data(), h_ref.data(), h.size()) == 0);

  // y = h [U1; S2] / (2L): a generated part above a stored one, the scale in the epilogue.
  tensor<float, shape<2 * LK, Out>> b2;
  for (std::size_t r = 0; r < 2 * LK; ++r)
    for (std::size_t c = 0; c < Out; ++c) b2[r * Out + c] = r < LK ? u1m[r * Out + c] : s2[(r - LK) * Out + c];
  tensor<float, shape<dyn, Out>> y(M), y_ref(M);
  y = matmul(h, vcat(u1, s2)) * (0.5f / Terms);
  y_ref = matmul(h, b2) * (0.5f / Terms);
  CHECK(bit_differences(y.data(), y_ref.data(), y.size()) == 0);

  // dh = g [U1; S2]^T = g [U1^T | S2^T]: transposes moved to the leaves.
  tensor<float, shape<dyn, 2 * LK>> dh(M), dh_ref(M);
  dh = matmul(g, transpose(vcat(u1, s2)));
  dh_ref = matmul(g, transpose(b2));
  CHECK(product_errors(dh.data(), M, 2 * LK, Out, [&](auto m, auto k) { return g[m * Out + k]; },
                       [&](auto k, auto n) { return b2[n * Out + k]; }) == 0);
  CHECK(bit_differences(dh.data(), dh_ref.data(), dh.size()) == 0);

  // dx = dh [S1 | U2]^T.
  tensor<float, shape<dyn, In>> dx(M), dx_ref(M);
  dx = matmul(dh, transpose(hcat(s1, u2)));
  dx_ref = matmul(dh, transpose(b1));
  CHECK(bit_differences(dx.data(), dx_ref.data(), dx.size()) == 0);

  // Column blocks with the batch as the inner extent: dS1 = x^T dh[:, :LK], dS2 = h[:, LK:]^T g.
  tensor<float, shape<In, LK>> ds1;
  tensor<float, shape<LK, Out>> ds2;
  ds1 = matmul(transpose(x), solder::columns<0, LK>(dh));
  ds2 = matmul(transpose(solder::columns<LK, 2 * LK>(h)), g);
  CHECK(product_errors(ds1.data(), In, LK, M, [&](auto m, auto k) { return x[k * In + m]; },
                       [&](auto k, auto n) { return dh[k * 2 * LK + n]; }) == 0);
  CHECK(product_errors(ds2.data(), LK, Out, M, [&](auto m, auto k) { return h[k * 2 * LK + LK + m]; },
                       [&](auto k, auto n) { return g[k * Out + n]; }) == 0);

  // A generated left operand: the folded weight [S1 | U2] [U1; S2].
  tensor<float, shape<In, Out>> w, w_ref;
  w = matmul(hcat(s1, u2), vcat(u1, s2));
  w_ref = matmul(b1, b2);
  CHECK(product_errors(w.data(), In, Out, 2 * LK, [&](auto m, auto k) { return b1[m * 2 * LK + k]; },
                       [&](auto k, auto n) { return b2[k * Out + n]; }) == 0);
  CHECK(bit_differences(w.data(), w_ref.data(), w.size()) == 0);
}

}  // namespace

TEST_CASE("matmul: sketches, concatenations and column blocks against a double loop", "[operand]") {
  for (std::size_t M : {std::size_t(1), std::size_t(17), std::size_t(64)}) {
    check_sketch_products<48, 40, 2, 8>(M);
    check_sketch_products<37, 29, 3, 5>(M);  // edges in every extent
  }
  check_sketch_products<256, 128, 4, 16>(33);
  // K longer than a K block with a narrow B (one panel): each tile runs all its K blocks with B
  // packed over all of K, x read where it lies.
  for (std::size_t M : {std::size_t(1), std::size_t(29)}) check_sketch_products<1100, 12, 2, 4>(M);
}

namespace {

/// x [S | U] on 1 and 2 threads, x [200, In], S [In, Terms TC] stored, U Terms sketches [In, TC].
template <std::size_t In, std::size_t TC, std::size_t Terms>
void check_thread_bits(std::uint64_t seed) {
  constexpr std::size_t LK = Terms * TC;
  using U = sign_sketch<In, TC, Terms, sketch_stack::columns>;
  tensor<float, shape<In, LK>> s;
  tensor<float, shape<dyn, In>> x(200);
  solder::test::fill_uniform(s, -1, 1, seed);
  solder::test::fill_uniform(x, -1, 1, seed + 1);
  tensor<float, shape<dyn, 2 * LK>> one(200), two(200);
  const int saved = solder::num_threads();
  solder::set_num_threads(1);
  one = matmul(x, hcat(s, U{seed + 2, 0.25f}));
  solder::set_num_threads(2);
  two = matmul(x, hcat(s, U{seed + 2, 0.25f}));
  solder::set_num_threads(saved);
  CHECK(bit_differences(one.data(), two.data(), one.size()) == 0);
}

}  // namespace

TEST_CASE("matmul: generated operands give the same bits for any thread count", "[operand]") {
  check_thread_bits<512, 16, 4>(7);
  // A narrow B over K longer than a K block (each tile all its K blocks, x read in place).
  check_thread_bits<1536, 8, 2>(10);
}
