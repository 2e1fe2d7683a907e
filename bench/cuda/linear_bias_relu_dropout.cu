// linear_bias_relu_dropout.cu: y = dropout(relu(x W^T + b)) on a CUDA device: solder's product with the epilogue fused (fp32, TF32, BF16) against cuBLASLt followed by separate passes, and cuBLASLt's dense GEMM as the measured peak.
#include <benchmark/benchmark.h>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common.cuh"
#include "cublaslt.cuh"
#include "solder/cuda.hpp"
#include "solder/eval/cuda/product_kernel.hpp"

namespace {

using namespace solder_bench::gpu;
namespace cu = solder::eval::cuda;
using solder::dyn;
using solder::shape;

constexpr float drop_p = 0.1f;
/// Every pass draws the same mask (drawing costs the same at any offset), so the outputs of all
/// implementations can be compared element by element, zeros included.
constexpr solder::philox_state dropout_rng{0x5eedULL, 0};

/// Seeds of the data, fixed so every run sees the same numbers; set k adds 16 k.
enum seed : std::uint64_t { seed_x = 1, seed_w = 2, seed_b = 3 };

// ---------------------------------------------------------------------------------------------
// The checks
// ---------------------------------------------------------------------------------------------

/// The dropped fraction of the clearly positive outputs is p within this: over 10 standard
/// deviations of a binomial over the thousands of such elements in three rows.
constexpr double dropped_fraction_tol = 0.05;

// ---------------------------------------------------------------------------------------------
// The cases of one shape
// ---------------------------------------------------------------------------------------------

/// x [M, K] (M rows of the batch, K in features), W [N, K] (N out features, PyTorch's layout),
/// b [N], y [M, N]; x in [-1, 1), W in +-1/sqrt(K) (nn.Linear's init range), b in [-0.5, 0.5)
/// (wider than nn.Linear's, so a missing bias shows above the BF16 tolerance).
template <std::size_t N, std::size_t K>
struct cases {
  using S = shape<dyn, N>;
  using input = solder::tensor<float, shape<dyn, K>, solder::device>;
  using weight = solder::tensor<float, shape<N, K>, solder::device>;
  using bias_vector = solder::tensor<float, shape<N>, solder::device>;
  using output = solder::tensor<float, S, solder::device>;

  struct set {
    input x;
    weight w;
    bias_vector b;
    output y;
    std::optional<output> pre;                 // cuBLASLt's output, before the separate pass
    cu::device_array<__nv_bfloat16> x16, w16;  // x and W as bf16 for cuBLASLt, converted untimed
  };

  static double flops(std::size_t M) { return 2.0 * double(M) * N * K; }
  static float keep_scale() { return float(solder::dropout_mask<S>::with_p(drop_p, dropout_rng).scale()); }

  /// Buffer sets enough that 2 x L2 of other data passes between two uses of one (or `count`);
  /// `pre`: with cuBLASLt's intermediate output; `bf16`: with x and W converted. Set k holds the
  /// same data in every case.
  static std::vector<set> make_sets(std::size_t M, bool pre, bool bf16, std::size_t count = 0) {
    // Bytes one pass touches: x and W (fp32 or bf16), b, y, and the intermediate written and read.
    const double bytes = (bf16 ? 2.0 : 4.0) * (double(M) * K + double(N) * K) + 4.0 * N + 4.0 * M * N * (pre ? 3 : 1);
    const float w_bound = 1.0f / std::sqrt(float(K));
    std::vector<set> sets;
    for (std::size_t k = 0, n = count ? count : rotation_sets(std::size_t(bytes)); k < n; ++k) {
      set s{input(M, solder::uninitialized), weight(solder::uninitialized), bias_vector(solder::uninitialized),
            output(M, solder::uninitialized), std::nullopt, {}, {}};
      fill_uniform(s.x.data(), s.x.size(), seed_x + 16 * k);
      fill_uniform(s.w.data(), s.w.size(), seed_w + 16 * k, -w_bound, w_bound);
      fill_uniform(s.b.data(), N, seed_b + 16 * k, -0.5f, 0.5f);
      if (pre) s.pre.emplace(M, solder::uninitialized);
      if (bf16) {
        s.x16 = bf16_copy(s.x.data(), s.x.size());
        s.w16 = bf16_copy(s.w.data(), s.w.size());
      }
      sets.push_back(std::move(s));
    }
    return sets;
  }

  /// solder's pass: one product whose epilogue is the rest of the expression (bias, ReLU, the
  /// dropout mask drawn inline), y written once.
  template <class Tiling>
  static auto solder_pass(set& s) {
    const auto x = std::as_const(s.x).ref();
    const auto w = std::as_const(s.w).ref();
    const auto b = std::as_const(s.b).ref();
    return cu::product_of<Tiling>(
        solder::write(s.y.ref(), solder::dropout(solder::relu(solder::matmul(x, solder::transpose(w)) + b), drop_p, dropout_rng)));
  }
  template <math Math>
  using tiling = solder_tiling<Math, N>;

  /// solder fp32's output in rows {0, M / 2, M - 1} of set 0, and the double product there.
  struct reference {
    std::vector<std::size_t> rows;
    std::vector<float> y;
    std::vector<double> pre, magnitude;  // x W^T + b and sum_k |x_k W_nk| + |b_n|, in double
    std::string error;                   // where solder fp32 disagrees with the double product
  };

  static const reference& reference_for(std::size_t M) {
    static std::map<std::size_t, reference> refs;
    if (auto it = refs.find(M); it != refs.end()) return it->second;
    auto sets = make_sets(M, false, false, 1);
    set& s = sets[0];
    cu::run_product(solder::current_stream(), solder_pass<tiling<math::fp32>>(s));
    reference r;
    r.rows = {0, M / 2, M - 1};
    r.y = host_rows(s.y.data(), N, r.rows);
    const auto hx = host_rows(s.x.data(), K, r.rows), hb = host_rows(s.b.data(), N, {0});
    std::vector<float> hw(N * K);
    check(cudaMemcpy(hw.data(), s.w.data(), hw.size() * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
    r.pre.resize(r.y.size());
    r.magnitude.resize(r.y.size());
    for (std::size_t i = 0; i < r.rows.size(); ++i)
      for (std::size_t n = 0; n < N; ++n) {
        double acc = hb[n], mag = std::abs(double(hb[n]));
        for (std::size_t k = 0; k < K; ++k) {
          const double t = double(hx[i * K + k]) * double(hw[n * K + k]);
          acc += t;
          mag += std::abs(t);
        }
        r.pre[i * N + n] = acc;
        r.magnitude[i * N + n] = mag;
      }
    r.error = check_fp32(r);
    return refs[M] = std::move(r);
  }

  static std::string at(const reference& r, std::size_t i) {
    return "y[" + std::to_string(r.rows[i / N]) + ", " + std::to_string(i % N) + "]";
  }

  /// "" when every element is relu(x W^T + b) / (1 - p) or 0, within fp32's tolerance, and the
  /// dropped fraction of the clearly positive ones is p.
  static std::string check_fp32(const reference& r) {
    const double scale = keep_scale(), tol = fp32_tol(K);
    std::size_t positive = 0, dropped = 0;
    for (std::size_t i = 0; i < r.y.size(); ++i) {
      const double band = tol * r.magnitude[i], y = r.y[i];
      if (y != 0 && !(std::abs(y - std::max(r.pre[i], 0.0) * scale) <= band * scale))
        return at(r, i) + " is " + std::to_string(y) + ", expected 0 or " + std::to_string(std::max(r.pre[i], 0.0) * scale);
      if (r.pre[i] > band) {
        ++positive;
        dropped += y == 0;
      } else if (r.pre[i] < -band && y != 0) {
        return at(r, i) + " is " + std::to_string(y) + " where relu gives 0";
      }
    }
    const double fraction = double(dropped) / double(std::max<std::size_t>(1, positive));
    if (!(std::abs(fraction - drop_p) <= dropped_fraction_tol))
      return "drops " + std::to_string(fraction) + " of the positive elements, expected " + std::to_string(drop_p);
    return "";
  }

  /// "" when an implementation's rows `got` agree with solder fp32's: the same zeros wherever
  /// x W^T + b is clearly away from 0 (the same dropout mask and ReLU), and every element within
  /// both products' tolerances (`tol`: the implementation's) times the dropout scale.
  static std::string compare(const reference& r, const std::vector<float>& got, double tol) {
    const double scale = keep_scale(), both = tol + fp32_tol(K);
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double band = both * r.magnitude[i];
      if (std::abs(r.pre[i]) > band && (got[i] == 0) != (r.y[i] == 0))
        return at(r, i) + " is " + std::to_string(got[i]) + ", solder fp32 gives " + std::to_string(r.y[i]) +
               ": the zero patterns (dropout mask, ReLU) differ";
      if (!(std::abs(double(got[i]) - double(r.y[i])) <= band * scale))
        return at(r, i) + " is " + std::to_string(got[i]) + ", solder fp32 gives " + std::to_string(r.y[i]) +
               " (tolerance " + std::to_string(band * scale) + ")";
    }
    return "";
  }

  /// The reference, or false after SkipWithError where solder fp32 itself is wrong.
  static const reference* checked_reference(benchmark::State& state, std::size_t M) {
    const reference& r = reference_for(M);
    if (!r.error.empty()) {
      state.SkipWithError(("solder fp32 against the double product: " + r.error).c_str());
      return nullptr;
    }
    return &r;
  }

  static void set_rates(benchmark::State& state, std::size_t M, double seconds, math m) {
    set_flop_rates(state, flops(M), seconds, m);
  }

  /// solder's product with the epilogue fused, math `Math`.
  template <math Math>
  static void solder_case(benchmark::State& state, std::size_t M) {
    const reference* r = checked_reference(state, M);
    if (!r) return;
    auto sets = make_sets(M, false, false);
    using pass_type = decltype(solder_pass<tiling<Math>>(sets[0]));
    std::vector<pass_type> passes;
    for (set& s : sets) passes.push_back(solder_pass<tiling<Math>>(s));
    const cudaStream_t stream = solder::current_stream();
    cu::run_product(stream, passes[0]);
    if (const std::string err = compare(*r, host_rows(sets[0].y.data(), N, r->rows), tol_of(Math, K)); !err.empty())
      return state.SkipWithError(err.c_str());
    const double seconds = timed_seconds(state, sets.size(), [&](std::size_t k) { cu::run_product(stream, passes[k]); });
    set_rates(state, M, seconds, Math);
    const char* how = Math == math::fp32   ? "fp32 fma"
                      : Math == math::tf32 ? "TF32 mma.sync, float x and W rounded to tf32 while staged"
                                           : "BF16 mma.sync, float x and W rounded to bf16 while staged";
    state.SetLabel(std::to_string(sets.size()) + " buffer sets; one product, epilogue fused; " + how);
  }

  /// What follows cuBLASLt's matmul: its RELU_BIAS epilogue then a dropout pass, or a plain GEMM
  /// then one bias + ReLU + dropout pass (solder's elementwise pass, the mask solder's).
  enum class lt_form { relu_bias, gemm };

  template <math Math, lt_form Form>
  static void cublaslt_case(benchmark::State& state, std::size_t M) {
    const reference* r = checked_reference(state, M);
    if (!r) return;
    constexpr bool bf16 = Math == math::bf16;
    auto sets = make_sets(M, true, bf16);
    lt_linear op(Math, M, N, K, Form == lt_form::relu_bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
    const cudaStream_t stream = solder::current_stream();
    const auto pass = [&](std::size_t k) {
      set& s = sets[k];
      const void* x = bf16 ? static_cast<const void*>(s.x16.data()) : s.x.data();
      const void* w = bf16 ? static_cast<const void*>(s.w16.data()) : s.w.data();
      const auto pre = std::as_const(*s.pre).ref();
      if constexpr (Form == lt_form::relu_bias) {
        op.run(x, w, s.b.data(), s.pre->data(), stream);
        cu::run_writes(stream, solder::write(s.y.ref(), solder::dropout(pre, drop_p, dropout_rng)));
      } else {
        op.run(x, w, nullptr, s.pre->data(), stream);
        cu::run_writes(stream, solder::write(s.y.ref(), solder::dropout(solder::relu(pre + std::as_const(s.b).ref()), drop_p, dropout_rng)));
      }
    };
    pass(0);
    if (const std::string err = compare(*r, host_rows(sets[0].y.data(), N, r->rows), tol_of(Math, K)); !err.empty())
      return state.SkipWithError(err.c_str());
    const double seconds = timed_seconds(state, sets.size(), pass);
    set_rates(state, M, seconds, Math);
    const std::string how = std::string(Math == math::fp32 ? "fp32 (CUBLAS_COMPUTE_32F)"
                                        : Math == math::tf32 ? "TF32 (CUBLAS_COMPUTE_32F_FAST_TF32)"
                                                             : "bf16 x and W converted before timing, fp32 accumulation") +
                            (Form == lt_form::relu_bias ? "; cublasLtMatmul RELU_BIAS, then a dropout pass"
                                                        : "; cublasLtMatmul, then a bias + ReLU + dropout pass");
    state.SetLabel(std::to_string(sets.size()) + " buffer sets; " + how);
  }
};

/// The cases of (M, N, K): M batch rows, N out features, K in features.
template <std::size_t N, std::size_t K>
void register_shape(std::size_t M) {
  using C = cases<N, K>;
  using form = typename C::lt_form;
  const std::string shape = std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K);
  using case_fn = void (*)(benchmark::State&, std::size_t);
  const std::pair<const char*, case_fn> list[] = {
      {"solder_fp32", &C::template solder_case<math::fp32>},
      {"solder_tf32", &C::template solder_case<math::tf32>},
      {"solder_bf16", &C::template solder_case<math::bf16>},
      {"cublaslt_relu_bias_fp32", &C::template cublaslt_case<math::fp32, form::relu_bias>},
      {"cublaslt_relu_bias_tf32", &C::template cublaslt_case<math::tf32, form::relu_bias>},
      {"cublaslt_relu_bias_bf16", &C::template cublaslt_case<math::bf16, form::relu_bias>},
      {"cublaslt_gemm_fp32", &C::template cublaslt_case<math::fp32, form::gemm>},
      {"cublaslt_gemm_tf32", &C::template cublaslt_case<math::tf32, form::gemm>},
      {"cublaslt_gemm_bf16", &C::template cublaslt_case<math::bf16, form::gemm>},
  };
  for (const auto& [impl, fn] : list)
    benchmark::RegisterBenchmark(("BM_cuda_linear_bias_relu_dropout_fwd/" + std::string(impl) + "/" + shape).c_str(),
                                 [fn = fn, M](benchmark::State& state) { guarded(state, [&] { fn(state, M); }); })
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
}

}  // namespace

int main(int argc, char** argv) {
  return run_benchmarks(argc, argv, [] {
    benchmark::AddCustomContext("cublasLt_version", std::to_string(cublasLtGetVersion()));
    auto lt = std::make_unique<lt_library>();
    // The peaks first: the cases after them divide by the rates they measured.
    register_peaks();
    register_shape<4096, 4096>(4096);  // (M, N, K) = (4096, 4096, 4096)
    register_shape<2048, 1024>(256);   // (M, N, K) = (256, 2048, 1024)
    return lt;
  });
}
