// tests/nn/flatten.test.cpp: nn::flatten: element (b, c, h, w) of x lands at (b, (c H + h) W + w)
// of y and back, bit for bit (NaN payloads included); rank-4 and already-flat inputs, static and
// dynamic batches, batch 1, the zero-copy view, shared buffers, and the batch errors.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include <catch2/catch.hpp>

#include "solder/nn/flatten.hpp"
#include "solder/nn/layer_info.hpp"
#include "support/data.hpp"

namespace {

using solder::test::make;

using Catch::Matchers::Contains;
using solder::dyn;
using solder::shape;
using solder::tensor;
using solder::tensor_ref;

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

/// flatten<3, 4, 5> from x of shape SX ([batch, 3, 4, 5] or [batch, 60]) to [batch, 60] and back.
template <class SX, class SY>
void check_flatten(std::size_t batch) {
  solder::nn::flatten<3, 4, 5> layer;
  auto x = make<SX>(batch), dx = make<SX>(batch);
  auto y = make<SY>(batch), dy = make<SY>(batch);
  solder::test::fill_uniform(x, -1, 1, 1);
  solder::test::fill_uniform(dy, -1, 1, 2);
  x[7] = std::numeric_limits<float>::quiet_NaN();
  x[x.size() - 1] = -std::numeric_limits<float>::infinity();
  dx.fill(9);
  layer.forward(x, y);
  layer.backward(x, y, dy, dx);
  std::size_t bad_y = 0, bad_dx = 0;
  for (std::size_t b = 0; b < batch; ++b)
    for (std::size_t c = 0; c < 3; ++c)
      for (std::size_t h = 0; h < 4; ++h)
        for (std::size_t w = 0; w < 5; ++w) {
          const std::size_t f = (c * 4 + h) * 5 + w;  // torch.flatten's order: row-major
          float xv, dxv;
          if constexpr (SX::rank == 4) {
            xv = x(b, c, h, w);
            dxv = dx(b, c, h, w);
          } else {
            xv = x(b, f);
            dxv = dx(b, f);
          }
          bad_y += !same_bits(y(b, f), xv);
          bad_dx += !same_bits(dxv, dy(b, f));
        }
  CHECK(bad_y == 0);
  CHECK(bad_dx == 0);
}

}  // namespace

TEST_CASE("nn::flatten: constants, parameters and the sample shapes it takes", "[nn][flatten]") {
  using L = solder::nn::flatten<3, 4, 5>;
  using info = solder::nn::layer_info<L>;
  using rules = solder::nn::shape_rules<L>;
  using solder::nn::sample_shape;
  STATIC_REQUIRE(L::features == 60);
  STATIC_REQUIRE(info::parameters == 0);
  STATIC_REQUIRE(info::saved_floats(60) == 0);
  STATIC_REQUIRE(info::forward_flops(60) == 0);
  STATIC_REQUIRE(info::backward_flops(60) == 0);
  STATIC_REQUIRE(solder::nn::flatten<7>::features == 7);
  STATIC_REQUIRE(rules::takes(sample_shape(3, 4, 5)));
  STATIC_REQUIRE(rules::takes(sample_shape(60)));
  STATIC_REQUIRE(!rules::takes(sample_shape(4, 3, 5)));
  STATIC_REQUIRE(!rules::takes(sample_shape(59)));
  STATIC_REQUIRE(rules::gives(sample_shape(3, 4, 5)) == sample_shape(60));
  using any = solder::nn::shape_rules<solder::nn::flatten<>>;
  STATIC_REQUIRE(any::takes(sample_shape(16, 2, 2)));
  STATIC_REQUIRE(any::gives(sample_shape(16, 2, 2)) == sample_shape(64));
  STATIC_REQUIRE(any::gives(sample_shape(9)) == sample_shape(9));
  CHECK(std::string(L::name) == "flatten");
  CHECK(L().params("2.").empty());
}

TEST_CASE("nn::flatten<>: a sample of any shape, in torch.flatten's order", "[nn][flatten]") {
  tensor<float, shape<dyn, 3, 4, 5>> x(2);
  solder::test::fill_uniform(x, -1, 1, 5);
  tensor<float, shape<dyn, 60>> y(2), dy(2);
  tensor<float, shape<dyn, 3, 4, 5>> dx(2);
  solder::test::fill_uniform(dy, -1, 1, 6);
  solder::nn::flatten<> layer;
  layer.forward(x, y);
  layer.backward(x, y, dy, dx);
  CHECK(y(1, (2 * 4 + 3) * 5 + 4) == x(1, 2, 3, 4));
  CHECK(std::memcmp(y.data(), x.data(), x.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(dx.data(), dy.data(), dy.size() * sizeof(float)) == 0);
}

TEST_CASE("nn::flatten: [batch, 3, 4, 5] to [batch, 60] and back, in torch.flatten's order", "[nn][flatten]") {
  check_flatten<shape<dyn, 3, 4, 5>, shape<dyn, 60>>(GENERATE(1, 2, 7));
  check_flatten<shape<1, 3, 4, 5>, shape<1, 60>>(1);
  check_flatten<shape<6, 3, 4, 5>, shape<6, 60>>(6);
  // An input that is already flat (the usual case in a chain of [batch, features]).
  check_flatten<shape<dyn, 60>, shape<dyn, 60>>(GENERATE(1, 5));
  check_flatten<shape<4, 60>, shape<4, 60>>(4);
}

TEST_CASE("nn::flatten: view() is the same memory, and shared buffers are left as they are", "[nn][flatten]") {
  tensor<float, shape<dyn, 3, 4, 5>> x(2);
  solder::test::fill_uniform(x, -1, 1, 3);
  const tensor_ref<float, shape<dyn, 60>> v = solder::nn::flatten<3, 4, 5>::view(x);
  CHECK(v.data() == x.data());
  CHECK(v.batch() == 2);
  CHECK(v(1, 59) == x(1, 2, 3, 4));
  const auto cv = solder::nn::flatten<3, 4, 5>::view(std::as_const(x).ref());
  STATIC_REQUIRE(std::is_same_v<decltype(cv), const tensor_ref<const float, shape<dyn, 60>>>);
  tensor<float, shape<8, 3, 4, 5>> xs;
  STATIC_REQUIRE(std::is_same_v<decltype(solder::nn::flatten<3, 4, 5>::view(xs)), tensor_ref<float, shape<8, 60>>>);

  // forward and backward from a buffer into itself (a chain may pass the same one): unchanged.
  solder::nn::flatten<3, 4, 5> layer;
  const tensor<float, shape<dyn, 3, 4, 5>> before = x;
  layer.forward(std::as_const(x).ref(), v);
  layer.backward(std::as_const(x).ref(), tensor_ref<const float, shape<dyn, 60>>(v), tensor_ref<const float, shape<dyn, 60>>(v),
                 x.ref());
  CHECK(std::memcmp(before.data(), x.data(), x.size() * sizeof(float)) == 0);
}

TEST_CASE("nn::flatten: batch mismatches are errors naming both batches", "[nn][flatten]") {
  solder::nn::flatten<3, 4, 5> layer;
  tensor<float, shape<dyn, 3, 4, 5>> x(3), dx(3), dx2(2);
  tensor<float, shape<dyn, 60>> y(4), y3(3), dy(3);
  CHECK_THROWS_WITH(layer.forward(x, y), Contains("solder::nn::flatten::forward") && Contains("x (3) and y (4) differ"));
  CHECK_THROWS_WITH(layer.backward(x, y3, dy, dx2),
                    Contains("solder::nn::flatten::backward") && Contains("x (3), y (3), dy (3) and dx (2) differ"));
  CHECK_NOTHROW(layer.backward(x, y3, dy, dx));
}
