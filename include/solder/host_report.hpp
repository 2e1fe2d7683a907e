// host_report.hpp: `std::cout << solder::host_report{}` prints the CPU solder detected
// (host.hpp), the instruction set this build runs, and the CPU backend's constants: those
// chosen for this host (eval/cpu/tuning.hpp) and those fixed by the compile target. Benchmarks
// and demos print it next to their figures, so every number says what machine it is from.
#pragma once

#include <cstddef>
#include <ostream>
#include <string>

#include "solder/eval/cpu/batch.hpp"
#include "solder/eval/cpu/evaluator.hpp"
#include "solder/eval/cpu/gemm_blocking.hpp"
#include "solder/eval/cpu/parallel.hpp"
#include "solder/eval/cpu/tuning.hpp"
#include "solder/host.hpp"

namespace solder {

struct host_report {};

namespace detail {

inline std::string byte_size(std::size_t bytes) {
  if (bytes == 0) return "unknown";
  if (bytes % (std::size_t(1) << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes % (std::size_t(1) << 10) == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

}  // namespace detail

inline std::ostream& operator<<(std::ostream& os, host_report) {
  using detail::byte_size;
  namespace cpu = eval::cpu;
  const host_cpu& h = this_host();
  const cpu::cpu_tuning& t = cpu::tuning();
  using blocking = cpu::gemm_blocking;

  os << "solder host: " << (h.name.empty() ? std::string("(CPU name not reported)") : h.name) << "\n";
  os << "  vendor " << (h.vendor_id.empty() ? vendor_name(h.vendor) : h.vendor_id.c_str()) << ", family "
     << h.family << ", model " << h.model << ", " << h.logical_cpus << " logical CPUs\n";
  os << "  caches: L1d " << byte_size(h.l1d_bytes) << ", L2 " << byte_size(h.l2_bytes) << ", L3 "
     << byte_size(h.l3_bytes) << "\n";
  os << "  CPU has:" << (h.avx2 ? " AVX2" : "") << (h.fma ? " FMA" : "") << (h.avx512f ? " AVX-512F" : "")
     << (h.avx512bw ? " AVX-512BW" : "") << (h.avx2 || h.avx512f ? "" : " none of AVX2, AVX-512") << "\n";
  os << "  this build runs: " << cpu::arch::name() << ", " << cpu::float_lanes << " floats a vector, "
     << num_threads() << " thread" << (num_threads() == 1 ? "" : "s") << "\n";
  if (h.avx512f && cpu::float_lanes < 16)
    os << "  note: the CPU has AVX-512 but this build does not use it (compile with -march=native)\n";
  os << "  chosen for this host: streaming stores from " << byte_size(t.stream_min_bytes)
     << " of output; GEMM K block <= " << t.gemm_kc_max << ", B block " << byte_size(t.gemm_l2_b_bytes) << " in L2 ("
     << cpu::gemm_n_block_panels(t.gemm_kc_max, blocking::nr) << " panels at that K block); software prefetch in cached "
     << "passes " << (t.prefetch_cached ? "on" : "off") << "\n";
  os << "  fixed by the build: GEMM tile " << blocking::mr << " x " << blocking::nr << ", A block "
     << byte_size(blocking::a_block_bytes) << "; random-bit segments of " << cpu::segment_elements
     << " elements; prefetch " << byte_size(cpu::prefetch_bytes_cached) << " ahead (cached stores, where on), "
     << byte_size(cpu::prefetch_bytes_streaming) << " (streaming)\n";
  return os;
}

}  // namespace solder
