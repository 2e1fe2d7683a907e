// dist/reduction.hpp: the fixed-order weighted sum that data-parallel training reduces
// gradients with, and the layout of a reduced bucket; the same body on the host and the device.
//
// A bucket of n floats is cut into P chunks of chunk_floats(n, P) values plus one status slot
// each. Rank r owns chunk r: it receives chunk r of every rank, sums them in rank order
// (weighted_sum_at), then every rank gathers the owners' sums. Nothing depends on which rank's
// data arrives first, so for a fixed world size a step gives the same bits every run.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "solder/config.hpp"
#include "solder/simd.hpp"

namespace solder::dist {

/// Values per chunk when n values are cut into P chunks (the last one padded).
SOLDER_HD constexpr std::size_t chunk_floats(std::size_t n, std::size_t P) { return P == 0 ? 0 : (n + P - 1) / P; }
/// A chunk as sent: its values, then one status slot.
SOLDER_HD constexpr std::size_t chunk_stride(std::size_t n, std::size_t P) { return chunk_floats(n, P) + 1; }

/// The status a rank sends with each chunk: 0 when its step went well, 1 when it failed (its
/// values are then meaningless and every rank stops with an error).
inline constexpr float status_ok = 0.0f, status_failed = 1.0f;

/// out = sum over ranks j = 0, 1, ..., P - 1 (in that order) of w[j] * parts[j * stride + i],
/// each term added by one fused multiply-add in double, rounded to float once. parts holds the P
/// ranks' copies of one chunk, stride apart. The fma is written out: a compiler may or may not
/// contract a multiply and an add, and every rank, the host and the device must agree.
/// NaN and infinities propagate as in the double sum.
SOLDER_HD inline float weighted_sum_at(const float* parts, std::size_t stride, const double* w, std::size_t P,
                                       std::size_t i) {
  double s = 0.0;
  for (std::size_t j = 0; j < P; ++j) {
    s = simd::fma(w[j], double(parts[j * stride + i]), s);
  }
  return float(s);
}

/// weighted_sum_at for len consecutive elements: out[k] = the sum over ranks j in order of
/// w[j] * parts[j][k], the same fma per rank into a double and one rounding, with the loops
/// exchanged so that the compiler vectorizes along k. The host's owner sum; the same bits.
inline void weighted_sum_run(const float* const* parts, const double* w, std::size_t P, std::size_t len, float* out) {
  constexpr std::size_t block = 256;
  double acc[block];
  for (std::size_t at = 0; at < len; at += block) {
    const std::size_t m = std::min(block, len - at);
    const float* first = parts[0] + at;
    for (std::size_t k = 0; k < m; ++k) acc[k] = simd::fma(w[0], double(first[k]), 0.0);
    for (std::size_t j = 1; j < P; ++j) {
      const float* part = parts[j] + at;
      const double wj = w[j];
      for (std::size_t k = 0; k < m; ++k) acc[k] = simd::fma(wj, double(part[k]), acc[k]);
    }
    for (std::size_t k = 0; k < m; ++k) out[at + k] = float(acc[k]);
  }
}

/// The status an owner writes into its reduced chunk: 1 + the lowest rank whose status says it
/// failed, or 0 when none did (exact in a float for any world size below 2^24).
SOLDER_HD inline float reduced_status(const float* parts, std::size_t stride, std::size_t P, std::size_t status_at) {
  for (std::size_t j = 0; j < P; ++j)
    if (parts[j * stride + status_at] != status_ok) return float(j + 1);
  return 0.0f;
}

}  // namespace solder::dist
