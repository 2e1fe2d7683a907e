// data/csv.hpp: numeric CSV files (every field a number, every line the same number of fields),
// read as a table of floats or as a labeled data set.
#pragma once

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "solder/config.hpp"
#include "solder/data/dataset.hpp"

namespace solder::data {

/// How a CSV file is read.
struct csv_options {
  char delimiter = ',';
  /// Skip the first non-blank line (column names).
  bool header = false;
};

/// A numeric table: `rows * columns` floats, row-major.
struct csv_table {
  std::size_t rows = 0;
  std::size_t columns = 0;
  std::vector<float> values{};

  std::span<const float> row(std::size_t i) const { return {values.data() + i * columns, columns}; }
};

namespace detail {

/// "solder::data::read_csv: path:line: what" (line 0: no line).
[[noreturn]] inline void csv_fail(const char* who, const std::filesystem::path& path, std::size_t line,
                                  const std::string& what) {
  std::string m = std::string(who) + ": " + path.string();
  if (line) m += ":" + std::to_string(line);
  solder::detail::fail(m + ": " + what);
}

inline std::string field_text(std::string_view f) {
  constexpr std::size_t shown = 40;
  // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on the operator+ chain.
  std::string s = "\"";
  s.append(f.substr(0, shown));
  s.append(f.size() > shown ? "...\"" : "\"");
  return s;
}

/// The whole file; a missing file, a directory or a read error throws, naming the path.
inline std::string read_text(const char* who, const std::filesystem::path& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) csv_fail(who, path, 0, "no such file");
  if (std::filesystem::is_directory(status)) csv_fail(who, path, 0, "is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) csv_fail(who, path, 0, "cannot be opened for reading");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) csv_fail(who, path, 0, "read error");
  return text;
}

/// Calls on_record(line_number, fields) for every line that is not blank (nor the header, when
/// options.header). Fields are split at the delimiter and trimmed of spaces and tabs; a
/// trailing '\r' (Windows line ends) is dropped.
template <class F>
void for_each_record(const char* who, const std::filesystem::path& path, const csv_options& options, F&& on_record) {
  const std::string text = read_text(who, path);
  const auto trim = [](std::string_view s) {
    const auto first = s.find_first_not_of(" \t");
    if (first == std::string_view::npos) return std::string_view();
    return s.substr(first, s.find_last_not_of(" \t") - first + 1);
  };
  std::vector<std::string_view> fields;
  bool header_pending = options.header;
  std::size_t line_no = 0;
  for (std::size_t pos = 0; pos < text.size();) {
    ++line_no;
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (trim(line).empty()) continue;
    if (header_pending) {
      header_pending = false;
      continue;
    }
    fields.clear();
    for (std::size_t start = 0;;) {
      const std::size_t cut = line.find(options.delimiter, start);
      fields.push_back(trim(line.substr(start, cut == std::string_view::npos ? cut : cut - start)));
      if (cut == std::string_view::npos) break;
      start = cut + 1;
    }
    on_record(line_no, std::span<const std::string_view>(fields));
  }
}

/// Parses one field as a float (std::from_chars: decimal or scientific, "nan", "inf"; an
/// optional leading '+'); anything else throws, naming the line, the column and the text.
inline float parse_float(const char* who, const std::filesystem::path& path, std::size_t line, std::size_t column,
                         std::string_view f) {
  const std::string where = "field " + std::to_string(column + 1) + " ";
  if (f.empty()) csv_fail(who, path, line, where + "is empty; every field must be a number");
  std::string_view digits = f;
  if (digits.size() > 1 && digits[0] == '+' && digits[1] != '-' && digits[1] != '+') digits.remove_prefix(1);
  float v = 0.0f;
  const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (r.ec == std::errc::result_out_of_range)
    csv_fail(who, path, line, where + field_text(f) + " is outside the range of float");
  if (r.ec != std::errc() || r.ptr != digits.data() + digits.size()) {
    std::string hint = line == 1 ? "; if the first line names the columns, set csv_options::header" : "";
    csv_fail(who, path, line, where + field_text(f) + " is not a number" + hint);
  }
  return v;
}

}  // namespace detail

/// Reads a CSV file of numbers into a table. Blank lines are skipped; every other line must
/// have as many fields as the first. Fields are decimal or scientific numbers ("nan" and "inf"
/// are read as such); quotes are not understood. Throws solder::error naming the file, the line
/// and the problem: a missing file, a non-numeric or empty field, a line with another number of
/// fields. An empty file gives an empty table.
inline csv_table read_csv(const std::filesystem::path& path, const csv_options& options = {}) {
  constexpr const char* who = "solder::data::read_csv";
  csv_table t;
  std::size_t first_line = 0;
  detail::for_each_record(who, path, options, [&](std::size_t line, std::span<const std::string_view> fields) {
    if (t.rows == 0) {
      t.columns = fields.size();
      first_line = line;
    } else if (fields.size() != t.columns) {
      detail::csv_fail(who, path, line,
                       "this line has " + std::to_string(fields.size()) + " fields, but line " +
                           std::to_string(first_line) + " has " + std::to_string(t.columns) +
                           "; every line needs the same number");
    }
    for (std::size_t c = 0; c < fields.size(); ++c)
      t.values.push_back(detail::parse_float(who, path, line, c, fields[c]));
    ++t.rows;
  });
  return t;
}

/// Reads a CSV file whose every line holds `features` numbers and one label: a non-negative
/// integer (digits only, at most 2^31 - 1) in column `label_column` (0-based, 0..features); the
/// features are the other columns, in order. Features must be finite. For the digits file:
/// load_labeled_csv("examples/data/digits.csv", 64, 64). Throws solder::error naming the file,
/// the line and the problem (as read_csv, plus: a wrong number of fields, a bad label, a
/// non-finite feature, no samples at all).
inline labeled_dataset load_labeled_csv(const std::filesystem::path& path, std::size_t features,
                                        std::size_t label_column, const csv_options& options = {}) {
  constexpr const char* who = "solder::data::load_labeled_csv";
  if (features == 0) detail::csv_fail(who, path, 0, "a sample needs at least 1 feature");
  if (label_column > features)
    detail::csv_fail(who, path, 0,
                     "label_column " + std::to_string(label_column) + " is past the last of the " +
                         std::to_string(features + 1) + " columns (" + std::to_string(features) +
                         " features and the label)");
  labeled_dataset d;
  d.features = features;
  detail::for_each_record(who, path, options, [&](std::size_t line, std::span<const std::string_view> fields) {
    if (fields.size() != features + 1)
      detail::csv_fail(who, path, line,
                       "this line has " + std::to_string(fields.size()) + " fields; expected " +
                           std::to_string(features + 1) + " (" + std::to_string(features) + " features and a label)");
    for (std::size_t c = 0; c < fields.size(); ++c) {
      if (c == label_column) continue;
      const float v = detail::parse_float(who, path, line, c, fields[c]);
      if (!std::isfinite(v))
        detail::csv_fail(who, path, line,
                         "field " + std::to_string(c + 1) + " " + detail::field_text(fields[c]) +
                             " is not finite; features must be finite numbers");
      d.x.push_back(v);
    }
    const std::string_view f = fields[label_column];
    std::uint64_t label = 0;
    const auto r = std::from_chars(f.data(), f.data() + f.size(), label);
    const bool digits_only = !f.empty() && f.find_first_not_of("0123456789") == std::string_view::npos;
    if (!digits_only || r.ptr != f.data() + f.size())
      detail::csv_fail(who, path, line,
                       "label " + detail::field_text(f) + " (field " + std::to_string(label_column + 1) +
                           ") is not a non-negative integer");
    if (r.ec == std::errc::result_out_of_range || label > std::uint64_t(std::numeric_limits<std::int32_t>::max()))
      detail::csv_fail(who, path, line,
                       "label " + detail::field_text(f) + " (field " + std::to_string(label_column + 1) +
                           ") is too large; labels are class indices of at most 2147483647");
    d.y.push_back(static_cast<std::int32_t>(label));
  });
  if (d.size() == 0) detail::csv_fail(who, path, 0, "holds no samples");
  return d;
}

}  // namespace solder::data
