// host.hpp: the CPU this process runs on, detected once: vendor, family and model, name, cache
// sizes and the vector extensions it has. The CPU backend chooses its host-dependent constants
// from it (eval/cpu/tuning.hpp); `std::cout << solder::host_report{}` prints both
// (host_report.hpp).
#pragma once

#include <cstddef>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__unix__)
#include <unistd.h>
#else
#include <thread>
#endif

namespace solder {

enum class cpu_vendor { intel, amd, other };

/// What was detected; a size or count the system does not report is 0.
struct host_cpu {
  cpu_vendor vendor = cpu_vendor::other;
  std::string vendor_id;  // CPUID's vendor string: "GenuineIntel", "AuthenticAMD", ...
  std::string name;       // the brand string, as /proc/cpuinfo's "model name"
  unsigned family = 0, model = 0, stepping = 0;  // CPUID's display family and model
  std::size_t l1d_bytes = 0, l2_bytes = 0, l3_bytes = 0;  // per core (L1, L2) and per L3 slice seen
  unsigned logical_cpus = 0;
  bool avx2 = false, fma = false, avx512f = false, avx512bw = false;  // what the CPU has
};

namespace detail {

inline std::string trim(std::string s) {
  const auto b = s.find_first_not_of(' ');
  const auto e = s.find_last_not_of(' ');
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

/// One subleaf of CPUID's deterministic cache parameters (leaf 4 on Intel, 0x8000001D on AMD,
/// the same layout): the cache's level, whether it holds data (data or unified), and its size
/// (ways x partitions x line size x sets); type 0 ends the list.
struct cache_leaf {
  unsigned type = 0, level = 0;  // type: 0 none, 1 data, 2 instruction, 3 unified
  std::size_t bytes = 0;
  constexpr bool holds_data() const { return type == 1 || type == 3; }
};
constexpr cache_leaf decode_cache_leaf(unsigned eax, unsigned ebx, unsigned ecx) {
  cache_leaf c;
  c.type = eax & 0x1f;
  c.level = (eax >> 5) & 0x7;
  if (c.type != 0)
    c.bytes = std::size_t(((ebx >> 22) & 0x3ff) + 1) * (((ebx >> 12) & 0x3ff) + 1) * ((ebx & 0xfff) + 1) *
              (std::size_t(ecx) + 1);
  return c;
}

inline std::size_t sysconf_bytes([[maybe_unused]] int name) {
#if defined(__GLIBC__)
  const long v = ::sysconf(name);
  return v > 0 ? std::size_t(v) : 0;
#else
  return 0;
#endif
}

/// The logical CPUs online, as std::thread::hardware_concurrency() counts them (0 where the
/// system does not say); POSIX's count where there is one, so that <thread> is not parsed.
inline unsigned online_cpus() {
#if defined(__unix__)
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? unsigned(n) : 0;
#else
  return std::thread::hardware_concurrency();
#endif
}

inline host_cpu detect_host() {
  host_cpu h;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0, ext_max = 0;
  __get_cpuid(0x80000000u, &ext_max, &b, &c, &d);  // the highest extended leaf
  if (__get_cpuid(0, &a, &b, &c, &d)) {
    const unsigned max_leaf = a;
    char id[13] = {};
    for (int i = 0; i < 4; ++i) {
      id[i] = char(b >> (8 * i));
      id[4 + i] = char(d >> (8 * i));
      id[8 + i] = char(c >> (8 * i));
    }
    h.vendor_id = id;
    h.vendor = h.vendor_id == "GenuineIntel" ? cpu_vendor::intel
               : h.vendor_id == "AuthenticAMD" ? cpu_vendor::amd
                                               : cpu_vendor::other;
    if (max_leaf >= 1 && __get_cpuid(1, &a, &b, &c, &d)) {
      const unsigned base_family = (a >> 8) & 0xf, base_model = (a >> 4) & 0xf;
      h.family = base_family == 0xf ? base_family + ((a >> 20) & 0xff) : base_family;
      h.model = base_family == 0x6 || base_family == 0xf ? base_model | (((a >> 16) & 0xf) << 4) : base_model;
      h.stepping = a & 0xf;
      h.fma = (c >> 12) & 1;
    }
    if (max_leaf >= 7 && __get_cpuid_count(7, 0, &a, &b, &c, &d)) {
      h.avx2 = (b >> 5) & 1;
      h.avx512f = (b >> 16) & 1;
      h.avx512bw = (b >> 30) & 1;
    }
    // Cache sizes from the deterministic cache leaves, as the kernel reads them. Not glibc's
    // sysconf: on AMD, glibc 2.36 takes L3 from the legacy leaf 0x80000006, which a hypervisor
    // may fill with the whole machine's L3 (320 MiB on a Zen 4 guest whose core complex has 32).
    unsigned cache_leaf_id = 0;
    if (h.vendor == cpu_vendor::intel && max_leaf >= 4) cache_leaf_id = 4;
    if (h.vendor == cpu_vendor::amd && ext_max >= 0x8000001Du && __get_cpuid(0x80000001u, &a, &b, &c, &d) &&
        ((c >> 22) & 1))  // the topology extensions
      cache_leaf_id = 0x8000001Du;
    for (unsigned sub = 0; cache_leaf_id != 0 && sub < 16; ++sub) {
      __cpuid_count(cache_leaf_id, sub, a, b, c, d);
      const cache_leaf leaf = decode_cache_leaf(a, b, c);
      if (leaf.type == 0) break;
      if (!leaf.holds_data()) continue;
      if (leaf.level == 1) h.l1d_bytes = leaf.bytes;
      if (leaf.level == 2) h.l2_bytes = leaf.bytes;
      if (leaf.level == 3) h.l3_bytes = leaf.bytes;
    }
  }
  if (ext_max >= 0x80000004u) {
    char brand[49] = {};
    for (unsigned leaf = 0; leaf < 3; ++leaf) {
      unsigned r[4] = {};
      __get_cpuid(0x80000002u + leaf, &r[0], &r[1], &r[2], &r[3]);
      for (int i = 0; i < 16; ++i) brand[16 * leaf + i] = char(r[i / 4] >> (8 * (i % 4)));
    }
    h.name = trim(brand);
  }
#endif
#if defined(__GLIBC__)
  // Where CPUID said nothing (another vendor, an old CPU): what glibc reports.
  if (h.l1d_bytes == 0) h.l1d_bytes = sysconf_bytes(_SC_LEVEL1_DCACHE_SIZE);
  if (h.l2_bytes == 0) h.l2_bytes = sysconf_bytes(_SC_LEVEL2_CACHE_SIZE);
  if (h.l3_bytes == 0) h.l3_bytes = sysconf_bytes(_SC_LEVEL3_CACHE_SIZE);
#endif
  h.logical_cpus = online_cpus();
  return h;
}

}  // namespace detail

/// This process's CPU, detected on first use.
inline const host_cpu& this_host() {
  static const host_cpu h = detail::detect_host();
  return h;
}

inline const char* vendor_name(cpu_vendor v) {
  switch (v) {
    case cpu_vendor::intel: return "Intel";
    case cpu_vendor::amd: return "AMD";
    default: return "other";
  }
}

}  // namespace solder
