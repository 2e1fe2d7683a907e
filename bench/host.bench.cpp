// bench/host.bench.cpp: no cases; puts the facts of solder's host report (the detected CPU and
// caches, the build's instruction set, the constants chosen for this host) into the context of
// every run, where the console shows them before the table and --benchmark_out's JSON keeps
// them beside the figures.
#include <benchmark/benchmark.h>

#include <string>

#include "solder/host_report.hpp"

namespace {

const bool host_context = [] {
  const solder::host_cpu& h = solder::this_host();
  const auto& t = solder::eval::cpu::tuning();
  benchmark::AddCustomContext("solder_cpu", h.name);
  benchmark::AddCustomContext("solder_cpu_id", h.vendor_id + " family " + std::to_string(h.family) + " model " +
                                                   std::to_string(h.model));
  benchmark::AddCustomContext("solder_arch", solder::eval::cpu::arch::name());
  benchmark::AddCustomContext("solder_stream_min_bytes", std::to_string(t.stream_min_bytes));
  benchmark::AddCustomContext("solder_gemm_l2_b_bytes", std::to_string(t.gemm_l2_b_bytes));
  benchmark::AddCustomContext("solder_gemm_kc_max", std::to_string(t.gemm_kc_max));
  benchmark::AddCustomContext("solder_prefetch_cached", t.prefetch_cached ? "on" : "off");
  benchmark::AddCustomContext("solder_caches", "L1d " + solder::detail::byte_size(h.l1d_bytes) + ", L2 " +
                                                   solder::detail::byte_size(h.l2_bytes) + ", L3 " +
                                                   solder::detail::byte_size(h.l3_bytes));
  return true;
}();

}  // namespace
