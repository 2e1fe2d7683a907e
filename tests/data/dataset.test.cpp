// Tests for data/csv.hpp and data/dataset.hpp: the digits file, bad CSV files, the seeded
// shuffle against hand-computed values, splits, scaling and per-epoch batches.
#include "solder/data/dataset.hpp"

#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>

#include "support/temp_dir.hpp"
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "solder/data/csv.hpp"

using namespace solder;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

/// examples/data/digits.csv. SOLDER_DIGITS_CSV may name it; otherwise it is found from this
/// source file's path (which CMake passes to the compiler as an absolute path).
fs::path digits_path() {
#ifdef SOLDER_DIGITS_CSV
  return fs::path(SOLDER_DIGITS_CSV);
#else
  return fs::path(__FILE__).parent_path() / ".." / ".." / "examples" / "data" / "digits.csv";
#endif
}

using solder::test::temp_dir;

/// n samples of f features: x[i][j] = 100 i + j (a row names its sample), y[i] = i % classes.
data::labeled_dataset numbered(std::size_t n, std::size_t f, std::int32_t classes) {
  data::labeled_dataset d;
  d.features = f;
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < f; ++j) d.x.push_back(float(100 * i + j));
    d.y.push_back(std::int32_t(i % std::size_t(classes)));
  }
  return d;
}

/// The sample a row of numbered() came from.
std::size_t sample_of(const float* row) { return std::size_t(row[0]) / 100; }

}  // namespace

// ---- CSV ------------------------------------------------------------------------------------

TEST_CASE("digits.csv loads as 1797 samples of 64 pixels with the class counts of its raw text", "[data][csv]") {
  const fs::path path = digits_path();
  REQUIRE(fs::exists(path));
  const data::labeled_dataset d = data::load_labeled_csv(path, 64, 64);
  REQUIRE(d.size() == 1797);
  REQUIRE(d.features == 64);
  REQUIRE(d.x.size() == 1797 * 64);

  // An independent reading of the raw text: getline, strtod, the label after the last comma.
  std::ifstream in(path);
  std::string line;
  std::size_t i = 0;
  std::map<int, std::size_t> raw_counts;
  bool values_match = true;
  while (std::getline(in, line)) {
    REQUIRE(i < d.size());
    const char* p = line.c_str();
    for (std::size_t j = 0; j < 64; ++j) {
      char* end = nullptr;
      const double v = std::strtod(p, &end);
      values_match = values_match && end != p && *end == ',' && float(v) == d.x[i * 64 + j];
      p = end + 1;
    }
    const int label = std::atoi(line.substr(line.rfind(',') + 1).c_str());
    ++raw_counts[label];
    CHECK(d.y[i] == label);
    ++i;
  }
  CHECK(i == 1797);
  CHECK(values_match);

  std::map<int, std::size_t> loaded_counts;
  for (std::int32_t y : d.y) ++loaded_counts[y];
  CHECK(loaded_counts == raw_counts);
  // The class distribution the UCI repository publishes for this file (optdigits.tes).
  const std::map<int, std::size_t> known{{0, 178}, {1, 182}, {2, 177}, {3, 183}, {4, 181},
                                         {5, 182}, {6, 181}, {7, 179}, {8, 174}, {9, 180}};
  CHECK(raw_counts == known);
  CHECK(d.classes() == 10);
  CHECK(std::all_of(d.x.begin(), d.x.end(), [](float v) { return v >= 0 && v <= 16 && v == std::floor(v); }));
}

TEST_CASE("read_csv: blank lines, CRLF, spaces, a header, other delimiters, nan and inf", "[data][csv]") {
  temp_dir dir("csv_ok");
  const auto t = data::read_csv(dir.write("a.csv", "\n1, 2.5 ,-3\r\n\n  \n+4,1e-3,\t6\n7,nan,-inf"));
  REQUIRE(t.rows == 3);
  REQUIRE(t.columns == 3);
  CHECK(t.row(0)[1] == 2.5f);
  CHECK(t.row(0)[2] == -3.0f);
  CHECK(t.row(1)[0] == 4.0f);
  CHECK(t.row(1)[1] == 1e-3f);
  CHECK(std::isnan(t.row(2)[1]));
  CHECK(t.row(2)[2] == -INFINITY);

  const auto h = data::read_csv(dir.write("h.csv", "a;b\n1;2\n3;4\n"), {.delimiter = ';', .header = true});
  CHECK(h.rows == 2);
  CHECK(h.values == std::vector<float>{1, 2, 3, 4});

  const auto empty = data::read_csv(dir.write("e.csv", ""));
  CHECK(empty.rows == 0);
  CHECK(empty.values.empty());

  const auto labeled = data::load_labeled_csv(dir.write("l.csv", "3,0.5,1\n0,-2,7\n"), 2, 0);
  CHECK(labeled.y == std::vector<std::int32_t>{3, 0});
  CHECK(labeled.x == std::vector<float>{0.5f, 1.0f, -2.0f, 7.0f});
}

TEST_CASE("bad CSV files throw solder::error naming the file, the line and the problem", "[data][csv]") {
  temp_dir dir("csv_bad");
  const auto file = [&](const std::string& name, const std::string& text) { return dir.write(name, text); };

  SECTION("missing file or a directory") {
    const fs::path missing = dir.path / "nope.csv";
    CHECK_THROWS_AS(data::read_csv(missing), solder::error);
    CHECK_THROWS_WITH(data::read_csv(missing), Contains("nope.csv") && Contains("no such file"));
    CHECK_THROWS_WITH(data::load_labeled_csv(missing, 2, 2), Contains("nope.csv") && Contains("no such file"));
    CHECK_THROWS_WITH(data::read_csv(dir.path), Contains("is a directory"));
  }
  SECTION("a non-numeric field") {
    const auto p = file("text.csv", "1,2,3\n4,5,6\n7,abc,9\n");
    CHECK_THROWS_WITH(data::read_csv(p),
                      Contains("text.csv:3") && Contains("field 2") && Contains("\"abc\"") && Contains("not a number"));
    CHECK_THROWS_WITH(data::load_labeled_csv(p, 2, 2), Contains("text.csv:3") && Contains("\"abc\""));
    CHECK_THROWS_WITH(data::read_csv(file("partial.csv", "1,2x,3\n")), Contains(":1") && Contains("\"2x\""));
    CHECK_THROWS_WITH(data::read_csv(file("empty_field.csv", "1,,3\n")),
                      Contains(":1") && Contains("field 2 is empty"));
    // A header read as data gets a hint.
    CHECK_THROWS_WITH(data::read_csv(file("named.csv", "a,b\n1,2\n")), Contains("csv_options::header"));
    CHECK_THROWS_WITH(data::read_csv(file("huge.csv", "1,1e60\n")), Contains("outside the range of float"));
  }
  SECTION("a wrong number of columns") {
    CHECK_THROWS_WITH(data::read_csv(file("ragged.csv", "1,2,3\n\n4,5\n")),
                      Contains("ragged.csv:3") && Contains("has 2 fields") && Contains("line 1 has 3"));
    CHECK_THROWS_WITH(data::load_labeled_csv(file("wide.csv", "1,2,3\n1,2,3,4\n"), 2, 2),
                      Contains("wide.csv:2") && Contains("has 4 fields; expected 3"));
    CHECK_THROWS_WITH(data::load_labeled_csv(digits_path(), 63, 63),
                      Contains("digits.csv:1") && Contains("expected 64"));
  }
  SECTION("a label that is not a non-negative integer") {
    for (const char* label : {"-1", "2.5", "abc", "1e3", "+3", "0x2"}) {
      INFO(label);
      const auto p = file("label.csv", std::string("0.5,0.25,1\n0.5,0.25,") + label + "\n");
      CHECK_THROWS_WITH(data::load_labeled_csv(p, 2, 2), Contains("label.csv:2") &&
                                                             Contains(std::string("\"") + label + "\"") &&
                                                             Contains("not a non-negative integer"));
    }
    CHECK_THROWS_WITH(data::load_labeled_csv(file("big.csv", "1,2,3000000000\n"), 2, 2),
                      Contains("big.csv:1") && Contains("too large"));
    CHECK_THROWS_WITH(data::load_labeled_csv(file("nolabel.csv", "1,2,\n"), 2, 2),
                      Contains("not a non-negative integer"));
  }
  SECTION("non-finite features, no samples, bad arguments") {
    CHECK_THROWS_WITH(data::load_labeled_csv(file("nan.csv", "1,nan,0\n"), 2, 2),
                      Contains("nan.csv:1") && Contains("not finite"));
    CHECK_THROWS_WITH(data::load_labeled_csv(file("blank.csv", "\n\n"), 2, 2), Contains("holds no samples"));
    CHECK_THROWS_WITH(data::load_labeled_csv(digits_path(), 64, 65), Contains("label_column 65"));
    CHECK_THROWS_WITH(data::load_labeled_csv(digits_path(), 0, 0), Contains("at least 1 feature"));
  }
}

// ---- the generator and the shuffle ----------------------------------------------------------

TEST_CASE("splitmix64 gives the reference outputs", "[data][random]") {
  // Seed 1234567: the published outputs of Vigna's splitmix64.c (Rosetta Code, "Pseudo-random
  // numbers/Splitmix64").
  data::splitmix64 g{1234567};
  CHECK(g.next() == 6457827717110365317ull);
  CHECK(g.next() == 3203168211198807973ull);
  CHECK(g.next() == 9817491932198370423ull);
  CHECK(g.next() == 4593380528125082431ull);
  CHECK(g.next() == 16408922859458223821ull);
}

TEST_CASE("splitmix64::below rejects the draws under 2^64 mod n", "[data][random]") {
  // n = 2^63 + 1: 2^64 mod n = 2^63 - 1, so draws below 9223372036854775807 are rejected.
  // Seed 7's raw draws are 7191089600892374487 (rejected), 309689372594955804 (rejected),
  // 16616101746815609346 (kept: minus n gives 7392729709960833537).
  data::splitmix64 raw{7};
  CHECK(raw.next() == 7191089600892374487ull);
  CHECK(raw.next() == 309689372594955804ull);
  CHECK(raw.next() == 16616101746815609346ull);
  data::splitmix64 g{7};
  CHECK(g.below((1ull << 63) + 1) == 7392729709960833537ull);
  CHECK(g.state == raw.state);  // exactly three draws were taken
  data::splitmix64 one{99};
  CHECK(one.below(1) == 0);
}

TEST_CASE("permutation(10, 42) is the Fisher-Yates order worked out by hand", "[data][random]") {
  // splitmix64{42}'s first nine draws modulo 10, 9, ..., 2 (no rejections for n <= 10 here) are
  //   13679457532755275413 % 10 = 3, 2949826092126892291 % 9 = 1, 5139283748462763858 % 8 = 2,
  //   6349198060258255764 % 7 = 2,  701532786141963250 % 6 = 4,  16015981125662989062 % 5 = 2,
  //   4028864712777624925 % 4 = 1,  14769051326987775908 % 3 = 2, 6270620877612482005 % 2 = 1.
  // Swapping a[i-1] with a[j] for i = 10..2 on 0..9:
  //   [0 1 2 9 4 5 6 7 8 3] [0 8 2 9 4 5 6 7 1 3] [0 8 7 9 4 5 6 2 1 3] [0 8 6 9 4 5 7 2 1 3]
  //   [0 8 6 9 5 4 7 2 1 3] [0 8 5 9 6 4 7 2 1 3] [0 9 5 8 6 4 7 2 1 3], then two self-swaps.
  data::splitmix64 g{42};
  const std::vector<std::uint64_t> draws{13679457532755275413ull, 2949826092126892291ull,  5139283748462763858ull,
                                         6349198060258255764ull,  701532786141963250ull,   16015981125662989062ull,
                                         4028864712777624925ull,  14769051326987775908ull, 6270620877612482005ull};
  for (std::uint64_t d : draws) CHECK(g.next() == d);
  CHECK(data::permutation(10, 42) == std::vector<std::size_t>{0, 9, 5, 8, 6, 4, 7, 2, 1, 3});
}

TEST_CASE("permutations are permutations, the same for a seed, different across seeds", "[data][random]") {
  for (std::size_t n : {0, 1, 2, 3, 37, 1797}) {
    INFO(n);
    const auto p = data::permutation(n, 2024);
    std::vector<std::size_t> sorted = p;
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t i = 0; i < n; ++i) CHECK(sorted[i] == i);
    CHECK(data::permutation(n, 2024) == p);
    if (n >= 37) CHECK(data::permutation(n, 2025) != p);
  }
  // Over many seeds every element lands in every place (a broken swap bound would pin one).
  std::vector<std::vector<int>> seen(5, std::vector<int>(5, 0));
  for (std::uint64_t s = 0; s < 400; ++s) {
    const auto p = data::permutation(5, s);
    for (std::size_t i = 0; i < 5; ++i) ++seen[i][p[i]];
  }
  for (const auto& row : seen)
    for (int c : row) CHECK(c > 40);  // expected 80 each
}

// ---- splits ---------------------------------------------------------------------------------

TEST_CASE("train_test_split: sizes, every sample once, order kept, classes balanced", "[data][split]") {
  const data::labeled_dataset digits = data::load_labeled_csv(digits_path(), 64, 64);
  data::labeled_dataset d = numbered(1797, 2, 1);
  d.y = digits.y;  // the digits' real class sizes, rows that name their sample

  for (auto mode : {data::split_mode::plain, data::split_mode::stratified}) {
    INFO((mode == data::split_mode::plain ? "plain" : "stratified"));
    const auto s = data::train_test_split(d, 0.2, 7, mode);
    CHECK(s.test.size() == 359);  // round(0.2 * 1797) = round(359.4)
    CHECK(s.train.size() == 1438);
    std::vector<std::size_t> seen;
    for (const auto* part : {&s.train, &s.test}) {
      std::size_t last = 0;
      for (std::size_t i = 0; i < part->size(); ++i) {
        const std::size_t k = sample_of(part->row(i).data());
        CHECK(part->y[i] == d.y[k]);  // labels travel with their rows
        CHECK(part->row(i)[1] == float(100 * k + 1));
        if (i) CHECK(k > last);  // original order kept
        last = k;
        seen.push_back(k);
      }
    }
    std::sort(seen.begin(), seen.end());
    for (std::size_t i = 0; i < seen.size(); ++i) REQUIRE(seen[i] == i);
    CHECK(seen.size() == 1797);

    const auto again = data::train_test_split(d, 0.2, 7, mode);
    CHECK(again.test.x == s.test.x);
    CHECK(data::train_test_split(d, 0.2, 8, mode).test.x != s.test.x);
  }

  // Stratified: each class's test count is its share rounded down or up.
  const auto s = data::train_test_split(d, 0.25, 3);
  CHECK(s.test.size() == 449);  // round(449.25)
  std::map<int, std::size_t> all, test;
  for (auto y : d.y) ++all[y];
  for (auto y : s.test.y) ++test[y];
  for (const auto& [c, n] : all) {
    INFO("class " << c);
    const double share = double(n) * 449.0 / 1797.0;
    CHECK(double(test[c]) >= std::floor(share));
    CHECK(double(test[c]) <= std::ceil(share));
  }
}

TEST_CASE("stratified split with sparse, large labels", "[data][split]") {
  // Labels 7 and 2000000000 only: classes are the distinct labels, not 0..max.
  auto d = numbered(10, 1, 1);
  for (std::size_t i = 0; i < 10; ++i) d.y[i] = i < 4 ? 7 : 2000000000;
  const auto s = data::train_test_split(d, 0.5, 9);
  REQUIRE(s.test.size() == 5);
  // Shares 4 * 5 / 10 = 2 and 6 * 5 / 10 = 3, exactly.
  CHECK(std::count(s.test.y.begin(), s.test.y.end(), 7) == 2);
  CHECK(std::count(s.test.y.begin(), s.test.y.end(), 2000000000) == 3);
}

TEST_CASE("train_test_split: tiny sets and bad fractions", "[data][split]") {
  const auto d = numbered(3, 2, 2);
  const auto s = data::train_test_split(d, 0.5, 1, data::split_mode::plain);  // round(1.5) = 2
  CHECK(s.test.size() == 2);
  CHECK(s.train.size() == 1);
  CHECK_THROWS_WITH(data::train_test_split(d, 0.0, 1), Contains("strictly between 0 and 1") && Contains("got 0"));
  CHECK_THROWS_WITH(data::train_test_split(d, 1.0, 1), Contains("strictly between 0 and 1"));
  CHECK_THROWS_WITH(data::train_test_split(d, std::nan(""), 1), Contains("strictly between 0 and 1"));
  CHECK_THROWS_WITH(data::train_test_split(d, 0.1, 1), Contains("leaves the test part empty"));
  CHECK_THROWS_WITH(data::train_test_split(d, 0.9, 1), Contains("leaves the train part empty"));
  auto bad = d;
  bad.y[1] = -4;
  CHECK_THROWS_WITH(data::train_test_split(bad, 0.5, 1), Contains("label -4 of sample 1 is negative"));
  bad = d;
  bad.x.pop_back();
  CHECK_THROWS_WITH(data::train_test_split(bad, 0.5, 1), Contains("5 feature values for 3 labels"));
}

// ---- scaling --------------------------------------------------------------------------------

TEST_CASE("divide_features and standardize against double references", "[data][scale]") {
  auto digits = data::load_labeled_csv(digits_path(), 64, 64);
  const auto raw = digits.x;
  data::divide_features(digits, 16.0f);
  for (std::size_t i = 0; i < raw.size(); ++i) REQUIRE(digits.x[i] == float(double(raw[i]) / 16.0));
  CHECK_THROWS_WITH(data::divide_features(digits, 0.0f), Contains("finite and non-zero"));
  CHECK_THROWS_WITH(data::divide_features(digits, NAN), Contains("finite and non-zero"));

  // Column 0 is constant (centred only); column 1 varies; column 2 mixes signs.
  data::labeled_dataset train;
  train.features = 3;
  train.x = {5, 1, -2, 5, 2, 0.5f, 5, 4, 7, 5, 9, -1};
  train.y = {0, 1, 0, 1};
  const auto stats = data::feature_statistics(train);
  for (std::size_t j = 0; j < 3; ++j) {
    double mean = 0, var = 0;
    for (std::size_t i = 0; i < 4; ++i) mean += train.x[i * 3 + j];
    mean /= 4;
    for (std::size_t i = 0; i < 4; ++i) var += (train.x[i * 3 + j] - mean) * (train.x[i * 3 + j] - mean);
    CHECK(stats.mean[j] == Approx(mean).epsilon(1e-15));
    CHECK(stats.stddev[j] == Approx(std::sqrt(var / 4)).epsilon(1e-15));
  }
  data::labeled_dataset test = train;
  test.x = {6, 3, 1, 5, 0, 0};
  test.y = {0, 1};
  data::standardize(train, stats);
  data::standardize(test, stats);  // with the training split's statistics
  const std::vector<double> mean{5, 4, 1.125}, sd{0, std::sqrt(9.5), std::sqrt(12.296875)};
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t j = 0; j < 3; ++j) {
      const double x = std::vector<double>{6, 3, 1, 5, 0, 0}[i * 3 + j];
      const double want = sd[j] > 0 ? (x - mean[j]) / sd[j] : x - mean[j];
      // 1 ulp: the reference's mean and deviation are the same doubles up to their last bit.
      CHECK_THAT(test.x[i * 3 + j], Catch::Matchers::WithinULP(float(want), 1));
    }
  double col1 = 0;
  for (std::size_t i = 0; i < 4; ++i) col1 += train.x[i * 3 + 1];
  CHECK(std::abs(col1) < 1e-6);
  CHECK(train.x[0] == 0.0f);
  data::feature_stats wrong{{0, 0}, {1, 1}};
  CHECK_THROWS_WITH(data::standardize(test, wrong), Contains("statistics are for 2 features"));
  CHECK_THROWS_WITH(data::feature_statistics(data::labeled_dataset{.features = 3}), Contains("empty"));
}

// ---- batches --------------------------------------------------------------------------------

TEST_CASE("batches cover every sample exactly once per epoch, rows paired with labels", "[data][batch]") {
  const auto d = numbered(37, 3, 5);  // 37: four full batches of 8 and a tail of 5
  for (auto last : {data::last_batch::keep, data::last_batch::drop}) {
    const bool keep = last == data::last_batch::keep;
    INFO((keep ? "keep" : "drop"));
    data::batch_loader loader(d, 8, last);
    CHECK(loader.size() == (keep ? 5u : 4u));
    const float* buffer = loader[0].x;
    std::vector<std::vector<std::size_t>> orders;
    for (std::uint64_t epoch = 0; epoch < 4; ++epoch) {
      loader.shuffle(11, epoch);
      CHECK(loader[0].x == buffer);  // reordered in place, nothing reallocated
      std::vector<std::size_t> order;
      std::size_t batches = 0;
      for (data::batch_view b : loader) {
        ++batches;
        CHECK(b.features == 3);
        CHECK(b.rows == (batches == 5 ? 5u : 8u));
        CHECK(b.y.size() == b.rows);
        for (std::size_t r = 0; r < b.rows; ++r) {
          const float* row = b.x + r * 3;
          const std::size_t k = sample_of(row);
          CHECK(b.y[r] == std::int32_t(k % 5));
          CHECK(row[2] == float(100 * k + 2));
          order.push_back(k);
        }
      }
      CHECK(batches == loader.size());
      std::vector<std::size_t> sorted = order;
      std::sort(sorted.begin(), sorted.end());
      CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());  // no sample twice
      CHECK(order.size() == (keep ? 37u : 32u));
      if (keep)
        for (std::size_t i = 0; i < 37; ++i) CHECK(sorted[i] == i);
      orders.push_back(order);
    }
    CHECK(orders[0] != orders[1]);
    CHECK(orders[1] != orders[2]);
    loader.shuffle(11, 1);  // the same (seed, epoch): the same order
    std::vector<std::size_t> again;
    for (auto b : loader)
      for (std::size_t r = 0; r < b.rows; ++r) again.push_back(sample_of(b.x + r * 3));
    CHECK(again == orders[1]);
  }
}

TEST_CASE("batch order for (seed 5, epoch 2) is the hand-checked epoch stream", "[data][batch]") {
  // epoch_generator(5, 2) = splitmix64{5 ^ splitmix64{2}.next()}; its Fisher-Yates order of
  // 0..9, computed with an independent Python implementation of splitmix64:
  const auto d = numbered(10, 1, 10);
  auto loader = data::batches(d, 4, 5, 2);
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < 10; ++i) order.push_back(loader.sample(i));
  CHECK(order == std::vector<std::size_t>{2, 4, 5, 9, 6, 8, 1, 7, 3, 0});
  CHECK(loader.size() == 3);
  CHECK(loader[2].rows == 2);
  CHECK(sample_of(loader[2].x) == 3);
  CHECK(loader[2].y[1] == 0);
  data::splitmix64 direct{5 ^ data::splitmix64{2}.next()};
  CHECK(data::epoch_generator(5, 2).next() == direct.next());
}

TEST_CASE("batch_loader: file order, edge batch sizes, tensor views, bad arguments", "[data][batch]") {
  const auto d = numbered(7, 4, 3);
  data::batch_loader loader(d, 3);
  for (std::size_t i = 0; i < 7; ++i) CHECK(loader.sample(i) == i);  // file order until shuffled
  CHECK(reinterpret_cast<std::uintptr_t>(loader[0].x) % solder::alignment == 0);
  loader.shuffle(1, 0);
  loader.reset();
  CHECK(sample_of(loader[2].x) == 6);

  CHECK(data::batch_loader(d, 1).size() == 7);
  CHECK(data::batch_loader(d, 7).size() == 1);
  CHECK(data::batch_loader(d, 100).size() == 1);
  CHECK(data::batch_loader(d, 100)[0].rows == 7);
  CHECK(data::batch_loader(d, 100, data::last_batch::drop).size() == 0);
  CHECK(std::distance(loader.begin(), loader.end()) == 3);

  const auto view = loader[1].features_as<4>();
  CHECK(view.batch() == 3);
  CHECK(view(0, 0) == 300.0f);
  CHECK(view(2, 3) == 503.0f);
  CHECK_THROWS_WITH(loader[1].features_as<5>(), Contains("4 features per sample, not 5"));

  CHECK_THROWS_WITH(data::batch_loader(d, 0), Contains("batch size must be at least 1"));
  const data::labeled_dataset empty{.features = 2};
  CHECK_THROWS_WITH(data::batch_loader(empty, 4), Contains("empty"));
}
