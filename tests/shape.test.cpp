// tests/shape.test.cpp: shape<...>: extents, rank, size, strides, the dynamic leading extent,
// the broadcasting rule (broadcastable, broadcast_t, broadcasts_to) and to_string.
#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>

#include <catch2/catch.hpp>

#include "solder/shape.hpp"

namespace {

using solder::dyn;
using solder::shape;

template <std::size_t... Ns>
constexpr std::array<std::size_t, sizeof...(Ns)> arr{Ns...};

}  // namespace

TEST_CASE("shape: extents, rank, size and last of static shapes", "[shape]") {
  using M = shape<256, 4096>;
  STATIC_REQUIRE(M::rank == 2);
  STATIC_REQUIRE(M::extents == arr<256, 4096>);
  STATIC_REQUIRE(M::extent(0) == 256);
  STATIC_REQUIRE(M::extent(1) == 4096);
  STATIC_REQUIRE(M::size == 256 * 4096);
  STATIC_REQUIRE(M::inner_size == 4096);
  STATIC_REQUIRE(M::last == 4096);
  STATIC_REQUIRE_FALSE(M::dynamic);

  using T3 = shape<2, 3, 5>;
  STATIC_REQUIRE(T3::rank == 3);
  STATIC_REQUIRE(T3::size == 30);
  STATIC_REQUIRE(T3::inner_size == 15);
  STATIC_REQUIRE(T3::last == 5);

  using V = shape<37>;
  STATIC_REQUIRE(V::rank == 1);
  STATIC_REQUIRE(V::size == 37);
  STATIC_REQUIRE(V::inner_size == 1);  // the product of no extents
  STATIC_REQUIRE(V::last == 37);

  using Scalar = shape<>;
  STATIC_REQUIRE(Scalar::rank == 0);
  STATIC_REQUIRE(Scalar::size == 1);
  STATIC_REQUIRE(Scalar::last == 1);
  STATIC_REQUIRE_FALSE(Scalar::dynamic);

  // A static shape ignores the batch argument of elements().
  STATIC_REQUIRE(M::elements(7) == M::size);
  STATIC_REQUIRE(shape<1, 1>::size == 1);
}

TEST_CASE("shape: row-major strides", "[shape]") {
  STATIC_REQUIRE(shape<2, 3, 5>::strides == arr<15, 5, 1>);
  STATIC_REQUIRE(shape<3, 37>::strides == arr<37, 1>);
  STATIC_REQUIRE(shape<37>::strides == arr<1>);
  STATIC_REQUIRE(shape<1, 1, 1>::strides == arr<1, 1, 1>);
  STATIC_REQUIRE(shape<4, 1, 8>::strides == arr<8, 8, 1>);
  // The leading extent never enters a stride, so a dynamic batch does not either.
  STATIC_REQUIRE(shape<dyn, 4, 8>::strides == arr<32, 8, 1>);
  STATIC_REQUIRE(shape<dyn>::strides == arr<1>);
}

TEST_CASE("shape: a dynamic leading extent", "[shape]") {
  using D = shape<dyn, 64>;
  STATIC_REQUIRE(D::dynamic);
  STATIC_REQUIRE(D::rank == 2);
  STATIC_REQUIRE(D::inner_size == 64);
  STATIC_REQUIRE(D::size == 64);  // the elements of one batch entry
  STATIC_REQUIRE(D::last == 64);
  STATIC_REQUIRE(D::elements(1) == 64);
  STATIC_REQUIRE(D::elements(10) == 640);

  using D3 = shape<dyn, 3, 5>;
  STATIC_REQUIRE(D3::dynamic);
  STATIC_REQUIRE(D3::size == 15);
  STATIC_REQUIRE(D3::elements(4) == 60);

  using D1 = shape<dyn>;
  STATIC_REQUIRE(D1::dynamic);
  STATIC_REQUIRE(D1::size == 1);
  STATIC_REQUIRE(D1::elements(5) == 5);
}

TEST_CASE("shape: the Shape concept accepts well-formed shapes only", "[shape]") {
  STATIC_REQUIRE(solder::Shape<shape<256, 4096>>);
  STATIC_REQUIRE(solder::Shape<shape<>>);
  STATIC_REQUIRE(solder::Shape<shape<dyn>>);
  STATIC_REQUIRE(solder::Shape<shape<dyn, 3, 5>>);
  STATIC_REQUIRE_FALSE(solder::Shape<shape<0>>);
  STATIC_REQUIRE_FALSE(solder::Shape<shape<4, 0>>);
  STATIC_REQUIRE_FALSE(solder::Shape<shape<4, dyn>>);  // dyn only in front
  STATIC_REQUIRE_FALSE(solder::Shape<int>);
}

TEST_CASE("shape: broadcasting follows NumPy's rules", "[shape]") {
  using solder::broadcast_t;
  using solder::broadcastable;

  // A bias [N] over a batch [B, N], either operand first.
  STATIC_REQUIRE(std::is_same_v<broadcast_t<shape<256, 4096>, shape<4096>>, shape<256, 4096>>);
  STATIC_REQUIRE(std::is_same_v<broadcast_t<shape<4096>, shape<256, 4096>>, shape<256, 4096>>);
  // A column [B, 1] against a row [1, N] gives their outer shape.
  STATIC_REQUIRE(std::is_same_v<broadcast_t<shape<3, 1>, shape<1, 5>>, shape<3, 5>>);
  // A per-channel [C, 1, 1] over [C, H, W].
  STATIC_REQUIRE(std::is_same_v<broadcast_t<shape<8, 4, 4>, shape<8, 1, 1>>, shape<8, 4, 4>>);
  STATIC_REQUIRE(std::is_same_v<broadcast_t<shape<4, 4>, shape<8, 1, 1>>, shape<8, 4, 4>>);
  // A scalar [] broadcasts to anything, and [] with [] stays [].
  STATIC_REQUIRE(std::is_same_v<broadcast_t<shape<>, shape<2, 3>>, shape<2, 3>>);
  STATIC_REQUIRE(std::is_same_v<broadcast_t<shape<>, shape<>>, shape<>>);
  STATIC_REQUIRE(std::is_same_v<broadcast_t<shape<1, 1>, shape<1, 1>>, shape<1, 1>>);
  // The dynamic batch survives broadcasting with static extents.
  STATIC_REQUIRE(std::is_same_v<broadcast_t<shape<dyn, 64>, shape<64>>, shape<dyn, 64>>);
  STATIC_REQUIRE(std::is_same_v<broadcast_t<shape<64>, shape<dyn, 64>>, shape<dyn, 64>>);
  STATIC_REQUIRE(std::is_same_v<broadcast_t<shape<1, 64>, shape<dyn, 64>>, shape<dyn, 64>>);
  STATIC_REQUIRE(std::is_same_v<broadcast_t<shape<dyn, 64>, shape<dyn, 64>>, shape<dyn, 64>>);

  STATIC_REQUIRE_FALSE(broadcastable<shape<3>, shape<4>>);
  STATIC_REQUIRE_FALSE(broadcastable<shape<2, 3>, shape<3, 3>>);
  STATIC_REQUIRE_FALSE(broadcastable<shape<256, 4096>, shape<1024>>);
  STATIC_REQUIRE_FALSE(broadcastable<shape<dyn, 64>, shape<3, 64>>);  // a runtime batch is not 3
  // After a mismatch broadcast_t is the first operand, so one error does not cascade.
  STATIC_REQUIRE(std::is_same_v<broadcast_t<shape<3>, shape<4>>, shape<3>>);
}

TEST_CASE("shape: broadcasting never moves the dynamic extent out of the front", "[shape]") {
  // [?, 4] with [2, 1, 4] would put the runtime batch in the middle: [2, ?, 4] is not a Shape
  // (no tensor can have it, and its size() multiplies dyn in), so the pair must be rejected.
  // Checked at run time so that a failure reports instead of breaking the build.
  using A = shape<dyn, 4>;
  using B = shape<2, 1, 4>;
  constexpr bool accepted = solder::broadcastable<A, B>;
  constexpr bool well_formed = solder::Shape<solder::broadcast_t<A, B>>;
  INFO("broadcastable<[?, 4], [2, 1, 4]> = " << accepted << ", Shape<broadcast_t<...>> = " << well_formed);
  CHECK((!accepted || well_formed));
}

TEST_CASE("shape: broadcasts_to says whether one shape broadcasts into exactly another", "[shape]") {
  using solder::broadcasts_to;
  STATIC_REQUIRE(broadcasts_to<shape<4096>, shape<256, 4096>>);
  STATIC_REQUIRE(broadcasts_to<shape<8, 1, 1>, shape<8, 4, 4>>);
  STATIC_REQUIRE(broadcasts_to<shape<3, 1>, shape<3, 5>>);
  STATIC_REQUIRE(broadcasts_to<shape<>, shape<3, 5>>);
  STATIC_REQUIRE(broadcasts_to<shape<3, 5>, shape<3, 5>>);
  STATIC_REQUIRE(broadcasts_to<shape<64>, shape<dyn, 64>>);
  STATIC_REQUIRE(broadcasts_to<shape<1, 64>, shape<dyn, 64>>);
  STATIC_REQUIRE_FALSE(broadcasts_to<shape<256, 4096>, shape<4096>>);  // would need a reduction
  STATIC_REQUIRE_FALSE(broadcasts_to<shape<1, 3>, shape<2, 1>>);       // broadcasts, but to [2, 3]
  STATIC_REQUIRE_FALSE(broadcasts_to<shape<dyn, 64>, shape<3, 64>>);
}

TEST_CASE("shape: to_string", "[shape]") {
  CHECK(solder::to_string<shape<256, 4096>>() == "[256, 4096]");
  CHECK(solder::to_string<shape<2, 3, 5>>() == "[2, 3, 5]");
  CHECK(solder::to_string<shape<37>>() == "[37]");
  CHECK(solder::to_string<shape<>>() == "[]");
  CHECK(solder::to_string<shape<dyn, 64>>() == "[?, 64]");
  CHECK(solder::to_string<shape<dyn, 64>>(32) == "[32, 64]");  // the batch filled in
  CHECK(solder::to_string<shape<3, 5>>(7) == "[3, 5]");        // static shapes ignore it
}

TEST_CASE("shape: the compile-time broadcast message names both shapes", "[shape]") {
  // The text a mismatch instantiates diagnostic<...> with (see diagnostic.hpp).
  constexpr auto& m = solder::detail::broadcast_rule<shape<256, 4096>, shape<1024>>::message;
  CHECK(std::string_view(m.text, m.length) == "solder: cannot broadcast [256, 4096] with [1024]");
  constexpr auto& d = solder::detail::broadcast_rule<shape<dyn, 64>, shape<3, 64>>::message;
  CHECK(std::string_view(d.text, d.length) == "solder: cannot broadcast [?, 64] with [3, 64]");
}
