// tests/autodiff/product.test.cpp: the reverse of a product node. For C = A' B' and a gradient G
// of C, left_grad and right_grads against the derivative of L = sum G * C written out in double
// (dL/dA'[m, k] = sum_n G[m, n] B'[k, n], dL/dB'[k, n] = sum_m A'[m, k] G[m, n]), for stored,
// transposed, batch-inner and concatenated operands, a sketch part getting no gradient.
#include <cmath>
#include <cstddef>
#include <tuple>

#include <catch2/catch.hpp>

#include "solder/assign.hpp"
#include "solder/autodiff/product.hpp"
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
using solder::test::product_errors;

}  // namespace

TEST_CASE("product rules: x W^T (a linear layer) gives dx = G W and dW = G^T x", "[autodiff][product]") {
  constexpr std::size_t In = 37, Out = 29;
  for (std::size_t B : {std::size_t(1), std::size_t(19)}) {
    tensor<float, shape<dyn, In>> x(B), dx(B);
    tensor<float, shape<Out, In>> w, dw;
    tensor<float, shape<dyn, Out>> g(B);
    solder::test::fill_uniform(x, -1, 1, 1);
    solder::test::fill_uniform(w, -1, 1, 2);
    solder::test::fill_uniform(g, -1, 1, 3);
    const auto c = matmul(x, transpose(w));
    solder::assign(dx, solder::autodiff::left_grad(c, g));
    solder::assign(dw, std::get<0>(solder::autodiff::right_grads(c, g)));
    INFO("batch " << B);
    // dx[m, i] = sum_o G[m, o] W[o, i]; dW[o, i] = sum_m G[m, o] x[m, i]
    CHECK(product_errors(dx.data(), B, In, Out, [&](auto m, auto o) { return g[m * Out + o]; },
                         [&](auto o, auto i) { return w[o * In + i]; }) == 0);
    CHECK(product_errors(dw.data(), Out, In, B, [&](auto o, auto m) { return g[m * Out + o]; },
                         [&](auto m, auto i) { return x[m * In + i]; }) == 0);
  }
}

TEST_CASE("product rules: a transposed left operand gets its gradient transposed back", "[autodiff][product]") {
  constexpr std::size_t M = 13, K = 21, N = 17;
  tensor<float, shape<K, M>> at, dat;  // A' = at^T
  tensor<float, shape<K, N>> b;
  tensor<float, shape<M, N>> g;
  solder::test::fill_uniform(at, -1, 1, 4);
  solder::test::fill_uniform(b, -1, 1, 5);
  solder::test::fill_uniform(g, -1, 1, 6);
  const auto c = matmul(transpose(at), b);
  solder::assign(dat, solder::autodiff::left_grad(c, g));
  // d(at)[k, m] = dA'[m, k] = sum_n G[m, n] B[k, n]
  CHECK(product_errors(dat.data(), K, M, N, [&](auto k, auto n) { return b[k * N + n]; },
                       [&](auto n, auto m) { return g[m * N + n]; }) == 0);
}

TEST_CASE("product rules: stored parts of concatenations get their block, sketches none", "[autodiff][product]") {
  constexpr std::size_t B = 11, In = 24, Out = 20, R = 6;
  using U = sign_sketch<In, 3, 2, sketch_stack::columns>;  // [In, 6]
  using V = sign_sketch<3, Out, 2, sketch_stack::rows>;    // [6, Out]
  tensor<float, shape<dyn, In>> x(B);
  tensor<float, shape<In, R>> s1, ds1;
  tensor<float, shape<R, Out>> s2, ds2;
  tensor<float, shape<Out, R>> w, dw;  // stored transposed inside a concatenation
  solder::test::fill_uniform(x, -1, 1, 7);
  solder::test::fill_uniform(s1, -1, 1, 8);
  solder::test::fill_uniform(s2, -1, 1, 9);
  solder::test::fill_uniform(w, -1, 1, 10);

  // C1 = x [S1 | U]: one gradient, dS1 = x^T G[:, :R]; U is a constant.
  tensor<float, shape<dyn, 2 * R>> g1(B);
  solder::test::fill_uniform(g1, -1, 1, 11);
  const auto c1 = matmul(x, hcat(s1, U{12, 0.5f}));
  const auto grads1 = solder::autodiff::right_grads(c1, g1);
  STATIC_REQUIRE(std::tuple_size_v<decltype(grads1)> == 1);
  solder::assign(ds1, std::get<0>(grads1));
  CHECK(product_errors(ds1.data(), In, R, B, [&](auto i, auto m) { return x[m * In + i]; },
                       [&](auto m, auto j) { return g1[m * 2 * R + j]; }) == 0);

  // C2 = H [V; S2; W^T] with H [B, 3R]: dS2 = H[:, R:2R]^T G, dW = G^T H[:, 2R:3R].
  tensor<float, shape<dyn, 3 * R>> h(B);
  tensor<float, shape<dyn, Out>> g2(B);
  solder::test::fill_uniform(h, -1, 1, 13);
  solder::test::fill_uniform(g2, -1, 1, 14);
  const auto c2 = matmul(h, vcat(vcat(V{15, 0.25f}, s2), transpose(w)));
  const auto grads2 = solder::autodiff::right_grads(c2, g2);
  STATIC_REQUIRE(std::tuple_size_v<decltype(grads2)> == 2);
  solder::assign(ds2, std::get<0>(grads2));
  solder::assign(dw, std::get<1>(grads2));
  CHECK(product_errors(ds2.data(), R, Out, B, [&](auto j, auto m) { return h[m * 3 * R + R + j]; },
                       [&](auto m, auto o) { return g2[m * Out + o]; }) == 0);
  CHECK(product_errors(dw.data(), Out, R, B, [&](auto o, auto m) { return g2[m * Out + o]; },
                       [&](auto m, auto j) { return h[m * 3 * R + 2 * R + j]; }) == 0);

  // And the left operand's gradient through the same concatenation: dH = G [V; S2; W^T]^T.
  tensor<float, shape<dyn, 3 * R>> dh(B);
  solder::assign(dh, solder::autodiff::left_grad(c2, g2));
  tensor<float, shape<3 * R, Out>> b2;  // [V; S2; W^T] written out, V from the sign definition
  for (std::size_t j = 0; j < 3 * R; ++j)
    for (std::size_t o = 0; o < Out; ++o)
      b2[j * Out + o] = j < R       ? 0.25f * solder::random::sketch_sign(15, j / 3, (j % 3) * Out + o)
                        : j < 2 * R ? s2[(j - R) * Out + o]
                                    : w[o * R + (j - 2 * R)];
  CHECK(product_errors(dh.data(), B, 3 * R, Out, [&](auto m, auto o) { return g2[m * Out + o]; },
                       [&](auto o, auto j) { return b2[j * Out + o]; }) == 0);
}
