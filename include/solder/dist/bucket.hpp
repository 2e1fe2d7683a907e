// dist/bucket.hpp: the per-element bodies of a bucket's fixed-order reduction (pack a bucket into
// chunks, sum the chunks a rank owns, unpack the gathered sums) and the failed rank they report;
// one definition for the host and the device, and the whole reduction run here for P ranks.
//
// A step of the reduction of a bucket of n floats over P ranks (dist/reduction.hpp's layout):
//   pack     packed   (P * stride)  chunk c = bucket[c * chunk, (c + 1) * chunk), zero past n, status
//   exchange received (P * stride)  chunk j = rank j's packed chunk r       (r: this rank)
//   sum      gathered[r * stride, (r + 1) * stride) = the weighted sum of received, reduced_status
//   gather   gathered (P * stride)  chunk c = owner c's sum
//   unpack   bucket[i] = gathered's value i; failed_rank(gathered) = the lowest failed rank or -1
// where chunk = chunk_floats(n, P) and stride = chunk_stride(n, P) = chunk + 1.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "solder/config.hpp"
#include "solder/dist/reduction.hpp"

namespace solder::dist {

/// Floats in a packed (or received, or gathered) bucket: P chunks of chunk_stride(n, P).
SOLDER_HD constexpr std::size_t packed_floats(std::size_t n, std::size_t P) { return P * chunk_stride(n, P); }

/// packed[c * stride + k] = bucket[c * chunk + k] (0 where that is past n) for k < chunk, and
/// packed[c * stride + chunk] = status; one element per packed float.
struct pack_body {
  const float* bucket;  // n
  float* packed;        // packed_floats(n, ranks)
  std::size_t n, ranks;
  float status;  // status_ok or status_failed

  SOLDER_HD std::size_t elements() const { return packed_floats(n, ranks); }
  SOLDER_HD void operator()(std::size_t i) const {
    const std::size_t stride = chunk_stride(n, ranks), chunk = stride - 1, c = i / stride, k = i % stride;
    if (k == chunk) {
      packed[i] = status;
    } else {
      const std::size_t at = c * chunk + k;
      packed[i] = at < n ? bucket[at] : 0.0f;
    }
  }
};

/// reduced[k] = weighted_sum_at(received, stride, weights, ranks, k) for k < chunk (rank order,
/// double, one rounding), reduced[chunk] = reduced_status(...); received holds the ranks' copies
/// of one chunk, rank j's at j * stride. One element per float of the reduced chunk.
struct sum_body {
  const float* received;   // packed_floats(n, ranks)
  float* reduced;          // chunk_stride(n, ranks)
  const double* weights;   // ranks
  std::size_t n, ranks;

  SOLDER_HD std::size_t elements() const { return chunk_stride(n, ranks); }
  SOLDER_HD void operator()(std::size_t k) const {
    const std::size_t stride = chunk_stride(n, ranks), chunk = stride - 1;
    reduced[k] = k == chunk ? reduced_status(received, stride, ranks, chunk)
                            : weighted_sum_at(received, stride, weights, ranks, k);
  }
};

/// bucket[i] = gathered[(i / chunk) * stride + i % chunk]: the owners' sums back in bucket order;
/// one element per bucket float.
struct unpack_body {
  const float* gathered;  // packed_floats(n, ranks)
  float* bucket;          // n
  std::size_t n, ranks;

  SOLDER_HD std::size_t elements() const { return n; }
  SOLDER_HD void operator()(std::size_t i) const {
    const std::size_t chunk = chunk_floats(n, ranks), stride = chunk + 1;
    bucket[i] = gathered[(i / chunk) * stride + i % chunk];
  }
};

/// The rank a gathered bucket reports as failed: the lowest (status - 1) over the owners' status
/// slots status[c * stride], c < ranks, or -1 when all are 0. Every owner sums the same statuses,
/// so they agree; a slot that is not a rank's number (only a corrupted transfer makes one)
/// reports rank 0, so a damaged bucket never passes as a good one.
SOLDER_HD inline int failed_rank(const float* status, std::size_t stride, std::size_t ranks) {
  int lowest = -1;
  for (std::size_t c = 0; c < ranks; ++c) {
    const float s = status[c * stride];
    if (s == status_ok) continue;
    const int r = s >= 1.0f && s <= float(ranks) && s == float(int(s)) ? int(s) - 1 : 0;
    if (lowest < 0 || r < lowest) lowest = r;
  }
  return lowest;
}

/// The whole reduction of one bucket run here for `buckets.size()` ranks, each step as the ranks
/// run it: buckets[r] (n floats) is rank r's bucket before and every rank's reduced bucket after;
/// statuses[r] is rank r's status, weights[j] rank j's weight. Returns failed_rank's answer.
/// The reference the device and the message-passing runs are compared with bit for bit.
inline int reduce_on_host(std::span<float* const> buckets, std::size_t n, std::span<const double> weights,
                          std::span<const float> statuses) {
  const std::size_t P = buckets.size();
  SOLDER_ASSERT(P > 0, "solder::dist::reduce_on_host: no ranks; pass one bucket per rank");
  SOLDER_ASSERT(weights.size() == P && statuses.size() == P,
                "solder::dist::reduce_on_host: one weight and one status per rank are needed");
  const std::size_t stride = chunk_stride(n, P), all = packed_floats(n, P);
  std::vector<float> packed(P * all), received(P * all), gathered(all);
  for (std::size_t r = 0; r < P; ++r) {
    const pack_body pack{buckets[r], packed.data() + r * all, n, P, statuses[r]};
    for (std::size_t i = 0; i < pack.elements(); ++i) pack(i);
  }
  for (std::size_t r = 0; r < P; ++r)  // rank r receives chunk r of every rank j
    for (std::size_t j = 0; j < P; ++j)
      for (std::size_t k = 0; k < stride; ++k) received[r * all + j * stride + k] = packed[j * all + r * stride + k];
  for (std::size_t r = 0; r < P; ++r) {  // owner r's sum lands in its slot of the gathered bucket
    const sum_body sum{received.data() + r * all, gathered.data() + r * stride, weights.data(), n, P};
    for (std::size_t k = 0; k < sum.elements(); ++k) sum(k);
  }
  for (std::size_t r = 0; r < P; ++r) {
    const unpack_body unpack{gathered.data(), buckets[r], n, P};
    for (std::size_t i = 0; i < unpack.elements(); ++i) unpack(i);
  }
  return failed_rank(gathered.data() + (stride - 1), stride, P);
}

}  // namespace solder::dist
