// tests/eval/tuning.test.cpp: the detected host (CPUID and the OS against /proc/cpuinfo), the
// constants chosen for the hosts solder has met, and the report that prints both.
#include <cstddef>
#include <fstream>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>

#include "solder/host_report.hpp"

namespace {

using solder::cpu_vendor;
using solder::eval::cpu::choose_tuning;
constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;

/// The first value of `key` in /proc/cpuinfo ("" when there is none).
std::string cpuinfo(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos || line.find_first_not_of(" \t", key.size()) != colon) continue;
    const auto v = line.find_first_not_of(' ', colon + 1);
    return v == std::string::npos ? std::string() : line.substr(v);
  }
  return {};
}

}  // namespace

TEST_CASE("host: CPUID's vendor, family, model and name are the kernel's", "[host]") {
  const solder::host_cpu& h = solder::this_host();
  const std::string vendor = cpuinfo("vendor_id");
#if defined(__x86_64__) && defined(__linux__)
  REQUIRE(!vendor.empty());
#else
  if (vendor.empty()) return;  // no x86 /proc/cpuinfo to compare with
#endif
  CHECK(h.vendor_id == vendor);
  CHECK(h.vendor == (vendor == "GenuineIntel" ? cpu_vendor::intel : vendor == "AuthenticAMD" ? cpu_vendor::amd : cpu_vendor::other));
  CHECK(std::to_string(h.family) == cpuinfo("cpu family"));
  CHECK(std::to_string(h.model) == cpuinfo("model"));
  CHECK(h.name == cpuinfo("model name"));
  const std::string flags = " " + cpuinfo("flags") + " ";
  CHECK(h.avx2 == (flags.find(" avx2 ") != std::string::npos));
  CHECK(h.fma == (flags.find(" fma ") != std::string::npos));
  CHECK(h.avx512f == (flags.find(" avx512f ") != std::string::npos));
  CHECK(h.avx512bw == (flags.find(" avx512bw ") != std::string::npos));
  CHECK(h.logical_cpus >= 1);
  // Every x86 CPU this library vectorizes for has these levels; sizes are whole KiB.
  CHECK(h.l1d_bytes >= 16 * KiB);
  CHECK(h.l2_bytes >= 256 * KiB);
  CHECK(h.l1d_bytes % KiB == 0);
  CHECK(h.l2_bytes % KiB == 0);
}

TEST_CASE("host: CPUID's cache leaves decoded, with a Zen 4 guest's registers", "[host]") {
  using solder::detail::decode_cache_leaf;
  // CPUID 0x8000001D on a 2-vCPU AMD EPYC (Zen 4) guest, subleaves 0-3 (EAX, EBX, ECX).
  constexpr auto l1d = decode_cache_leaf(0x121, 0x1c0003f, 0x3f);
  constexpr auto l1i = decode_cache_leaf(0x122, 0x1c0003f, 0x3f);
  constexpr auto l2 = decode_cache_leaf(0x143, 0x1c0003f, 0x7ff);
  constexpr auto l3 = decode_cache_leaf(0x4163, 0x3c0003f, 0x7fff);
  STATIC_REQUIRE((l1d.level == 1 && l1d.holds_data() && l1d.bytes == 32 * KiB));
  STATIC_REQUIRE((l1i.level == 1 && !l1i.holds_data()));
  STATIC_REQUIRE((l2.level == 2 && l2.holds_data() && l2.bytes == 1 * MiB));
  STATIC_REQUIRE((l3.level == 3 && l3.holds_data() && l3.bytes == 32 * MiB));
  // Leaf 4's layout on Intel is the same: 16 ways of 2048 sets of 64-byte lines, 2 MiB.
  STATIC_REQUIRE(decode_cache_leaf(0x43, (15u << 22) | 63u, 2047).bytes == 2 * MiB);
  STATIC_REQUIRE(decode_cache_leaf(0, 0x1c0003f, 0x3f).bytes == 0);  // type 0: the list's end
}

TEST_CASE("host: the cache sizes are the kernel's (sysfs), where it lists them", "[host]") {
  const solder::host_cpu& h = solder::this_host();
  int compared = 0;
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream level_in(dir + "level"), type_in(dir + "type"), size_in(dir + "size");
    int level = 0;
    std::string type, size;
    if (!(level_in >> level) || !(type_in >> type) || !(size_in >> size)) break;
    if (type == "Instruction" || size.empty() || size.back() != 'K') continue;
    const std::size_t bytes = std::stoull(size.substr(0, size.size() - 1)) * KiB;
    CAPTURE(level, type, size);
    if (level == 1) CHECK(h.l1d_bytes == bytes);
    if (level == 2) CHECK(h.l2_bytes == bytes);
    if (level == 3) CHECK(h.l3_bytes == bytes);
    ++compared;
  }
  if (compared == 0) SUCCEED("no sysfs cache list on this system");
}

TEST_CASE("tuning: the choices for the hosts solder has met, and for unknown ones", "[host]") {
  // Intel Sapphire/Emerald Rapids: 2 MiB L2, a large mesh L3 that is not worth writing through.
  constexpr auto intel = choose_tuning(cpu_vendor::intel, 2 * MiB, 300 * MiB);
  STATIC_REQUIRE(intel.stream_min_bytes == 8 * MiB);
  STATIC_REQUIRE(intel.gemm_l2_b_bytes == 512 * KiB);
  STATIC_REQUIRE(intel.prefetch_cached);
  // AMD Zen 4: 1 MiB L2, 32 MiB L3 per core complex: outputs up to half of it stay cached.
  constexpr auto zen4 = choose_tuning(cpu_vendor::amd, 1 * MiB, 32 * MiB);
  STATIC_REQUIRE(zen4.stream_min_bytes == 16 * MiB);
  STATIC_REQUIRE(zen4.gemm_l2_b_bytes == 256 * KiB);
  STATIC_REQUIRE(!zen4.prefetch_cached);  // the hardware prefetchers keep up with the CCX's L3
  STATIC_REQUIRE(zen4.gemm_kc_max == 512);
  STATIC_REQUIRE(choose_tuning(cpu_vendor::amd, 1 * MiB, 32 * MiB, 25).gemm_kc_max == 512);
  STATIC_REQUIRE(intel.gemm_kc_max == 512);
  // AMD Zen 5 (family 26): K blocks of up to 1024.
  constexpr auto zen5 = choose_tuning(cpu_vendor::amd, 1 * MiB, 32 * MiB, 26);
  STATIC_REQUIRE(zen5.gemm_kc_max == 1024);
  STATIC_REQUIRE(zen5.gemm_l2_b_bytes == 256 * KiB);
  STATIC_REQUIRE(choose_tuning(cpu_vendor::intel, 2 * MiB, 300 * MiB, 26).gemm_kc_max == 512);
  // A small L3 never streams below the floor; nothing reported keeps the defaults.
  STATIC_REQUIRE(choose_tuning(cpu_vendor::amd, 512 * KiB, 8 * MiB).stream_min_bytes == 8 * MiB);
  STATIC_REQUIRE(choose_tuning(cpu_vendor::amd, 512 * KiB, 8 * MiB).gemm_l2_b_bytes == 128 * KiB);
  STATIC_REQUIRE(choose_tuning(cpu_vendor::other, 0, 0).stream_min_bytes == 8 * MiB);
  STATIC_REQUIRE(choose_tuning(cpu_vendor::other, 0, 0).gemm_l2_b_bytes == 512 * KiB);
  STATIC_REQUIRE(choose_tuning(cpu_vendor::other, 0, 0).prefetch_cached);
  STATIC_REQUIRE(choose_tuning(cpu_vendor::intel, 64 * MiB, 0).gemm_l2_b_bytes == 512 * KiB);

  const solder::host_cpu& h = solder::this_host();
  const auto mine = choose_tuning(h.vendor, h.l2_bytes, h.l3_bytes, h.family);
  CHECK(solder::eval::cpu::tuning().stream_min_bytes == mine.stream_min_bytes);
  CHECK(solder::eval::cpu::tuning().gemm_l2_b_bytes == mine.gemm_l2_b_bytes);
  CHECK(solder::eval::cpu::tuning().prefetch_cached == mine.prefetch_cached);
  CHECK(solder::eval::cpu::tuning().gemm_kc_max == mine.gemm_kc_max);
}

TEST_CASE("tuning: set_tuning replaces the choice and keeps the streaming floor", "[host]") {
  namespace cpu = solder::eval::cpu;
  const cpu::cpu_tuning before = cpu::tuning();
  const cpu::cpu_tuning previous = cpu::set_tuning({1 * MiB, 256 * KiB});
  CHECK(previous.stream_min_bytes == before.stream_min_bytes);
  CHECK(cpu::tuning().stream_min_bytes == cpu::stream_min_bytes_floor);
  CHECK(cpu::tuning().gemm_l2_b_bytes == 256 * KiB);
  CHECK(cpu::gemm_blocking::for_k(1024).nc == 256 * KiB / (512 * cpu::gemm_blocking::nr * sizeof(float)));
  cpu::set_tuning(previous);
  CHECK(cpu::tuning().gemm_l2_b_bytes == before.gemm_l2_b_bytes);
}

TEST_CASE("host_report names the CPU, the build's instruction set and the choices", "[host]") {
  std::ostringstream os;
  os << solder::host_report{};
  const std::string r = os.str();
  const solder::host_cpu& h = solder::this_host();
  if (!h.name.empty()) CHECK(r.find(h.name) != std::string::npos);
  CHECK(r.find("family " + std::to_string(h.family) + ", model " + std::to_string(h.model)) != std::string::npos);
  CHECK(r.find(std::string("this build runs: ") + solder::eval::cpu::arch::name()) != std::string::npos);
  CHECK(r.find("streaming stores from " + solder::detail::byte_size(solder::eval::cpu::tuning().stream_min_bytes)) !=
        std::string::npos);
  CHECK(r.find("GEMM tile") != std::string::npos);
  CHECK(r.find(std::string("software prefetch in cached passes ") + (solder::eval::cpu::tuning().prefetch_cached ? "on" : "off")) !=
        std::string::npos);
}
