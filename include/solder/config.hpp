// config.hpp: every macro solder defines, in one place (host/device markers, assertions, inlining).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

/// SOLDER_HAS_CUDA: defined when the translation unit is compiled by nvcc.
#if defined(__CUDACC__)
#define SOLDER_HAS_CUDA 1
#define SOLDER_HD __host__ __device__
#else
#define SOLDER_HD
#endif

/// SOLDER_UNROLL: before a loop of a host+device body with a compile-time trip count whose
/// index selects registers (a thread's accumulators): unrolled by nvcc, so they stay in
/// registers instead of local memory. The host compilers unroll such loops themselves.
#if defined(__CUDACC__)
#define SOLDER_UNROLL _Pragma("unroll")
#else
#define SOLDER_UNROLL
#endif

/// SOLDER_EXEC_CHECK_OFF: before a SOLDER_HD template that host-only code also instantiates
/// with host-only value types (xsimd batches): nvcc then checks its calls per instantiation
/// instead of warning that a host+device function calls host code.
#if defined(__CUDACC__)
#define SOLDER_EXEC_CHECK_OFF _Pragma("nv_exec_check_disable")
#else
#define SOLDER_EXEC_CHECK_OFF
#endif

/// SOLDER_INLINE: force inlining of the small functions every loop nest is built from; the
/// loop nests only vectorize well when the whole expression tree collapses into one body.
/// SOLDER_INLINE_LAMBDA does the same for a lambda (after its parameter list).
#if defined(_MSC_VER)
#define SOLDER_INLINE __forceinline
#define SOLDER_INLINE_LAMBDA
#else
#define SOLDER_INLINE inline __attribute__((always_inline))
#define SOLDER_INLINE_LAMBDA __attribute__((always_inline))
#endif

/// SOLDER_INTRINSIC_WARNINGS_OFF / SOLDER_INTRINSIC_WARNINGS_ON: around code that inlines
/// AVX-512 intrinsics (solder's own, or xsimd's exp and log1p). GCC 12.2 warns
/// -W(maybe-)uninitialized inside its own intrinsics (the "undefined" source operand of the
/// unmasked forms, GCC bug 105593, fixed in 12.3); the warning names no solder code.
#if defined(__GNUC__) && !defined(__clang__)
#define SOLDER_INTRINSIC_WARNINGS_OFF                                                          \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")  \
      _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")
#define SOLDER_INTRINSIC_WARNINGS_ON _Pragma("GCC diagnostic pop")
#else
#define SOLDER_INTRINSIC_WARNINGS_OFF
#define SOLDER_INTRINSIC_WARNINGS_ON
#endif

/// SOLDER_FLATTEN_KERNEL: on a row kernel, every call inside it is inlined into one body (in
/// translation units with many row shapes GCC's inliner otherwise runs out of budget and calls
/// exp out of line once per vector) while the kernel itself stays out of line.
#if defined(__GNUC__) && !defined(__clang__)
#define SOLDER_FLATTEN_KERNEL [[gnu::flatten, gnu::noinline, gnu::noclone]]
#elif defined(__clang__)
#define SOLDER_FLATTEN_KERNEL [[gnu::flatten, gnu::noinline]]
#else
#define SOLDER_FLATTEN_KERNEL
#endif

/// SOLDER_ASSERT(cond, msg): a runtime check of what the types cannot prove (a dynamic batch
/// size, a file's contents). Always on: the checks sit outside the hot loops.
#define SOLDER_ASSERT(cond, msg)                                                               \
  do {                                                                                         \
    if (!(cond)) ::solder::detail::fail(msg);                                                  \
  } while (0)

namespace solder {

/// The error every runtime check throws; its what() names the problem in the user's terms.
struct error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {
[[noreturn]] inline void fail(const char* msg) { throw error(msg); }
[[noreturn]] inline void fail(const std::string& msg) { throw error(msg); }

/// One piece of an error message: text, or a number, written as std::to_string writes it. A
/// check keeps only the pieces at its call site; the message is put together out of line
/// (fail_message), so that a check costs its caller a few stores and one call.
class message_part {
 public:
  message_part() : kind_(kind::text), text_() {}
  message_part(const char* s) : kind_(kind::text), text_(s) {}
  message_part(std::string_view s) : kind_(kind::text), text_(s) {}
  message_part(const std::string& s) : kind_(kind::text), text_(s) {}
  template <class T>
    requires std::is_integral_v<T> && (!std::is_same_v<T, bool>) && (!std::is_same_v<T, char>)
  message_part(T v) {
    if constexpr (std::is_signed_v<T>) {
      kind_ = kind::signed_number;
      signed_ = v;
    } else {
      kind_ = kind::unsigned_number;
      unsigned_ = v;
    }
  }
  message_part(double v) : kind_(kind::real), real_(v) {}
  message_part(float v) : kind_(kind::real), real_(v) {}

  /// Writes the part at out (at most room characters, cut there) and returns its length.
  std::size_t write_to(char* out, std::size_t room) const {
    if (kind_ == kind::text) return text_.copy(out, room);
    char number[64];  // as std::to_string writes it
    const int n = kind_ == kind::signed_number     ? std::snprintf(number, sizeof number, "%lld", signed_)
                  : kind_ == kind::unsigned_number ? std::snprintf(number, sizeof number, "%llu", unsigned_)
                                                   : std::snprintf(number, sizeof number, "%f", real_);
    return std::string_view(number, n < 0 ? 0 : std::size_t(n)).copy(out, room);
  }

 private:
  enum class kind { text, signed_number, unsigned_number, real } kind_;
  union {
    std::string_view text_;
    long long signed_;
    unsigned long long unsigned_;
    double real_;
  };
};

/// fail() with the message the parts spell, in order (cut at 4095 characters). Written into a
/// buffer, not a std::string: in C++20 every std::string member is inline, so string code in a
/// header is compiled again by every translation unit.
[[noreturn, gnu::cold, gnu::noinline]] inline void fail_message(const message_part* parts, std::size_t count) {
  char msg[4096];
  std::size_t n = 0;
  for (std::size_t i = 0; i < count; ++i) n += parts[i].write_to(msg + n, sizeof msg - 1 - n);
  msg[n] = '\0';
  throw error(msg);
}
[[noreturn, gnu::cold, gnu::noinline]] inline void fail_message(std::initializer_list<message_part> parts) {
  fail_message(parts.begin(), parts.size());
}

/// fail(first + a + second + b + last) with the counts written in decimal.
[[noreturn, gnu::cold, gnu::noinline]] inline void fail_counts(const char* first, std::size_t a, const char* second,
                                                            std::size_t b, const char* last = "") {
  fail_message({first, a, second, b, last});
}
}  // namespace detail

/// Bytes of alignment of every solder buffer: one cache line, one AVX-512 register.
inline constexpr std::size_t alignment = 64;

}  // namespace solder
