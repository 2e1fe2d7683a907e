// bias_relu_dropout.cu: y = dropout(relu(x + b)) forward and backward on a CUDA device, against a device-to-device copy.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common.cuh"
#include "solder/cuda.hpp"
#include "solder/nn/elementwise_block.hpp"

namespace {

using namespace solder_bench::gpu;

constexpr float drop_p = 0.1f;

/// Seeds of the data, fixed so every run sees the same numbers.
enum seed : std::uint64_t { seed_x = 1, seed_b = 2, seed_dy = 4 };

/// Times the passes (timed_seconds) and sets bytes, GBps and peak_fraction; returns GBps.
template <class Pass>
double run_timed(benchmark::State& state, std::size_t sets, double bytes, Pass&& pass) {
  const double gbps = bytes / timed_seconds(state, sets, pass) * 1e-9;
  state.counters["bytes"] = bytes;
  state.counters["GBps"] = gbps;
  state.counters["peak_fraction"] = gbps / device().peak_gbps;
  return gbps;
}

/// The copy's GB/s per shape (B, N): set by the copy case, else measured on first use.
std::map<std::pair<std::size_t, std::size_t>, double>& copy_rates() {
  static std::map<std::pair<std::size_t, std::size_t>, double> rates;
  return rates;
}

// ---------------------------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------------------------

/// Relative tolerance of one element: an add, a max and a multiply in float, a few ulps apart
/// however the scale is folded.
constexpr double element_rel_tol = 1e-5;
/// Relative tolerance of db against a double sum of the column, relative to the sum of |terms|:
/// up to 16384 float additions in a fixed tree, about 200 roundings deep at most.
constexpr double column_sum_rel_tol = 1e-4;

template <std::size_t N>
struct cases {
  using S = solder::shape<solder::dyn, N>;
  using matrix = solder::tensor<float, S, solder::device>;
  using vector = solder::tensor<float, solder::shape<N>, solder::device>;
  using layer_type = solder::nn::bias_relu_dropout<N, drop_p>;
  static constexpr auto train = solder::nn::mode::train;

  /// Only its dropout's Philox stream is used: the bias is a device leaf of the expression.
  static layer_type& layer() {
    static layer_type l;
    return l;
  }
  static float keep_scale() { return layer().template layer<2>().scale(); }

  static matrix filled(std::size_t rows, std::uint64_t seed) {
    matrix m(rows, solder::uninitialized);
    fill_uniform(m.data(), m.size(), seed);
    return m;
  }
  static vector bias() {
    vector b(solder::uninitialized);
    fill_uniform(b.data(), N, seed_b, -0.5f, 0.5f);
    return b;
  }

  /// The layer's training forward: a fresh mask, then y = dropout(relu(x + b)) in one pass.
  static void forward(const matrix& x, const vector& b, matrix& y) {
    layer().advance();
    solder::assign(y.ref(), layer().template expression<train>(x.ref(), b.ref()));
  }
  /// The layer's backward_from_output: dx = g and db = column sums of g in one pass, where
  /// g = (y > 0 ? dy * scale : 0) is read from the saved output y.
  static void backward(const matrix& y, const matrix& dy, matrix& dx, vector& db) {
    const auto g = layer().template gate_from_output<train>(y.ref(), dy.ref());
    solder::assign_all(solder::write(dx.ref(), g), solder::write(db.ref(), solder::sum_to<solder::shape<N>>(g)));
  }

  static double copy_bytes(std::size_t rows) { return 2.0 * rows * N * sizeof(float); }

  struct copy_set {
    matrix x, y;
  };
  static std::vector<copy_set> copy_sets(std::size_t rows) {
    std::vector<copy_set> sets;
    for (std::size_t k = 0, n = rotation_sets(copy_bytes(rows)); k < n; ++k)
      sets.push_back({filled(rows, seed_x + 16 * k), matrix(rows, solder::uninitialized)});
    return sets;
  }
  /// The floor: y = x as one cudaMemcpyAsync, the same bytes read and written as the forward.
  static void copy_pass(copy_set& s) {
    check(cudaMemcpyAsync(s.y.data(), s.x.data(), s.x.size() * sizeof(float), cudaMemcpyDeviceToDevice,
                          solder::current_stream()),
          "cudaMemcpyAsync");
  }

  /// The copy's GB/s for this shape: the copy case's, or the median of 31 timed copies.
  static double copy_gbps(std::size_t rows) {
    auto& rates = copy_rates();
    if (auto it = rates.find({rows, N}); it != rates.end()) return it->second;
    auto sets = copy_sets(rows);
    const double seconds = median_seconds(sets.size(), 31, [&](std::size_t k) { copy_pass(sets[k]); });
    return rates[{rows, N}] = copy_bytes(rows) / seconds * 1e-9;
  }

  static void set_roofline(benchmark::State& state, double gbps, std::size_t rows) {
    const double copy = copy_gbps(rows);
    state.counters["copy_GBps"] = copy;
    state.counters["roofline"] = gbps / copy;
  }

  static void copy(benchmark::State& state, std::size_t rows) {
    auto sets = copy_sets(rows);
    const double gbps = run_timed(state, sets.size(), copy_bytes(rows), [&](std::size_t k) { copy_pass(sets[k]); });
    copy_rates()[{rows, N}] = gbps;
    state.counters["copy_GBps"] = gbps;
    state.counters["roofline"] = 1.0;
    state.SetLabel(std::to_string(sets.size()) + " buffer sets");
  }

  /// "" when rows of y hold dropout(relu(x + b)): every nonzero (x + b) * scale, zero where
  /// x + b <= 0, and the kept fraction of the positive ones 1 - p within 0.05.
  static std::string check_forward(const matrix& x, const vector& b, const matrix& y) {
    const std::vector<std::size_t> rows = {0, x.batch() / 2, x.batch() - 1};
    const auto hx = host_rows(x.data(), N, rows), hy = host_rows(y.data(), N, rows), hb = host_rows(b.data(), N, {0});
    const double scale = keep_scale();
    std::size_t positive = 0, kept = 0;
    for (std::size_t i = 0; i < hx.size(); ++i) {
      const double pre = double(hx[i]) + hb[i % N], want = pre * scale;
      if (hy[i] != 0.0f && (pre <= 0 || std::abs(hy[i] - want) > element_rel_tol * std::abs(want)))
        return "y[" + std::to_string(rows[i / N]) + ", " + std::to_string(i % N) + "] is " + std::to_string(hy[i]) +
               ", expected 0 or " + std::to_string(want);
      positive += pre > 0;
      kept += hy[i] != 0.0f;
    }
    const double fraction = double(kept) / double(positive);
    if (std::abs(fraction - (1.0 - drop_p)) > 0.05) return "keeps " + std::to_string(fraction) + " of the positive elements";
    return "";
  }

  /// "" when rows of dx hold (y > 0 ? dy * scale : 0) and db a few column sums of dx.
  static std::string check_backward(const matrix& y, const matrix& dy, const matrix& dx, const vector& db) {
    const std::vector<std::size_t> rows = {0, y.batch() / 2, y.batch() - 1};
    const auto hy = host_rows(y.data(), N, rows), hdy = host_rows(dy.data(), N, rows), hdx = host_rows(dx.data(), N, rows);
    const double scale = keep_scale();
    for (std::size_t i = 0; i < hy.size(); ++i) {
      const double want = hy[i] > 0 ? hdy[i] * scale : 0.0;
      if (std::abs(hdx[i] - want) > element_rel_tol * std::abs(want))
        return "dx[" + std::to_string(rows[i / N]) + ", " + std::to_string(i % N) + "] is " + std::to_string(hdx[i]) +
               ", expected " + std::to_string(want);
    }
    const auto hdb = host_rows(db.data(), N, {0});
    std::vector<float> column(dx.batch());
    for (std::size_t c : {std::size_t{0}, std::size_t{1}, N / 2, N - 1}) {
      check(cudaMemcpy2D(column.data(), sizeof(float), dx.data() + c, N * sizeof(float), sizeof(float), dx.batch(),
                         cudaMemcpyDeviceToHost),
            "cudaMemcpy2D");
      double sum = 0, magnitude = 0;
      for (float v : column) sum += v, magnitude += std::abs(v);
      if (std::abs(hdb[c] - sum) > column_sum_rel_tol * magnitude)
        return "db[" + std::to_string(c) + "] is " + std::to_string(hdb[c]) + ", the column sum of dx " + std::to_string(sum);
    }
    return "";
  }

  struct fwd_set {
    matrix x, y;
  };
  static void fwd(benchmark::State& state, std::size_t rows) {
    const double bytes = 2.0 * rows * N * sizeof(float);  // reads x, writes y
    const vector b = bias();
    std::vector<fwd_set> sets;
    for (std::size_t k = 0, n = rotation_sets(bytes); k < n; ++k)
      sets.push_back({filled(rows, seed_x + 16 * k), matrix(rows, solder::uninitialized)});
    forward(sets[0].x, b, sets[0].y);
    if (const std::string err = check_forward(sets[0].x, b, sets[0].y); !err.empty()) return state.SkipWithError(err.c_str());
    const double gbps = run_timed(state, sets.size(), bytes, [&](std::size_t k) { forward(sets[k].x, b, sets[k].y); });
    set_roofline(state, gbps, rows);
    state.SetLabel(std::to_string(sets.size()) + " buffer sets");
  }

  struct bwd_set {
    matrix y, dy, dx;
  };
  static void bwd(benchmark::State& state, std::size_t rows) {
    const double bytes = 3.0 * rows * N * sizeof(float);  // reads y and dy, writes dx
    const vector b = bias();
    vector db(solder::uninitialized);
    std::vector<bwd_set> sets;
    {
      const matrix x = filled(rows, seed_x);
      for (std::size_t k = 0, n = rotation_sets(bytes); k < n; ++k) {
        sets.push_back({matrix(rows, solder::uninitialized), filled(rows, seed_dy + 16 * k), matrix(rows, solder::uninitialized)});
        forward(x, b, sets[k].y);  // each set's saved output, with its own mask
      }
    }
    backward(sets[0].y, sets[0].dy, sets[0].dx, db);
    if (const std::string err = check_backward(sets[0].y, sets[0].dy, sets[0].dx, db); !err.empty())
      return state.SkipWithError(err.c_str());
    const double gbps =
        run_timed(state, sets.size(), bytes, [&](std::size_t k) { backward(sets[k].y, sets[k].dy, sets[k].dx, db); });
    set_roofline(state, gbps, rows);
    state.SetLabel(std::to_string(sets.size()) + " buffer sets");
  }
};

template <std::size_t N>
void register_shape(std::size_t rows) {
  const std::string shape = std::to_string(rows) + "x" + std::to_string(N);
  // The copy first: the cases after it compare with the rate it measured.
  const std::pair<const char*, void (*)(benchmark::State&, std::size_t)> list[] = {
      {"BM_cuda_copy/", &cases<N>::copy},
      {"BM_cuda_bias_relu_dropout_fwd/", &cases<N>::fwd},
      {"BM_cuda_bias_relu_dropout_bwd/", &cases<N>::bwd},
  };
  for (const auto& [prefix, fn] : list)
    benchmark::RegisterBenchmark((prefix + shape).c_str(),
                                 [fn = fn, rows](benchmark::State& state) { guarded(state, [&] { fn(state, rows); }); })
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
}

}  // namespace

int main(int argc, char** argv) {
  return run_benchmarks(argc, argv, [] {
    register_shape<4096>(4096);
    register_shape<16384>(16384);
  });
}
