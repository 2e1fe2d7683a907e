// eval/cpu/tuning.hpp: the CPU backend's constants that depend on the host rather than on the
// compile target, chosen once from the detected CPU (solder/host.hpp). None of them changes a
// result bit: they decide where data waits (cache or memory), never the order of a sum.
// host_report.hpp prints them beside the detected CPU.
#pragma once

#include <algorithm>
#include <cstddef>

#include "solder/host.hpp"

namespace solder::eval::cpu {

struct cpu_tuning {
  /// Outputs of an elementwise pass at least this large are written with non-temporal stores
  /// (when aligned), which skip the read for ownership of each line but leave nothing in cache.
  std::size_t stream_min_bytes;
  /// Bytes of the packed B operand one GEMM N block keeps in L2 while every tile of an M block
  /// passes over it: a quarter of L2, leaving room for the next block arriving and the A panels
  /// and partial sums passing through.
  std::size_t gemm_l2_b_bytes;
  /// Whether passes that store to cache prefetch their operands (prefetch_bytes_cached ahead, into
  /// L2). Passes that stream their output always do.
  bool prefetch_cached = true;
  /// Longest GEMM K block: a K block's partial sums are stored and reloaded once per tile and
  /// panel, and a longer one keeps A's panel (mr x kc) out of L1.
  std::size_t gemm_kc_max = 512;
};

/// Below this, no output is streamed on any host (a static shape that small never checks).
inline constexpr std::size_t stream_min_bytes_floor = std::size_t(8) << 20;

/// The choice for a host (a pure function, so it is tested for the hosts solder has met; the
/// figures behind it: docs/design.md, "Host-dependent constants").
///
/// Streaming: a cached store pays a read for ownership but leaves the output where the next
/// pass reads it, which wins only where that cache is faster for one core than memory. Intel's
/// server mesh L3 is not (cached stores stop winning at 8 MiB of output); the L3 of an AMD Zen
/// core complex is, so there outputs that leave room in L3 for their inputs (half of it) stay
/// cached.
///
/// GEMM: a quarter of L2, leaving room for the next block arriving and the A panels and partial
/// sums passing through, within [128 KiB, 512 KiB].
///
/// GEMM K block: 512 (a 14 x 512 panel of A, 28 KiB, stays in L1; measured on Intel against 256:
/// 3-5% faster), but 1024 on AMD Zen 5 (family 26), whose L2 keeps the panel's broadcasts fed:
/// 1.7-2.5% faster there at the three linear shapes (docs/gemm.md).
///
/// Prefetching in cached passes: on Intel a pass whose data stays in cache waits on the mesh L3
/// unless its operands are fetched ahead; on AMD Zen the hardware prefetchers already keep up
/// with the core complex's L3, and the prefetch instructions only take issue slots from a pass
/// bound by its own instructions (a dropout pass drawing its bits).
constexpr cpu_tuning choose_tuning(cpu_vendor vendor, std::size_t l2_bytes, std::size_t l3_bytes, unsigned family = 0) {
  cpu_tuning t{};
  t.stream_min_bytes = stream_min_bytes_floor;
  if (vendor == cpu_vendor::amd && l3_bytes > 0) t.stream_min_bytes = std::max(stream_min_bytes_floor, l3_bytes / 2);
  constexpr std::size_t b_default = std::size_t(512) << 10, b_min = std::size_t(128) << 10;
  t.gemm_l2_b_bytes = l2_bytes == 0 ? b_default : std::clamp(l2_bytes / 4, b_min, b_default);
  t.prefetch_cached = vendor != cpu_vendor::amd;
  t.gemm_kc_max = vendor == cpu_vendor::amd && family == 26 ? 1024 : 512;
  return t;
}

namespace detail {
inline cpu_tuning& tuning_state() {
  static cpu_tuning t = [] {
    const host_cpu& h = this_host();
    return choose_tuning(h.vendor, h.l2_bytes, h.l3_bytes, h.family);
  }();
  return t;
}
}  // namespace detail

/// The choice for this process's CPU, made on first use.
inline const cpu_tuning& tuning() { return detail::tuning_state(); }

/// Replaces the choice (to measure another, or to pin one), before any pass runs on another
/// thread; returns the previous one.
/// stream_min_bytes is taken as at least stream_min_bytes_floor.
inline cpu_tuning set_tuning(cpu_tuning t) {
  const cpu_tuning previous = detail::tuning_state();
  t.stream_min_bytes = std::max(t.stream_min_bytes, stream_min_bytes_floor);
  detail::tuning_state() = t;
  return previous;
}

}  // namespace solder::eval::cpu
