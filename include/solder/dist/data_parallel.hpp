// dist/data_parallel.hpp: data-parallel training. Every rank holds the whole chain and trains on
// its shard of each global batch; the gradients are reduced in buckets, each launched as soon
// as the kernels that fill it have run their backward (last kernel first), so the reduction of
// the late layers overlaps the backward of the early ones; then every rank takes the same
// optimizer step.
//
//   dist::mpi_session mpi(&argc, &argv);
//   dist::mpi_communicator comm;
//   model_type model(seed);                      // the same seed on every rank
//   optim::adamw opt(model.params(), {...});
//   dist::data_parallel dp(model, opt, comm);   // checks that the ranks agree
//   for (batch_view b : loader)                  // the same global batches on every rank
//     loss = dp.train_step(b.features_as<64>(), b.y);
//
// For a fixed world size two runs give the same bits (dist/reduction.hpp: a fixed order, no
// sum that depends on arrival); dropout masks are those of the global batch
// (chain::set_first_sample), whatever the world size.
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <span>
#include <sstream>
#include <string>
#include <typeinfo>
#include <vector>

#if __has_include(<cxxabi.h>)
#include <cxxabi.h>
#endif

#include "solder/config.hpp"
#include "solder/dist/reduction.hpp"
#include "solder/dist/shard.hpp"
#include "solder/nn/chain.hpp"
#include "solder/optim/optimizer.hpp"

namespace solder::dist {

/// What data_parallel needs of a transport (dist/mpi.hpp's mpi_communicator is one): ranks, the
/// fixed-order weighted reduction of float buckets in flight, and small exact collectives.
template <class C>
concept Communicator = requires(C& c, const C& cc, typename C::reduction& r, std::span<const std::span<float>> pieces,
                                std::span<const double> w, std::string s) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  c.start(r, pieces, w, status_ok);  // the spans reduced as one bucket, in place
  { c.progress(r) } -> std::convertible_to<bool>;
  { c.finish(r) } -> std::convertible_to<int>;
  { cc.min(std::int64_t{}) } -> std::convertible_to<std::int64_t>;
  { cc.broadcast(s, 0) } -> std::convertible_to<std::string>;
};

struct data_parallel_options {
  /// Gradient bytes per bucket: a bucket closes, walking the kernels last to first, once it
  /// holds this many; 0 gives every kernel with parameters a bucket of its own.
  std::size_t bucket_bytes = 256 * 1024;
};

/// Seconds of the last step: all of it, and the part spent waiting for reductions after the
/// backward had ended (communication the backward did not hide).
struct step_timing {
  double step_seconds = 0, wait_seconds = 0;
};

namespace detail {

inline std::string type_name(const std::type_info& t) {
#if __has_include(<cxxabi.h>)
  int status = 0;
  char* s = abi::__cxa_demangle(t.name(), nullptr, nullptr, &status);
  if (status == 0 && s) {
    std::string out(s);
    std::free(s);
    return out;
  }
#endif
  return t.name();
}

/// FNV-1a over the bytes of n floats: equal values, equal checksums.
inline std::uint64_t checksum(const float* p, std::size_t n) {
  std::uint64_t h = 1469598103934665603ULL;
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ULL;
  return h;
}

inline std::string exact(double v) {
  char s[40];
  std::snprintf(s, sizeof s, "%.9g", v);
  return s;
}

/// The optimizer's hyperparameters that its options carry, as "name=value" text.
template <class O>
std::string describe_options(const O& o) {
  std::string s;
  const auto add = [&](const char* name, double v) { s += std::string(s.empty() ? "" : " ") + name + "=" + exact(v); };
  if constexpr (requires { o.lr; }) add("lr", o.lr);
  if constexpr (requires { o.momentum; }) add("momentum", o.momentum);
  if constexpr (requires { o.dampening; }) add("dampening", o.dampening);
  if constexpr (requires { o.nesterov; }) add("nesterov", o.nesterov);
  if constexpr (requires { o.beta1; }) add("beta1", o.beta1);
  if constexpr (requires { o.beta2; }) add("beta2", o.beta2);
  if constexpr (requires { o.eps; }) add("eps", o.eps);
  if constexpr (requires { o.weight_decay; }) add("weight_decay", o.weight_decay);
  return s;
}

inline std::string dims_text(std::span<const std::size_t> d) {
  std::string s = "[";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

}  // namespace detail

template <class Model, class Optimizer, Communicator Comm>
class data_parallel {
 public:
  using input_ref = typename Model::input_ref;

  /// Collective: every rank must construct it with its own model, optimizer and communicator.
  /// Checks that the ranks agree (model type, parameter names, shapes and values, dropout
  /// streams, optimizer and its settings, bucket size); a difference is a solder::error on every
  /// rank naming it, instead of a hang or a silent divergence.
  data_parallel(Model& model, Optimizer& opt, Comm& comm, data_parallel_options options = {})
      : model_(model), opt_(opt), comm_(comm), options_(options) {
    verify();
    plan_buckets();
  }

  /// The ranks agree, or every rank throws naming the first difference (collective).
  void verify() {
    const std::vector<std::string> mine = description();
    std::string all;
    for (const auto& l : mine) all += l + "\n";
    const std::string root = comm_.broadcast(all, 0);
    std::vector<std::string> theirs;
    std::istringstream in(root);
    for (std::string l; std::getline(in, l);) theirs.push_back(l);
    std::string problem;
    for (std::size_t i = 0; i < std::max(mine.size(), theirs.size()) && problem.empty(); ++i) {
      const std::string a = i < theirs.size() ? theirs[i] : "(nothing)", b = i < mine.size() ? mine[i] : "(nothing)";
      if (a != b) problem = "rank " + std::to_string(comm_.rank()) + " has " + b + " where rank 0 has " + a;
    }
    const std::int64_t first_bad = comm_.min(problem.empty() ? std::int64_t(comm_.size()) : std::int64_t(comm_.rank()));
    if (first_bad < comm_.size())
      solder::detail::fail("solder::dist::data_parallel: the ranks' models differ: " +
                           comm_.broadcast(problem, int(first_bad)) +
                           " (every rank must build the same chain with the same seed, the same optimizer and options)");
  }

  /// One step on this rank's shard x (rows [first, first + x.batch()) of a global batch of
  /// `global` samples, as shard_of cuts it) with its targets: forward, loss, backward with the
  /// gradients reduced as they are ready, the optimizer step. Returns the global batch's mean
  /// loss, the same on every rank. Collective. If any rank fails in its step, every rank
  /// throws a solder::error naming that rank and its error, and no rank steps.
  template <class Target, class Loss = nn::cross_entropy_loss>
  float train_step(input_ref x, const Target& target, std::size_t first, std::size_t global, const Loss& loss = {}) {
    const auto t0 = clock::now();
    const shard mine = shard_of(global, comm_.rank(), comm_.size());
    std::string failure;
    if (mine.first != first || mine.count != x.batch())
      failure = "its shard is rows [" + std::to_string(first) + ", " + std::to_string(first + x.batch()) +
                ") of a global batch of " + std::to_string(global) + ", not shard_of's [" + std::to_string(mine.first) +
                ", " + std::to_string(mine.first + mine.count) + ")";
    set_weights(global);
    launched = 0;
    float local = 0.0f;
    if (failure.empty()) {
      try {
        model_.set_first_sample(first);
        local = model_.loss_and_backward(x, target, loss, [&](std::size_t k) { block_done(k); });
      } catch (const std::exception& e) {
        failure = e.what();
      }
    }
    const auto t1 = clock::now();
    launch_rest(failure.empty() ? status_ok : status_failed, local);
    int failed = -1;
    for (auto& b : buckets) {
      const int f = comm_.finish(b.red);
      if (f >= 0 && (failed < 0 || f < failed)) failed = f;
    }
    timing.wait_seconds = seconds(clock::now() - t1);
    if (failed >= 0)
      solder::detail::fail("solder::dist::data_parallel: rank " + std::to_string(failed) + " failed in its training step: " +
                           comm_.broadcast(failure, failed));
    opt_.step();
    timing.step_seconds = seconds(clock::now() - t0);
    return buckets.back().loss;
  }

  /// train_step given the whole global batch (every rank reads the same one) with integer
  /// labels: this rank takes its shard of it.
  template <class Loss = nn::cross_entropy_loss>
  float train_step(input_ref global_x, std::span<const std::int32_t> labels, const Loss& loss = {}) {
    if (labels.size() != global_x.batch())
      solder::detail::fail("solder::dist::data_parallel::train_step: got " + std::to_string(labels.size()) +
                           " labels for a global batch of " + std::to_string(global_x.batch()));
    const shard s = shard_of(global_x.batch(), comm_.rank(), comm_.size());
    return train_step(input_ref(global_x.data() + s.first * Model::in_features, s.count),
                      labels.subspan(s.first, s.count), s.first, global_x.batch(), loss);
  }

  const step_timing& last_step() const { return timing; }
  /// Buckets of the last plan: the kernels each covers (first, last) and its float count.
  struct bucket_info {
    std::size_t first_kernel, last_kernel, floats;
  };
  std::vector<bucket_info> bucket_plan() const {
    std::vector<bucket_info> out;
    for (const auto& b : buckets) {
      std::size_t floats = 0;
      for (const auto& piece : b.pieces) floats += piece.size();
      out.push_back({b.lo, b.hi, floats});
    }
    return out;
  }
  Comm& communicator() { return comm_; }

 private:
  using clock = std::chrono::steady_clock;
  static double seconds(clock::duration d) { return std::chrono::duration<double>(d).count(); }

  struct bucket {
    std::size_t lo = 0, hi = 0;       // kernels [lo, hi], launched after kernel lo's backward
    std::vector<std::span<float>> pieces;  // their gradients, in params() order (and the loss)
    float loss = 0;                        // the rank's loss, then the global one (last bucket)
    typename Comm::reduction red;
  };

  std::vector<std::string> description() {
    std::vector<std::string> d;
    d.push_back("model " + detail::type_name(typeid(Model)));
    d.push_back("world size " + std::to_string(comm_.size()));
    const auto ps = model_.params();
    d.push_back(std::to_string(ps.size()) + " parameters");
    for (const auto& p : ps) d.push_back("parameter " + p.name + " " + detail::dims_text(p.dims));
    for (const auto& p : ps) {
      char h[17];
      std::snprintf(h, sizeof h, "%016llx", static_cast<unsigned long long>(detail::checksum(p.value.data(), p.value.size())));
      d.push_back("parameter " + p.name + " values with checksum " + h);
    }
    std::size_t k = 0;
    for (const philox_state& s : model_.dropout_streams())
      d.push_back("dropout stream " + std::to_string(k++) + " seed " + std::to_string(s.seed) + " offset " +
                  std::to_string(s.offset));
    d.push_back("optimizer " + detail::type_name(typeid(Optimizer)));
    if constexpr (requires { opt_.hyperparameters(); })
      d.push_back("optimizer settings " + detail::describe_options(opt_.hyperparameters()));
    if constexpr (requires { opt_.steps(); }) d.push_back("optimizer steps taken " + std::to_string(opt_.steps()));
    d.push_back("bucket bytes " + std::to_string(options_.bucket_bytes));
    return d;
  }

  void plan_buckets() {
    buckets.clear();
    std::size_t floats = 0, hi = Model::kernels - 1;
    std::vector<std::span<float>> held;
    for (std::size_t k = Model::kernels; k-- > 0;) {
      const auto ps = model_.block_params(k);
      std::vector<std::span<float>> grads;
      for (const auto& p : ps) grads.emplace_back(p.grad.data(), p.grad.size());
      held.insert(held.begin(), grads.begin(), grads.end());
      for (const auto& p : ps) floats += p.grad.size();
      if (k == 0 || (floats > 0 && floats * sizeof(float) >= options_.bucket_bytes)) {
        bucket& b = buckets.emplace_back();
        b.lo = k;
        b.hi = hi;
        b.pieces = std::move(held);
        held = {};
        floats = 0;
        hi = k - 1;
      }
    }
    // The last bucket carries the loss; its address is final once the vector stops growing.
    buckets.back().pieces.emplace_back(&buckets.back().loss, 1);
  }

  void set_weights(std::size_t global) {
    if (global == 0) solder::detail::fail("solder::dist::data_parallel::train_step: the global batch is empty");
    weights.resize(std::size_t(comm_.size()));
    for (int j = 0; j < comm_.size(); ++j) weights[std::size_t(j)] = double(shard_of(global, j, comm_.size()).count) / double(global);
  }

  /// Kernel k's backward has run: launch the bucket it completes, and move the others on.
  void block_done(std::size_t k) {
    if (launched < buckets.size() && buckets[launched].lo == k && buckets[launched].lo != 0) {
      comm_.start(buckets[launched].red, buckets[launched].pieces, weights, status_ok);
      ++launched;
    }
    for (std::size_t i = 0; i < launched; ++i) comm_.progress(buckets[i].red);
  }

  /// After the backward (or a failure): launch what is left; the last bucket with the loss.
  void launch_rest(float status, float local_loss) {
    for (; launched < buckets.size(); ++launched) {
      bucket& b = buckets[launched];
      if (b.lo == 0) b.loss = local_loss;
      comm_.start(b.red, b.pieces, weights, status);
    }
  }

  Model& model_;
  Optimizer& opt_;
  Comm& comm_;
  data_parallel_options options_;
  std::vector<bucket> buckets;
  std::vector<double> weights;
  std::size_t launched = 0;
  step_timing timing;
};

}  // namespace solder::dist
