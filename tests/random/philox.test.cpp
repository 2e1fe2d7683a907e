// tests/random/philox.test.cpp: Philox4x32-7 and -10 known answers, the bits16 mapping, the SIMD forms against the scalar
// form with either rounds, and statistics.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "solder/eval/cpu/philox.hpp"
#include "solder/expr/random.hpp"
#include "solder/random/philox.hpp"

namespace {

using solder::random::philox_ctr;
using solder::random::philox_key;

constexpr uint64_t u64_max = std::numeric_limits<uint64_t>::max();

bool same_block(const philox_ctr& a, const philox_ctr& b) {
  return a.v[0] == b.v[0] && a.v[1] == b.v[1] && a.v[2] == b.v[2] && a.v[3] == b.v[3];
}

// The published known answers (Random123 kat_vectors, philox4x32 10 rounds), also checked
// against an independent Python implementation with plain integers.
struct kat {
  philox_ctr ctr;
  philox_key key;
  philox_ctr expected;
};
constexpr kat kats[] = {
    {{{0, 0, 0, 0}}, {{0, 0}}, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
    {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}}, {{0xffffffff, 0xffffffff}}, {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
    {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}}, {{0xa4093822, 0x299f31d0}}, {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
};
// The same inputs' published answers for 7 rounds (Random123 kat_vectors, philox4x32 7).
constexpr kat kats7[] = {
    {{{0, 0, 0, 0}}, {{0, 0}}, {{0x5f6fb709, 0x0d893f64, 0x4f121f81, 0x4f730a48}}},
    {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}}, {{0xffffffff, 0xffffffff}}, {{0x5207ddc2, 0x45165e59, 0x4d8ee751, 0x8c52f662}}},
    {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}}, {{0xa4093822, 0x299f31d0}}, {{0x4dfccaba, 0x190a87f0, 0xc47362ba, 0xb6b5242a}}},
};

// bits16 values of 10-round streams from the independent Python implementation of the element
// -> bits mapping (group i >> 7, lane i & 15, word ((i >> 4) & 7) >> 1, half (i >> 4) & 1).
struct bits16_case {
  uint64_t seed, offset, i;
  uint32_t expected;
};
constexpr bits16_case bits16_cases[] = {
    {0x0ull, 0x0ull, 0x0ull, 59605u},  // low half of word 0 of the all-zero known answer
    {0x0ull, 0x0ull, 0x1ull, 52388u},
    {0x0ull, 0x0ull, 0xfull, 30325u},
    {0x0ull, 0x0ull, 0x10ull, 26151u},  // high half of word 0 of the all-zero known answer
    {0x0ull, 0x0ull, 0x11ull, 63716u},
    {0x0ull, 0x0ull, 0x7full, 792u},
    {0x0ull, 0x0ull, 0x80ull, 45077u},
    {0x0ull, 0x0ull, 0x81ull, 28387u},
    {0x2aull, 0x7ull, 0x53ull, 34631u},
    {0x2aull, 0x7ull, 0x7full, 30861u},
    {0x1ull, 0x2ull, 0x3ull, 48978u},
    {0x123456789abcdef0ull, 0xfedcba9876543210ull, 0xfffffffffffffffbull, 45894u},
    {0x2aull, 0x7ull, 0x1000003e8ull, 39489u},
    {0xffffffffffffffffull, 0xffffffffffffffffull, 0xffffffffffffffffull, 27098u},
    {0x5ull, 0x100000000ull, 0x800000004dull, 64310u},
    {0xdeadbeefull, 0x3ull, 0xf4243ull, 11939u},
};

// Runs philox_bits16<A> over [i0, i0 + n) into a buffer at an odd address with guard words
// after it, and returns the first k where it differs from the scalar bits16 (n if none).
template <class A>
std::size_t first_mismatch(uint64_t seed, uint64_t offset, uint64_t i0, std::size_t n,
                           uint32_t rounds = solder::random::philox_default_rounds) {
  constexpr uint16_t guard = 0xA5A5;
  constexpr std::size_t guards = 64;
  std::vector<uint16_t> buf(1 + n + guards, guard);
  uint16_t* out = buf.data() + 1;
  solder::eval::cpu::philox_bits16<A>(seed, offset, i0, n, out, rounds);
  for (std::size_t k = 0; k < n; ++k)
    if (out[k] != solder::random::bits16(seed, offset, i0 + k, rounds)) return k;
  for (std::size_t k = 0; k <= guards; ++k)
    if (buf[(k == 0 ? 0 : n + k)] != guard) return n + 1;  // wrote outside [out, out + n)
  return n;
}

template <class A>
void check_simd_equals_scalar() {
  const uint64_t seeds[] = {0, 1, 0xDEADBEEFCAFEBABEull, u64_max};
  const uint64_t offsets[] = {0, 3, (uint64_t(1) << 32) + 5, u64_max};
  const uint64_t starts[] = {0,
                             1,
                             5,
                             127,
                             128,
                             1000,
                             (uint64_t(1) << 32) - 300,  // crosses 2^32: the counter's high word must carry
                             (uint64_t(1) << 32) - 1,
                             (uint64_t(1) << 32) + 77,
                             (uint64_t(1) << 32) - 128,  // whole groups (the inline path) across 2^32
                             (uint64_t(1) << 57) + 3,
                             u64_max - 1000 - 64,
                             u64_max - 999,   // with n = 1000 the last element is 2^64 - 1
                             u64_max - 1023};  // whole groups ending at 2^64 - 1 with n = 1024
  // 256, 768 and 1024: whole steps of groups from a group start, drawn inline.
  const std::size_t sizes[] = {0, 1, 15, 16, 17, 127, 128, 129, 256, 768, 1000, 1024};
  for (uint32_t rounds : {7u, 10u})
    for (uint64_t seed : seeds)
      for (uint64_t offset : offsets)
        for (uint64_t i0 : starts)
          for (std::size_t n : sizes) {
            if (n != 0 && n - 1 > u64_max - i0) continue;  // past 2^64: rejected (tested below)
            CAPTURE(rounds, seed, offset, i0, n);
            REQUIRE(first_mismatch<A>(seed, offset, i0, n, rounds) == n);
          }
  // The last element of the counter range, alone.
  REQUIRE(first_mismatch<A>(7, 9, u64_max, 1) == 1);
  REQUIRE(first_mismatch<A>(7, 9, u64_max, 1, 10) == 1);
}

template <class A>
void check_load_and_mask() {
  using bits_t = xsimd::batch<uint32_t, A>;
  using floats = xsimd::batch<float, A>;
  constexpr std::size_t lanes = floats::size;
  STATIC_REQUIRE(bits_t::size == lanes);
  const uint16_t pattern[] = {0, 1, 6553, 6554, 6555, 32767, 32768, 32769, 65534, 65535, 0x8000, 0x7FFF, 12345, 54321, 2, 65533};
  std::vector<uint16_t> src(lanes + 1);
  for (std::size_t l = 0; l < lanes + 1; ++l) src[l] = pattern[(l * 7 + 3) % 16];
  for (std::size_t shift = 0; shift < 2; ++shift) {  // an aligned and an odd address
    const uint16_t* p = src.data() + shift;
    const bits_t bits = solder::eval::cpu::load_bits16<A>(p);
    alignas(64) uint32_t got[lanes];
    bits.store_aligned(got);
    for (std::size_t l = 0; l < lanes; ++l) REQUIRE(got[l] == uint32_t(p[l]));  // zero-extended, never sign-extended
    for (uint32_t t : {0u, 1u, 6554u, 32768u, 65535u, 65536u}) {
      alignas(64) float kept[lanes];
      alignas(64) float kept16[lanes];
      xsimd::select(solder::eval::cpu::keep_mask<A>(bits, t), floats(1.0f), floats(0.0f)).store_aligned(kept);
      // keep_mask16 compares the stored 16-bit draws directly (AVX-512 BW); same lanes.
      xsimd::select(solder::eval::cpu::keep_mask16<A>(p, t), floats(1.0f), floats(0.0f)).store_aligned(kept16);
      for (std::size_t l = 0; l < lanes; ++l) {
        CAPTURE(t, l, got[l]);
        REQUIRE(kept[l] == (got[l] >= t ? 1.0f : 0.0f));
        REQUIRE(kept16[l] == kept[l]);
      }
    }
  }
  // Any uint32 bits, the sign bit included: the compare is unsigned.
  alignas(64) uint32_t wide[lanes];
  const uint32_t wide_pattern[] = {0x80000000u, 0xFFFFFFFFu, 0x7FFFFFFFu, 0u, 65536u, 65535u, 0x80000001u, 1u};
  for (std::size_t l = 0; l < lanes; ++l) wide[l] = wide_pattern[l % 8];
  for (uint32_t t : {0u, 65536u, 0x7FFFFFFFu, 0x80000000u, 0xFFFFFFFFu}) {
    alignas(64) float kept[lanes];
    xsimd::select(solder::eval::cpu::keep_mask<A>(bits_t::load_aligned(wide), t), floats(1.0f), floats(0.0f)).store_aligned(kept);
    for (std::size_t l = 0; l < lanes; ++l) {
      CAPTURE(t, wide[l]);
      REQUIRE(kept[l] == (wide[l] >= t ? 1.0f : 0.0f));
    }
  }
}

}  // namespace

TEST_CASE("philox4x32 with 7 and 10 rounds matches the Random123 known-answer vectors", "[philox]") {
  const auto check = [](const auto& answers, std::uint32_t rounds, auto generator) {
    for (const kat& k : answers) {
      const philox_ctr got = generator(k.ctr, k.key);
      CAPTURE(rounds, got.v[0], got.v[1], got.v[2], got.v[3]);
      REQUIRE(same_block(got, k.expected));
      REQUIRE(same_block(solder::random::philox4x32_rounds(k.ctr, k.key, rounds), k.expected));
    }
  };
  check(kats, 10, solder::random::philox4x32_10);
  check(kats7, 7, solder::random::philox4x32_7);
  // The scalar generator is constexpr: the known answers hold at compile time too.
  STATIC_REQUIRE(solder::random::philox4x32_10(kats[2].ctr, kats[2].key).v[0] == kats[2].expected.v[0]);
  STATIC_REQUIRE(solder::random::philox4x32_10(kats[1].ctr, kats[1].key).v[3] == kats[1].expected.v[3]);
  STATIC_REQUIRE(solder::random::philox4x32_7(kats7[2].ctr, kats7[2].key).v[1] == kats7[2].expected.v[1]);
  // Seven rounds are the default of every stream that does not ask for ten.
  STATIC_REQUIRE(solder::random::philox_default_rounds == 7);
  STATIC_REQUIRE(solder::philox_state{}.rounds == 7);
}

TEST_CASE("bits16 follows the element -> block, word and half mapping", "[philox]") {
  for (const bits16_case& c : bits16_cases) {
    CAPTURE(c.seed, c.offset, c.i);
    REQUIRE(solder::random::bits16(c.seed, c.offset, c.i, 10) == c.expected);
  }
  // Element 16 k + l of group g is half k & 1 of word k >> 1 of block 16 g + l, with the
  // stream's rounds (7 by default).
  const uint64_t seed = 0x0123456789ABCDEFull, offset = 0xFEDCBA9876543210ull;
  for (uint32_t rounds : {7u, 10u}) {
    for (uint64_t g : {uint64_t(0), uint64_t(1), uint64_t(1) << 28, (uint64_t(1) << 57) - 1}) {
      for (uint64_t l = 0; l < 16; ++l) {
        const uint64_t block = 16 * g + l;
        const philox_ctr ctr{{uint32_t(block), uint32_t(block >> 32), uint32_t(offset), uint32_t(offset >> 32)}};
        const philox_key key{{uint32_t(seed), uint32_t(seed >> 32)}};
        const philox_ctr w = rounds == 7 ? solder::random::philox4x32_7(ctr, key) : solder::random::philox4x32_10(ctr, key);
        for (uint64_t k = 0; k < 8; ++k) {
          CAPTURE(rounds, g, l, k);
          const uint32_t expected = (w.v[k >> 1] >> (16 * (k & 1))) & 0xFFFFu;
          REQUIRE(solder::random::bits16(seed, offset, 128 * g + 16 * k + l, rounds) == expected);
          if (rounds == 7) REQUIRE(solder::random::bits16(seed, offset, 128 * g + 16 * k + l) == expected);
        }
      }
    }
  }
  // The two rounds give different streams.
  int same = 0;
  for (uint64_t i = 0; i < 256; ++i) same += solder::random::bits16(seed, offset, i, 7) == solder::random::bits16(seed, offset, i, 10);
  REQUIRE(same < 8);
}

TEST_CASE("threshold16 rounds p * 65536 and clamps it to [0, 65536]", "[philox]") {
  using solder::random::threshold16;
  CHECK(threshold16(0.0f) == 0u);
  CHECK(threshold16(-0.5f) == 0u);
  CHECK(threshold16(std::numeric_limits<float>::quiet_NaN()) == 0u);
  CHECK(threshold16(1.0f) == 65536u);
  CHECK(threshold16(2.0f) == 65536u);
  CHECK(threshold16(std::numeric_limits<float>::infinity()) == 65536u);
  CHECK(threshold16(0.5f) == 32768u);
  CHECK(threshold16(0.1f) == 6554u);  // 6553.6 rounds up
  CHECK(threshold16(0.25f) == 16384u);
  const float half_step = std::ldexp(1.0f, -17);  // p * 65536 = 0.5 exactly: halves round up
  CHECK(threshold16(half_step) == 1u);
  CHECK(threshold16(std::nextafter(half_step, 0.0f)) == 0u);  // just below one half
  CHECK(threshold16(3 * half_step) == 2u);
  CHECK(threshold16(std::nextafter(1.0f, 0.0f)) == 65536u);  // 65535.996 rounds to 65536
  STATIC_REQUIRE(threshold16(0.5f) == 32768u);
}

TEST_CASE("philox_bits16 equals the scalar bits16 on every core", "[philox]") {
  SECTION("solder::eval::cpu::arch") { check_simd_equals_scalar<solder::eval::cpu::arch>(); }
#if XSIMD_WITH_AVX512BW
  SECTION("avx512bw") { check_simd_equals_scalar<xsimd::avx512bw>(); }
#endif
#if XSIMD_WITH_AVX512F
  SECTION("avx512f (no word permute)") { check_simd_equals_scalar<xsimd::avx512f>(); }
#endif
#if XSIMD_WITH_AVX2
  SECTION("avx2") { check_simd_equals_scalar<xsimd::avx2>(); }
#endif
#if XSIMD_WITH_SSE4_2
  SECTION("sse4_2 (portable core)") { check_simd_equals_scalar<xsimd::sse4_2>(); }
#endif
}

TEST_CASE("philox_bits16 rejects a range past 2^64", "[philox]") {
  uint16_t out[2] = {};
  REQUIRE_THROWS_AS(solder::eval::cpu::philox_bits16(1, 2, u64_max, 2, out), solder::error);
  REQUIRE_THROWS_AS(solder::eval::cpu::philox_bits16(1, 2, u64_max - 10, 12, out), solder::error);
  REQUIRE_NOTHROW(solder::eval::cpu::philox_bits16(1, 2, u64_max - 1, 2, out));
  std::vector<uint16_t> whole(512);  // whole groups from a group start, past 2^64
  REQUIRE_THROWS_AS(solder::eval::cpu::philox_bits16(1, 2, u64_max - 255, 512, whole.data()), solder::error);
}

TEST_CASE("load_bits16 zero-extends and keep_mask selects bits >= threshold", "[philox]") {
#if XSIMD_WITH_AVX512BW
  SECTION("avx512bw") { check_load_and_mask<xsimd::avx512bw>(); }
#endif
  SECTION("solder::eval::cpu::arch") { check_load_and_mask<solder::eval::cpu::arch>(); }
#if XSIMD_WITH_AVX512F
  SECTION("avx512f") { check_load_and_mask<xsimd::avx512f>(); }
#endif
#if XSIMD_WITH_AVX2
  SECTION("avx2") { check_load_and_mask<xsimd::avx2>(); }
#endif
#if XSIMD_WITH_SSE4_2
  SECTION("sse4_2 (portable)") { check_load_and_mask<xsimd::sse4_2>(); }
#endif
}

TEST_CASE("bits16 streams are uniform and independent", "[philox]") {
  // Uniform 16-bit values: mean 32767.5, variance (65536^2 - 1) / 12. Every bound below is
  // 5 standard deviations of the statistic for a truly uniform source, so a correct generator
  // fails one of these checks with probability about 1e-6 per check.
  constexpr std::size_t n = std::size_t(1) << 20;
  constexpr double sigmas = 5.0;
  const double value_sd = std::sqrt((65536.0 * 65536.0 - 1.0) / 12.0);
  const uint64_t seed = 0x5EED5EED5EEDull, offset = 17;
  std::vector<uint16_t> bits(n);
  solder::eval::cpu::philox_bits16(seed, offset, 12345, n, bits.data());

  SECTION("mean, per element class and per bit") {
    double sum = 0;
    double class_sum[8] = {};
    uint64_t ones[16] = {};
    for (std::size_t k = 0; k < n; ++k) {
      sum += bits[k];
      class_sum[((12345 + k) >> 4) & 7] += bits[k];  // the 8 (word, half) positions of a block
      for (int b = 0; b < 16; ++b) ones[b] += (bits[k] >> b) & 1u;
    }
    CHECK(std::abs(sum / n - 32767.5) < sigmas * value_sd / std::sqrt(double(n)));
    for (int c = 0; c < 8; ++c) {
      CAPTURE(c);
      CHECK(std::abs(class_sum[c] / (n / 8) - 32767.5) < sigmas * value_sd / std::sqrt(double(n / 8)));
    }
    for (int b = 0; b < 16; ++b) {
      CAPTURE(b);
      CHECK(std::abs(double(ones[b]) / n - 0.5) < sigmas * 0.5 / std::sqrt(double(n)));
    }
  }

  SECTION("keep fraction for p = 0.1 and p = 0.5") {
    for (float p : {0.1f, 0.5f}) {
      const uint32_t t = solder::random::threshold16(p);
      std::size_t kept = 0;
      for (uint16_t b : bits) kept += b >= t;
      const double q = 1.0 - double(p);
      CAPTURE(p, t, kept);
      CHECK(std::abs(double(kept) / n - q) < sigmas * std::sqrt(q * (1 - q) / n));
    }
  }

  SECTION("different offsets, seeds and ranges give different streams") {
    std::vector<uint16_t> other(n);
    // Two independent uniform 16-bit streams agree at about n / 65536 = 16 places.
    const auto agreements = [&](const std::vector<uint16_t>& a) {
      std::size_t same = 0;
      for (std::size_t k = 0; k < n; ++k) same += a[k] == bits[k];
      return same;
    };
    const double expected = double(n) / 65536.0;
    const double bound = expected + sigmas * std::sqrt(expected);
    solder::eval::cpu::philox_bits16(seed, offset + 1, 12345, n, other.data());
    CHECK(double(agreements(other)) < bound);
    solder::eval::cpu::philox_bits16(seed + 1, offset, 12345, n, other.data());
    CHECK(double(agreements(other)) < bound);
    solder::eval::cpu::philox_bits16(seed, offset + (uint64_t(1) << 32), 12345, n, other.data());  // the offset's high word counts
    CHECK(double(agreements(other)) < bound);
    solder::eval::cpu::philox_bits16(seed, offset, 12345 + (uint64_t(1) << 32), n, other.data());  // the counter's high word counts
    CHECK(double(agreements(other)) < bound);
  }
}
