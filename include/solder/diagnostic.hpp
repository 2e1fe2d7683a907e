// diagnostic.hpp: compile-time error text. A mismatch instantiates `diagnostic<"...">`, so the
// compiler prints the user's shapes in the first line of the error ("In instantiation of
// 'struct solder::diagnostic<...{"solder: cannot broadcast [256, 4096] with [1024]"}>'").
#pragma once

#include <cstddef>

namespace solder {

/// A string usable as a template argument; built by constexpr code, printed by the compiler.
struct fixed_string {
  static constexpr std::size_t capacity = 160;
  char text[capacity]{};
  std::size_t length = 0;

  constexpr fixed_string() = default;
  template <std::size_t N>
  constexpr fixed_string(const char (&s)[N]) {  // NOLINT: implicit from a literal on purpose
    append(s);
  }
  constexpr fixed_string& append(const char* s) {
    for (; *s && length + 1 < capacity; ++s) text[length++] = *s;
    return *this;
  }
  constexpr fixed_string& append(std::size_t n) {
    char digits[24]{};
    int k = 0;
    do {
      digits[k++] = char('0' + n % 10);
      n /= 10;
    } while (n);
    while (k && length + 1 < capacity) text[length++] = digits[--k];
    return *this;
  }
};

template <fixed_string Message, class... Context>
inline constexpr bool never = false;

/// Instantiated only on an error; the static_assert message says where to read. `Context`
/// names the types involved (and makes a message inside a template wait for instantiation).
template <fixed_string Message, class... Context>
struct diagnostic {
  static constexpr bool reported = never<Message, Context...>;
  static_assert(never<Message, Context...>, "solder: compile-time check failed; the reason is the text in 'diagnostic<...>' above");
};

}  // namespace solder
