// io/safetensors.hpp: float32 tensors to and from safetensors files (Hugging Face's format: an
// 8-byte little-endian header length, a JSON header, the raw little-endian data). The header is
// read and written with nlohmann-json and checked strictly; loading is all-or-nothing and
// saving replaces the file atomically.
#pragma once

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#if __has_include(<unistd.h>)
#include <unistd.h>  // fsync: the data is on disk before the rename makes it visible
#endif

#include <nlohmann/json.hpp>

#include "solder/config.hpp"

namespace solder::io {

/// A float32 tensor to save: its name, its row-major shape ({} for a scalar) and its elements.
struct named_tensor {
  std::string name{};
  std::vector<std::size_t> shape{};
  const float* data = nullptr;
};

/// Where to load a float32 tensor: its name in the file, the shape it must have there, and
/// room for its elements.
struct named_tensor_ref {
  std::string name{};
  std::vector<std::size_t> shape{};
  float* data = nullptr;
};

/// The free-form string map a file may carry under "__metadata__" (e.g. {"format": "pt"}).
using safetensors_metadata = std::map<std::string, std::string>;

/// One tensor as a file's header describes it; begin and end are byte offsets into the data,
/// which starts right after the header.
struct safetensors_entry {
  std::string name{};
  std::string dtype{};
  std::vector<std::size_t> shape{};
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

/// A file's header, validated: the tensors in data order, the metadata, and the file offset of
/// the data (8 + the header length).
struct safetensors_header {
  std::vector<safetensors_entry> tensors{};
  safetensors_metadata metadata{};
  std::uint64_t data_start = 0;
};

namespace detail {

/// The format's limit on the header (the reference implementation refuses larger ones).
inline constexpr std::uint64_t max_header_bytes = 100'000'000;

[[noreturn]] inline void st_fail(const char* who, const std::filesystem::path& path, const std::string& what) {
  solder::detail::fail(std::string(who) + ": " + path.string() + ": " + what);
}

inline std::string shape_text(std::span<const std::size_t> s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

/// Element count of a shape; false on overflow of 64 bits.
inline bool element_count(std::span<const std::size_t> s, std::uint64_t& n) {
  n = 1;
  for (std::size_t e : s) {
    if (e != 0 && n > std::numeric_limits<std::uint64_t>::max() / e) return false;
    n *= e;
  }
  return true;
}

/// Bits per element of the dtypes the format defines; 0 for a name it does not.
inline std::size_t dtype_bits(std::string_view dtype) {
  struct known {
    std::string_view name;
    std::size_t bits;
  };
  static constexpr known table[] = {{"BOOL", 8},    {"U8", 8},   {"I8", 8},   {"F8_E5M2", 8}, {"F8_E4M3", 8},
                                    {"F8_E8M0", 8}, {"I16", 16}, {"U16", 16}, {"F16", 16},    {"BF16", 16},
                                    {"I32", 32},    {"U32", 32}, {"F32", 32}, {"F64", 64},    {"I64", 64},
                                    {"U64", 64},    {"C64", 64}, {"F4", 4},   {"F6_E2M3", 6}, {"F6_E3M2", 6}};
  for (const known& k : table)
    if (k.name == dtype) return k.bits;
  return 0;
}

/// True when s is well-formed UTF-8 (no overlong forms, surrogates or code points > U+10FFFF).
inline bool valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t len;
    std::uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (std::size_t k = 1; k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3F);
    }
    constexpr std::uint32_t smallest[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < smallest[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

/// The JSON of a header; its objects keep their members in file order.
using header_json = nlohmann::ordered_json;

/// A header's top-level members (tensor entries and "__metadata__") in file order. A vector of
/// them moves on growth, where a header_json object's would copy them (its keys are const).
using header_members = std::vector<std::pair<std::string, header_json>>;

/// A pointer into the header text that counts the bytes nlohmann's lexer has taken from it, so
/// that what the SAX handler below refuses can be placed at a byte.
struct counting_iterator {
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;
  const char* at = nullptr;
  std::size_t* taken = nullptr;

  reference operator*() const { return *at; }
  counting_iterator& operator++() {
    ++at;
    ++*taken;
    return *this;
  }
  counting_iterator operator++(int) {
    counting_iterator before = *this;
    ++*this;
    return before;
  }
  bool operator==(const counting_iterator& other) const { return at == other.at; }
};

/// Parses a header (text starting with '{') with nlohmann-json's SAX interface. nlohmann enforces
/// RFC 8259 (syntax, escapes, surrogate pairs, no raw control characters, no leading zeros);
/// this handler adds what JSON allows and the format does not: duplicate keys in any object,
/// fractions, exponents, true, false, null, integers beyond 64 bits, nesting deeper than 64
/// levels, and anything after the closing brace. nlohmann's errors are reworded so that every
/// message says what is wrong, and at which byte, in the terms of a safetensors header.
class header_reader {
 public:
  header_reader(std::string_view text, const char* who, const std::filesystem::path& path)
      : s_(text), who_(who), path_(path) {}

  header_members parse() {
    const counting_iterator first{s_.data(), &taken_}, last{s_.data() + s_.size(), nullptr};
    if (!header_json::sax_parse(first, last, this)) fail(taken_, "the JSON parser stopped early");  // refusals throw
    // nlohmann takes a NUL byte outside a string for the end of the input.
    if (taken_ < s_.size() || s_.back() == '\0')
      fail(taken_ - 1, "unexpected " + describe(taken_ - 1) + " after the end of the top-level value");
    return std::move(top_);
  }

  // The SAX events, called by nlohmann's parser; a refusal throws solder::error. A value deeper
  // than max_depth is refused before anything else is said about it.
  bool null() { refuse_literal(4); }
  bool boolean(bool value) { refuse_literal(value ? 4 : 5); }
  bool number_integer(header_json::number_integer_t v) {
    if (too_deep()) refuse_depth(number_start());
    return add(v);
  }
  bool number_unsigned(header_json::number_unsigned_t v) {
    if (too_deep()) refuse_depth(number_start());
    return add(v);
  }
  bool number_float(header_json::number_float_t, const std::string& text) {
    // The number ends one byte before taken_ (nlohmann read a byte past it), or at taken_ when
    // it ends the header; a float is never followed by a digit.
    const std::size_t start = s_.rfind(text, taken_ - text.size());
    if (too_deep()) refuse_depth(start);
    // nlohmann reads an integer beyond 64 bits as a double. One below -2^63 still has a 64-bit
    // magnitude: an integer, refused as negative wherever the format wants a number.
    if (text[0] == '-' && text.find_first_of(".eE") == std::string::npos &&
        overflow_at(std::string_view(text).substr(1)) == std::string_view::npos)
      return add(std::numeric_limits<std::int64_t>::min());
    refuse_number(start, text);
  }
  bool string(std::string& v) {
    if (too_deep()) refuse_depth(string_start(taken_));
    return add(std::move(v));
  }
  bool binary(header_json::binary_t&) { return false; }  // only the binary formats produce these
  bool start_object(std::size_t) {
    if (open_.empty()) {  // the header itself, whose members go to top_
      open_.push_back({nullptr, {}});
      return true;
    }
    header_json object = header_json::object();
    object.get_ref<header_json::object_t&>().reserve(4);  // a tensor entry's 3 members, without regrowth
    return open(std::move(object));
  }
  bool start_array(std::size_t) {
    header_json array = header_json::array();
    array.get_ref<header_json::array_t&>().reserve(4);  // a shape's usual extents
    return open(std::move(array));
  }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(std::string& k) {
    frame& f = open_.back();
    return f.value == nullptr ? add_key(f, top_, k) : add_key(f, f.value->get_ref<header_json::object_t&>(), k);
  }

  /// nlohmann's syntax and lexer errors. `position` counts the bytes read, the one that failed
  /// (or the end of the input) included; `token` is what the lexer holds of the last token.
  bool parse_error(std::size_t position, const std::string& token, const header_json::exception& e) {
    const std::size_t failed = std::min(position - 1, s_.size());  // s_.size(): the end
    const std::size_t end = std::min(position, s_.size());         // one past the last byte read
    if (e.id == 406) {  // a number beyond a double: 1e999, or an integer of 400 digits
      if (too_deep()) refuse_depth(end - token.size());
      refuse_number(end - token.size(), token);
    }
    // "[json.exception.parse_error.101] parse error at line 1, column 9: syntax error while
    // parsing <context> - <problem>", where the problem is "unexpected <token>[; expected ...]"
    // or a lexer message, "invalid ...; last read: '<token>'[; expected ...]".
    const std::string_view what = e.what();
    const std::size_t c = what.find("while parsing "), dash = what.find(" - ", c);
    if (c == std::string_view::npos || dash == std::string_view::npos) fail(failed, std::string(what));
    const std::string_view context = what.substr(c + 14, dash - c - 14);
    const std::string_view problem = what.substr(dash + 3);
    const std::string_view lexer = problem.substr(0, problem.find("; last read: '"));

    // Where the offending token starts: the messages name a token by its first byte.
    std::size_t start = failed;  // one byte: a structural character, the end, a NUL
    if (lexer.starts_with("invalid literal")) {
      while (start > 0 && s_[start - 1] >= 'a' && s_[start - 1] <= 'z') --start;  // back to its t, f or n
    } else if (lexer.starts_with("invalid")) {  // a string or number, read up to the failing byte
      const bool control = failed < s_.size() && static_cast<unsigned char>(s_[failed]) < 0x20;
      start = end - (token.size() - (control ? 7 : 0));  // nlohmann shows a control byte as <U+00XX>
    } else if (problem.starts_with("unexpected string literal") || problem.starts_with("unexpected number literal")) {
      start = end - token.size();
    } else if (problem.starts_with("unexpected true literal") || problem.starts_with("unexpected null literal")) {
      start = end - 4;
    } else if (problem.starts_with("unexpected false literal")) {
      start = end - 5;
    }
    const std::string found = describe(start);

    if (context == "value" && what.ends_with("; expected end of input"))
      fail(start, "unexpected " + found + " after the end of the top-level value");
    if (context == "value" && too_deep()) refuse_depth(start);
    if (context == "object separator") fail(start, "expected ':' after an object key, found " + found);
    if (context == "object" || context == "array") {
      // nlohmann reads "02" as the numbers 0 and 2, the second where a ',' belongs.
      if (start > 0 && start < s_.size() && s_[start - 1] == '0' && s_[start] >= '0' && s_[start] <= '9') {
        const std::string_view run = s_.substr(start - 1, s_.find_first_not_of("0123456789", start) - (start - 1));
        if (const std::size_t over = overflow_at(run); over != std::string_view::npos)
          fail(start - 1 + over, "integer too large for 64 bits");  // met first, reading the digits
        fail(start - 1, "a number must not have leading zeros");
      }
      fail(start, context == "object" ? "expected ',' or '}' in an object, found " + found
                                      : "expected ',' or ']' in an array, found " + found);
    }
    // Where a key or a value belongs, the lexer's complaint about a string or number is the precise one.
    if (lexer.starts_with("invalid string")) refuse_string(lexer, failed, end);
    if (context == "value" && lexer.starts_with("invalid number")) {
      if (lexer.ends_with("after '-'")) fail(failed, "expected digits, found " + describe(failed));
      refuse_number(start, s_.substr(start, failed - start));  // "1." or "1e": a fraction or exponent begun
    }
    if (context == "object key") fail(start, "expected a string key, found " + found);
    fail(start, "expected a value, found " + (start < s_.size() ? found : "the end of the header"));
  }

 private:
  static constexpr std::size_t max_depth = 64;     // the format nests 3 deep
  static constexpr std::size_t small_object = 16;  // members searched one by one for a duplicate

  struct frame {
    header_json* value;                    // an open object or array; nullptr: the header (top_)
    std::unordered_set<std::string> keys;  // a large object's keys, for the duplicate check
  };

  [[noreturn]] void fail(std::size_t at, const std::string& what) const {
    st_fail(who_, path_, "malformed JSON header at byte " + std::to_string(at) + ": " + what);
  }

  std::string describe(std::size_t i) const {
    if (i >= s_.size()) return "end of the header";
    const auto c = static_cast<unsigned char>(s_[i]);
    if (c >= 0x20 && c < 0x7F) return std::string("'") + char(c) + "'";
    return "byte 0x" + std::string(1, "0123456789abcdef"[c >> 4]) + "0123456789abcdef"[c & 15];
  }

  /// Where the string whose closing quote is at end - 1 opens: the nearest quote before it that
  /// no backslash escapes.
  std::size_t string_start(std::size_t end) const {
    std::size_t q = end - 1;
    for (;;) {
      q = s_.rfind('"', q - 1);
      std::size_t backslashes = 0;
      while (q > backslashes && s_[q - 1 - backslashes] == '\\') ++backslashes;
      if (backslashes % 2 == 0) return q;
    }
  }

  /// Where the integer nlohmann has just read begins: back from its end over digits and sign.
  std::size_t number_start() const {
    std::size_t i = taken_;
    if (s_[i - 1] < '0' || s_[i - 1] > '9') --i;  // the byte after it, read to find its end
    while (i > 0 && ((s_[i - 1] >= '0' && s_[i - 1] <= '9') || s_[i - 1] == '-')) --i;
    return i;
  }

  /// The index of the digit at which a decimal integer overflows 64 bits; npos if it fits.
  static std::size_t overflow_at(std::string_view digits) {
    std::uint64_t m = 0;
    for (std::size_t i = 0; i < digits.size(); ++i) {
      const auto d = std::uint64_t(digits[i] - '0');
      if (m > (std::numeric_limits<std::uint64_t>::max() - d) / 10) return i;
      m = m * 10 + d;
    }
    return std::string_view::npos;
  }

  /// The lexer's complaint about a string, reworded, at the byte where the problem shows:
  /// `failed` is the byte nlohmann stopped on, `end` one past it.
  [[noreturn]] void refuse_string(std::string_view lexer, std::size_t failed, std::size_t end) const {
    const bool ended = failed >= s_.size();
    const auto says = [&](const char* what) { return lexer.find(what) != std::string_view::npos; };
    if (says("forbidden character after backslash"))
      fail(failed,
           ended ? "unterminated string" : "unknown escape sequence: a backslash followed by " + describe(failed));
    if (says("must be followed by 4 hex digits"))
      fail(failed, ended ? "unterminated \\u escape" : "a \\u escape needs 4 hex digits, found " + describe(failed));
    if (says("must follow U+D800")) fail(end, "a \\u escape holds a lone low surrogate");  // after the escape
    if (says("must be followed by U+DC00")) {
      // After the high escape when no \u follows it; after the second escape when that is not a low one.
      const bool second = failed >= 5 && s_.compare(failed - 5, 2, "\\u") == 0;
      fail(second                   ? end
           : s_[failed - 1] == '\\' ? failed - 1
                                    : failed,
           "a high surrogate \\u escape must be followed by a low one");
    }
    if (says("control character"))
      fail(failed, "raw control character " + describe(failed) + " in a string; write it as an escape");
    if (says("missing closing quote")) fail(failed, "unterminated string");
    fail(failed, std::string(lexer));  // ill-formed UTF-8, which read_header has already refused
  }

  /// A number that is not a 64-bit integer, refused for what comes first: an integer part that
  /// overflows, or a fraction or exponent.
  [[noreturn]] void refuse_number(std::size_t start, std::string_view text) const {
    const std::size_t sign = text[0] == '-' ? 1 : 0;
    const std::string_view digits = text.substr(sign, text.find_first_of(".eE", sign) - sign);
    if (const std::size_t over = overflow_at(digits); over != std::string_view::npos)
      fail(start + sign + over, "integer too large for 64 bits");
    fail(start + sign + digits.size(), "numbers in a safetensors header are integers; found a fraction or an exponent");
  }

  [[noreturn]] void refuse_literal(std::size_t length) const {
    if (too_deep()) refuse_depth(taken_ - length);
    fail(taken_ - length, "true, false and null have no place in a safetensors header");
  }

  bool too_deep() const { return open_.size() > max_depth; }  // open_.size(): the next value's depth
  [[noreturn]] void refuse_depth(std::size_t at) const {
    fail(at, "nested deeper than " + std::to_string(max_depth) + " levels");
  }

  /// Adds key `k` to `members` (top_ or an object's), refusing a duplicate.
  bool add_key(frame& f, auto& members, std::string& k) {
    if (members.size() >= small_object && f.keys.empty())
      for (const auto& m : members) f.keys.insert(m.first);
    const bool repeated = members.size() < small_object
                              ? std::any_of(members.begin(), members.end(), [&](const auto& m) { return m.first == k; })
                              : !f.keys.insert(k).second;
    if (repeated) fail(string_start(taken_), "duplicate key \"" + k + "\"");
    members.emplace_back(std::move(k), nullptr);  // not ordered_map's insert, which would search again
    member_ = &members.back().second;
    return true;
  }

  /// Puts a value where the parse is: the next element of an array, or the member whose key
  /// came last.
  header_json* place(header_json&& v) {
    header_json* parent = open_.back().value;
    if (parent != nullptr && parent->is_array()) {
      parent->push_back(std::move(v));
      return &parent->back();
    }
    *member_ = std::move(v);
    return member_;
  }

  bool add(header_json&& v) {
    place(std::move(v));
    return true;
  }

  bool open(header_json&& empty) {
    if (too_deep()) refuse_depth(taken_ - 1);
    open_.push_back({place(std::move(empty)), {}});
    return true;
  }

  bool close() {
    open_.pop_back();
    return true;
  }

  std::string_view s_;
  const char* who_;
  const std::filesystem::path& path_;
  std::size_t taken_ = 0;  // bytes nlohmann has taken from s_
  header_members top_;
  std::vector<frame> open_;        // the objects and arrays not yet closed, outermost first
  header_json* member_ = nullptr;  // the member of the innermost object whose value comes next
};

/// The header's meaning, checked against the format: every tensor entry is
/// {"dtype": string, "shape": [n, ...], "data_offsets": [begin, end]} and nothing else; its
/// bytes match its dtype and shape; the tensors cover the data exactly, without overlaps or
/// holes (`data_bytes` is what follows the header). "__metadata__" maps strings to strings.
inline safetensors_header interpret(const header_members& members, std::uint64_t data_bytes, const char* who,
                                    const std::filesystem::path& path) {
  safetensors_header h;
  const auto entry_fail = [&](const std::string& name, const std::string& what) {
    st_fail(who, path, "tensor '" + name + "' " + what);
  };
  const auto unsigned_value = [&](const header_json& v, const std::string& name, const char* field) -> std::uint64_t {
    if (!v.is_number_integer()) entry_fail(name, std::string("has a non-integer in \"") + field + "\"");
    if (!v.is_number_unsigned() && v.get<std::int64_t>() < 0)
      entry_fail(name, std::string("has a negative number in \"") + field + "\"");
    return v.get<std::uint64_t>();
  };
  for (const auto& [name, v] : members) {
    if (name == "__metadata__") {
      if (!v.is_object()) st_fail(who, path, "\"__metadata__\" is not an object of strings");
      for (const auto& [key, value] : v.get_ref<const header_json::object_t&>()) {
        if (!value.is_string()) st_fail(who, path, "\"__metadata__\" entry \"" + key + "\" is not a string");
        h.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) entry_fail(name, "is not described by an object");
    safetensors_entry e;
    e.name = name;
    bool has_dtype = false, has_shape = false, has_offsets = false;
    for (const auto& [field, fv] : v.get_ref<const header_json::object_t&>()) {
      if (field == "dtype") {
        if (!fv.is_string()) entry_fail(name, "has a \"dtype\" that is not a string");
        e.dtype = fv.get<std::string>();
        has_dtype = true;
      } else if (field == "shape") {
        if (!fv.is_array()) entry_fail(name, "has a \"shape\" that is not an array");
        for (const header_json& d : fv) {
          const std::uint64_t x = unsigned_value(d, name, "shape");
          if (x > std::numeric_limits<std::size_t>::max()) entry_fail(name, "has an extent too large for size_t");
          e.shape.push_back(static_cast<std::size_t>(x));
        }
        has_shape = true;
      } else if (field == "data_offsets") {
        if (!fv.is_array() || fv.size() != 2) entry_fail(name, "needs \"data_offsets\" of the form [begin, end]");
        e.begin = unsigned_value(fv[0], name, "data_offsets");
        e.end = unsigned_value(fv[1], name, "data_offsets");
        has_offsets = true;
      } else {
        entry_fail(name, "has an unknown field \"" + field + "\" (a tensor has dtype, shape, data_offsets)");
      }
    }
    if (!has_dtype || !has_shape || !has_offsets)
      entry_fail(name, std::string("lacks \"") + (!has_dtype ? "dtype" : !has_shape ? "shape" : "data_offsets") + "\"");
    const std::string offsets = "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
    if (e.end < e.begin) entry_fail(name, "has data_offsets " + offsets + " that end before they begin");
    if (e.end > data_bytes)
      entry_fail(name, "has data_offsets " + offsets + " past the end of the data (" + std::to_string(data_bytes) +
                           " bytes follow the header); the file is truncated or corrupt");
    std::uint64_t count = 0;
    if (!element_count(e.shape, count)) entry_fail(name, "has a shape whose element count overflows 64 bits");
    if (const std::size_t bits = dtype_bits(e.dtype); bits != 0) {  // unknown dtypes: only a load refuses them
      if (count > std::numeric_limits<std::uint64_t>::max() / bits || count * bits != (e.end - e.begin) * 8)
        entry_fail(name, "of dtype " + e.dtype + " and shape " + shape_text(e.shape) + " needs " +
                             std::to_string(count * bits / 8) + " bytes, but its data_offsets " + offsets + " hold " +
                             std::to_string(e.end - e.begin));
    }
    h.tensors.push_back(std::move(e));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const safetensors_entry& a, const safetensors_entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t covered = 0;  // the data [0, covered) belongs to the tensors seen so far
  for (std::size_t i = 0; i < h.tensors.size(); ++i) {
    const safetensors_entry& e = h.tensors[i];
    if (e.begin < covered)
      st_fail(who, path,
              "tensors '" + h.tensors[i - 1].name + "' [" + std::to_string(h.tensors[i - 1].begin) + ", " +
                  std::to_string(h.tensors[i - 1].end) + "] and '" + e.name + "' [" + std::to_string(e.begin) + ", " +
                  std::to_string(e.end) + "] overlap");
    if (e.begin > covered)
      st_fail(who, path,
              "data bytes [" + std::to_string(covered) + ", " + std::to_string(e.begin) +
                  ") belong to no tensor; the format allows no holes");
    covered = e.end;
  }
  if (covered != data_bytes)
    st_fail(who, path,
            std::to_string(data_bytes - covered) + " bytes after the last tensor's data belong to no tensor");
  return h;
}

inline std::uint64_t read_u64_le(const unsigned char* b) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | b[i];
  return v;
}

/// Opens `path` and reads its header; `in` is left open for the data.
inline safetensors_header read_header(std::ifstream& in, const char* who, const std::filesystem::path& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) st_fail(who, path, "no such file");
  if (std::filesystem::is_directory(status)) st_fail(who, path, "is a directory, not a file");
  in.open(path, std::ios::binary);
  if (!in) st_fail(who, path, "cannot be opened for reading");
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::uint64_t>(std::streamoff(in.tellg()));
  in.seekg(0);
  if (size < 8)
    st_fail(who, path,
            "is " + std::to_string(size) +
                " bytes long, too short for the 8-byte header length; the file is truncated or not a "
                "safetensors file");
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  const std::uint64_t n = read_u64_le(len_bytes);
  if (n > size - 8)
    st_fail(who, path,
            "the header length " + std::to_string(n) + " runs past the end of the file (" + std::to_string(size) +
                " bytes); the file is truncated or not a safetensors file");
  if (n > max_header_bytes)
    st_fail(who, path,
            "the header length " + std::to_string(n) + " exceeds the format's limit of " +
                std::to_string(max_header_bytes) + " bytes");
  std::string text(static_cast<std::size_t>(n), '\0');
  in.read(text.data(), std::streamsize(n));
  if (!in) st_fail(who, path, "read error in the header");
  if (text.empty() || text[0] != '{') st_fail(who, path, "the header does not start with '{'; not a safetensors file");
  if (!valid_utf8(text)) st_fail(who, path, "the header is not valid UTF-8");
  safetensors_header h = interpret(header_reader(text, who, path).parse(), size - 8 - n, who, path);
  h.data_start = 8 + n;
  return h;
}

/// Closes a FILE* on every path out of save_safetensors.
struct file_closer {
  void operator()(std::FILE* f) const noexcept { std::fclose(f); }
};

}  // namespace detail

/// The header of a safetensors file, validated as load_safetensors validates it (the data is
/// not read). Lists every tensor with its dtype (any dtype, not only F32), shape and offsets.
inline safetensors_header read_safetensors_header(const std::filesystem::path& path) {
  std::ifstream in;
  return detail::read_header(in, "solder::io::read_safetensors_header", path);
}

/// Loads float32 tensors by name into `tensors` (each `data` holding the product of its
/// `shape` floats). All or nothing: the whole header is validated and every requested tensor
/// is read into a temporary buffer first; only when all of them are there are they copied into
/// the destinations, so on any error the destinations are unchanged. Tensors in the file that
/// are not requested are allowed (checked for consistency, not read). Throws solder::error,
/// naming the file, the tensor and the problem: no such file; a file too short for its header
/// length or its data (truncated); a malformed header (bad JSON, unknown fields, overlapping or
/// out-of-range offsets, sizes that do not match dtype and shape); a requested tensor that is
/// missing, not F32, or of another shape than its destination.
inline void load_safetensors(const std::filesystem::path& path, std::span<const named_tensor_ref> tensors) {
  constexpr const char* who = "solder::io::load_safetensors";
  std::ifstream in;
  const safetensors_header h = detail::read_header(in, who, path);
  std::unordered_map<std::string_view, const safetensors_entry*> by_name;
  for (const safetensors_entry& e : h.tensors) by_name.emplace(e.name, &e);

  std::string missing;
  for (const named_tensor_ref& t : tensors)
    if (!by_name.count(t.name)) missing += (missing.empty() ? "'" : ", '") + t.name + "'";
  if (!missing.empty()) {
    std::string held;
    for (std::size_t i = 0; i < h.tensors.size() && i < 8; ++i) held += (i ? ", '" : "'") + h.tensors[i].name + "'";
    if (h.tensors.size() > 8) held += ", ...";
    detail::st_fail(who, path,
                    "no tensor named " + missing + " in the file (it holds " + std::to_string(h.tensors.size()) +
                        (h.tensors.empty() ? "" : ": " + held) + ")");
  }

  std::vector<std::vector<float>> staged(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const named_tensor_ref& t = tensors[i];
    const safetensors_entry& e = *by_name.at(t.name);
    if (e.dtype != "F32")
      detail::st_fail(who, path,
                      "tensor '" + t.name + "' has dtype " + e.dtype +
                          (detail::dtype_bits(e.dtype) ? "" : " (unknown to the format)") +
                          "; solder loads F32 only (save it as float32, e.g. tensor.float() in PyTorch)");
    if (e.shape != t.shape)
      detail::st_fail(who, path,
                      "tensor '" + t.name + "' has shape " + detail::shape_text(e.shape) +
                          " in the file, but the destination expects " + detail::shape_text(t.shape));
    const std::size_t count = static_cast<std::size_t>((e.end - e.begin) / 4);
    if (count != 0 && t.data == nullptr)
      detail::st_fail(who, path, "the destination of tensor '" + t.name + "' has no data pointer");
    staged[i].resize(count);
    in.seekg(std::streamoff(h.data_start + e.begin));
    in.read(reinterpret_cast<char*>(staged[i].data()), std::streamsize(count * 4));
    if (!in) detail::st_fail(who, path, "read error in the data of tensor '" + t.name + "' (did the file change?)");
    if constexpr (std::endian::native == std::endian::big)
      for (float& v : staged[i]) v = std::bit_cast<float>(__builtin_bswap32(std::bit_cast<std::uint32_t>(v)));
  }
  for (std::size_t i = 0; i < tensors.size(); ++i)
    if (!staged[i].empty()) std::memcpy(tensors[i].data, staged[i].data(), staged[i].size() * sizeof(float));
}

inline void load_safetensors(const std::filesystem::path& path, std::initializer_list<named_tensor_ref> tensors) {
  load_safetensors(path, std::span<const named_tensor_ref>(tensors.begin(), tensors.size()));
}

/// Saves float32 tensors, in the given order, with optional metadata. The header is compact
/// JSON with each tensor as {"dtype":"F32","shape":[...],"data_offsets":[begin,end]},
/// "__metadata__" first when there is any, padded with spaces to a multiple of 8 bytes (as the
/// reference implementation does, so the data is aligned). The file is written to
/// `path` + ".tmp", flushed to disk, then renamed over `path`: a reader never sees a partial
/// file, and a failed save leaves an existing file as it was. Throws solder::error for an empty,
/// repeated or reserved ("__metadata__") name, a name that is not UTF-8, a null data pointer,
/// or an I/O failure (naming the file and the system's reason).
inline void save_safetensors(const std::filesystem::path& path, std::span<const named_tensor> tensors,
                             const safetensors_metadata& metadata = {}) {
  constexpr const char* who = "solder::io::save_safetensors";
  std::vector<std::string_view> names;
  for (const named_tensor& t : tensors) {
    if (t.name.empty()) detail::st_fail(who, path, "a tensor has an empty name");
    if (t.name == "__metadata__") detail::st_fail(who, path, "\"__metadata__\" is reserved for the metadata map");
    if (!detail::valid_utf8(t.name)) detail::st_fail(who, path, "tensor name '" + t.name + "' is not valid UTF-8");
    names.push_back(t.name);
  }
  std::sort(names.begin(), names.end());
  if (const auto dup = std::adjacent_find(names.begin(), names.end()); dup != names.end())
    detail::st_fail(who, path, "two tensors are named '" + std::string(*dup) + "'");
  for (const auto& [k, v] : metadata)
    if (!detail::valid_utf8(k) || !detail::valid_utf8(v))
      detail::st_fail(who, path, "metadata entry '" + k + "' is not valid UTF-8");

  // Compact JSON in insertion order: "__metadata__" first, then the tensors as given. The names
  // are known to be distinct, so members are appended without ordered_map's linear search.
  detail::header_json json = detail::header_json::object();
  auto& members = json.get_ref<detail::header_json::object_t&>();
  members.reserve(tensors.size() + 1);  // a reallocation would copy every member (its key is const)
  if (!metadata.empty()) members.emplace_back("__metadata__", metadata);
  std::vector<std::uint64_t> counts;
  std::uint64_t offset = 0;
  for (const named_tensor& t : tensors) {
    std::uint64_t count = 0;
    if (!detail::element_count(t.shape, count) || count > std::numeric_limits<std::uint64_t>::max() / 4 - offset)
      detail::st_fail(who, path, "tensor '" + t.name + "' has a shape whose size overflows 64 bits");
    if (count != 0 && t.data == nullptr) detail::st_fail(who, path, "tensor '" + t.name + "' has no data pointer");
    members.emplace_back(
        t.name,
        detail::header_json{{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + 4 * count}}});
    offset += 4 * count;
    counts.push_back(count);
  }
  std::string header = json.dump();
  header.append((8 - header.size() % 8) % 8, ' ');

  std::filesystem::path tmp = path;
  tmp += ".tmp";
  const auto io_fail = [&](const char* what) {
    const std::string reason = std::strerror(errno);
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    detail::st_fail(who, path, std::string(what) + " '" + tmp.string() + "': " + reason);
  };
  {
    errno = 0;
    std::unique_ptr<std::FILE, detail::file_closer> f(std::fopen(tmp.c_str(), "wb"));
    if (!f) {
      const std::string reason = std::strerror(errno);
      detail::st_fail(who, path, "cannot create '" + tmp.string() + "': " + reason);
    }
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(std::uint64_t(header.size()) >> (8 * i));
    bool ok =
        std::fwrite(len, 1, 8, f.get()) == 8 && std::fwrite(header.data(), 1, header.size(), f.get()) == header.size();
    for (std::size_t i = 0; ok && i < tensors.size(); ++i) {
      const std::size_t n = static_cast<std::size_t>(counts[i]);
      if constexpr (std::endian::native == std::endian::little) {
        ok = n == 0 || std::fwrite(tensors[i].data, sizeof(float), n, f.get()) == n;
      } else {
        for (std::size_t j = 0; ok && j < n; ++j) {
          const std::uint32_t b = __builtin_bswap32(std::bit_cast<std::uint32_t>(tensors[i].data[j]));
          ok = std::fwrite(&b, 4, 1, f.get()) == 1;
        }
      }
    }
    if (!ok || std::fflush(f.get()) != 0) io_fail("cannot write");
#if __has_include(<unistd.h>)
    if (::fsync(::fileno(f.get())) != 0) io_fail("cannot flush to disk");
#endif
    if (std::fclose(f.release()) != 0) io_fail("cannot close");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    detail::st_fail(who, path, "cannot rename '" + tmp.string() + "' over it: " + ec.message());
  }
}

inline void save_safetensors(const std::filesystem::path& path, std::initializer_list<named_tensor> tensors,
                             const safetensors_metadata& metadata = {}) {
  save_safetensors(path, std::span<const named_tensor>(tensors.begin(), tensors.size()), metadata);
}

}  // namespace solder::io
