// Tests for io/safetensors.hpp: round trips, files compared byte for byte with bytes written by
// hand, and every kind of bad file (which must throw and leave the destinations untouched).
#include "solder/io/safetensors.hpp"

#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "support/reference.hpp"
#include "support/temp_dir.hpp"

using namespace solder;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

using solder::test::temp_dir;

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// The 8-byte little-endian length, the header text, the data: a file as the format lays it out.
std::string layout(const std::string& header, const std::string& data) {
  std::string out;
  for (int i = 0; i < 8; ++i) out += char((std::uint64_t(header.size()) >> (8 * i)) & 0xFF);
  return out + header + data;
}

/// Float bits compared exactly (NaN payloads, signed zeros).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Destinations for the two-tensor file used by the bad-file cases, filled with a sentinel.
struct two_destinations {
  std::vector<float> a = std::vector<float>(6, 7.5f), b = std::vector<float>(2, 7.5f);
  std::vector<io::named_tensor_ref> refs() { return {{"a", {2, 3}, a.data()}, {"b", {2}, b.data()}}; }
  bool untouched() const {
    return std::all_of(a.begin(), a.end(), [](float v) { return v == 7.5f; }) &&
           std::all_of(b.begin(), b.end(), [](float v) { return v == 7.5f; });
  }
};

const std::string good_header = R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                                R"("b":{"dtype":"F32","shape":[2],"data_offsets":[24,32]}})";

/// 32 bytes of data: a = 1..6, b = -1, -2.
std::string good_data() {
  const float v[8] = {1, 2, 3, 4, 5, 6, -1, -2};
  return std::string(reinterpret_cast<const char*>(v), sizeof v);
}

}  // namespace

TEST_CASE("safetensors round trip: several tensors, a scalar, 1-D, tails, empty, special values", "[io][safetensors]") {
  temp_dir dir("st_round");
  std::vector<float> w(4 * 3), b(4), s(1), tail(3 * 37), cube(1 * 1 * 2);
  w = solder::test::uniform(12, -1, 1, 1);
  b = solder::test::uniform(4, -1, 1, 2);
  s[0] = -0.0f;
  tail = solder::test::uniform(3 * 37, -100, 100, 3);
  const auto special = solder::test::special_values();
  std::copy_n(special.begin(), 33, tail.begin());  // NaN, infinities, zeros, subnormals...
  cube = {std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max()};
  const std::vector<io::named_tensor> saved{
      {"0.weight", {4, 3}, w.data()}, {"0.bias", {4}, b.data()},  {"scale", {}, s.data()},
      {"tail", {3, 37}, tail.data()}, {"empty", {2, 0}, nullptr}, {"odd name/with:chars", {1, 1, 2}, cube.data()}};
  const fs::path file = dir.path / "model.safetensors";
  io::save_safetensors(file, saved, {{"format", "pt"}, {"note", "line\n\"quoted\""}});
  CHECK_FALSE(fs::exists(dir.path / "model.safetensors.tmp"));

  std::vector<float> w2(12, 9), b2(4, 9), s2(1, 9), tail2(111, 9), cube2(2, 9);
  io::load_safetensors(file, {{"tail", {3, 37}, tail2.data()},  // any order
                              {"0.weight", {4, 3}, w2.data()},
                              {"0.bias", {4}, b2.data()},
                              {"scale", {}, s2.data()},
                              {"empty", {2, 0}, nullptr},
                              {"odd name/with:chars", {1, 1, 2}, cube2.data()}});
  CHECK(same_bits(w2, w));
  CHECK(same_bits(b2, b));
  CHECK(same_bits(s2, s));
  CHECK(std::signbit(s2[0]));
  CHECK(same_bits(tail2, tail));
  CHECK(same_bits(cube2, cube));

  // Tensors that are not asked for are allowed.
  std::vector<float> only(4, 9);
  io::load_safetensors(file, {{"0.bias", {4}, only.data()}});
  CHECK(same_bits(only, b));

  const io::safetensors_header h = io::read_safetensors_header(file);
  REQUIRE(h.tensors.size() == 6);
  CHECK(h.tensors[0].name == "0.weight");  // data order = the order saved
  CHECK(h.tensors[0].dtype == "F32");
  CHECK(h.tensors[0].shape == std::vector<std::size_t>{4, 3});
  CHECK(h.tensors[0].begin == 0);
  CHECK(h.tensors[0].end == 48);
  CHECK(h.tensors[2].shape.empty());
  CHECK(h.tensors[4].begin == h.tensors[4].end);
  CHECK(h.metadata == io::safetensors_metadata{{"format", "pt"}, {"note", "line\n\"quoted\""}});
  CHECK(h.data_start % 8 == 0);  // the header is padded so the data is aligned
  CHECK(fs::file_size(file) == h.data_start + 4 * (12 + 4 + 1 + 111 + 2));

  // Saving again replaces the file.
  io::save_safetensors(file, {{"x", {1}, s.data()}});
  CHECK(io::read_safetensors_header(file).tensors.size() == 1);
}

TEST_CASE("safetensors files match bytes written by hand", "[io][safetensors]") {
  // The cases of the reference implementation's own serialization tests (huggingface/safetensors,
  // safetensors/src/tensor.rs: test_serialization, test_serialization_forced_alignement,
  // test_empty), written out here by hand.
  temp_dir dir("st_bytes");
  const float v[6] = {0, 1, 2, 3, 4, 5};
  // 0, 1, 2, 3, 4, 5 as little-endian IEEE-754 float32.
  const std::string data(
      "\x00\x00\x00\x00"
      "\x00\x00\x80\x3f"
      "\x00\x00\x00\x40"
      "\x00\x00\x40\x40"
      "\x00\x00\x80\x40"
      "\x00\x00\xa0\x40",
      24);

  SECTION("a header of exactly 64 bytes, no padding") {
    const std::string header = R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";
    REQUIRE(header.size() == 64);
    const std::string expected = std::string("\x40\x00\x00\x00\x00\x00\x00\x00", 8) + header + data;
    io::save_safetensors(dir.path / "a.safetensors", {{"attn.0", {1, 2, 3}, v}});
    CHECK(read_bytes(dir.path / "a.safetensors") == expected);
  }
  SECTION("a 65-byte header padded with 7 spaces to 72") {
    const std::string header = R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}})"
                               "       ";
    REQUIRE(header.size() == 72);
    const std::string expected = std::string("\x48\x00\x00\x00\x00\x00\x00\x00", 8) + header + data;
    io::save_safetensors(dir.path / "b.safetensors", {{"attn0", {1, 1, 2, 3}, v}});
    CHECK(read_bytes(dir.path / "b.safetensors") == expected);

    std::vector<float> back(6, -1);
    io::load_safetensors(dir.write("hand.safetensors", expected), {{"attn0", {1, 1, 2, 3}, back.data()}});
    CHECK(back == std::vector<float>(v, v + 6));
  }
  SECTION("no tensors, with and without metadata") {
    io::save_safetensors(dir.path / "e.safetensors", std::span<const io::named_tensor>());
    CHECK(read_bytes(dir.path / "e.safetensors") == std::string("\x08\x00\x00\x00\x00\x00\x00\x00{}      ", 16));
    io::save_safetensors(dir.path / "m.safetensors", std::span<const io::named_tensor>(), {{"framework", "pt"}});
    CHECK(read_bytes(dir.path / "m.safetensors") ==
          std::string("\x28\x00\x00\x00\x00\x00\x00\x00", 8) + R"({"__metadata__":{"framework":"pt"}})" + "     ");
    CHECK(io::read_safetensors_header(dir.path / "e.safetensors").tensors.empty());
  }
}

TEST_CASE("safetensors names with JSON escapes, both ways", "[io][safetensors]") {
  temp_dir dir("st_names");
  const float one = 1.0f, two = 2.0f;
  const std::string odd = "q\"b\\s\nt\t\x01 caf\xc3\xa9 \xf0\x9f\x98\x80";  // quote, backslash, controls, é, 😀
  io::save_safetensors(dir.path / "n.safetensors", {{odd, {}, &one}});
  const std::string bytes = read_bytes(dir.path / "n.safetensors");
  CHECK_THAT(bytes, Contains(R"("q\"b\\s\nt\t\u0001 caf)"));
  float back = 0;
  io::load_safetensors(dir.path / "n.safetensors", {{odd, {}, &back}});
  CHECK(back == 1.0f);

  // Escapes written by hand: \u00e9, a surrogate pair for U+1F600, an escaped slash.
  const std::string header = R"({"caf\u00e9 \ud83d\ude00 \/":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})";
  const fs::path p = dir.write("h.safetensors", layout(header, std::string(reinterpret_cast<const char*>(&two), 4)));
  io::load_safetensors(p, {{"caf\xc3\xa9 \xf0\x9f\x98\x80 /", {}, &back}});
  CHECK(back == 2.0f);
}

TEST_CASE("bad safetensors files throw, naming the problem, and leave the destinations untouched",
          "[io][safetensors]") {
  temp_dir dir("st_bad");
  two_destinations dst;
  // Loads `bytes` into both destinations; must throw solder::error whose message has `what`.
  const auto rejects = [&](const std::string& bytes, const std::string& what) {
    const fs::path p = dir.write("bad.safetensors", bytes);
    CHECK_THROWS_AS(io::load_safetensors(p, dst.refs()), solder::error);
    CHECK_THROWS_WITH(io::load_safetensors(p, dst.refs()), Contains(what) && Contains("bad.safetensors"));
    CHECK(dst.untouched());
  };
  // A copy of good_header with `from` replaced by `to`.
  const auto edit = [](std::string from, std::string to) {
    std::string h = good_header;
    const auto at = h.find(from);
    REQUIRE(at != std::string::npos);
    return h.replace(at, from.size(), to);
  };

  SECTION("the good file loads (the cases below differ from it in one thing)") {
    io::load_safetensors(dir.write("good.safetensors", layout(good_header, good_data())), dst.refs());
    CHECK(dst.a == std::vector<float>{1, 2, 3, 4, 5, 6});
    CHECK(dst.b == std::vector<float>{-1, -2});
  }
  SECTION("missing tensor") {
    const fs::path p = dir.write("bad.safetensors", layout(good_header, good_data()));
    std::vector<float> c(3, 7.5f);
    auto refs = dst.refs();
    refs.push_back({"3.weight", {3}, c.data()});
    CHECK_THROWS_WITH(io::load_safetensors(p, refs),
                      Contains("no tensor named '3.weight'") && Contains("it holds 2: 'a', 'b'"));
    CHECK(dst.untouched());
    CHECK(c == std::vector<float>(3, 7.5f));
  }
  SECTION("wrong shape") {
    const fs::path p = dir.write("bad.safetensors", layout(good_header, good_data()));
    CHECK_THROWS_WITH(io::load_safetensors(p, {{"a", {2, 3}, dst.a.data()}, {"b", {1, 2}, dst.b.data()}}),
                      Contains("tensor 'b' has shape [2] in the file, but the destination expects [1, 2]"));
    CHECK_THROWS_WITH(io::load_safetensors(p, {{"a", {3, 2}, dst.a.data()}}),
                      Contains("tensor 'a' has shape [2, 3]") && Contains("expects [3, 2]"));
    CHECK(dst.untouched());  // 'a' was fine in the first call, and still not written
  }
  SECTION("wrong dtype") {
    rejects(layout(edit(R"("F32","shape":[2])", R"("F16","shape":[4])"), good_data()),
            "tensor 'b' has dtype F16; solder loads F32 only");
    rejects(layout(edit(R"("F32","shape":[2])", R"("Q7","shape":[2])"), good_data()),
            "has dtype Q7 (unknown to the format)");
    // The same file is fine when the F16 tensor is not asked for.
    const fs::path p =
        dir.write("f16.safetensors", layout(edit(R"("F32","shape":[2])", R"("F16","shape":[4])"), good_data()));
    io::load_safetensors(p, {{"a", {2, 3}, dst.a.data()}});
    CHECK(dst.a[5] == 6.0f);
    CHECK(io::read_safetensors_header(p).tensors[1].dtype == "F16");
  }
  SECTION("truncated data") {
    std::string bytes = layout(good_header, good_data());
    bytes.resize(bytes.size() - 4);
    rejects(bytes, "tensor 'b' has data_offsets [24, 32] past the end of the data (28 bytes follow the header)");
    rejects(bytes, "truncated");
  }
  SECTION("truncated header") {
    const std::string bytes = layout(good_header, good_data());
    rejects(bytes.substr(0, 5), "is 5 bytes long, too short for the 8-byte header length");
    rejects(bytes.substr(0, 0), "is 0 bytes long");
    rejects(bytes.substr(0, 60), "the header length 112 runs past the end of the file (60 bytes)");
  }
  SECTION("bad JSON") {
    struct bad {
      std::string header, what;
    };
    const std::vector<bad> cases{
        {edit("]}}", "]},}"), "expected a string key, found '}'"},
        {good_header.substr(0, good_header.size() - 1), "expected ',' or '}' in an object, found end of the header"},
        {edit(R"("b")", R"("b)"), "expected ':' after an object key"},
        {R"({"a)", "unterminated string"},
        {edit(R"("b")", R"("b\x")"), "unknown escape sequence: a backslash followed by 'x'"},
        {edit(R"("b")", R"("\udc00")"), "lone low surrogate"},
        {edit(R"("b")", R"("\ud800x")"), "must be followed by a low one"},
        {edit(R"("b")", R"("\u12")"), "needs 4 hex digits"},
        {edit("[2,3]", "[2.0,3]"), "fraction or an exponent"},
        {edit("[2,3]", "[2e1,3]"), "fraction or an exponent"},
        {edit("[2,3]", "[02,3]"), "leading zeros"},
        {edit("[2,3]", "[-2,3]"), "tensor 'a' has a negative number in \"shape\""},
        {edit("[2,3]", "[2,-]"), "expected digits"},
        {edit("[2,3]", "[2,3,]"), "expected a value, found ']'"},
        {edit("[2,3]", "true"), "true, false and null have no place"},
        {edit("[2,3]", "null"), "true, false and null have no place"},
        {edit("[0,24]", "[0,18446744073709551616]"), "integer too large for 64 bits"},
        {edit(R"("b")", R"("a")"), "duplicate key \"a\""},
        {edit(R"("dtype":"F32","shape":[2])", R"("dtype":"F32","dtype":"F32","shape":[2])"), "duplicate key \"dtype\""},
        {edit(R"("b")", "\"b\n\""), "raw control character byte 0x0a"},
        {good_header + " x", "unexpected 'x' after the end of the top-level value"},
        {"[" + good_header + "]", "the header does not start with '{'"},
        {"", "the header does not start with '{'"},
        {edit(R"("b")", "\"\xff\""), "the header is not valid UTF-8"},
        {edit(R"("b")", "\"\xc0\xaf\""), "the header is not valid UTF-8"},  // overlong '/'
        {R"({"a":)" + std::string(70, '[') + std::string(70, ']') + "}", "nested deeper than 64 levels"},
        {R"({"a":[1]})", "tensor 'a' is not described by an object"},
        {edit(R"(,"data_offsets":[24,32])", ""), "tensor 'b' lacks \"data_offsets\""},
        {edit(R"("dtype":"F32","shape":[2])", R"("dtype":"F32","foo":"x","shape":[2])"), "unknown field \"foo\""},
        {edit("[24,32]", "[24,32,40]"), "needs \"data_offsets\" of the form [begin, end]"},
        {edit("[24,32]", R"([24,"32"])"), "has a non-integer in \"data_offsets\""},
        {edit(R"("F32","shape":[2])", R"(7,"shape":[2])"), "has a \"dtype\" that is not a string"},
        {edit(R"({"a":)", R"({"__metadata__":{"n":1},"a":)"), "\"__metadata__\" entry \"n\" is not a string"},
        {edit(R"({"a":)", R"({"__metadata__":[],"a":)"), "\"__metadata__\" is not an object of strings"},
    };
    for (const bad& c : cases) {
      INFO(c.header);
      rejects(layout(c.header, good_data()), c.what);
    }
    rejects(layout(edit(R"("b")", "\"\n\""), good_data()), "malformed JSON header at byte 58");
  }
  SECTION("offsets that overlap, leave holes, run backwards or disagree with the shape") {
    rejects(layout(edit("[24,32]", "[16,24]"), good_data().substr(0, 24)),
            "tensors 'a' [0, 24] and 'b' [16, 24] overlap");
    rejects(layout(edit("[24,32]", "[28,36]"), good_data() + "1234"), "data bytes [24, 28) belong to no tensor");
    rejects(layout(good_header, good_data() + "1234"), "4 bytes after the last tensor's data belong to no tensor");
    rejects(layout(edit("[0,24]", "[24,0]"), good_data()),
            "tensor 'a' has data_offsets [24, 0] that end before they begin");
    rejects(layout(edit("[0,24]", "[0,20]"), good_data()),
            "tensor 'a' of dtype F32 and shape [2, 3] needs 24 bytes, but its data_offsets [0, 20] hold 20");
    rejects(layout(edit("[2,3]", "[4294967296,4294967296]"), good_data()), "element count overflows 64 bits");
  }
  SECTION("a header length beyond the format's limit") {
    const fs::path p = dir.write("bad.safetensors", layout(std::string(1, '{'), ""));
    {
      std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
      const unsigned char len[8] = {0x01, 0xe1, 0xf5, 0x05, 0, 0, 0, 0};  // 100000001
      f.write(reinterpret_cast<const char*>(len), 8);
    }
    fs::resize_file(p, 100'000'020);  // sparse: costs no disk
    CHECK_THROWS_WITH(io::load_safetensors(p, dst.refs()), Contains("exceeds the format's limit of 100000000 bytes"));
    CHECK(dst.untouched());
  }
  SECTION("no such file, or a directory") {
    CHECK_THROWS_WITH(io::load_safetensors(dir.path / "absent.safetensors", dst.refs()),
                      Contains("absent.safetensors: no such file"));
    CHECK_THROWS_WITH(io::load_safetensors(dir.path, dst.refs()), Contains("is a directory"));
    CHECK(dst.untouched());
  }
  SECTION("a null destination") {
    const fs::path p = dir.write("bad.safetensors", layout(good_header, good_data()));
    CHECK_THROWS_WITH(io::load_safetensors(p, {{"a", {2, 3}, dst.a.data()}, {"b", {2}, nullptr}}),
                      Contains("the destination of tensor 'b' has no data pointer"));
    CHECK(dst.untouched());
  }
}

TEST_CASE("safetensors headers that JSON allows and the format does not are refused", "[io][safetensors]") {
  // Duplicate keys (which a JSON parser may silently resolve), numbers that are not 64-bit
  // integers, true/false/null, invalid UTF-8, NUL bytes, and what follows the closing brace.
  temp_dir dir("st_strict");
  two_destinations dst;
  const auto rejects = [&](const std::string& header, const std::string& what) {
    INFO(header);
    const fs::path p = dir.write("strict.safetensors", layout(header, good_data()));
    CHECK_THROWS_WITH(io::load_safetensors(p, dst.refs()), Contains(what) && Contains("strict.safetensors"));
    CHECK_THROWS_WITH(io::read_safetensors_header(p), Contains(what));
    CHECK(dst.untouched());
  };
  const auto edit = [](std::string from, std::string to) {
    std::string h = good_header;
    const auto at = h.find(from);
    REQUIRE(at != std::string::npos);
    return h.replace(at, from.size(), to);
  };
  const std::string nul(1, '\0');

  SECTION("duplicate keys, at any depth, compared after unescaping") {
    rejects(edit(R"("b")", R"("a")"), "malformed JSON header at byte 57: duplicate key \"a\"");
    rejects(edit(R"("b")", R"("\u0061")"), "malformed JSON header at byte 57: duplicate key \"a\"");
    rejects(edit(R"("data_offsets":[24,32])", R"("data_offsets":[24,32],"shape":[2])"), "duplicate key \"shape\"");
    rejects(edit(R"("data_offsets":[0,24])", R"("data_offsets":[0,24],"data_offsets":[0,24])"),
            "duplicate key \"data_offsets\"");
    rejects(edit(R"({"a":)", R"({"__metadata__":{},"__metadata__":{"k":"v"},"a":)"),
            "malformed JSON header at byte 19: duplicate key \"__metadata__\"");
    rejects(edit(R"({"a":)", R"({"__metadata__":{"k":"1","k":"2"},"a":)"), "duplicate key \"k\"");
    // Many members: past the size where members are searched one by one.
    std::string many = R"({"__metadata__":{)", tensors;
    for (int i = 0; i < 40; ++i) many += "\"m" + std::to_string(i) + "\":\"v\",";
    rejects(edit(R"({"a":)", many + R"("m7":"w"},"a":)"), "duplicate key \"m7\"");
    for (int i = 0; i < 40; ++i)
      tensors += "\"e" + std::to_string(i) + R"(":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)";
    rejects(edit(R"({"a":)", "{" + tensors + R"("e39":{},"a":)"), "duplicate key \"e39\"");
  }
  SECTION("numbers must be 64-bit integers, not negative where a size or offset belongs") {
    rejects(edit("[0,24]", "[0,24.0]"), "fraction or an exponent");
    rejects(edit("[0,24]", "[0,2.4e1]"), "fraction or an exponent");
    rejects(edit("[0,24]", "[0,24E0]"), "fraction or an exponent");
    rejects(edit("[0,24]", "[0,-0.0]"), "fraction or an exponent");
    rejects(edit("[2,3]", "[1e3,3]"), "fraction or an exponent");
    rejects(edit("[2,3]", "[2.,3]"), "fraction or an exponent");
    rejects(edit("[2,3]", "[2e+,3]"), "fraction or an exponent");
    rejects(edit("[2,3]", "[1e999,3]"), "fraction or an exponent");
    rejects(edit("[0,24]", "[-1,24]"), "tensor 'a' has a negative number in \"data_offsets\"");
    rejects(edit("[2,3]", "[2,-1]"), "tensor 'a' has a negative number in \"shape\"");
    rejects(edit("[2,3]", "[-9223372036854775809,3]"), "tensor 'a' has a negative number in \"shape\"");
    rejects(edit("[2,3]", "[99999999999999999999,3]"), "at byte 48: integer too large for 64 bits");
    rejects(edit("[2,3]", "[-18446744073709551616,3]"), "integer too large for 64 bits");
    rejects(edit("[2,3]", "[1" + std::string(400, '0') + ",3]"), "integer too large for 64 bits");
    rejects(edit("[0,24]", "[00,24]"), "a number must not have leading zeros");
    rejects(edit("[0,24]", "[0,-024]"), "a number must not have leading zeros");
    // 2^64 - 1 is an integer: the offsets are then refused for what they say.
    rejects(edit("[0,24]", "[0,18446744073709551615]"), "past the end of the data");
  }
  SECTION("true, false and null") {
    rejects(edit(R"("F32","shape":[2,3])", R"(true,"shape":[2,3])"), "true, false and null have no place");
    rejects(edit("[0,24]", "[0,false]"), "true, false and null have no place");
    rejects(edit("[2,3]", "[null]"), "true, false and null have no place");
    rejects(edit(R"({"a":)", R"({"__metadata__":{"k":null},"a":)"), "true, false and null have no place");
    rejects(edit("[2,3]", "[tru]"), "expected a value, found 't'");
  }
  SECTION("invalid UTF-8 anywhere in the header") {
    rejects(edit(R"("b")", "\"\xed\xa0\x80\""), "the header is not valid UTF-8");      // an encoded surrogate
    rejects(edit(R"("b")", "\"\xf4\x90\x80\x80\""), "the header is not valid UTF-8");  // above U+10FFFF
    rejects(edit(R"("b")", "\"b\xe2\x82\""), "the header is not valid UTF-8");         // a cut sequence
    rejects(edit(R"({"a":)", "{\"__metadata__\":{\"k\":\"\xc3\"},\"a\":"), "the header is not valid UTF-8");
  }
  SECTION("NUL bytes, a byte-order mark, comments, deep nesting") {
    rejects(good_header + nul, "at byte 112: unexpected byte 0x00 after the end of the top-level value");
    rejects(good_header + "  " + nul + R"({"c":1})", "at byte 114: unexpected byte 0x00 after the end");
    rejects(edit("[2,3]", "[2," + nul + "]"), "expected a value, found byte 0x00");
    rejects(edit(R"("b")", "\"b" + nul + "\""), "raw control character byte 0x00 in a string");
    rejects("\xef\xbb\xbf" + good_header, "the header does not start with '{'");
    rejects(edit(R"(,"b")", R"(,/**/"b")"), "expected a string key, found '/'");
    rejects(R"({"a":)" + std::string(64, '[') + "1" + std::string(64, ']') + "}", "nested deeper than 64 levels");
    rejects(R"({"a":)" + std::string(63, '[') + "1" + std::string(63, ']') + "}",
            "tensor 'a' is not described by an object");
  }
  SECTION("whitespace between tokens is allowed") {
    const std::string spaced =
        " {\r\n\t\"a\" : { \"dtype\" : \"F32\" , \"shape\" : [ 2 , 3 ] , \"data_offsets\" : [ 0 , 24 ] } ,"
        "\n\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[24,32]}\t} ";
    rejects(spaced, "the header does not start with '{'");
    io::load_safetensors(dir.write("spaced.safetensors", layout(spaced.substr(1), good_data())), dst.refs());
    CHECK(dst.a == std::vector<float>{1, 2, 3, 4, 5, 6});
    CHECK(dst.b == std::vector<float>{-1, -2});
  }
}

TEST_CASE("safetensors headers escape exactly the control characters, quote and backslash", "[io][safetensors]") {
  temp_dir dir("st_escape");
  const float one = 1.0f;
  // '/' and DEL stay as they are, as does UTF-8; U+0001 becomes \u0001, a newline \n.
  io::save_safetensors(dir.path / "e.safetensors", {{"q\"\\/\x01\x7f\xc3\xa9", {}, &one}}, {{"k\n", "\t"}});
  const std::string header =
      "{\"__metadata__\":{\"k\\n\":\"\\t\"},\"q\\\"\\\\/\\u0001\x7f\xc3\xa9\":"
      R"({"dtype":"F32","shape":[],"data_offsets":[0,4]}})"
      " ";
  REQUIRE(header.size() == 96);
  CHECK(read_bytes(dir.path / "e.safetensors") ==
        layout(header, std::string(reinterpret_cast<const char*>(&one), sizeof one)));
  const io::safetensors_header h = io::read_safetensors_header(dir.path / "e.safetensors");
  REQUIRE(h.tensors.size() == 1);
  CHECK(h.tensors[0].name == "q\"\\/\x01\x7f\xc3\xa9");
  CHECK(h.metadata == io::safetensors_metadata{{"k\n", "\t"}});
}

TEST_CASE("every truncation and many corruptions of a file either load or throw solder::error", "[io][safetensors]") {
  // No crash, no other exception, and a failed load writes nothing (run under ASan in CI).
  temp_dir dir("st_fuzz");
  const std::string good = layout(good_header, good_data());
  std::size_t loaded = 0, refused = 0;
  const auto attempt = [&](const std::string& bytes) {
    const fs::path p = dir.write("f.safetensors", bytes);
    two_destinations dst;
    try {
      io::load_safetensors(p, dst.refs());
      ++loaded;
    } catch (const solder::error&) {
      ++refused;
      CHECK(dst.untouched());
    }
  };
  for (std::size_t n = 0; n < good.size(); ++n) attempt(good.substr(0, n));
  for (std::size_t i = 0; i < 8 + good_header.size(); ++i)
    for (const char c : {'\0', '"', '{', '[', ',', '9', '\\', '\x80'}) {
      std::string bytes = good;
      bytes[i] = c;
      attempt(bytes);
    }
  CHECK(refused >= good.size());  // every truncation is refused
  CHECK(loaded > 0);              // some corruptions are harmless (a digit for a digit, data bytes)
}

TEST_CASE("save_safetensors refuses bad input and leaves an existing file as it was", "[io][safetensors]") {
  temp_dir dir("st_save");
  const float v[2] = {1, 2};
  const fs::path file = dir.path / "keep.safetensors";
  io::save_safetensors(file, {{"w", {2}, v}});
  const std::string before = read_bytes(file);

  const auto refuses = [&](std::vector<io::named_tensor> tensors, const std::string& what) {
    CHECK_THROWS_WITH(io::save_safetensors(file, tensors), Contains(what) && Contains("keep.safetensors"));
    CHECK(read_bytes(file) == before);
    CHECK_FALSE(fs::exists(dir.path / "keep.safetensors.tmp"));
  };
  refuses({{"w", {2}, v}, {"w", {1}, v}}, "two tensors are named 'w'");
  refuses({{"", {2}, v}}, "a tensor has an empty name");
  refuses({{"__metadata__", {2}, v}}, "\"__metadata__\" is reserved");
  refuses({{"w", {2}, nullptr}}, "tensor 'w' has no data pointer");
  refuses({{"bad\xff", {2}, v}}, "is not valid UTF-8");
  refuses({{"huge", {std::size_t(1) << 62, 8}, v}}, "overflows 64 bits");
  CHECK_THROWS_WITH(io::save_safetensors(file, {{"w", {2}, v}}, {{"k", "\xfe"}}), Contains("metadata entry 'k'"));

  CHECK_THROWS_WITH(io::save_safetensors(dir.path / "no" / "such" / "dir.safetensors", {{"w", {2}, v}}),
                    Contains("cannot create") && Contains("dir.safetensors.tmp"));
  fs::create_directory(dir.path / "taken");
  CHECK_THROWS_WITH(io::save_safetensors(dir.path / "taken", {{"w", {2}, v}}), Contains("cannot rename"));
  CHECK_FALSE(fs::exists(dir.path / "taken.tmp"));
}

TEST_CASE("a file written by examples/export_torch.py loads (manual, see docs/io.md)", "[.][torch]") {
  // SOLDER_TORCH_FILE: a file from `export_torch.py write`; SOLDER_TORCH_RESAVE (optional): where
  // to save what was loaded, for `export_torch.py verify` to compare with PyTorch's tensors.
  const char* in = std::getenv("SOLDER_TORCH_FILE");
  if (!in) FAIL("set SOLDER_TORCH_FILE to a file written by examples/export_torch.py");
  struct layer {
    std::string name;
    std::size_t out, in;
  };
  const std::vector<layer> layers{{"0", 256, 64}, {"3", 128, 256}, {"6", 10, 128}};
  std::vector<std::vector<float>> storage;
  std::vector<io::named_tensor_ref> refs;
  for (const layer& l : layers) {
    storage.emplace_back(l.out * l.in, NAN);
    refs.push_back({l.name + ".weight", {l.out, l.in}, storage.back().data()});
    storage.emplace_back(l.out, NAN);
    refs.push_back({l.name + ".bias", {l.out}, storage.back().data()});
  }
  for (std::size_t i = 0; i < refs.size(); ++i) refs[i].data = storage[i].data();  // after the last reallocation
  io::load_safetensors(in, refs);
  // PyTorch's nn.Linear initializes weight and bias uniform in [-1/sqrt(in), 1/sqrt(in)].
  for (std::size_t i = 0; i < refs.size(); ++i) {
    INFO(refs[i].name);
    const double bound = 1.0 / std::sqrt(double(layers[i / 2].in));
    CHECK(std::all_of(storage[i].begin(), storage[i].end(), [&](float v) { return std::abs(v) <= bound; }));
    CHECK(std::any_of(storage[i].begin(), storage[i].end(), [](float v) { return v != 0.0f; }));
  }
  if (const char* out = std::getenv("SOLDER_TORCH_RESAVE")) {
    std::vector<io::named_tensor> saved;
    for (const auto& r : refs) saved.push_back({r.name, r.shape, r.data});
    io::save_safetensors(out, saved, {{"format", "pt"}});
  }
}
