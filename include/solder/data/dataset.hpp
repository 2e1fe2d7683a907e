// data/dataset.hpp: a labeled data set in memory, feature scaling, a seeded shuffle that gives
// the same order on every machine, train/test splits and per-epoch shuffled mini-batches.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "solder/config.hpp"
#include "solder/random/seed.hpp"
#include "solder/shape.hpp"
#include "solder/tensor.hpp"

namespace solder::data {

namespace detail {
/// The shortest text that reads back as v (std::to_string would print 1e-9 as 0.000000).
inline std::string number_text(double v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}
}  // namespace detail

// ---- the generator --------------------------------------------------------------------------

/// The generator of every shuffle and split below (random/seed.hpp).
using random::splitmix64;

/// Shuffles `items` in place (Durstenfeld's Fisher-Yates): for i = n-1 down to 1, swap
/// items[i] with items[gen.below(i + 1)].
template <class T>
void shuffle(std::span<T> items, splitmix64& gen) {
  for (std::size_t i = items.size(); i > 1; --i) {
    const std::size_t j = static_cast<std::size_t>(gen.below(i));
    using std::swap;
    swap(items[i - 1], items[j]);
  }
}

/// 0, 1, ..., n-1 shuffled by splitmix64{seed}: the same permutation on every platform.
inline std::vector<std::size_t> permutation(std::size_t n, std::uint64_t seed) {
  std::vector<std::size_t> p(n);
  std::iota(p.begin(), p.end(), std::size_t(0));
  splitmix64 gen{seed};
  data::shuffle(std::span<std::size_t>(p), gen);
  return p;
}

/// The generator that shuffles epoch `epoch` of a run seeded with `seed`:
/// splitmix64{seed ^ splitmix64{epoch}.next()}. Consecutive epochs start far apart in the
/// generator's sequence (seed + epoch would make epoch e+1 the stream of epoch e moved by one).
constexpr splitmix64 epoch_generator(std::uint64_t seed, std::uint64_t epoch) {
  return splitmix64{seed ^ splitmix64{epoch}.next()};
}

// ---- the data set ---------------------------------------------------------------------------

/// Samples with `features` float features each and an int32 class label (>= 0).
/// x is row-major [size(), features]; y is [size()].
struct labeled_dataset {
  std::size_t features = 0;
  std::vector<float> x{};
  std::vector<std::int32_t> y{};

  std::size_t size() const { return y.size(); }
  /// The features of sample i.
  std::span<const float> row(std::size_t i) const { return {x.data() + i * features, features}; }
  /// Largest label + 1 (0 for an empty set).
  std::size_t classes() const { return y.empty() ? 0 : std::size_t(*std::max_element(y.begin(), y.end())) + 1; }
};

/// Checks that `d` is consistent: features >= 1, x.size() == size() * features, labels >= 0.
/// Throws solder::error naming what is wrong; `who` is the calling function, for the message.
inline void validate(const labeled_dataset& d, const char* who = "solder::data::validate") {
  const std::string w(who);
  if (d.features == 0) solder::detail::fail(w + ": the data set has 0 features per sample");
  if (d.x.size() != d.y.size() * d.features)
    solder::detail::fail(w + ": the data set holds " + std::to_string(d.x.size()) + " feature values for " +
                         std::to_string(d.y.size()) + " labels of " + std::to_string(d.features) +
                         " features each; x must hold size() * features values");
  for (std::size_t i = 0; i < d.y.size(); ++i)
    if (d.y[i] < 0)
      solder::detail::fail(w + ": label " + std::to_string(d.y[i]) + " of sample " + std::to_string(i) +
                           " is negative; labels are class indices 0, 1, ...");
}

/// The samples at `indices` (each < d.size()), in that order.
inline labeled_dataset select(const labeled_dataset& d, std::span<const std::size_t> indices) {
  labeled_dataset out;
  out.features = d.features;
  out.x.resize(indices.size() * d.features);
  out.y.resize(indices.size());
  for (std::size_t k = 0; k < indices.size(); ++k) {
    SOLDER_ASSERT(indices[k] < d.size(), "solder::data::select: a sample index is past the end of the data set");
    std::copy_n(d.x.data() + indices[k] * d.features, d.features, out.x.data() + k * d.features);
    out.y[k] = d.y[indices[k]];
  }
  return out;
}

/// The data set in the order of permutation(size(), seed).
inline labeled_dataset shuffled(const labeled_dataset& d, std::uint64_t seed) {
  const auto p = permutation(d.size(), seed);
  return select(d, p);
}

// ---- feature scaling ------------------------------------------------------------------------

/// x <- x / divisor for every feature value; divisor finite and non-zero. For digits, whose
/// pixels are 0..16: divide_features(d, 16) maps them to [0, 1]. (A division, not a product by
/// 1/divisor, so each value is the correctly rounded quotient.)
inline void divide_features(labeled_dataset& d, float divisor) {
  if (!(std::isfinite(divisor) && divisor != 0.0f))
    solder::detail::fail("solder::data::divide_features: the divisor must be finite and non-zero; got " +
                         detail::number_text(divisor));
  for (float& v : d.x) v /= divisor;
}

/// Per-feature mean and standard deviation (population: divided by n), computed in double.
struct feature_stats {
  std::vector<double> mean{};
  std::vector<double> stddev{};
};

/// The statistics of each feature over the samples of `d` (two passes in double). Compute them
/// on the training split and apply them to every split, so no test sample leaks into training.
inline feature_stats feature_statistics(const labeled_dataset& d) {
  validate(d, "solder::data::feature_statistics");
  if (d.size() == 0) solder::detail::fail("solder::data::feature_statistics: the data set is empty");
  const std::size_t n = d.size(), f = d.features;
  feature_stats s{std::vector<double>(f, 0.0), std::vector<double>(f, 0.0)};
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < f; ++j) s.mean[j] += d.x[i * f + j];
  for (double& m : s.mean) m /= double(n);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < f; ++j) {
      const double c = d.x[i * f + j] - s.mean[j];
      s.stddev[j] += c * c;
    }
  for (double& v : s.stddev) v = std::sqrt(v / double(n));
  return s;
}

/// x <- (x - mean) / stddev per feature, in double, rounded once to float. A feature with
/// stddev 0 (a pixel that is always blank) is only centred, as scikit-learn's StandardScaler does.
inline void standardize(labeled_dataset& d, const feature_stats& s) {
  validate(d, "solder::data::standardize");
  if (s.mean.size() != d.features || s.stddev.size() != d.features)
    solder::detail::fail("solder::data::standardize: the statistics are for " + std::to_string(s.mean.size()) +
                         " features, the data set has " + std::to_string(d.features));
  for (std::size_t i = 0; i < d.size(); ++i)
    for (std::size_t j = 0; j < d.features; ++j) {
      float& v = d.x[i * d.features + j];
      const double c = double(v) - s.mean[j];
      v = static_cast<float>(s.stddev[j] > 0.0 ? c / s.stddev[j] : c);
    }
}

// ---- train/test split -----------------------------------------------------------------------

/// plain: the test samples are drawn from the whole set; stratified: from each class in
/// proportion, so both parts keep the class balance.
enum class split_mode { plain, stratified };

/// The two parts of a split.
struct train_test {
  labeled_dataset train;
  labeled_dataset test;
};

/// Splits `d` in two. The test part gets n_test = round(test_fraction * n) samples (halves up),
/// and must leave both parts non-empty.
/// - plain: the test samples are the first n_test of permutation(n, seed).
/// - stratified: class c gets n_c * n_test / n test samples rounded down, and the samples still
///   missing go one each to the classes with the largest remainders (ties: lower label first);
///   then each class's samples, in file order, are shuffled by one splitmix64{seed} stream
///   (lowest label first) and the first ones go to the test part.
/// Both parts keep the samples' original relative order.
inline train_test train_test_split(const labeled_dataset& d, double test_fraction, std::uint64_t seed,
                                   split_mode mode = split_mode::stratified) {
  constexpr const char* who = "solder::data::train_test_split";
  validate(d, who);
  const std::size_t n = d.size();
  if (!(test_fraction > 0.0 && test_fraction < 1.0))
    solder::detail::fail(std::string(who) + ": test_fraction must lie strictly between 0 and 1; got " +
                         detail::number_text(test_fraction));
  const auto n_test = static_cast<std::size_t>(std::floor(test_fraction * double(n) + 0.5));
  if (n_test == 0 || n_test >= n)
    solder::detail::fail(std::string(who) + ": a test fraction of " + detail::number_text(test_fraction) + " of " +
                         std::to_string(n) + " samples leaves " + (n_test == 0 ? "the test" : "the train") +
                         " part empty; use more samples or another fraction");

  std::vector<char> in_test(n, 0);
  if (mode == split_mode::plain) {
    const auto p = permutation(n, seed);
    for (std::size_t k = 0; k < n_test; ++k) in_test[p[k]] = 1;
  } else {
    // The distinct labels, ascending (not 0..max: a label may be large).
    std::vector<std::int32_t> labels = d.y;
    std::sort(labels.begin(), labels.end());
    labels.erase(std::unique(labels.begin(), labels.end()), labels.end());
    const std::size_t classes = labels.size();
    std::vector<std::vector<std::size_t>> members(classes);
    for (std::size_t i = 0; i < n; ++i)
      members[std::size_t(std::lower_bound(labels.begin(), labels.end(), d.y[i]) - labels.begin())].push_back(i);
    // Largest-remainder rounding, in exact integer arithmetic: sum of quotas == n_test.
    std::vector<std::size_t> quota(classes), remainder(classes);
    std::size_t assigned = 0;
    for (std::size_t c = 0; c < classes; ++c) {
      quota[c] = members[c].size() * n_test / n;
      remainder[c] = members[c].size() * n_test % n;
      assigned += quota[c];
    }
    std::vector<std::size_t> order(classes);
    std::iota(order.begin(), order.end(), std::size_t(0));
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return remainder[a] > remainder[b]; });
    for (std::size_t k = 0; assigned < n_test; ++k, ++assigned) ++quota[order[k]];
    splitmix64 gen{seed};
    for (std::size_t c = 0; c < classes; ++c) {
      data::shuffle(std::span<std::size_t>(members[c]), gen);
      for (std::size_t k = 0; k < quota[c]; ++k) in_test[members[c][k]] = 1;
    }
  }

  std::vector<std::size_t> train_idx, test_idx;
  train_idx.reserve(n - n_test);
  test_idx.reserve(n_test);
  for (std::size_t i = 0; i < n; ++i) (in_test[i] ? test_idx : train_idx).push_back(i);
  return {select(d, train_idx), select(d, test_idx)};
}

// ---- mini-batches ---------------------------------------------------------------------------

/// What happens to a last batch smaller than the batch size.
enum class last_batch { keep, drop };

/// One mini-batch: `rows` consecutive samples of a batch_loader's current order. Valid until
/// the loader is shuffled again or destroyed.
struct batch_view {
  const float* x = nullptr;         // [rows, features], row-major
  std::span<const std::int32_t> y;  // [rows]
  std::size_t rows = 0;
  std::size_t features = 0;

  /// The features as a solder tensor view [rows, Features]; Features must equal `features`.
  template <std::size_t Features>
  tensor_ref<const float, shape<dyn, Features>> features_as() const {
    if (Features != features)
      solder::detail::fail("solder::data::batch_view: the batch has " + std::to_string(features) +
                           " features per sample, not " + std::to_string(Features));
    return tensor_ref<const float, shape<dyn, Features>>(x, rows);
  }
};

/// Mini-batches of a data set: b = 0, 1, ... covers samples [b * batch_size, ...) of a copy of
/// the data in the current order (file order until shuffled). All buffers are allocated once,
/// at construction; `shuffle` reorders the copy in place, and a batch is a view into it, so
/// the per-batch path allocates nothing. The data set must outlive the loader.
///
///   batch_loader loader(train, 32);
///   for (std::uint64_t epoch = 0; epoch < epochs; ++epoch) {
///     loader.shuffle(seed, epoch);                 // the same order for the same (seed, epoch)
///     for (batch_view b : loader) step(b.features_as<64>(), b.y);
///   }
class batch_loader {
 public:
  batch_loader(const labeled_dataset& d, std::size_t batch_size, last_batch last = last_batch::keep)
      : data_(&d), batch_size_(batch_size), last_(last) {
    validate(d, "solder::data::batch_loader");
    if (batch_size == 0) solder::detail::fail("solder::data::batch_loader: the batch size must be at least 1");
    if (d.size() == 0) solder::detail::fail("solder::data::batch_loader: the data set is empty");
    x_ = allocate_aligned<float>(d.x.size());
    y_.resize(d.size());
    order_.resize(d.size());
    reset();
  }
  batch_loader(const labeled_dataset&&, std::size_t, last_batch = last_batch::keep) = delete;  // would dangle

  /// Puts the samples back in file order.
  void reset() {
    std::iota(order_.begin(), order_.end(), std::size_t(0));
    gather();
  }
  /// Orders the samples for one epoch: a Fisher-Yates shuffle of 0..n-1 by
  /// epoch_generator(seed, epoch), applied to the rows and labels together.
  void shuffle(std::uint64_t seed, std::uint64_t epoch) {
    std::iota(order_.begin(), order_.end(), std::size_t(0));
    splitmix64 gen = epoch_generator(seed, epoch);
    data::shuffle(std::span<std::size_t>(order_), gen);
    gather();
  }

  /// Sample index (in the data set) of position i of the current order.
  std::size_t sample(std::size_t i) const { return order_[i]; }
  std::size_t batch_size() const { return batch_size_; }
  /// Number of batches: n / batch_size, plus one partial batch when kept.
  std::size_t size() const {
    const std::size_t n = order_.size();
    return n / batch_size_ + (last_ == last_batch::keep && n % batch_size_ != 0 ? 1 : 0);
  }

  batch_view operator[](std::size_t b) const {
    const std::size_t f = data_->features;
    const std::size_t first = b * batch_size_;
    const std::size_t rows = std::min(batch_size_, order_.size() - first);
    return {x_.get() + first * f, std::span<const std::int32_t>(y_.data() + first, rows), rows, f};
  }

  class iterator {
   public:
    using iterator_concept = std::forward_iterator_tag;
    using iterator_category = std::input_iterator_tag;  // operator* returns a value
    using value_type = batch_view;
    using difference_type = std::ptrdiff_t;

    iterator() = default;
    iterator(const batch_loader* owner, std::size_t b) : owner_(owner), b_(b) {}
    batch_view operator*() const { return (*owner_)[b_]; }
    iterator& operator++() {
      ++b_;
      return *this;
    }
    iterator operator++(int) {
      iterator old = *this;
      ++b_;
      return old;
    }
    bool operator==(const iterator& o) const { return b_ == o.b_; }

   private:
    const batch_loader* owner_ = nullptr;
    std::size_t b_ = 0;
  };
  iterator begin() const { return {this, 0}; }
  iterator end() const { return {this, size()}; }

 private:
  void gather() {
    const std::size_t f = data_->features;
    for (std::size_t i = 0; i < order_.size(); ++i) {
      std::memcpy(x_.get() + i * f, data_->x.data() + order_[i] * f, f * sizeof(float));
      y_[i] = data_->y[order_[i]];
    }
  }

  const labeled_dataset* data_;
  std::size_t batch_size_;
  last_batch last_;
  aligned_array<float> x_;  // 64-byte aligned rows
  std::vector<std::int32_t> y_;
  std::vector<std::size_t> order_;
};

/// A loader over `d` already shuffled for (seed, epoch): `for (auto b : batches(train, 32, seed, e))`.
/// Allocates its buffers on each call; to reuse them across epochs, keep one batch_loader and
/// call its shuffle.
inline batch_loader batches(const labeled_dataset& d, std::size_t batch_size, std::uint64_t seed, std::uint64_t epoch,
                            last_batch last = last_batch::keep) {
  batch_loader loader(d, batch_size, last);
  loader.shuffle(seed, epoch);
  return loader;
}
batch_loader batches(const labeled_dataset&&, std::size_t, std::uint64_t, std::uint64_t,
                     last_batch = last_batch::keep) = delete;  // the loader would dangle

}  // namespace solder::data
