// tests/dist/bucket.test.cpp: the bodies of a bucket's fixed-order reduction (dist/bucket.hpp)
// run over whole buckets on the host for 1, 2, 3 and 5 ranks: the packed layout (padding,
// status slots, pack then unpack is the identity), the reduced bucket against the weighted sum
// written out in double, the failed rank for every set of failed ranks, and NaN and infinities
// carried to their own element only.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "solder/dist/bucket.hpp"
#include "support/data.hpp"

namespace {

using namespace solder::dist;
using solder::test::bit_differences;
using solder::test::bit_differences_any_nan;
using solder::test::fill_uniform;

/// The ranks' buckets: rank r's is uniform in [-2, 3), seeded by (n, P, r).
std::vector<std::vector<float>> rank_buckets(std::size_t n, std::size_t P) {
  std::vector<std::vector<float>> b(P, std::vector<float>(n));
  for (std::size_t r = 0; r < P; ++r) fill_uniform(b[r], -2, 3, std::uint32_t(1000 * n + 10 * P + r));
  return b;
}

/// Weights that differ per rank, so that a rank taken twice or in another slot shows.
std::vector<double> rank_weights(std::size_t P) {
  std::vector<double> w(P);
  for (std::size_t j = 0; j < P; ++j) w[j] = (1.0 + 0.37 * double(j)) / double(P);
  return w;
}

/// ref[i] = sum over j = 0, 1, ..., P - 1 of w[j] * b[j][i] in double, rounded to float once.
/// The same expression as the body's, so a compiler that contracts one into a fused
/// multiply-add contracts the other: the two agree bit for bit.
std::vector<float> weighted_reference(const std::vector<std::vector<float>>& b, const std::vector<double>& w) {
  const std::size_t n = b.empty() ? 0 : b[0].size();
  std::vector<float> ref(n);
  for (std::size_t i = 0; i < n; ++i) {
    double s = 0.0;
    for (std::size_t j = 0; j < b.size(); ++j) s = std::fma(w[j], double(b[j][i]), s);
    ref[i] = float(s);
  }
  return ref;
}

/// reduce_on_host over copies of `b`: the buckets every rank holds afterwards, and the failed rank.
struct reduction_result {
  std::vector<std::vector<float>> buckets;
  int failed;
};
reduction_result reduce(std::vector<std::vector<float>> b, const std::vector<double>& w, const std::vector<float>& statuses) {
  std::vector<float*> pointers;
  for (auto& v : b) pointers.push_back(v.data());
  const int failed = reduce_on_host(pointers, b[0].size(), w, statuses);
  return {std::move(b), failed};
}

}  // namespace

TEST_CASE("dist bucket: pack lays out P chunks with zero padding and a status slot; unpack undoes it",
          "[dist][bucket]") {
  const std::size_t P = GENERATE(1u, 2u, 3u, 5u);
  const std::size_t n = GENERATE(0u, 1u, 7u, 100u, 1001u);
  CAPTURE(P, n);
  const std::size_t chunk = chunk_floats(n, P), stride = chunk_stride(n, P);
  REQUIRE(chunk * P >= n);
  REQUIRE((chunk == 0 || (chunk - 1) * P < n));  // the shortest chunk that holds the bucket

  std::vector<float> bucket(n);
  fill_uniform(bucket, -1, 1, std::uint32_t(7 + n));
  std::vector<float> packed(packed_floats(n, P), -99.0f);
  const pack_body pack{bucket.data(), packed.data(), n, P, status_failed};
  REQUIRE(pack.elements() == P * stride);
  for (std::size_t i = 0; i < pack.elements(); ++i) pack(i);

  std::size_t misplaced = 0;
  for (std::size_t c = 0; c < P; ++c) {
    misplaced += packed[c * stride + chunk] != status_failed;
    for (std::size_t k = 0; k < chunk; ++k) {
      const std::size_t at = c * chunk + k;
      misplaced += at < n ? bit_differences(&packed[c * stride + k], &bucket[at], 1) : packed[c * stride + k] != 0.0f;
    }
  }
  CHECK(misplaced == 0);

  // The gathered bucket has the packed layout: unpacking the packed bucket gives the bucket back.
  std::vector<float> back(n, -99.0f);
  const unpack_body unpack{packed.data(), back.data(), n, P};
  for (std::size_t i = 0; i < unpack.elements(); ++i) unpack(i);
  CHECK(bit_differences(back.data(), bucket.data(), n) == 0);
}

TEST_CASE("dist bucket: every rank's reduced bucket is the weighted sum in rank order, in double, rounded once",
          "[dist][bucket]") {
  const std::size_t P = GENERATE(1u, 2u, 3u, 5u);
  const std::size_t n = GENERATE(1u, 7u, 100u, 1001u);
  CAPTURE(P, n);
  const auto b = rank_buckets(n, P);
  const auto w = rank_weights(P);
  const auto ref = weighted_reference(b, w);
  const auto out = reduce(b, w, std::vector<float>(P, status_ok));
  CHECK(out.failed == -1);
  for (std::size_t r = 0; r < P; ++r) {
    CAPTURE(r);
    CHECK(bit_differences(out.buckets[r].data(), ref.data(), n) == 0);
  }

  // The averaging weights of data-parallel training (1 / P each), and a second run: the same bits.
  const std::vector<double> mean(P, 1.0 / double(P));
  const auto again = reduce(b, mean, std::vector<float>(P, status_ok));
  const auto twice = reduce(b, mean, std::vector<float>(P, status_ok));
  const auto mean_ref = weighted_reference(b, mean);
  CHECK(bit_differences(again.buckets[P - 1].data(), mean_ref.data(), n) == 0);
  CHECK(bit_differences(again.buckets[0].data(), twice.buckets[0].data(), n) == 0);
}

TEST_CASE("dist bucket: the sum of one owner's chunk, its padding and its status slot", "[dist][bucket]") {
  // P = 3, n = 7: chunks of 3 (the last holds 1 value and 2 of padding), stride 4.
  constexpr std::size_t P = 3, n = 7, stride = chunk_stride(n, P);
  static_assert(chunk_floats(n, P) == 3 && stride == 4 && packed_floats(n, P) == 12);
  // What owner 2 receives: ranks 0, 1, 2's chunk 2 (one value, two zeros of padding, a status).
  const std::vector<float> received{1.5f, 0.0f, 0.0f, status_ok,  //
                                    -2.0f, 0.0f, 0.0f, status_failed,  //
                                    4.0f, 0.0f, 0.0f, status_failed};
  const std::vector<double> w{0.5, 0.25, 2.0};
  std::vector<float> reduced(stride, -99.0f);
  const sum_body sum{received.data(), reduced.data(), w.data(), n, P};
  REQUIRE(sum.elements() == stride);
  for (std::size_t k = 0; k < sum.elements(); ++k) sum(k);
  CHECK(reduced[0] == 0.75f - 0.5f + 8.0f);
  CHECK(reduced[1] == 0.0f);
  CHECK(reduced[2] == 0.0f);
  CHECK(reduced[3] == 2.0f);  // 1 + the lowest failed rank
}

TEST_CASE("dist bucket: the failed rank is the lowest rank whose status said so, on every rank", "[dist][bucket]") {
  const std::size_t P = GENERATE(1u, 2u, 3u, 5u);
  constexpr std::size_t n = 7;
  const auto b = rank_buckets(n, P);
  const auto w = rank_weights(P);
  for (std::uint32_t failed_set = 0; failed_set < (1u << P); ++failed_set) {
    CAPTURE(P, failed_set);
    std::vector<float> statuses(P);
    int lowest = -1;
    for (std::size_t r = P; r-- > 0;) {
      const bool failed = (failed_set >> r) & 1u;
      statuses[r] = failed ? status_failed : status_ok;
      if (failed) lowest = int(r);
    }
    const auto out = reduce(b, w, statuses);
    CHECK(out.failed == lowest);
    // The values are summed whatever the statuses say: every rank holds the same bucket.
    for (std::size_t r = 1; r < P; ++r) CHECK(bit_differences(out.buckets[r].data(), out.buckets[0].data(), n) == 0);
  }
}

TEST_CASE("dist bucket: failed_rank reads every owner's slot; a slot that names no rank reports rank 0",
          "[dist][bucket]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Slots 2 apart, as status slots of a gathered bucket with chunks of 1.
  const std::vector<float> none{9, 0, 9, 0, 9, 0}, third{9, 0, 9, 0, 9, 3}, mixed{9, 3, 9, 2, 9, 3};
  CHECK(failed_rank(none.data() + 1, 2, 3) == -1);
  CHECK(failed_rank(third.data() + 1, 2, 3) == 2);
  CHECK(failed_rank(mixed.data() + 1, 2, 3) == 1);
  const std::vector<float> out_of_range{0, 7, 0}, fraction{0, 1.5f, 0}, not_a_number{0, 0, nan};
  CHECK(failed_rank(out_of_range.data(), 1, 3) == 0);
  CHECK(failed_rank(fraction.data(), 1, 3) == 0);
  CHECK(failed_rank(not_a_number.data(), 1, 3) == 0);
  CHECK(failed_rank(none.data(), 1, 0) == -1);
}

TEST_CASE("dist bucket: NaN and infinities reach their own element of every rank's bucket, and no other",
          "[dist][bucket]") {
  const std::size_t P = GENERATE(1u, 2u, 3u, 5u);
  const std::size_t n = GENERATE(7u, 100u, 1001u);
  CAPTURE(P, n);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  auto b = rank_buckets(n, P);
  const std::size_t at_nan = n / 3, at_inf = n - 1, at_cancel = n / 2;
  b[P - 1][at_nan] = nan;  // the last rank's NaN
  b[0][at_inf] = inf;      // +inf alone stays +inf (every weight is positive)
  b[0][at_cancel] = inf;   // +inf + -inf is NaN where two ranks have them
  if (P > 1) b[1][at_cancel] = -inf;
  const auto w = rank_weights(P);
  const auto ref = weighted_reference(b, w);
  const auto out = reduce(b, w, std::vector<float>(P, status_ok));
  CHECK(out.failed == -1);
  for (std::size_t r = 0; r < P; ++r) {
    CAPTURE(r);
    const auto& got = out.buckets[r];
    CHECK(std::isnan(got[at_nan]));
    CHECK(got[at_inf] == inf);
    if (P > 1)
      CHECK(std::isnan(got[at_cancel]));
    else
      CHECK(got[at_cancel] == inf);
    CHECK(bit_differences_any_nan(got.data(), ref.data(), n) == 0);
  }
}

TEST_CASE("dist bucket: the host's owner sum over runs of a chunk gives the body's bits", "[dist][bucket]") {
  const std::size_t P = GENERATE(1u, 2u, 3u, 5u);
  const std::size_t n = GENERATE(1u, 255u, 256u, 257u, 1001u);  // around the sum's blocks of 256
  CAPTURE(P, n);
  auto b = rank_buckets(n, P);
  b[P - 1][n / 3] = std::numeric_limits<float>::quiet_NaN();
  b[0][n - 1] = std::numeric_limits<float>::infinity();
  const auto w = rank_weights(P);
  std::vector<const float*> parts;
  for (const auto& v : b) parts.push_back(v.data());
  std::vector<float> out(n + 1, -7.0f);
  weighted_sum_run(parts.data(), w.data(), P, n, out.data());
  CHECK(bit_differences_any_nan(out.data(), weighted_reference(b, w).data(), n) == 0);
  CHECK(out[n] == -7.0f);  // nothing past the run is written
}
