// eval/cpu/conv2d.hpp: the CPU backend's convolution (executor<cpu>::conv2d<Spec>, Spec an
// ops::conv2d_spec): forward with its activation and row writes, the gradients of each
// group's product (weight_gradient, input_gradient: what conv_product.hpp runs the product
// rules on), a depthwise layer's backward, and the choice among its algorithms by the layer's
// constants. One group (not pointwise on NCHW)
// runs conv_nhwc.hpp's register tiles, its weights packed per call or once for a frozen model;
// its dW runs conv_weight_grad.hpp's tiles when they fill, and with stride 1 its dx is the
// tiles' convolution of dy with the kernel turned around. Several groups and pointwise layers
// run, per sample and group, solder's GEMM over the image's columns (x as stored for a 1 x 1
// kernel with stride 1 and no padding, else the im2col operand of expr/operand.hpp, packed
// from the image by operand_packing.hpp with ops/conv2d.hpp's index map), dx gathered per
// input element (col2im without atomics).
// Depthwise layers run a direct loop per plane. docs/convolution.md, "How a convolution runs".
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "solder/config.hpp"
#include "solder/eval/cpu/access.hpp"
#include "solder/eval/cpu/batch.hpp"
#include "solder/eval/cpu/chunking.hpp"
#include "solder/eval/cpu/conv_nhwc.hpp"
#include "solder/eval/cpu/conv_weight_grad.hpp"
#include "solder/eval/cpu/gemm.hpp"
#include "solder/eval/cpu/gemm_epilogue.hpp"
#include "solder/eval/cpu/operand_packing.hpp"
#include "solder/eval/cpu/parallel.hpp"
#include "solder/eval/cpu/row_writes.hpp"
#include "solder/memory.hpp"
#include "solder/ops/conv2d.hpp"

namespace solder::eval::cpu {

namespace conv_detail {

/// The GEMM epilogue of forward: C[m][n] = op(acc + bias[m]) (bias per row of C, an output
/// channel), or op(acc) without a bias; op an activation (ops/activations.hpp) or the identity.
template <bool WithBias, class Op = ops::conv2d_identity>
struct conv2d_store_epilogue {
  const float* bias;
  float* C;
  std::size_t ldc;
  Op op{};

  template <std::size_t MR, std::size_t NV>
  SOLDER_INLINE void tile(const vec<float> (&acc)[MR][NV], std::size_t m0, std::size_t n0, std::size_t mr,
                          std::size_t nr) const {
    using V = vec<float>;
#pragma GCC unroll 16
    for (std::size_t r = 0; r < MR; ++r)
      if (r < mr) {
        float* c = C + (m0 + r) * ldc + n0;
        if constexpr (WithBias) {
          const V b(bias[m0 + r]);
          gemm_detail::store_row<NV>(c, acc[r], nr, [&](const V& x, std::size_t) { return op.forward(x + b); });
        } else {
          gemm_detail::store_row<NV>(c, acc[r], nr, [&](const V& x, std::size_t) { return op.forward(x); });
        }
      }
  }
};

/// The GEMM epilogue of dW over a run of samples: C = acc for the run's first sample, then
/// C = C + acc (one rounding per sample, in sample order).
struct conv2d_accumulate_epilogue {
  float* C;
  std::size_t ldc;
  bool first;

  template <std::size_t MR, std::size_t NV>
  SOLDER_INLINE void tile(const vec<float> (&acc)[MR][NV], std::size_t m0, std::size_t n0, std::size_t mr,
                          std::size_t nr) const {
    using V = vec<float>;
    constexpr std::size_t lanes = V::size;
#pragma GCC unroll 16
    for (std::size_t r = 0; r < MR; ++r)
      if (r < mr) {
        float* c = C + (m0 + r) * ldc + n0;
        if (first) {
          gemm_detail::store_row<NV>(c, acc[r], nr, [](const V& x, std::size_t) { return x; });
        } else {
          gemm_detail::store_row<NV>(c, acc[r], nr, [&](const V& x, std::size_t v) {
            const std::size_t col = v * lanes;  // store_row asks only for vectors with valid lanes
            const V old = col + lanes <= nr ? V::load_unaligned(c + col) : load_first<V>(c + col, nr - col);
            return old + x;
          });
        }
      }
  }
};

/// What each thread keeps between calls: im2col's columns, the column gradient, (for the
/// threads that start a backward) the partial dW sums its chunks write, and weights packed for
/// one call.
enum class conv2d_slot { columns, column_grad, partial_dw, packed_weights, count };
inline float* conv2d_workspace(conv2d_slot slot, std::size_t n) {
  thread_local growing_buffer<float> spaces[std::size_t(conv2d_slot::count)];
  return spaces[std::size_t(slot)].get(n);
}

}  // namespace conv_detail

/// A convolution layer's work on the CPU (Spec: ops::conv2d_spec), for images of the geometry
/// G (ops::conv2d_geometry) each call names: x [batch, Cin, H, W], y [batch, Cout, Ho, Wo],
/// weights [Cout, Cin/Groups, Kh, Kw] and bias [Cout] as torch stores them (bias null without
/// one). It keeps the weights packed for the direct path of a frozen model. Results do not
/// depend on the thread count.
template <class Spec>
class conv2d {
  static constexpr std::size_t Cin = Spec::in_channels, Cout = Spec::out_channels;
  static constexpr std::size_t Kh = Spec::kernel_height, Kw = Spec::kernel_width;
  static constexpr std::size_t Stride = Spec::stride, Pad = Spec::padding, Dilation = Spec::dilation;
  static constexpr std::size_t Groups = Spec::groups;
  static constexpr bool Bias = Spec::has_bias;
  static constexpr std::size_t group_in = Spec::group_in, group_out = Spec::group_out, fan_in = Spec::fan_in;
  static constexpr bool depthwise = Spec::depthwise;

 public:
  /// One group that is not depthwise: conv_nhwc.hpp's convolution, its weights packed. The
  /// only path that reads or writes channels-last images.
  static constexpr bool direct = Groups == 1 && !depthwise;

  /// Packs the weights once for the forward calls that follow (the model is frozen);
  /// weights_changed() returns to packing them per call, as training needs.
  void pack_weights(const float* weight) {
    if constexpr (direct) {
      if (!packed) packed = allocate_aligned<float>(packing::floats);
      packing::pack(weight, packed.get());
      packed_current = true;
    }
  }
  void weights_changed() { packed_current = false; }

  /// y = op(conv2d(x, weight) + bias) on NCHW tensors by the path that fits the layer, then the
  /// epilogue `after` over each part of y once stored.
  template <class G, class Op = ops::conv2d_identity>
  void forward(const float* weight, const float* bias, const float* x, float* y, std::size_t batch, const Op& op = {},
               row_epilogue after = row_epilogue::none()) const {
    call{weight, bias, current_packing(), nullptr, nullptr}.template run_forward<G>(x, y, batch, op, after);
  }

  /// forward on the direct path with x and y each stored NCHW or channels-last (NHWC) as x_last
  /// and y_last say; the same bits in every layout. One group only.
  template <class G, class Op = ops::conv2d_identity>
  void forward_layouts(const float* weight, const float* bias, const float* x, float* y, std::size_t batch,
                       bool x_last, bool y_last, const Op& op = {}) const {
    static_assert(direct, "solder::eval::cpu::conv2d::forward_layouts: runs convolutions with one group");
    call{weight, bias, current_packing(), nullptr, nullptr}.template direct_forward<G>(x, y, batch, op, x_last, y_last);
  }

  /// Depthwise: weight_grad, bias_grad (overwritten; bias_grad null without a bias) and,
  /// unless dx is null, dx = dL/dx, for x [batch, Cin, H, W] and dy [batch, Cout, Ho, Wo].
  /// (Other layers' gradients are their groups' products': weight_gradient and input_gradient.)
  template <class G>
  void backward(const float* weight, const float* x, const float* dy, float* dx, float* weight_grad, float* bias_grad,
                std::size_t batch) const {
    static_assert(depthwise, "solder::eval::cpu::conv2d::backward: a layer's groups' gradients are their products' "
                             "(weight_gradient, input_gradient)");
    call{weight, nullptr, nullptr, weight_grad, bias_grad}.template gradients<G>(x, dy, dx, batch);
  }

  /// One group's weight gradient dW_g [Cout/G, Cin/G Kh Kw] (overwritten) = g^T patches(x_g),
  /// g = dy_g [batch, Cout/G, Ho, Wo] of the group read as pixel rows; x, dy and weight_grad
  /// point at the group's first channel and weight row (samples Cin and Cout channels apart).
  /// One group in all: the dW tiles where they fill; else per-sample GEMMs over the image's
  /// columns. The same bits for any thread count.
  template <class G>
  static void weight_gradient(const float* x, const float* dy, float* weight_grad, std::size_t batch) {
    static_assert(!depthwise, "solder::eval::cpu::conv2d::weight_gradient: a depthwise layer runs backward");
    call c{nullptr, nullptr, nullptr, weight_grad, nullptr};
    if constexpr (call::dw_direct)
      c.template direct_dw<G>(x, dy, batch);
    else
      c.template gemm_dw<G>(x, dy, batch);
  }
  /// One group's input gradient dx_g = col2im(g W_g), g = dy_g read as pixel rows, the pointers
  /// at the group as weight_gradient's: with one group and stride 1 the tiles' convolution of
  /// dy with the kernel turned around, else per sample a GEMM into the image's column
  /// gradient, gathered per input element.
  template <class G>
  static void input_gradient(const float* weight, const float* dy, float* dx, std::size_t batch) {
    static_assert(!depthwise, "solder::eval::cpu::conv2d::input_gradient: a depthwise layer runs backward");
    const call c{weight, nullptr, nullptr, nullptr, nullptr};
    if constexpr (call::dx_direct)
      c.template direct_dx<G>(dy, dx, batch);
    else
      c.template gemm_dx<G>(dy, dx, batch);
  }

 private:
  using packing = conv_packed_weights<Cin, Cout, Kh, Kw>;
  aligned_array<float> packed;
  bool packed_current = false;
  const float* current_packing() const { return packed_current ? packed.get() : nullptr; }

  /// A 1 x 1 kernel with stride 1 and no padding: im2col's columns are x itself.
  static constexpr bool columns_are_x = Kh == 1 && Kw == 1 && Stride == 1 && Pad == 0;
  /// FLOPs below which work stays on the calling thread (a parallel region costs microseconds).
  static constexpr double parallel_min_flops = 4.0e6;
  /// Floats the per-chunk dW partial sums of backward may take: chunks are capped so that
  /// (chunks - 1) weights fit, and larger layers run fewer chunks with the GEMM threaded.
  static constexpr std::size_t partial_budget_floats = std::size_t(8) << 20;

  /// One group's planes of a sample as the product's B operand [group_in Kh Kw, Ho Wo].
  template <class G>
  using sample_columns = solder::im2col<G, group_in>;

  /// One call's tensors (packed: the weights packed once, or null to pack them per call) and
  /// the paths that run on them.
  struct call {
    const float* weight;
    const float* bias;
    const float* packed;
    float* weight_grad;
    float* bias_grad;

    // ---- one group: the direct path --------------------------------------------------------

    /// y = op(conv2d(x) + b) on NCHW tensors by the path that fits the layer, then the epilogue
    /// over each part of y once stored.
    template <class G, class Op>
    void run_forward(const float* x, float* y, std::size_t batch, const Op& op, row_epilogue after) const {
      if constexpr (depthwise)
        depthwise_forward<G>(x, y, batch, op, after);
      else if constexpr (Groups == 1 && !columns_are_x)
        direct_forward<G>(x, y, batch, op, false, false, after);
      else
        gemm_forward<G>(x, y, batch, op, after);
    }

    /// x and y NCHW, or channels-last (x_last, y_last). The output rows of all samples are cut
    /// into one run per thread (by the sizes alone; a row's values do not depend on who runs it).
    /// The epilogue runs on NCHW outputs only.
    template <class G, class Op>
    void direct_forward(const float* x, float* y, std::size_t batch, const Op& op, bool x_last, bool y_last,
                        row_epilogue after = row_epilogue::none()) const {
      namespace cd = conv_detail;
      const float* w = packed != nullptr ? packed : pack_for_call();
      const double flops = double(batch) * double(Cout * G::out_plane) * 2.0 * fan_in;
      const int threads = flops >= parallel_min_flops ? num_threads() : 1;
      using kernel = conv_nhwc<Cin, Cout, G::height, G::width, Kh, Kw, Stride, Pad, Dilation>;
      const cd::bias_op_store<Op> store{bias, op};
      const auto run = [&](const auto& rows) {
        if (y_last)
          kernel::run(w, rows, cd::nhwc_store<Cout, G::out_height, G::out_width>{y}, store, batch, threads);
        else
          kernel::run(w, rows, cd::nchw_store<Cout, G::out_height, G::out_width>{y, after}, store, batch, threads);
      };
      if (x_last)
        run(cd::nhwc_rows<Cin, G::height, G::width>{x});
      else
        run(cd::nchw_rows<Cin, G::height, G::width>{x});
    }
    const float* pack_for_call() const {
      float* w = conv_detail::conv2d_workspace(conv_detail::conv2d_slot::packed_weights, packing::floats);
      packing::pack(weight, w);
      return w;
    }

    // ---- several groups: the GEMM path ------------------------------------------------------

    /// Each sample is independent: samples are spread over the threads, or (fewer samples than
    /// threads) run in turn with the GEMM threaded; the GEMM's bits do not depend on its threads.
    template <class G, class Op>
    void gemm_forward(const float* x, float* y, std::size_t batch, const Op& op, row_epilogue after) const {
      const int threads = num_threads();
      const double flops = double(batch) * double(Cout * G::out_plane) * 2.0 * fan_in;
      const bool over_samples = threads > 1 && batch >= std::size_t(threads) && flops >= parallel_min_flops;
      const int inner = over_samples ? 1 : threads;
      constexpr std::size_t Ho = G::out_height;
      parallel_for(batch, over_samples ? threads : 1, [&](std::size_t n) {
        forward_sample<G>(x + n * Cin * G::in_plane, y + n * Cout * G::out_plane, inner, op);
        if (!after) return;
        if (over_samples)
          after.rows(n * Cout * Ho, Cout * Ho, 1);
        else
          parallel_for(Cout, inner, [&](std::size_t c) { after.rows((n * Cout + c) * Ho, Ho, 1); });
      });
    }

    /// y_g [Cout/G, Ho Wo] = W_g [Cout/G, K] col_g [K, Ho Wo] (+ b_g) for each group g of one sample.
    template <class G, class Op>
    void forward_sample(const float* x, float* y, int threads, const Op& op) const {
      constexpr std::size_t K = fan_in, N = G::out_plane;
      for (std::size_t g = 0; g < Groups; ++g) {
        const float* xg = x + g * group_in * G::in_plane;
        const float* wg = weight + g * group_out * K;
        float* yg = y + g * group_out * N;
        auto epi = conv_detail::conv2d_store_epilogue<Bias, Op>{Bias ? bias + g * group_out : nullptr, yg, N, op};
        if constexpr (columns_are_x)
          gemm<N, K, false, false>(group_out, wg, K, xg, N, epi, threads);
        else  // a product over the image's columns (an im2col operand), packed panel by panel
              // from the image as the product needs them: no column matrix is stored
          gemm_from<N>(group_out, K, gemm_detail::a_strided{wg, K, false},
                       b_block_packer<N, sample_columns<G>>{sample_columns<G>{xg}}, epi, threads);
      }
    }

    /// The columns of one group of one sample, [group_in Kh Kw, Ho Wo], in this thread's workspace.
    template <class G>
    static const float* im2col(const float* x, int threads) {
      constexpr std::size_t rows = fan_in, N = G::out_plane;
      float* col = conv_detail::conv2d_workspace(conv_detail::conv2d_slot::columns, rows * N);
      parallel_for(rows, rows * N >= parallel_min_elements ? threads : 1,
                              [=](std::size_t k) { im2col_row<G>(x, col + k * N, k); });
      return col;
    }
    template <class G>
    static void im2col_row(const float* x, float* row, std::size_t k) {
      const std::size_t ci = k / G::taps, kh = k / Kw % Kh, kw = k % Kw;
      for (std::size_t ho = 0; ho < G::out_height; ++ho)
        G::im2col_row(x + ci * G::in_plane, kh, kw, ho, row + ho * G::out_width);
    }

    /// dx_g [group_in, H, W] = col2im(dcol), gathered per input element.
    template <class G>
    static void col2im(const float* dcol, float* dx, int threads) {
      parallel_for(group_in, group_in * G::in_plane >= parallel_min_elements ? threads : 1,
                              [=](std::size_t ci) { col2im_plane<G>(dcol, dx + ci * G::in_plane, ci); });
    }
    template <class G>
    static void col2im_plane(const float* dcol, float* dx, std::size_t ci) {
      for (std::size_t hi = 0; hi < G::height; ++hi)
        for (std::size_t wi = 0; wi < G::width; ++wi) dx[hi * G::width + wi] = G::col2im_at(dcol, ci, hi, wi);
    }

    /// Depthwise.
    template <class G>
    void gradients(const float* x, const float* dy, float* dx, std::size_t batch) {
      if constexpr (Bias) bias_gradient<G>(dy, batch);
      depthwise_gradients<G>(x, dy, dx, batch);
    }

    /// One group, not a pointwise layer on x as stored, and enough channels to fill the tiles:
    /// dW on the register tiles (eval/cpu/conv_weight_grad.hpp), from staged rows, no columns.
    /// The output rows are cut
    /// into runs by the sizes alone, each run's dW summed in float in row order, the runs added
    /// in order in double: the same bits for any thread count.
    static constexpr bool dw_direct = direct && !columns_are_x && conv_weight_grad_fill(Cin, Cout) >= 0.2;
    template <class G>
    void direct_dw(const float* x, const float* dy, std::size_t batch) {
      using kernel = conv_weight_grad<Cin, Cout, G::height, G::width, Kh, Kw, Stride, Pad, Dilation>;
      const std::size_t total = batch * G::out_height;
      // A run's rows do at least 128 multiply-adds per float of its partial sum, which is zeroed
      // and added once.
      constexpr std::size_t min_rows =
          std::max<std::size_t>(1, std::size_t(128.0 * double(kernel::partial_floats) / kernel::row_fmas) + 1);
      const std::size_t cap = std::min(max_chunks, partial_budget_floats / kernel::partial_floats + 1);
      const std::size_t per_run = std::max(min_rows, (total + cap - 1) / cap);
      const std::size_t runs = std::max<std::size_t>(1, (total + per_run - 1) / per_run);
      float* parts = conv_detail::conv2d_workspace(conv_detail::conv2d_slot::partial_dw, runs * kernel::partial_floats);
      const double flops = double(batch) * double(Cout * G::out_plane) * 2.0 * fan_in;
      const int threads = flops >= parallel_min_flops ? num_threads() : 1;
      namespace cd = conv_detail;
      parallel_for(runs, threads, [&](std::size_t r) {
        kernel::run_rows(cd::nchw_rows<Cin, G::height, G::width>{x}, dy, parts + r * kernel::partial_floats, r * per_run,
                         std::min(total, (r + 1) * per_run));
      });
      constexpr std::size_t block = min_chunk_elements;
      constexpr std::size_t floats = kernel::partial_floats;
      const std::size_t blocks = (floats + block - 1) / block;
      float* dw = weight_grad;
      parallel_for(blocks, threads_for(runs * floats), [=](std::size_t b) {
        kernel::combine(parts, runs, dw, b * block, std::min(floats, (b + 1) * block));
      });
    }

    /// With stride 1, dx is itself a convolution, of dy with the kernel transposed and turned
    /// around: dx[ci][h][w] = sum over co, kh, kw of dy[co][h + P - kh D][w + P - kw D]
    /// W[co][ci][kh][kw], i.e. a convolution of dy (Cout channels) to Cin channels with
    /// W~[ci][co][Kh-1-kh][Kw-1-kw], padding D (K - 1) - P, the same dilation: the direct path's
    /// tiles run it, no columns stored (square kernels: the tiles take one padding for both axes).
    static constexpr bool dx_direct =
        direct && Stride == 1 && Dilation * (Kh - 1) >= Pad && Dilation * (Kw - 1) >= Pad && Kh == Kw;
    template <class G>
    void direct_dx(const float* dy, float* dx, std::size_t batch) const {
      namespace cd = conv_detail;
      constexpr std::size_t P = Dilation * (Kh - 1) - Pad;
      using kernel = conv_nhwc<Cout, Cin, G::out_height, G::out_width, Kh, Kw, 1, P, Dilation>;
      static_assert(kernel::Ho == G::height && kernel::Wo == G::width);
      using turned = conv_packed_weights<Cout, Cin, Kh, Kw>;
      float* flipped = conv_detail::conv2d_workspace(conv_detail::conv2d_slot::column_grad, Cin * Cout * Kh * Kw);
      for (std::size_t co = 0; co < Cout; ++co)
        for (std::size_t ci = 0; ci < Cin; ++ci)
          for (std::size_t t = 0; t < Kh * Kw; ++t)
            flipped[(ci * Cout + co) * Kh * Kw + (Kh * Kw - 1 - t)] = weight[(co * Cin + ci) * Kh * Kw + t];
      float* w = conv_detail::conv2d_workspace(conv_detail::conv2d_slot::packed_weights, turned::floats);
      turned::pack(flipped, w);
      const double flops = double(batch) * double(Cin * G::in_plane) * 2.0 * Cout * Kh * Kw;
      kernel::run(w, cd::nchw_rows<Cout, G::out_height, G::out_width>{dy}, cd::nchw_store<Cin, G::height, G::width>{dx},
                  cd::bias_op_store<ops::conv2d_identity>{nullptr, {}}, batch,
                  flops >= parallel_min_flops ? num_threads() : 1);
    }

    /// db[co] = the sum of dy over samples and positions, in that order, in double: one channel
    /// per task, so the thread count cannot change it.
    template <class G>
    void bias_gradient(const float* dy, std::size_t batch) {
      float* db = bias_grad;
      parallel_for(Cout, threads_for(batch * Cout * G::out_plane), [=](std::size_t co) {
        double acc = 0;
        for (std::size_t n = 0; n < batch; ++n) {
          const float* d = dy + (n * Cout + co) * G::out_plane;
          for (std::size_t p = 0; p < G::out_plane; ++p) acc += double(d[p]);
        }
        db[co] = float(acc);
      });
    }

    /// One group's dW_g = sum over samples of dy_g col_g^T (the pointers at the group). The
    /// samples are cut into chunks by the sizes alone; each chunk sums its samples' dW in sample
    /// order (chunk 0 into weight_grad, the others into partial sums), then the chunks are
    /// added in order in double.
    template <class G>
    void gemm_dw(const float* x, const float* dy, std::size_t batch) {
      constexpr std::size_t floats = group_out * fan_in;
      if (batch == 0) {
        std::fill_n(weight_grad, floats, 0.0f);
        return;
      }
      const std::size_t cap = std::min(max_chunks, partial_budget_floats / floats + 1);
      const std::size_t per_chunk = (batch + std::min(batch, cap) - 1) / std::min(batch, cap);
      const std::size_t chunks = (batch + per_chunk - 1) / per_chunk;
      float* partial =
          chunks > 1 ? conv_detail::conv2d_workspace(conv_detail::conv2d_slot::partial_dw, (chunks - 1) * floats) : nullptr;

      const int threads = num_threads();
      const double flops = double(batch) * double(group_out * G::out_plane) * 2.0 * fan_in;
      const bool over_chunks = threads > 1 && chunks >= std::size_t(threads) && flops >= parallel_min_flops;
      const int inner = over_chunks ? 1 : threads;
      float* dw0 = weight_grad;
      parallel_for(chunks, over_chunks ? threads : 1, [&](std::size_t c) {
        float* dw = c == 0 ? dw0 : partial + (c - 1) * floats;
        const std::size_t begin = c * per_chunk, end = std::min(batch, begin + per_chunk);
        for (std::size_t n = begin; n < end; ++n)
          sample_dw<G>(x + n * Cin * G::in_plane, dy + n * Cout * G::out_plane, dw, n == begin, inner);
      });
      if (chunks == 1) return;
      constexpr std::size_t block = min_chunk_elements;
      constexpr std::size_t blocks = (floats + block - 1) / block;
      parallel_for(blocks, threads_for(chunks * floats), [=](std::size_t b) {
        const std::size_t end = std::min(floats, (b + 1) * block);
        for (std::size_t i = b * block; i < end; ++i) {
          double acc = dw0[i];
          for (std::size_t c = 1; c < chunks; ++c) acc += double(partial[(c - 1) * floats + i]);
          dw0[i] = float(acc);
        }
      });
    }

    /// dx alone, of one group (the pointers at its first channel and weight row): per sample
    /// dcol [K, Ho Wo] = W_g^T dy_g, gathered into dx_g; samples spread over the threads, or
    /// (fewer samples than threads) the GEMM threaded.
    template <class G>
    void gemm_dx(const float* dy, float* dx, std::size_t batch) const {
      constexpr std::size_t K = fan_in, N = G::out_plane;
      const int threads = num_threads();
      const double flops = double(batch) * double(group_out * N) * 2.0 * K;
      const bool over_samples = threads > 1 && batch >= std::size_t(threads) && flops >= parallel_min_flops;
      const int inner = over_samples ? 1 : threads;
      parallel_for(batch, over_samples ? threads : 1, [&](std::size_t n) {
        float* dxn = dx + n * Cin * G::in_plane;
        float* dcol = columns_are_x ? dxn : conv_detail::conv2d_workspace(conv_detail::conv2d_slot::column_grad, K * N);
        gemm<N, group_out, true, false>(K, weight, K, dy + n * Cout * N, N,
                                        conv_detail::conv2d_store_epilogue<false>{nullptr, dcol, N}, inner);
        if constexpr (!columns_are_x) col2im<G>(dcol, dxn, inner);
      });
    }

    /// One sample's share of one group's dW_g (the pointers at the group): dW_g (+)= dy_g
    /// [Cout/G, Ho Wo] col_g^T [Ho Wo, K], col_g the group's columns (x itself for a 1x1 kernel
    /// with stride 1 and no padding).
    template <class G>
    void sample_dw(const float* x, const float* dy, float* dw, bool first, int threads) const {
      constexpr std::size_t K = fan_in, N = G::out_plane;
      const float* col = columns_are_x ? x : im2col<G>(x, threads);
      gemm<K, N, false, true>(group_out, dy, N, col, N, conv_detail::conv2d_accumulate_epilogue{dw, K, first}, threads);
    }

    // ---- the depthwise path -----------------------------------------------------------------

    /// Each output plane (sample n, channel co) from its one input plane co / (Cout / Cin).
    template <class G, class Op>
    void depthwise_forward(const float* x, float* y, std::size_t batch, const Op& op, row_epilogue after) const {
      const float* w = weight;
      const float* b = bias;
      const std::size_t planes = batch * Cout;
      parallel_for(planes, threads_for(planes * G::out_plane * G::taps), [=](std::size_t q) {
        const std::size_t n = q / Cout, co = q % Cout;
        depthwise_plane<G>(x + (n * Cin + co / group_out) * G::in_plane, w + co * G::taps, b ? b[co] : 0.0f,
                           y + q * G::out_plane, op);
        after.rows(q * G::out_height, G::out_height, 1);
      });
    }
    /// y = sum over taps of w[kh][kw] im2col(x)[kh][kw] (+ b), tap by tap over the whole plane
    /// (each tap's columns made in this thread's workspace, in L1 or L2).
    template <class G, class Op>
    static void depthwise_plane(const float* x, const float* w, float b, float* y, const Op& op) {
      if constexpr (Stride == 1) {
        depthwise_plane_rows<G>(x, w, b, y, op);
        return;
      }
      float* col = conv_detail::conv2d_workspace(conv_detail::conv2d_slot::columns, G::out_plane);
      std::fill_n(y, G::out_plane, 0.0f);
      for (std::size_t kh = 0; kh < Kh; ++kh)
        for (std::size_t kw = 0; kw < Kw; ++kw) {
          tap_columns<G>(x, kh, kw, col);
          const float wk = w[kh * Kw + kw];
          for (std::size_t p = 0; p < G::out_plane; ++p) y[p] += wk * col[p];
        }
      if constexpr (Bias)
        for (std::size_t p = 0; p < G::out_plane; ++p) y[p] += b;
      if constexpr (!std::is_same_v<Op, ops::conv2d_identity>)
        for (std::size_t p = 0; p < G::out_plane; ++p) y[p] = op.forward(y[p]);
    }
    /// Stride 1: the plane copied once into a zero-padded buffer (in L1), then each output row
    /// vector by vector, y[ho][wo..] = the taps' FMAs in (kh, kw) order on shifted runs of the
    /// padded rows, plus b, through op; no columns.
    /// A plane [Rows, Cols] copied into dst with Pd zeros on every side, rows Cols + 2 Pd floats
    /// apart, and one vector of zeros after the last row (vector loads run past a row's end).
    template <std::size_t Rows, std::size_t Cols, std::size_t Pd>
    static const float* padded_plane(const float* src, float* dst) {
      constexpr std::size_t PW = Cols + 2 * Pd, L = vec<float>::size;
      std::fill_n(dst, Pd * PW + Pd, 0.0f);
      for (std::size_t h = 0; h < Rows; ++h) {
        float* row = dst + (h + Pd) * PW;
        std::copy_n(src + h * Cols, Cols, row + Pd);
        std::fill_n(row + Pd + Cols, 2 * Pd, 0.0f);  // this row's right edge, the next one's left
      }
      std::fill_n(dst + (Rows + Pd) * PW, Pd * PW + L, 0.0f);
      return dst;
    }
    template <std::size_t Rows, std::size_t Cols, std::size_t Pd>
    static constexpr std::size_t padded_floats = (Rows + 2 * Pd) * (Cols + 2 * Pd) + vec<float>::size;

    template <class G, class Op>
    static void depthwise_plane_rows(const float* x, const float* w, float b, float* y, const Op& op) {
      using V = vec<float>;
      constexpr std::size_t L = V::size, PW = G::width + 2 * Pad;
      constexpr std::size_t floats = padded_floats<G::height, G::width, Pad>;
      const float* pad = padded_plane<G::height, G::width, Pad>(
          x, conv_detail::conv2d_workspace(conv_detail::conv2d_slot::columns, floats));
      for (std::size_t ho = 0; ho < G::out_height; ++ho) {
        float* out = y + ho * G::out_width;
        for (std::size_t wo = 0; wo < G::out_width; wo += L) {
          V acc(0.0f);
          for (std::size_t kh = 0; kh < Kh; ++kh) {
            const float* in = pad + (ho + kh * Dilation) * PW + wo;
            for (std::size_t kw = 0; kw < Kw; ++kw)
              acc = eval::cpu::fma(V::load_unaligned(in + kw * Dilation), V(w[kh * Kw + kw]), acc);
          }
          if constexpr (Bias) acc = acc + V(b);
          if constexpr (!std::is_same_v<Op, ops::conv2d_identity>) acc = op.forward(acc);
          if (wo + L <= G::out_width)
            acc.store_unaligned(out + wo);
          else
            store_first(out + wo, acc, G::out_width - wo);
        }
      }
    }

    /// col[ho Wo + wo] = im2col_at(x, 0, kh, kw, ho, wo): one tap's row of im2col for plane x.
    template <class G>
    static void tap_columns(const float* x, std::size_t kh, std::size_t kw, float* col) {
      for (std::size_t ho = 0; ho < G::out_height; ++ho) G::im2col_row(x, kh, kw, ho, col + ho * G::out_width);
    }
    /// Stride 1 with padding at most the kernel's span: dx and dW of a depthwise layer vectorized
    /// along rows over zero-padded copies of the planes, as its forward.
    static constexpr bool depthwise_rows_backward =
        depthwise && Stride == 1 && Dilation * (Kh - 1) >= Pad && Dilation * (Kw - 1) >= Pad;

    /// dx of one input plane: the sum over its `group_out` output planes j (dy_j = dy + j Ho Wo,
    /// kernel w_j = w + j Kh Kw) of the convolution of dy_j, padded by D (K - 1) - P, with w_j
    /// turned around: dx[h][w..] = sum over j, kh, kw of w_j[kh][kw] dyp_j[h + (Kh-1-kh) D][w + (Kw-1-kw) D].
    template <class G>
    static void depthwise_dx_rows(const float* dy, const float* w, float* dx) {
      using V = vec<float>;
      // The padding each axis needs, and the one the copies get (the larger): dy row h + P - kh D
      // is padded row h + (Kh - 1 - kh) D + (Pd - PH), column w + P - kw D padded column
      // w + (Kw - 1 - kw) D + (Pd - PWd).
      constexpr std::size_t L = V::size, PH = Dilation * (Kh - 1) - Pad, PWd = Dilation * (Kw - 1) - Pad;
      constexpr std::size_t Pd = PH > PWd ? PH : PWd, PW = G::out_width + 2 * Pd;
      constexpr std::size_t floats = padded_floats<G::out_height, G::out_width, Pd>;
      float* space = conv_detail::conv2d_workspace(conv_detail::conv2d_slot::column_grad, group_out * floats);
      for (std::size_t j = 0; j < group_out; ++j)
        padded_plane<G::out_height, G::out_width, Pd>(dy + j * G::out_plane, space + j * floats);
      for (std::size_t h = 0; h < G::height; ++h)
        for (std::size_t w0 = 0; w0 < G::width; w0 += L) {
          V acc(0.0f);
          for (std::size_t j = 0; j < group_out; ++j)
            for (std::size_t kh = 0; kh < Kh; ++kh) {
              const float* in = space + j * floats + (h + (Kh - 1 - kh) * Dilation + (Pd - PH)) * PW + w0 + (Pd - PWd);
              for (std::size_t kw = 0; kw < Kw; ++kw)
                acc = eval::cpu::fma(V::load_unaligned(in + (Kw - 1 - kw) * Dilation), V(w[j * G::taps + kh * Kw + kw]), acc);
            }
          if (w0 + L <= G::width)
            acc.store_unaligned(dx + h * G::width + w0);
          else
            store_first(dx + h * G::width + w0, acc, G::width - w0);
        }
    }

    /// sums[kh Kw + kw] = sum over ho, wo of dy[ho][wo] xp[ho + kh D][wo + kw D] for one sample's
    /// plane (xp: x padded by P), in float: lane l of tap k's vector sums its row vectors' lane l
    /// in order, then the lanes are added in order.
    template <class G>
    static void depthwise_dw_rows(const float* x, const float* dy, float* sums) {
      using V = vec<float>;
      constexpr std::size_t L = V::size, PW = G::width + 2 * Pad;
      constexpr std::size_t floats = padded_floats<G::height, G::width, Pad>;
      const float* xp = padded_plane<G::height, G::width, Pad>(x, conv_detail::conv2d_workspace(conv_detail::conv2d_slot::columns, floats));
      V acc[G::taps];
      for (auto& a : acc) a = V(0.0f);
      for (std::size_t ho = 0; ho < G::out_height; ++ho)
        for (std::size_t wo = 0; wo < G::out_width; wo += L) {
          const std::size_t n = G::out_width - wo < L ? G::out_width - wo : L;  // zeros past the row: 0 x anything
          const V d = load_first<V>(dy + ho * G::out_width + wo, n);
          for (std::size_t kh = 0; kh < Kh; ++kh) {
            const float* in = xp + (ho + kh * Dilation) * PW + wo;
            for (std::size_t kw = 0; kw < Kw; ++kw)
              acc[kh * Kw + kw] = eval::cpu::fma(d, load_first<V>(in + kw * Dilation, n), acc[kh * Kw + kw]);
          }
        }
      for (std::size_t k = 0; k < G::taps; ++k) sums[k] = lane_sum(acc[k]);
    }

    /// sum_p a[p] b[p] in float: lane j of a vector sums the p = j (mod lanes) in order, then
    /// the lanes are added in a fixed order (the same bits on every call).
    static float dot(const float* a, const float* b, std::size_t n) {
      using V = vec<float>;
      constexpr std::size_t lanes = V::size;
      V acc(0.0f);
      std::size_t p = 0;
      for (; p + lanes <= n; p += lanes) acc = acc + V::load_unaligned(a + p) * V::load_unaligned(b + p);
      if (p < n) acc = acc + load_first<V>(a + p, n - p) * load_first<V>(b + p, n - p);
      return lane_sum(acc);
    }
    /// The lanes of v added in order, in float (the same bits on every call).
    static float lane_sum(const vec<float>& v) {
      constexpr std::size_t lanes = vec<float>::size;
      alignas(64) float part[lanes];
      v.store_aligned(part);
      float s = 0.0f;
      for (std::size_t j = 0; j < lanes; ++j) s += part[j];
      return s;
    }

    /// dx per input plane (gathered from its Cout / Cin output planes), dW per output channel
    /// (each sample's sum in float, see dot, the samples added in order in double): one task per
    /// plane or channel, so the thread count cannot change a result.
    template <class G>
    void depthwise_gradients(const float* x, const float* dy, float* dx, std::size_t batch) {
      constexpr std::size_t mult = group_out;
      const float* w = weight;
      if constexpr (depthwise_rows_backward) {
        if (dx != nullptr) {
          const std::size_t planes = batch * Cin;
          const int threads = threads_for(planes * G::in_plane * G::taps * mult);
          parallel_for(planes, threads, [=](std::size_t q) {
            const std::size_t n = q / Cin, ci = q % Cin;
            depthwise_dx_rows<G>(dy + (n * Cout + ci * mult) * G::out_plane, w + ci * mult * G::taps, dx + q * G::in_plane);
          });
        }
        float* dw = weight_grad;
        parallel_for(Cout, threads_for(batch * Cout * G::out_plane * G::taps), [=](std::size_t co) {
          double acc[G::taps] = {};
          float sums[G::taps];
          for (std::size_t n = 0; n < batch; ++n) {
            depthwise_dw_rows<G>(x + (n * Cin + co / mult) * G::in_plane, dy + (n * Cout + co) * G::out_plane, sums);
            for (std::size_t k = 0; k < G::taps; ++k) acc[k] += double(sums[k]);
          }
          for (std::size_t k = 0; k < G::taps; ++k) dw[co * G::taps + k] = float(acc[k]);
        });
        return;
      }
      if (dx != nullptr) {
        const std::size_t planes = batch * Cin;
        const int threads = threads_for(planes * G::in_plane * G::taps * mult);
        parallel_for(planes, threads, [=](std::size_t q) {
          const std::size_t n = q / Cin, ci = q % Cin;
          const float* d = dy + (n * Cout + ci * mult) * G::out_plane;
          float* out = dx + q * G::in_plane;
          for (std::size_t hi = 0; hi < G::height; ++hi)
            for (std::size_t wi = 0; wi < G::width; ++wi)
              out[hi * G::width + wi] = G::depthwise_dx_at(d, w + ci * mult * G::taps, mult, hi, wi);
        });
      }
      float* dw = weight_grad;
      parallel_for(Cout, threads_for(batch * Cout * G::out_plane * G::taps), [=](std::size_t co) {
        float* col = conv_detail::conv2d_workspace(conv_detail::conv2d_slot::columns, G::out_plane);
        double acc[G::taps] = {};
        for (std::size_t n = 0; n < batch; ++n) {
          const float* xp = x + (n * Cin + co / mult) * G::in_plane;
          const float* d = dy + (n * Cout + co) * G::out_plane;
          for (std::size_t k = 0; k < G::taps; ++k) {
            tap_columns<G>(xp, k / Kw, k % Kw, col);
            acc[k] += double(dot(d, col, G::out_plane));
          }
        }
        for (std::size_t k = 0; k < G::taps; ++k) dw[co * G::taps + k] = float(acc[k]);
      });
    }
  };
};

}  // namespace solder::eval::cpu
