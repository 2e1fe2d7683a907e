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
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common.cuh"
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

/// The square GEMM whose cuBLASLt rate is the measured peak: large enough that each precision's
/// best kernel fills every multiprocessor for milliseconds.
constexpr std::size_t peak_extent = 8192;

/// How the product multiplies: fp32 fma (CUDA cores), TF32 or BF16 tensor cores with fp32 accumulation.
enum class math { fp32, tf32, bf16 };

const char* name_of(math m) { return m == math::fp32 ? "fp32" : m == math::tf32 ? "tf32" : "bf16"; }

// ---------------------------------------------------------------------------------------------
// cuBLASLt
// ---------------------------------------------------------------------------------------------

void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": " + cublasLtGetStatusString(s));
}

/// The process's cuBLASLt handle and the workspace every matmul may use.
class lt_library {
 public:
  /// What cuBLAS asks for on Hopper; the heuristic is told this is the most it may use.
  static constexpr std::size_t workspace_bytes = std::size_t{32} << 20;

  lt_library() {
    check_lt(cublasLtCreate(&handle_), "cublasLtCreate");
    check(cudaMalloc(&workspace_, workspace_bytes), "cudaMalloc of the cuBLASLt workspace");
    current() = this;
  }
  ~lt_library() {
    current() = nullptr;
    cudaFree(workspace_);
    cublasLtDestroy(handle_);
  }
  lt_library(const lt_library&) = delete;
  lt_library& operator=(const lt_library&) = delete;

  static lt_library& get() { return *current(); }
  cublasLtHandle_t handle() const { return handle_; }
  void* workspace() const { return workspace_; }

 private:
  static lt_library*& current() {
    static lt_library* p = nullptr;
    return p;
  }
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
};

template <class T>
void set_attribute(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t a, const T& value) {
  check_lt(cublasLtMatmulDescSetAttribute(op, a, &value, sizeof value), "cublasLtMatmulDescSetAttribute");
}

/// y [M, N] row-major = x [M, K] W^T, W [N, K], by cublasLtMatmul, with `epilogue` (DEFAULT or
/// RELU_BIAS: relu(. + b), b [N]). cuBLASLt is column-major, so it computes y^T [N, M] = W x^T:
/// A = W, a column-major [K, N] read transposed; B = x, a column-major [K, M]; D [N, M] with the
/// bias along its rows, the N out features. Inputs fp32 (fp32: CUBLAS_COMPUTE_32F; tf32:
/// CUBLAS_COMPUTE_32F_FAST_TF32) or bf16 (CUBLAS_COMPUTE_32F: fp32 accumulation); D fp32.
class lt_linear {
 public:
  lt_linear(math m, std::size_t M, std::size_t N, std::size_t K, cublasLtEpilogue_t epilogue) {
    const cudaDataType_t in = m == math::bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasComputeType_t compute = m == math::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    check_lt(cublasLtMatmulDescCreate(&op_, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
    set_attribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, cublasOperation_t(CUBLAS_OP_T));
    set_attribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, cublasOperation_t(CUBLAS_OP_N));
    set_attribute(op_, CUBLASLT_MATMUL_DESC_EPILOGUE, std::uint32_t(epilogue));
    check_lt(cublasLtMatrixLayoutCreate(&a_, in, K, N, std::int64_t(K)), "cublasLtMatrixLayoutCreate");
    check_lt(cublasLtMatrixLayoutCreate(&b_, in, K, M, std::int64_t(K)), "cublasLtMatrixLayoutCreate");
    check_lt(cublasLtMatrixLayoutCreate(&d_, CUDA_R_32F, N, M, std::int64_t(N)), "cublasLtMatrixLayoutCreate");
  }
  ~lt_linear() {
    if (d_) cublasLtMatrixLayoutDestroy(d_);
    if (b_) cublasLtMatrixLayoutDestroy(b_);
    if (a_) cublasLtMatrixLayoutDestroy(a_);
    if (op_) cublasLtMatmulDescDestroy(op_);
  }
  lt_linear(const lt_linear&) = delete;
  lt_linear& operator=(const lt_linear&) = delete;

  /// Queues y = x W^T (+ bias, relu) on `stream`; bias null without the bias epilogue. The first
  /// call asks the heuristic for its best algorithm (the bias pointer set, as it is in every call).
  void run(const void* x, const void* w, const float* bias, float* y, cudaStream_t stream) {
    if (bias) set_attribute(op_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    if (!chosen_) choose();
    const float one = 1.0f, zero = 0.0f;
    check_lt(cublasLtMatmul(lt_library::get().handle(), op_, &one, w, a_, x, b_, &zero, y, d_, y, d_, &algo_,
                            lt_library::get().workspace(), lt_library::workspace_bytes, stream),
             "cublasLtMatmul");
  }

 private:
  void choose() {
    cublasLtMatmulPreference_t pref = nullptr;
    check_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const std::uint64_t bytes = lt_library::workspace_bytes;
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof bytes);
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatmulAlgoGetHeuristic(lt_library::get().handle(), op_, a_, b_, d_, d_, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    check_lt(s, "cublasLtMatmulAlgoGetHeuristic");
    if (found == 0) throw std::runtime_error("cuBLASLt's heuristic has no algorithm for this matmul");
    algo_ = result.algo;
    chosen_ = true;
  }

  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  bool chosen_ = false;
};

/// out[i] = x[i] rounded to bf16, to nearest even (as solder's BF16 staging rounds).
__global__ void to_bf16_kernel(const float* x, __nv_bfloat16* out, std::size_t n) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(x[i]);
}

cu::device_array<__nv_bfloat16> bf16_copy(const float* x, std::size_t n) {
  auto out = cu::device_array<__nv_bfloat16>::allocate(n, solder::current_stream());
  to_bf16_kernel<<<unsigned(device().multiprocessors * 8), 256, 0, solder::current_stream()>>>(x, out.data(), n);
  check(cudaGetLastError(), "to_bf16_kernel");
  return out;
}

// ---------------------------------------------------------------------------------------------
// The measured peak: cuBLASLt's dense GEMM at peak_extent cubed, per precision
// ---------------------------------------------------------------------------------------------

/// TFLOP/s of the peak GEMM per precision: set by its case, else measured on first use.
std::map<math, double>& peak_rates() {
  static std::map<math, double> rates;
  return rates;
}

struct peak_gemm {
  using square = solder::tensor<float, shape<dyn, peak_extent>, solder::device>;
  struct set {
    std::optional<square> x, w;                 // fp32 and tf32
    cu::device_array<__nv_bfloat16> x16, w16;   // bf16
    square y;
    const void* a() const { return x ? static_cast<const void*>(x->data()) : x16.data(); }
    const void* b() const { return w ? static_cast<const void*>(w->data()) : w16.data(); }
  };

  static constexpr double flops = 2.0 * peak_extent * peak_extent * peak_extent;
  math m;
  std::vector<set> sets;
  lt_linear op;

  explicit peak_gemm(math m_) : m(m_), op(m_, peak_extent, peak_extent, peak_extent, CUBLASLT_EPILOGUE_DEFAULT) {
    const std::size_t e2 = peak_extent * peak_extent;
    const std::size_t bytes = e2 * ((m == math::bf16 ? 2 * 2 : 2 * 4) + 4);  // reads x and W, writes y
    const float w_bound = 1.0f / std::sqrt(float(peak_extent));
    for (std::size_t k = 0, n = rotation_sets(bytes); k < n; ++k) {
      square x(peak_extent, solder::uninitialized), w(peak_extent, solder::uninitialized);
      fill_uniform(x.data(), e2, seed_x + 16 * k);
      fill_uniform(w.data(), e2, seed_w + 16 * k, -w_bound, w_bound);
      set s{std::nullopt, std::nullopt, {}, {}, square(peak_extent, solder::uninitialized)};
      if (m == math::bf16) {
        s.x16 = bf16_copy(x.data(), e2);
        s.w16 = bf16_copy(w.data(), e2);
      } else {
        s.x.emplace(std::move(x));
        s.w.emplace(std::move(w));
      }
      sets.push_back(std::move(s));
    }
  }
  void pass(std::size_t k) { op.run(sets[k].a(), sets[k].b(), nullptr, sets[k].y.data(), solder::current_stream()); }
};

/// The peak TFLOP/s of `m`: the peak case's, or the median of 11 timed GEMMs.
double peak_tflops(math m) {
  auto& rates = peak_rates();
  if (auto it = rates.find(m); it != rates.end()) return it->second;
  peak_gemm g(m);
  const double seconds = median_seconds(g.sets.size(), 11, [&](std::size_t k) { g.pass(k); });
  return rates[m] = peak_gemm::flops / seconds * 1e-12;
}

void peak_case(benchmark::State& state, math m) {
  peak_gemm g(m);
  const double tflops = peak_gemm::flops / timed_seconds(state, g.sets.size(), [&](std::size_t k) { g.pass(k); }) * 1e-12;
  peak_rates()[m] = tflops;
  state.counters["flops"] = peak_gemm::flops;
  state.counters["TFLOPs"] = tflops;
  state.counters["peak_TFLOPs"] = tflops;
  state.counters["peak_fraction"] = 1.0;
  state.SetLabel(std::to_string(g.sets.size()) + " buffer sets; cublasLtMatmul, " +
                 (m == math::bf16 ? "bf16 inputs, " : "") + "fp32 out: the measured peak of " + name_of(m));
}

// ---------------------------------------------------------------------------------------------
// The checks
// ---------------------------------------------------------------------------------------------

// Tolerances of one element of x W^T + b, relative to its magnitude sum_k |x_k W_nk| + |b_n|:
/// fp32: K fused multiply-adds in sequence, each rounding once by at most 2^-24 of a partial sum
/// no larger than the magnitude, and the bias's add.
double fp32_tol(std::size_t K) { return double(K + 1) * 0x1p-24; }
/// Tensor cores add a fragment's products in their own order and width: 4 ulps per addition.
double tensor_core_accumulation_tol(std::size_t K) { return double(K + 1) * 0x1p-22; }
/// TF32: an input keeps 10 fraction bits, losing up to 2^-10 of itself where it is truncated
/// (cuBLASLt may pass fp32 bits to the tensor cores; solder rounds to nearest: 2^-11), so a
/// product up to 2^-9 (+ 2^-20).
double tf32_tol(std::size_t K) { return 0x1p-9 + 0x1p-20 + tensor_core_accumulation_tol(K); }
/// BF16: an input rounded to nearest even with 7 fraction bits is off by up to 2^-8 of itself,
/// a product by 2^-7 (+ 2^-16); solder and the conversion before cuBLASLt round alike.
double bf16_tol(std::size_t K) { return 0x1p-7 + 0x1p-16 + tensor_core_accumulation_tol(K); }

double tol_of(math m, std::size_t K) { return m == math::fp32 ? fp32_tol(K) : m == math::tf32 ? tf32_tol(K) : bf16_tol(K); }

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
  using tiling = std::conditional_t<Math == math::fp32, cu::product_tiling_for<N>,
                                    cu::mma_tiling_for<N, Math == math::tf32 ? cu::product_math::tf32 : cu::product_math::bf16>>;

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
    const double tflops = flops(M) / seconds * 1e-12, peak = peak_tflops(m);
    state.counters["flops"] = flops(M);
    state.counters["TFLOPs"] = tflops;
    state.counters["peak_TFLOPs"] = peak;
    state.counters["peak_fraction"] = tflops / peak;
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

/// Runs a case, reporting a CUDA, cuBLASLt or solder error (out of memory, say) as the case's error.
template <class F>
void guarded(benchmark::State& state, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void register_peaks() {
  const std::string shape = std::to_string(peak_extent) + "x" + std::to_string(peak_extent) + "x" + std::to_string(peak_extent);
  for (math m : {math::fp32, math::tf32, math::bf16})
    benchmark::RegisterBenchmark(("BM_cuda_gemm_peak/cublaslt_" + std::string(name_of(m)) + "/" + shape).c_str(),
                                 [m](benchmark::State& state) { guarded(state, [&] { peak_case(state, m); }); })
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
}

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
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (!have_device("solder CUDA bench")) return 0;
  try {
    start_device();
    benchmark::AddCustomContext("cublasLt_version", std::to_string(cublasLtGetVersion()));
    solder::stream s;
    solder::stream_guard on(s);
    lt_library lt;
    // The peaks first: the cases after them divide by the rates they measured.
    register_peaks();
    register_shape<4096, 4096>(4096);  // (M, N, K) = (4096, 4096, 4096)
    register_shape<2048, 1024>(256);   // (M, N, K) = (256, 2048, 1024)
    benchmark::RunSpecifiedBenchmarks();
    s.synchronize();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "solder CUDA bench: %s\n", e.what());
    return 1;
  }
  benchmark::Shutdown();
  return 0;
}
