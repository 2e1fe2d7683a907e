// eval/cuda/row_kernels.hpp: the CUDA backend's row kernels and their launchers (softmax and
// log_softmax forward and backward, layer_norm forward and backward, the softmax cross-entropy,
// mse and bce_with_logits losses) and the fixed-order total of doubles. One warp per row runs
// a row body of eval/cuda/row.hpp, the code the host suite tests. nvcc only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "solder/backend.hpp"
#include "solder/config.hpp"
#include "solder/eval/cuda/error.hpp"
#include "solder/eval/cuda/row.hpp"
#include "solder/eval/cuda/total.hpp"
#include "solder/ops/layer_norm.hpp"
#include "solder/ops/loss.hpp"
#include "solder/ops/softmax.hpp"
#include "solder/shape.hpp"
#include "solder/tensor.hpp"

namespace solder::eval::cuda {

/// The device's warp as warp_row's team: lane threadIdx.x % 32 of a one-dimensional block;
/// the butterflies by __shfl_xor_sync over all 32 lanes, which every row body keeps together.
struct warp_team {
  static constexpr unsigned all_lanes = 0xffffffffu;
  __device__ unsigned lane() const { return threadIdx.x % unsigned(warp_size); }
  __device__ void sync() const { __syncwarp(all_lanes); }
  __device__ double exchange_sum(double v) const {
    const unsigned l = lane();
    for (unsigned o = butterfly::first; o > 0; o /= 2)
      v = butterfly::sum(l, o, v, __shfl_xor_sync(all_lanes, v, int(o)));
    return v;
  }
  __device__ float exchange_max(float v) const {
    const unsigned l = lane();
    for (unsigned o = butterfly::first; o > 0; o /= 2)
      v = butterfly::max(l, o, v, __shfl_xor_sync(all_lanes, v, int(o)));
    return v;
  }
};

/// Threads per block of the row and elementwise kernels: 8 warps.
inline constexpr unsigned row_block_threads = 256;
/// The most blocks a grid-stride launch starts; the results never depend on the grid.
inline constexpr std::size_t max_grid_blocks = std::size_t(1) << 16;

/// Blocks of row_block_threads for `items` items of `per_block` each, at most max_grid_blocks.
inline unsigned grid_blocks(std::size_t items, std::size_t per_block) {
  const std::size_t blocks = (items + per_block - 1) / per_block;
  return unsigned(blocks < max_grid_blocks ? blocks : max_grid_blocks);
}

/// body(r, warp_team) for every row r of [0, rows), one warp per row, grid-stride.
template <class Body>
__global__ void __launch_bounds__(row_block_threads) row_kernel(Body body, std::size_t rows) {
  const warp_team team;
  const std::size_t warps = std::size_t(gridDim.x) * (blockDim.x / warp_size);
  for (std::size_t r = (std::size_t(blockIdx.x) * blockDim.x + threadIdx.x) / warp_size; r < rows; r += warps)
    body(r, team);
}

/// body(i) for every i of [0, n), one thread per element, grid-stride.
template <class Body>
__global__ void __launch_bounds__(row_block_threads) elementwise_kernel(Body body, std::size_t n) {
  const std::size_t threads = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += threads) body(i);
}

/// __syncthreads as block_total's barrier.
struct block_sync {
  __device__ void operator()() const { __syncthreads(); }
};

/// out[b] = block b's block_total of term(i), its threads starting at b total_threads and
/// striding by the grid's threads.
template <class Term>
__global__ void __launch_bounds__(total_threads) total_kernel(Term term, std::size_t n, double* out) {
  __shared__ double shared[total_threads];
  const std::size_t first = std::size_t(blockIdx.x) * total_threads, stride = std::size_t(gridDim.x) * total_threads;
  const double s = block_total<total_threads>::run(threadIdx.x, first, stride, n, term, shared, block_sync{});
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

/// Terms of a total: x[i].
struct double_terms {
  const double* x;
  SOLDER_HD double operator()(std::size_t i) const { return x[i]; }
};

namespace detail {

/// Device scratch from the stream-ordered allocator, given back on the same stream when it
/// goes out of scope (after the work queued on that stream before).
template <class T>
class stream_scratch {
 public:
  stream_scratch(std::size_t n, cudaStream_t stream, const char* what) : stream_(stream) {
    check(cudaMallocAsync(reinterpret_cast<void**>(&p_), (n ? n : 1) * sizeof(T), stream), what);
  }
  stream_scratch(const stream_scratch&) = delete;
  stream_scratch& operator=(const stream_scratch&) = delete;
  ~stream_scratch() { (void)cudaFreeAsync(p_, stream_); }
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
  cudaStream_t stream_;
};

/// row_kernel over `rows` rows; `what` names the launch in errors.
template <class Body>
void launch_rows(const Body& body, std::size_t rows, cudaStream_t stream, const char* what) {
  if (rows == 0) return;
  row_kernel<<<grid_blocks(rows, row_block_threads / warp_size), row_block_threads, 0, stream>>>(body, rows);
  check(cudaGetLastError(), what);
}

/// elementwise_kernel over n elements.
template <class Body>
void launch_elements(const Body& body, std::size_t n, cudaStream_t stream, const char* what) {
  if (n == 0) return;
  elementwise_kernel<<<grid_blocks(n, row_block_threads), row_block_threads, 0, stream>>>(body, n);
  check(cudaGetLastError(), what);
}

/// *out (device) = sum of term(i) over [0, n): one block, or total_blocks(n) blocks and then
/// one over their totals; the order is fixed by n alone.
template <class Term>
void sum_terms(const Term& term, std::size_t n, double* out, cudaStream_t stream, const char* what) {
  const std::size_t blocks = total_blocks(n);
  if (blocks == 1) {
    total_kernel<<<1, total_threads, 0, stream>>>(term, n, out);
    check(cudaGetLastError(), what);
    return;
  }
  const stream_scratch<double> partials(blocks, stream, what);
  total_kernel<<<unsigned(blocks), total_threads, 0, stream>>>(term, n, partials.get());
  check(cudaGetLastError(), what);
  total_kernel<<<1, total_threads, 0, stream>>>(double_terms{partials.get()}, blocks, out);
  check(cudaGetLastError(), what);
}

/// Waits for the stream and copies one value back.
template <class T>
T read_back(const T* p, cudaStream_t stream, const char* what) {
  T v{};
  check(cudaMemcpyAsync(&v, p, sizeof(T), cudaMemcpyDeviceToHost, stream), what);
  check(cudaStreamSynchronize(stream), what);
  return v;
}

/// Sets *first_bad to the lowest row whose label is outside [0, classes) (integer atomics:
/// the same result for any schedule).
template <class Label>
__global__ void __launch_bounds__(row_block_threads)
    find_bad_label(const Label* labels, std::size_t rows, std::size_t classes, unsigned long long* first_bad) {
  const std::size_t threads = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t r = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; r < rows; r += threads)
    if (labels[r] < 0 || std::size_t(labels[r]) >= classes) atomicMin(first_bad, (unsigned long long)r);
}

/// The mean of an elementwise loss Op over n elements, and with Grad its gradient in g: chunks
/// of loss_chunk summed by warps, the chunks by sum_terms; waits for the stream. `name` names
/// the loss in errors.
template <bool Grad, class Op>
double elementwise_mean_loss(const Op& op, const float* x, const float* t, float* g, std::size_t n,
                             cudaStream_t stream, const char* name) {
  if (n == 0) solder::detail::fail(std::string("solder::eval::cuda::") + name + ": the input has no elements");
  const std::string what = std::string(name) + " launch";
  const std::size_t chunks = elementwise_loss_body<Grad, Op>::chunks(n);
  const stream_scratch<double> losses(chunks + 1, stream, what.c_str());  // the chunks' sums, then the total
  launch_rows(elementwise_loss_body<Grad, Op>{op, x, t, g, losses.get(), n, 1.0f / float(n)}, chunks, stream,
              what.c_str());
  sum_terms(double_terms{losses.get()}, chunks, losses.get() + chunks, stream, what.c_str());
  return read_back(losses.get() + chunks, stream, what.c_str()) / double(n);
}

/// The row launchers take the row length as a constant (a static shape's last extent).
template <std::size_t N>
constexpr void check_row_length() {
  static_assert(N != dyn && N >= 1,
                "solder::eval::cuda row launchers: the row length N must be a constant >= 1; pass the last extent "
                "of a static shape");
}

/// The rows of a tensor of shape S: every extent but the last.
template <class S>
std::size_t rows_of(std::size_t batch) {
  return S::elements(batch) / S::last;
}

/// Every argument's batch is the first one's.
inline void check_batch(const char* who, std::size_t want, std::size_t got, const char* what) {
  if (want != got)
    solder::detail::fail(std::string(who) + ": " + what + " has a batch of " + std::to_string(got) +
                         " but the input has " + std::to_string(want));
}

/// A device view of floats of shape S, read only; not deduced (a mutable view converts).
template <class S>
using device_input = std::type_identity_t<tensor_ref<const float, S, device>>;

}  // namespace detail

// ---- softmax and log_softmax ------------------------------------------------------------

/// y = softmax(x) along each row of N: x, y [rows, N] in device memory; y may be x.
template <std::size_t N>
void softmax_forward(const float* x, float* y, std::size_t rows, cudaStream_t stream) {
  detail::check_row_length<N>();
  detail::launch_rows(softmax_forward_body<ops::softmax, N>{x, y}, rows, stream, "softmax_forward launch");
}
/// dx = y (dy - sum(dy y)) along each row, from softmax's output y; dx may be dy.
template <std::size_t N>
void softmax_backward(const float* y, const float* dy, float* dx, std::size_t rows, cudaStream_t stream) {
  detail::check_row_length<N>();
  detail::launch_rows(softmax_backward_body<ops::softmax, N>{y, dy, dx}, rows, stream, "softmax_backward launch");
}
/// y = log_softmax(x) along each row of N; y may be x.
template <std::size_t N>
void log_softmax_forward(const float* x, float* y, std::size_t rows, cudaStream_t stream) {
  detail::check_row_length<N>();
  detail::launch_rows(softmax_forward_body<ops::log_softmax, N>{x, y}, rows, stream, "log_softmax_forward launch");
}
/// dx = dy - exp(y) sum(dy) along each row, from log_softmax's output y; dx may be dy.
template <std::size_t N>
void log_softmax_backward(const float* y, const float* dy, float* dx, std::size_t rows, cudaStream_t stream) {
  detail::check_row_length<N>();
  detail::launch_rows(softmax_backward_body<ops::log_softmax, N>{y, dy, dx}, rows, stream,
                      "log_softmax_backward launch");
}

/// softmax along the last axis of x [rows..., N] into y of the same shape and batch.
template <class S>
void softmax_forward(detail::device_input<S> x, tensor_ref<float, S, device> y, cudaStream_t stream) {
  detail::check_batch("solder::eval::cuda::softmax_forward", x.batch(), y.batch(), "y");
  softmax_forward<S::last>(x.data(), y.data(), detail::rows_of<S>(x.batch()), stream);
}
/// softmax's backward from its output y: dx from y and dy, all of shape S.
template <class S>
void softmax_backward(detail::device_input<S> y, detail::device_input<S> dy, tensor_ref<float, S, device> dx,
                      cudaStream_t stream) {
  detail::check_batch("solder::eval::cuda::softmax_backward", y.batch(), dy.batch(), "dy");
  detail::check_batch("solder::eval::cuda::softmax_backward", y.batch(), dx.batch(), "dx");
  softmax_backward<S::last>(y.data(), dy.data(), dx.data(), detail::rows_of<S>(y.batch()), stream);
}
/// log_softmax along the last axis of x [rows..., N] into y.
template <class S>
void log_softmax_forward(detail::device_input<S> x, tensor_ref<float, S, device> y, cudaStream_t stream) {
  detail::check_batch("solder::eval::cuda::log_softmax_forward", x.batch(), y.batch(), "y");
  log_softmax_forward<S::last>(x.data(), y.data(), detail::rows_of<S>(x.batch()), stream);
}
/// log_softmax's backward from its output y.
template <class S>
void log_softmax_backward(detail::device_input<S> y, detail::device_input<S> dy, tensor_ref<float, S, device> dx,
                          cudaStream_t stream) {
  detail::check_batch("solder::eval::cuda::log_softmax_backward", y.batch(), dy.batch(), "dy");
  detail::check_batch("solder::eval::cuda::log_softmax_backward", y.batch(), dx.batch(), "dx");
  log_softmax_backward<S::last>(y.data(), dy.data(), dx.data(), detail::rows_of<S>(y.batch()), stream);
}

// ---- layer_norm -------------------------------------------------------------------------

/// y = (x - mean) rstd w + b along each row of N (torch's LayerNorm, biased variance), x, y
/// [rows, N], w, b [N]; writes each row's mean and rstd = 1 / sqrt(Var + eps) [rows] for
/// backward. y may be x.
template <std::size_t N>
void layer_norm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                        std::size_t rows, double eps, cudaStream_t stream) {
  detail::check_row_length<N>();
  detail::launch_rows(layer_norm_forward_body<N>{x, w, b, y, mean, rstd, eps}, rows, stream,
                      "layer_norm_forward launch");
}

/// dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w, along each row from the forward's
/// saved mean and rstd; dw = sum over rows of dy xhat and db = sum of dy (overwritten), summed
/// per chunk of rows (row_chunks, fixed by the row count) and then over the chunks in order,
/// without atomics: the same bits on every run. dx may be dy.
template <std::size_t N>
void layer_norm_backward(const float* x, const float* dy, const float* w, const float* mean, const float* rstd,
                         float* dx, float* dw, float* db, std::size_t rows, cudaStream_t stream) {
  detail::check_row_length<N>();
  const row_chunks chunks(rows);
  const detail::stream_scratch<float> partial(chunks.count * 2 * N, stream, "layer_norm_backward scratch");
  const detail::stream_scratch<double> sums(chunks.count * 2 * N, stream, "layer_norm_backward scratch");
  detail::launch_rows(layer_norm_backward_body<N>{x, dy, w, mean, rstd, dx, partial.get(), sums.get(), chunks},
                      chunks.count, stream, "layer_norm_backward launch");
  detail::launch_elements(layer_norm_param_grad_body{sums.get(), chunks.count, N, dw, db}, 2 * N, stream,
                          "layer_norm_param_grads launch");
}

/// layer_norm forward over the last axis of x [rows..., N]: mean and rstd hold one float per row.
template <class S>
void layer_norm_forward(detail::device_input<S> x, detail::device_input<shape<S::last>> w,
                        detail::device_input<shape<S::last>> b, tensor_ref<float, S, device> y,
                        tensor_ref<float, shape<dyn>, device> mean, tensor_ref<float, shape<dyn>, device> rstd,
                        double eps, cudaStream_t stream) {
  constexpr const char* who = "solder::eval::cuda::layer_norm_forward";
  const std::size_t rows = detail::rows_of<S>(x.batch());
  detail::check_batch(who, x.batch(), y.batch(), "y");
  detail::check_batch(who, rows, mean.batch(), "mean (one per row)");
  detail::check_batch(who, rows, rstd.batch(), "rstd (one per row)");
  layer_norm_forward<S::last>(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), rows, eps, stream);
}
/// layer_norm backward over the last axis: dx, and dw and db [N] overwritten.
template <class S>
void layer_norm_backward(detail::device_input<S> x, detail::device_input<S> dy, detail::device_input<shape<S::last>> w,
                         tensor_ref<const float, shape<dyn>, device> mean,
                         tensor_ref<const float, shape<dyn>, device> rstd,
                         tensor_ref<float, S, device> dx, tensor_ref<float, shape<S::last>, device> dw,
                         tensor_ref<float, shape<S::last>, device> db, cudaStream_t stream) {
  constexpr const char* who = "solder::eval::cuda::layer_norm_backward";
  const std::size_t rows = detail::rows_of<S>(x.batch());
  detail::check_batch(who, x.batch(), dy.batch(), "dy");
  detail::check_batch(who, x.batch(), dx.batch(), "dx");
  detail::check_batch(who, rows, mean.batch(), "mean (one per row)");
  detail::check_batch(who, rows, rstd.batch(), "rstd (one per row)");
  layer_norm_backward<S::last>(x.data(), dy.data(), w.data(), mean.data(), rstd.data(), dx.data(), dw.data(), db.data(),
                               rows, stream);
}

// ---- losses -----------------------------------------------------------------------------

/// sum of x[0, n) (device) into *out (device), in an order fixed by n (block_total; two
/// passes beyond total_blocks' first block).
inline void total(const double* x, std::size_t n, double* out, cudaStream_t stream) {
  detail::sum_terms(double_terms{x}, n, out, stream, "total launch");
}

namespace detail {
/// *out = T(*sum / rows): a mean rounded as the CPU loss rounds its double mean (T float).
template <class T>
__global__ void store_mean(const double* sum, double rows, T* out) {
  *out = T(*sum / rows);
}

/// The softmax cross-entropy's passes, queued: each row's loss (NaN for a label outside [0, C)),
/// dlogits where not null, their total into losses[rows], and where first_bad is not null the
/// lowest row whose label is outside [0, C) into *first_bad (~0 where there is none).
template <std::size_t C>
void queue_softmax_cross_entropy(const float* logits, const std::int32_t* labels, float* dlogits, std::size_t rows,
                                 float label_smoothing, double* losses, unsigned long long* first_bad,
                                 cudaStream_t stream) {
  check_row_length<C>();
  constexpr const char* who = "solder::eval::cuda::softmax_cross_entropy";
  constexpr const char* what = "softmax_cross_entropy launch";
  if (!(label_smoothing >= 0.0f && label_smoothing <= 1.0f))
    solder::detail::fail(std::string(who) + ": label_smoothing must be in [0, 1], got " +
                         std::to_string(label_smoothing));
  if (rows == 0) solder::detail::fail(std::string(who) + ": the batch has no rows");
  const ops::softmax_cross_entropy op{1.0f - label_smoothing, label_smoothing / float(C), 1.0f / float(rows)};
  if (first_bad) {
    check(cudaMemsetAsync(first_bad, 0xff, sizeof(unsigned long long), stream), what);
    find_bad_label<<<grid_blocks(rows, row_block_threads), row_block_threads, 0, stream>>>(labels, rows, C, first_bad);
    check(cudaGetLastError(), what);
  }
  if (dlogits)
    launch_rows(cross_entropy_body<true, C>{op, logits, labels, dlogits, losses}, rows, stream, what);
  else
    launch_rows(cross_entropy_body<false, C>{op, logits, labels, nullptr, losses}, rows, stream, what);
  sum_terms(double_terms{losses}, rows, losses + rows, stream, what);
}

/// A solder::error naming row `bad`'s label unless bad is ~0 (every label in [0, C)); waits for
/// the stream to read the label.
inline void report_bad_label(const std::int32_t* labels, unsigned long long bad, std::size_t classes,
                             cudaStream_t stream) {
  if (bad == ~0ull) return;
  const std::int32_t label = read_back(labels + bad, stream, "softmax_cross_entropy launch");
  solder::detail::fail("solder::eval::cuda::softmax_cross_entropy: label " + std::to_string(label) + " of row " +
                       std::to_string(bad) + " is outside [0, " + std::to_string(classes) + ")");
}
}  // namespace detail

/// Softmax cross-entropy of logits [rows, C] against labels [rows] in [0, C) (device int32),
/// mean over the rows, with torch's label smoothing (nn/loss.hpp's softmax_cross_entropy):
/// returns the mean loss after waiting for the stream; where dlogits is not null writes the
/// gradient of the mean, (softmax(x) - (1 - eps) onehot(y) - eps / C) / rows. A label outside
/// [0, C) is a solder::error naming the first such row.
template <std::size_t C>
double softmax_cross_entropy(const float* logits, const std::int32_t* labels, float* dlogits, std::size_t rows,
                             float label_smoothing, cudaStream_t stream) {
  constexpr const char* what = "softmax_cross_entropy launch";
  const detail::stream_scratch<double> losses(rows + 1, stream, what);  // the rows' losses, then the total
  const detail::stream_scratch<unsigned long long> first_bad(1, stream, what);
  detail::queue_softmax_cross_entropy<C>(logits, labels, dlogits, rows, label_smoothing, losses.get(), first_bad.get(),
                                         stream);
  const double sum = detail::read_back(losses.get() + rows, stream, what);
  detail::report_bad_label(labels, detail::read_back(first_bad.get(), stream, what), C, stream);
  return sum / double(rows);
}

/// As softmax_cross_entropy<C>, queued on the stream without waiting for it: the mean loss,
/// rounded to float as the CPU loss rounds its double mean, to *loss (device); where first_bad
/// (device) is not null, the lowest row whose label is outside [0, C) to *first_bad, ~0 where
/// every label is in range (such a row's loss is NaN, and so is the mean; its dlogits row is
/// not written). wait_for_loss reads both back.
template <std::size_t C>
void softmax_cross_entropy_async(const float* logits, const std::int32_t* labels, float* dlogits, std::size_t rows,
                                 float label_smoothing, float* loss, unsigned long long* first_bad,
                                 cudaStream_t stream) {
  constexpr const char* what = "softmax_cross_entropy launch";
  const detail::stream_scratch<double> losses(rows + 1, stream, what);  // the rows' losses, then the total
  detail::queue_softmax_cross_entropy<C>(logits, labels, dlogits, rows, label_smoothing, losses.get(), first_bad,
                                         stream);
  detail::store_mean<<<1, 1, 0, stream>>>(losses.get() + rows, double(rows), loss);
  check(cudaGetLastError(), what);
}

/// The loss softmax_cross_entropy_async<C> wrote to *loss, after one wait for the stream; a
/// solder::error, as softmax_cross_entropy's, where *first_bad names a row whose label is
/// outside [0, C).
template <std::size_t C>
float wait_for_loss(const float* loss, const unsigned long long* first_bad, const std::int32_t* labels,
                    cudaStream_t stream) {
  constexpr const char* what = "softmax_cross_entropy launch";
  float value = 0.0f;
  unsigned long long bad = 0;
  check(cudaMemcpyAsync(&value, loss, sizeof value, cudaMemcpyDeviceToHost, stream), what);
  check(cudaMemcpyAsync(&bad, first_bad, sizeof bad, cudaMemcpyDeviceToHost, stream), what);
  check(cudaStreamSynchronize(stream), what);
  detail::report_bad_label(labels, bad, C, stream);
  return value;
}

/// Mean squared error, mean((x - t)^2) over n elements (device); where dx is not null writes
/// dx = 2 (x - t) / n. Returns the loss after waiting for the stream.
inline double mse(const float* x, const float* t, float* dx, std::size_t n, cudaStream_t stream) {
  return dx ? detail::elementwise_mean_loss<true>(ops::mse{}, x, t, dx, n, stream, "mse")
            : detail::elementwise_mean_loss<false>(ops::mse{}, x, t, nullptr, n, stream, "mse");
}
/// Binary cross-entropy on logits, mean(softplus(x) - x t) over n elements (device); where dx
/// is not null writes dx = (sigmoid(x) - t) / n. Returns the loss after waiting for the stream.
inline double bce_with_logits(const float* x, const float* t, float* dx, std::size_t n, cudaStream_t stream) {
  return dx ? detail::elementwise_mean_loss<true>(ops::bce_with_logits{}, x, t, dx, n, stream, "bce_with_logits")
            : detail::elementwise_mean_loss<false>(ops::bce_with_logits{}, x, t, nullptr, n, stream, "bce_with_logits");
}

/// Softmax cross-entropy over the last axis of logits [rows..., C], labels one per row; writes
/// dlogits, the gradient of the mean.
template <class S>
double softmax_cross_entropy(detail::device_input<S> logits, tensor_ref<const std::int32_t, shape<dyn>, device> labels,
                             tensor_ref<float, S, device> dlogits, float label_smoothing, cudaStream_t stream) {
  constexpr const char* who = "solder::eval::cuda::softmax_cross_entropy";
  const std::size_t rows = detail::rows_of<S>(logits.batch());
  detail::check_batch(who, logits.batch(), dlogits.batch(), "dlogits");
  detail::check_batch(who, rows, labels.batch(), "labels (one per row)");
  return softmax_cross_entropy<S::last>(logits.data(), labels.data(), dlogits.data(), rows, label_smoothing, stream);
}
/// Softmax cross-entropy without the gradient (evaluation).
template <class T, class S>
  requires std::is_same_v<std::remove_const_t<T>, float>
double softmax_cross_entropy(tensor_ref<T, S, device> logits, tensor_ref<const std::int32_t, shape<dyn>, device> labels,
                             float label_smoothing, cudaStream_t stream) {
  const std::size_t rows = detail::rows_of<S>(logits.batch());
  detail::check_batch("solder::eval::cuda::softmax_cross_entropy", rows, labels.batch(), "labels (one per row)");
  return softmax_cross_entropy<S::last>(logits.data(), labels.data(), nullptr, rows, label_smoothing, stream);
}

/// mse of input and target of shape S; writes dinput.
template <class S>
double mse(detail::device_input<S> input, detail::device_input<S> target, tensor_ref<float, S, device> dinput,
           cudaStream_t stream) {
  detail::check_batch("solder::eval::cuda::mse", input.batch(), target.batch(), "the target");
  detail::check_batch("solder::eval::cuda::mse", input.batch(), dinput.batch(), "the gradient");
  return mse(input.data(), target.data(), dinput.data(), input.size(), stream);
}
/// mse without the gradient (evaluation).
template <class T, class S>
  requires std::is_same_v<std::remove_const_t<T>, float>
double mse(tensor_ref<T, S, device> input, detail::device_input<S> target, cudaStream_t stream) {
  detail::check_batch("solder::eval::cuda::mse", input.batch(), target.batch(), "the target");
  return mse(input.data(), target.data(), nullptr, input.size(), stream);
}
/// bce_with_logits of input and target of shape S; writes dinput.
template <class S>
double bce_with_logits(detail::device_input<S> input, detail::device_input<S> target,
                       tensor_ref<float, S, device> dinput, cudaStream_t stream) {
  detail::check_batch("solder::eval::cuda::bce_with_logits", input.batch(), target.batch(), "the target");
  detail::check_batch("solder::eval::cuda::bce_with_logits", input.batch(), dinput.batch(), "the gradient");
  return bce_with_logits(input.data(), target.data(), dinput.data(), input.size(), stream);
}
/// bce_with_logits without the gradient (evaluation).
template <class T, class S>
  requires std::is_same_v<std::remove_const_t<T>, float>
double bce_with_logits(tensor_ref<T, S, device> input, detail::device_input<S> target, cudaStream_t stream) {
  detail::check_batch("solder::eval::cuda::bce_with_logits", input.batch(), target.batch(), "the target");
  return bce_with_logits(input.data(), target.data(), nullptr, input.size(), stream);
}

}  // namespace solder::eval::cuda
