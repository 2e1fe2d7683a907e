// io/safetensors.hpp: float32 tensors to and from safetensors files (Hugging Face's format: an
// 8-byte little-endian header length, a JSON header, the raw little-endian data), with a
// strict header parser; loading is all-or-nothing and saving replaces the file atomically.
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
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#if __has_include(<unistd.h>)
#include <unistd.h>  // fsync: the data is on disk before the rename makes it visible
#endif

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

inline void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

/// A JSON value of the subset a safetensors header uses: objects, arrays, strings, integers.
struct json {
  enum class kind { object, array, string, integer };
  kind type = kind::integer;
  bool negative = false;  // integer: sign and magnitude
  std::uint64_t magnitude = 0;
  std::string text;               // string
  std::vector<std::string> keys;  // object: keys, in file order
  std::vector<json> items;        // object: values (same order as keys); array: elements
};

/// A strict parser of that subset (RFC 8259 syntax): no trailing commas, no comments, no
/// duplicate keys, no leading zeros, no fractions or exponents; strings with every JSON escape
/// (\u with four hex digits, surrogate pairs included) and no raw control characters.
/// true/false/null are not part of the format and are refused.
class json_parser {
 public:
  json_parser(std::string_view text, std::string context) : s_(text), context_(std::move(context)) {}

  json parse_document() {
    skip_space();
    json v = value(0);
    skip_space();
    if (pos_ != s_.size()) error("unexpected " + describe_here() + " after the end of the top-level value");
    return v;
  }

 private:
  static constexpr int max_depth = 64;  // the format nests 3 deep; this only guards the stack

  [[noreturn]] void error(const std::string& what) const {
    solder::detail::fail(context_ + ": malformed JSON header at byte " + std::to_string(pos_) + ": " + what);
  }
  std::string describe_here() const {
    if (pos_ >= s_.size()) return "end of the header";
    const auto c = static_cast<unsigned char>(s_[pos_]);
    if (c >= 0x20 && c < 0x7F) return std::string("'") + char(c) + "'";
    return "byte 0x" + std::string(1, "0123456789abcdef"[c >> 4]) + "0123456789abcdef"[c & 15];
  }
  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  void expect(char c, const char* what) {
    if (pos_ >= s_.size() || s_[pos_] != c) error(std::string("expected ") + what + ", found " + describe_here());
    ++pos_;
  }

  json value(int depth) {
    if (depth > max_depth) error("nested deeper than " + std::to_string(max_depth) + " levels");
    if (pos_ >= s_.size()) error("expected a value, found the end of the header");
    const char c = s_[pos_];
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') {
      json v;
      v.type = json::kind::string;
      v.text = string();
      return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return integer();
    if (s_.substr(pos_, 4) == "true" || s_.substr(pos_, 5) == "false" || s_.substr(pos_, 4) == "null")
      error("true, false and null have no place in a safetensors header");
    error("expected a value, found " + describe_here());
  }

  json object(int depth) {
    json v;
    v.type = json::kind::object;
    ++pos_;  // '{'
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == '}') {
      ++pos_;
      return v;
    }
    for (;;) {
      skip_space();
      if (pos_ >= s_.size() || s_[pos_] != '"') error("expected a string key, found " + describe_here());
      const std::size_t key_at = pos_;
      std::string key = string();
      // Linear search is fine for the small inner objects; the top level is checked in bulk below.
      if (depth > 0 && std::find(v.keys.begin(), v.keys.end(), key) != v.keys.end()) {
        pos_ = key_at;
        error("duplicate key \"" + key + "\"");
      }
      v.keys.push_back(std::move(key));
      skip_space();
      expect(':', "':' after an object key");
      skip_space();
      v.items.push_back(value(depth + 1));
      skip_space();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      expect('}', "',' or '}' in an object");
      break;
    }
    if (depth == 0) {
      std::vector<std::size_t> order(v.keys.size());
      for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return v.keys[a] < v.keys[b]; });
      for (std::size_t i = 1; i < order.size(); ++i)
        if (v.keys[order[i]] == v.keys[order[i - 1]])
          solder::detail::fail(context_ + ": malformed JSON header: duplicate key \"" + v.keys[order[i]] + "\"");
    }
    return v;
  }

  json array(int depth) {
    json v;
    v.type = json::kind::array;
    ++pos_;  // '['
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == ']') {
      ++pos_;
      return v;
    }
    for (;;) {
      skip_space();
      v.items.push_back(value(depth + 1));
      skip_space();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      expect(']', "',' or ']' in an array");
      return v;
    }
  }

  json integer() {
    json v;
    v.type = json::kind::integer;
    if (s_[pos_] == '-') {
      v.negative = true;
      ++pos_;
    }
    const std::size_t first = pos_;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      const std::uint64_t d = std::uint64_t(s_[pos_] - '0');
      if (v.magnitude > (std::numeric_limits<std::uint64_t>::max() - d) / 10) error("integer too large for 64 bits");
      v.magnitude = v.magnitude * 10 + d;
      ++pos_;
    }
    if (pos_ == first) error("expected digits, found " + describe_here());
    if (s_[first] == '0' && pos_ - first > 1) {
      pos_ = first;
      error("a number must not have leading zeros");
    }
    if (pos_ < s_.size() && (s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E'))
      error("numbers in a safetensors header are integers; found a fraction or an exponent");
    return v;
  }

  unsigned hex4() {
    unsigned u = 0;
    for (int k = 0; k < 4; ++k, ++pos_) {
      if (pos_ >= s_.size()) error("unterminated \\u escape");
      const char c = s_[pos_];
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      if (d < 0) error("a \\u escape needs 4 hex digits, found " + describe_here());
      u = u * 16 + unsigned(d);
    }
    return u;
  }

  std::string string() {
    ++pos_;  // '"'
    std::string out;
    for (;;) {
      if (pos_ >= s_.size()) error("unterminated string");
      const auto c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c < 0x20) error("raw control character " + describe_here() + " in a string; write it as an escape");
      if (c != '\\') {
        out += char(c);
        ++pos_;
        continue;
      }
      ++pos_;
      if (pos_ >= s_.size()) error("unterminated string");
      const char e = s_[pos_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          std::uint32_t cp = hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) error("a \\u escape holds a lone low surrogate");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (s_.substr(pos_, 2) != "\\u") error("a high surrogate \\u escape must be followed by a low one");
            pos_ += 2;
            const std::uint32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) error("a high surrogate \\u escape must be followed by a low one");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default:
          --pos_;
          error("unknown escape sequence: a backslash followed by " + describe_here());
      }
    }
  }

  std::string_view s_;
  std::string context_;
  std::size_t pos_ = 0;
};

/// The header's meaning, checked against the format: every tensor entry is
/// {"dtype": string, "shape": [n, ...], "data_offsets": [begin, end]} and nothing else; its
/// bytes match its dtype and shape; the tensors cover the data exactly, without overlaps or
/// holes (`data_bytes` is what follows the header). "__metadata__" maps strings to strings.
inline safetensors_header interpret(const json& root, std::uint64_t data_bytes, const char* who,
                                    const std::filesystem::path& path) {
  safetensors_header h;
  if (root.type != json::kind::object) st_fail(who, path, "the header is not a JSON object");
  const auto entry_fail = [&](const std::string& name, const std::string& what) {
    st_fail(who, path, "tensor '" + name + "' " + what);
  };
  const auto unsigned_value = [&](const json& v, const std::string& name, const char* field) -> std::uint64_t {
    if (v.type != json::kind::integer) entry_fail(name, std::string("has a non-integer in \"") + field + "\"");
    if (v.negative && v.magnitude != 0) entry_fail(name, std::string("has a negative number in \"") + field + "\"");
    return v.magnitude;
  };
  for (std::size_t k = 0; k < root.keys.size(); ++k) {
    const std::string& name = root.keys[k];
    const json& v = root.items[k];
    if (name == "__metadata__") {
      if (v.type != json::kind::object) st_fail(who, path, "\"__metadata__\" is not an object of strings");
      for (std::size_t m = 0; m < v.keys.size(); ++m) {
        if (v.items[m].type != json::kind::string)
          st_fail(who, path, "\"__metadata__\" entry \"" + v.keys[m] + "\" is not a string");
        h.metadata[v.keys[m]] = v.items[m].text;
      }
      continue;
    }
    if (v.type != json::kind::object) entry_fail(name, "is not described by an object");
    safetensors_entry e;
    e.name = name;
    bool has_dtype = false, has_shape = false, has_offsets = false;
    for (std::size_t f = 0; f < v.keys.size(); ++f) {
      const std::string& field = v.keys[f];
      const json& fv = v.items[f];
      if (field == "dtype") {
        if (fv.type != json::kind::string) entry_fail(name, "has a \"dtype\" that is not a string");
        e.dtype = fv.text;
        has_dtype = true;
      } else if (field == "shape") {
        if (fv.type != json::kind::array) entry_fail(name, "has a \"shape\" that is not an array");
        for (const json& d : fv.items) {
          const std::uint64_t x = unsigned_value(d, name, "shape");
          if (x > std::numeric_limits<std::size_t>::max()) entry_fail(name, "has an extent too large for size_t");
          e.shape.push_back(static_cast<std::size_t>(x));
        }
        has_shape = true;
      } else if (field == "data_offsets") {
        if (fv.type != json::kind::array || fv.items.size() != 2)
          entry_fail(name, "needs \"data_offsets\" of the form [begin, end]");
        e.begin = unsigned_value(fv.items[0], name, "data_offsets");
        e.end = unsigned_value(fv.items[1], name, "data_offsets");
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
  json root = json_parser(text, std::string(who) + ": " + path.string()).parse_document();
  safetensors_header h = interpret(root, size - 8 - n, who, path);
  h.data_start = 8 + n;
  return h;
}

inline void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += "0123456789abcdef"[c >> 4];
          out += "0123456789abcdef"[c & 15];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
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

  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!first) header += ',';
      first = false;
      detail::append_json_string(header, k);
      header += ':';
      detail::append_json_string(header, v);
    }
    header += '}';
  }
  std::vector<std::uint64_t> counts;
  std::uint64_t offset = 0;
  for (const named_tensor& t : tensors) {
    std::uint64_t count = 0;
    if (!detail::element_count(t.shape, count) || count > std::numeric_limits<std::uint64_t>::max() / 4 - offset)
      detail::st_fail(who, path, "tensor '" + t.name + "' has a shape whose size overflows 64 bits");
    if (count != 0 && t.data == nullptr) detail::st_fail(who, path, "tensor '" + t.name + "' has no data pointer");
    if (header.size() > 1) header += ',';
    detail::append_json_string(header, t.name);
    header += ":{\"dtype\":\"F32\",\"shape\":[";
    for (std::size_t d = 0; d < t.shape.size(); ++d) header += (d ? "," : "") + std::to_string(t.shape[d]);
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + 4 * count) + "]}";
    offset += 4 * count;
    counts.push_back(count);
  }
  header += '}';
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
