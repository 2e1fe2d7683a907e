// eval/cuda/product.hpp: the CUDA backend's matrix product C = A' B' with its epilogue, as
// host+device functions of a block's and a thread's coordinates: kernels of
// eval/cuda/product_kernel.hpp call them on the GPU between barriers, tests/support/grid.hpp
// calls them over a whole grid on the host, one barrier-separated phase after another.
//
// A block computes a bm x bn tile of C in slices of bk along K. Per slice, every thread copies
// its share of the A' and B' panels into shared memory (stage), then the tiling multiplies
// them into the thread's accumulators (accumulate): fused multiply-adds per thread in
// ascending k (fp32: an element's bits do not depend on the tiling or the launch), or
// tensor-core fragments per warp (tf32, bf16: the panels rounded while staged). Then each
// thread hands its accumulators to the epilogue (finish): the rest of the write's expression,
// read at the element's output coordinates by the evaluators of evaluator.hpp, with the product
// standing in as an accumulator leaf: bias, activation and a dropout mask equal to the CPU's
// bit for bit, applied before the single store.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "solder/config.hpp"
#include "solder/diagnostic.hpp"
#include "solder/eval/cuda/evaluator.hpp"
#include "solder/expr/contract.hpp"
#include "solder/expr/operand.hpp"
#include "solder/expr/write.hpp"
#include "solder/ops/conv2d.hpp"
#include "solder/random/sketch.hpp"
#include "solder/simd.hpp"

namespace solder::eval::cuda {

SOLDER_HD SOLDER_INLINE std::uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}
SOLDER_HD SOLDER_INLINE float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

/// The NaN round_tf32 gives for every NaN: PTX's canonical NaN 0x7FFFFFFF (what cvt.rna.tf32.f32
/// returns for a NaN) as the tensor cores read it, its low 13 bits dropped.
inline constexpr std::uint32_t tf32_canonical_nan = 0x7FFFE000u;

/// x rounded to TF32 (10 fraction bits), to nearest with ties away from zero, as the
/// tensor cores' cvt.rna.tf32.f32: the low 13 bits are zero in every result. Infinities stay;
/// every NaN becomes tf32_canonical_nan, as cvt.rna canonicalizes it: a NaN whose payload lies
/// only in the low 13 bits would otherwise read as an infinity once they are dropped. Integer
/// arithmetic, so the device and the host round alike.
SOLDER_HD SOLDER_INLINE float round_tf32(float x) {
  const std::uint32_t u = float_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return bits_float(tf32_canonical_nan);
  if ((u & 0x7F800000u) == 0x7F800000u) return x;
  return bits_float((u + 0x1000u) & 0xFFFFE000u);
}

/// x rounded to BF16 (7 fraction bits), to nearest even, kept as a float whose low 16 bits are
/// zero; NaN stays NaN.
SOLDER_HD SOLDER_INLINE float round_bf16(float x) {
  const std::uint32_t u = float_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return bits_float(u | 0x00400000u);
  return bits_float((u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u);
}

/// How a tiling multiplies.
enum class product_math {
  fp32,  // fused multiply-adds on each thread's own accumulators
  tf32,  // tensor cores: mma.sync m16n8k8 on inputs rounded to TF32, fp32 accumulators
  bf16,  // tensor cores: mma.sync m16n8k16 on inputs rounded to BF16, fp32 accumulators
};

/// Lane l of a warp in a tensor-core multiply: its group (l / 4, the row in a fragment) and its
/// index in the group (l % 4).
struct lane_of_warp {
  unsigned group, index;
  SOLDER_HD explicit lane_of_warp(unsigned lane) : group(lane / 4), index(lane % 4) {}
};

/// The warp-wide multiplies the fp32 tiling never calls: its team parameter.
struct no_team {};

// ---------------------------------------------------------------------------------------------
// Panels: how a slice of A' and B' lies in shared memory
// ---------------------------------------------------------------------------------------------
//
// Shared memory has 32 banks of 4-byte words; a warp's access takes as many passes as the most
// distinct words any one bank holds among its lanes' addresses (64-bit accesses: per half warp).
// A panel holds Rows (bm of A', bn of B') by BK values of k, each line padded to ld floats:
// - k-major (k at k ld, the rows contiguous): where the operand is staged along its rows, so a
//   warp's stores are consecutive; and for the fp32 tiling always, whose warps read along rows.
//   Staged along k instead (the operand's k contiguous in memory), a warp stores BK values of k
//   in each of 32 / BK rows: ld = 32 / BK (mod 32) puts them in distinct banks (odd for BK >= 32).
//   Tensor-core fragments read 8 rows at 4 k (tf32: ld = 8 mod 32) or at 4 even k, then 4 odd
//   ones (bf16: 2 ld = 8 mod 32, ld = 4 mod 32).
// - row-major (row r at r ld, its k contiguous): tensor-core tilings where the operand is staged
//   along k: a warp stores one row's 32 consecutive k (BK a multiple of 32), and fragments read
//   8 rows at 4 consecutive k (tf32: ld = 4 mod 32), or at 4 pairs of k as one 64-bit access each
//   (bf16: ld = 8 mod 32, each half warp's 16 pairs in distinct bank pairs).

/// The smallest n' >= n with n' = residue (mod 32).
constexpr unsigned padded_to(unsigned n, unsigned residue) { return n + (residue + 32 - n % 32) % 32; }

/// A panel of Rows x BK floats: element (row, k) at at(row, k), k contiguous when RowMajor (else
/// the rows), lines ld floats apart; `floats` rounded up to a multiple of 4, so that the panel
/// after it starts 16-byte aligned.
template <unsigned Rows, unsigned BK, bool RowMajor, unsigned LD>
struct panel_layout {
  static constexpr unsigned rows = Rows, bk = BK, ld = LD;
  static constexpr bool row_major = RowMajor;
  static constexpr unsigned floats = ((RowMajor ? Rows : BK) * LD + 3) / 4 * 4;
  SOLDER_HD static SOLDER_INLINE constexpr unsigned at(unsigned row, unsigned k) { return RowMajor ? row * LD + k : k * LD + row; }
};

/// The layout of a panel of Rows x BK for a tiling of math Math, its operand staged along k
/// (KStaged: k contiguous in the operand's memory) or along its rows; see above.
template <unsigned Rows, unsigned BK, product_math Math, bool KStaged>
struct panel_for {
  static constexpr bool row_major = KStaged && Math != product_math::fp32;
  static constexpr unsigned ld = row_major                       ? padded_to(BK, Math == product_math::tf32 ? 4 : 8)
                                 : Math == product_math::tf32    ? padded_to(Rows, 8)
                                 : Math == product_math::bf16    ? padded_to(Rows, 4)
                                 : KStaged                       ? padded_to(Rows, BK >= 32 ? 1 : 32 / BK)
                                                                 : Rows;
  using type = panel_layout<Rows, BK, row_major, ld>;
};

/// The panels of a pass: A' (bm rows) at 0, B' (bn rows) after it.
template <class LA, class LB>
struct panels {
  using a = LA;
  using b = LB;
  static constexpr unsigned floats = LA::floats + LB::floats;
};

/// The panels of a tiling not yet bound to its operands (k-major, unpadded): its constants only.
template <unsigned BM, unsigned BN, unsigned BK>
using unbound_panels = panels<panel_layout<BM, BK, false, BM>, panel_layout<BN, BK, false, BN>>;

/// A block's tile of C (BM x BN), the slice of K staged per step (BK), and each thread's
/// sub-tile (TM x TN): (BM / TM) x (BN / TN) threads, each accumulating with fma in ascending
/// k, so an element's bits do not depend on the tiling. Thread (ty, tx) holds rows ty TM + i and
/// columns tx + j (BN / TN): a warp's 16 tx read 16 consecutive floats of B' per k. P: the
/// panels (a product pass binds them to its operands' layouts, with_panels).
template <unsigned BM, unsigned BN, unsigned BK, unsigned TM, unsigned TN, class P = unbound_panels<BM, BN, BK>>
struct product_tiling {
  static_assert(BM % TM == 0 && BN % TN == 0, "solder::eval::cuda::product_tiling: a thread's sub-tile must divide the block's tile");
  static constexpr product_math math = product_math::fp32;
  static constexpr unsigned bm = BM, bn = BN, bk = BK, tm = TM, tn = TN;
  static constexpr unsigned thread_cols = BN / TN;
  static constexpr unsigned threads = (BM / TM) * thread_cols;
  static_assert((BM * BK) % threads == 0 && (BK * BN) % threads == 0,
                "solder::eval::cuda::product_tiling: every thread must stage the same number of panel elements");
  using panel_types = P;
  /// Shared floats of one buffer: the A' panel, then the B' panel.
  static constexpr unsigned shared_floats = P::floats;
  template <class LA, class LB>
  using with_panels = product_tiling<BM, BN, BK, TM, TN, panels<LA, LB>>;

  struct accumulators {
    float v[TM][TN];
  };
  SOLDER_HD static SOLDER_INLINE float round(float x) { return x; }

  /// Where thread t reads A'(ty TM + i, k) and B'(k, tx + j BN / TN) in a panel buffer.
  SOLDER_HD static SOLDER_INLINE unsigned a_load_at(unsigned t, unsigned k, unsigned i) {
    return P::a::at(t / thread_cols * TM + i, k);
  }
  SOLDER_HD static SOLDER_INLINE unsigned b_load_at(unsigned t, unsigned k, unsigned j) {
    return P::a::floats + P::b::at(t % thread_cols + j * thread_cols, k);
  }

  /// Thread t's sub-tile accumulates a slice's bk products in ascending k.
  template <class Team>
  SOLDER_HD static SOLDER_INLINE void accumulate(unsigned t, const float* shared, accumulators& acc, const Team&) {
    for (unsigned k = 0; k < BK; ++k) {
      float av[TM], bv[TN];
      SOLDER_UNROLL
      for (unsigned i = 0; i < TM; ++i) av[i] = shared[a_load_at(t, k, i)];
      SOLDER_UNROLL
      for (unsigned j = 0; j < TN; ++j) bv[j] = shared[b_load_at(t, k, j)];
      SOLDER_UNROLL
      for (unsigned i = 0; i < TM; ++i)
        SOLDER_UNROLL
        for (unsigned j = 0; j < TN; ++j) acc.v[i][j] = simd::fma(av[i], bv[j], acc.v[i][j]);
    }
  }
  /// f(row, col, value) for each of thread t's accumulators, at its coordinates in the tile.
  template <class F>
  SOLDER_HD static SOLDER_INLINE void for_each(unsigned t, const accumulators& acc, F&& f) {
    const unsigned ty = t / thread_cols, tx = t % thread_cols;
    SOLDER_UNROLL
    for (unsigned i = 0; i < TM; ++i)
      SOLDER_UNROLL
      for (unsigned j = 0; j < TN; ++j) f(ty * TM + i, tx + j * thread_cols, acc.v[i][j]);
  }
};

/// Two consecutive floats of shared memory, p 8-byte aligned: one 64-bit load on the device.
SOLDER_HD SOLDER_INLINE void load_pair(const float* p, float& lo, float& hi) {
#if defined(__CUDA_ARCH__)
  const float2 v = *reinterpret_cast<const float2*>(p);
  lo = v.x;
  hi = v.y;
#else
  lo = p[0];
  hi = p[1];
#endif
}

/// A block's tile of C (BM x BN) cut into warp tiles (WM x WN) of 16 x 8 tensor-core
/// fragments, K staged BK at a time. Math tf32 or bf16: the panels are rounded while staged
/// and each warp issues mma.sync over them (Team::mma_tf32 / mma_bf16: the instruction on the
/// device, an exchange of the 32 lanes' fragments on the host). The fragments follow the PTX
/// layouts of mma.m16n8k8 (.tf32) and mma.m16n8k16 (.bf16), row.col: lane l holds A at rows
/// l / 4 (+ 8) and k l % 4 (+ 4) (pairs of k for bf16), B at column l / 4, and C at row l / 4
/// (+ 8), columns 2 (l % 4) and 2 (l % 4) + 1. P: the panels, as product_tiling's.
template <unsigned BM, unsigned BN, unsigned BK, unsigned WM, unsigned WN, product_math Math,
          class P = unbound_panels<BM, BN, BK>>
struct mma_tiling {
  static_assert(Math != product_math::fp32, "solder::eval::cuda::mma_tiling: tensor cores multiply tf32 or bf16");
  static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 8 == 0,
                "solder::eval::cuda::mma_tiling: warp tiles must divide the block's tile into 16 x 8 fragments");
  static constexpr product_math math = Math;
  /// K of one mma instruction.
  static constexpr unsigned mk = Math == product_math::tf32 ? 8 : 16;
  static_assert(BK % mk == 0, "solder::eval::cuda::mma_tiling: the staged slice must hold whole mma steps of K");
  static constexpr unsigned bm = BM, bn = BN, bk = BK;
  static constexpr unsigned warp_cols = BN / WN;
  static constexpr unsigned warps = (BM / WM) * warp_cols;
  static constexpr unsigned threads = warps * 32;
  static constexpr unsigned frag_rows = WM / 16, frag_cols = WN / 8;
  static_assert((BM * BK) % threads == 0 && (BK * BN) % threads == 0,
                "solder::eval::cuda::mma_tiling: every thread must stage the same number of panel elements");
  using panel_types = P;
  static constexpr unsigned shared_floats = P::floats;
  template <class LA, class LB>
  using with_panels = mma_tiling<BM, BN, BK, WM, WN, Math, panels<LA, LB>>;
  /// Whether a lane reads a bf16 word's two k as one 64-bit access (k contiguous in the panel).
  static constexpr bool a_pairs = Math == product_math::bf16 && P::a::row_major;
  static constexpr bool b_pairs = Math == product_math::bf16 && P::b::row_major;

  struct accumulators {
    float v[frag_rows][frag_cols][4];
  };
  SOLDER_HD static SOLDER_INLINE float round(float x) {
    return Math == product_math::tf32 ? round_tf32(x) : round_bf16(x);
  }

  /// One lane's registers of one mma step: A for each fragment row, B for each fragment column.
  struct fragments {
    std::uint32_t a[frag_rows][4];
    std::uint32_t b[frag_cols][2];
  };

  /// Where thread t (lane t % 32 of warp t / 32) reads word r of its A fragment row i at the
  /// mma step k0: the float of k half h (bf16: 0 the lower k, 1 the upper; tf32: 0).
  SOLDER_HD static SOLDER_INLINE unsigned a_fragment_at(unsigned t, unsigned k0, unsigned i, unsigned r, unsigned h) {
    const unsigned w = t / 32, wr = w / warp_cols;
    const lane_of_warp l(t % 32);
    const unsigned q = l.index + 4 * (r / 2);
    return P::a::at(wr * WM + i * 16 + l.group + 8 * (r % 2), Math == product_math::tf32 ? k0 + q : k0 + 2 * q + h);
  }
  /// Where thread t reads word r of its B fragment column j at the mma step k0, k half h.
  SOLDER_HD static SOLDER_INLINE unsigned b_fragment_at(unsigned t, unsigned k0, unsigned j, unsigned r, unsigned h) {
    const unsigned w = t / 32, wc = w % warp_cols;
    const lane_of_warp l(t % 32);
    const unsigned q = l.index + 4 * r;
    return P::a::floats + P::b::at(wc * WN + j * 8 + l.group, Math == product_math::tf32 ? k0 + q : k0 + 2 * q + h);
  }

  /// Thread t (lane t % 32 of warp t / 32) loads its fragments of the mma step at k0 of the slice.
  SOLDER_HD static SOLDER_INLINE void load(unsigned t, const float* shared, unsigned k0, fragments& f) {
    SOLDER_UNROLL
    for (unsigned i = 0; i < frag_rows; ++i)
      SOLDER_UNROLL
      for (unsigned r = 0; r < 4; ++r) f.a[i][r] = word<a_pairs>(shared, a_fragment_at(t, k0, i, r, 0), a_fragment_at(t, k0, i, r, 1));
    SOLDER_UNROLL
    for (unsigned j = 0; j < frag_cols; ++j)
      SOLDER_UNROLL
      for (unsigned r = 0; r < 2; ++r) f.b[j][r] = word<b_pairs>(shared, b_fragment_at(t, k0, j, r, 0), b_fragment_at(t, k0, j, r, 1));
  }

  /// Thread t's warp multiplies the slice, mma step by mma step in ascending k: each lane loads
  /// its fragments, then the warp issues one mma per fragment of its tile (Team: the
  /// instructions; the host's test support emulates the warp instead of calling this).
  template <class Team>
  SOLDER_HD static SOLDER_INLINE void accumulate(unsigned t, const float* shared, accumulators& acc, const Team& team) {
    for (unsigned k0 = 0; k0 < BK; k0 += mk) {
      fragments f;
      load(t, shared, k0, f);
      SOLDER_UNROLL
      for (unsigned i = 0; i < frag_rows; ++i)
        SOLDER_UNROLL
        for (unsigned j = 0; j < frag_cols; ++j) {
          if constexpr (Math == product_math::tf32)
            team.mma_tf32(acc.v[i][j], f.a[i], f.b[j]);
          else
            team.mma_bf16(acc.v[i][j], f.a[i], f.b[j]);
        }
    }
  }
  template <class F>
  SOLDER_HD static SOLDER_INLINE void for_each(unsigned t, const accumulators& acc, F&& f) {
    const unsigned w = t / 32, wr = w / warp_cols, wc = w % warp_cols;
    const lane_of_warp l(t % 32);
    SOLDER_UNROLL
    for (unsigned i = 0; i < frag_rows; ++i)
      SOLDER_UNROLL
      for (unsigned j = 0; j < frag_cols; ++j)
        SOLDER_UNROLL
        for (unsigned r = 0; r < 4; ++r)
          f(wr * WM + i * 16 + l.group + 8 * (r / 2), wc * WN + j * 8 + 2 * l.index + r % 2, acc.v[i][j][r]);
  }

 private:
  /// A register word: one tf32 (at lo), or the bf16 pair of the k at lo (the low half) and at hi,
  /// read as one 64-bit access where Pairs (hi = lo + 1).
  template <bool Pairs>
  SOLDER_HD static SOLDER_INLINE std::uint32_t word(const float* shared, unsigned lo, unsigned hi) {
    if constexpr (Math == product_math::tf32) {
      return float_bits(shared[lo]);
    } else {
      float x, y;
      if constexpr (Pairs)
        load_pair(shared + lo, x, y);
      else
        x = shared[lo], y = shared[hi];
      return (float_bits(x) >> 16) | (float_bits(y) & 0xFFFF0000u);
    }
  }
};

/// The tiling for a product with N static columns: 128 x 128 tiles of 8 x 8 per thread where
/// N fills them, 64 x 64 of 4 x 4 otherwise (a narrow layer would leave most threads idle).
template <std::size_t N>
using product_tiling_for = std::conditional_t<(N >= 128), product_tiling<128, 128, 8, 8, 8>, product_tiling<64, 64, 16, 4, 4>>;

/// The tensor-core tiling for N static columns: 128 x 128 blocks of 8 warps (64 x 32 each) where
/// N fills them, 64 x 64 blocks of 4 warps (32 x 32) otherwise.
template <std::size_t N, product_math Math>
using mma_tiling_for = std::conditional_t<(N >= 128), mma_tiling<128, 128, 32, 64, 32, Math>, mma_tiling<64, 64, 32, 32, 32, Math>>;

// ---------------------------------------------------------------------------------------------
// Operands: what a block's panel is copied from
// ---------------------------------------------------------------------------------------------

/// A' [M, K] or B' [K, N] stored row-major in device memory with row stride ld: element (r, c)
/// at p[r * ld + c], or at p[c * ld + r] when Trans (a linear layer's weight W [N, K] read as
/// W^T).
template <bool Trans>
struct matrix_operand {
  static constexpr bool transposed = Trans;
  const float* p;
  std::size_t ld;
  SOLDER_HD SOLDER_INLINE float at(std::size_t r, std::size_t c) const { return Trans ? p[c * ld + r] : p[r * ld + c]; }
  /// Whether consecutive c are consecutive in memory (the panel's copy walks that index fastest).
  static constexpr bool cols_contiguous = !Trans;
};

/// One term of a sign sketch (expr/operand.hpp, sign_sketch): [TR, TC] entries of +scale or
/// -scale, entry e = r * TC + c with random::sketch_sign(seed, term, e, rounds); read transposed
/// when Trans. Regenerated while staging, never stored: the same signs as the CPU's packing.
template <std::size_t TR, std::size_t TC, bool Trans>
struct sign_operand {
  static constexpr bool transposed = Trans;
  std::uint64_t seed, term;
  float scale;
  std::uint32_t rounds = random::philox_default_rounds;
  SOLDER_HD SOLDER_INLINE float at(std::size_t r, std::size_t c) const {
    const std::size_t e = Trans ? c * TC + r : r * TC + c;
    return scale * random::sketch_sign(seed, term, e, rounds);
  }
  static constexpr bool cols_contiguous = !Trans;
};

/// Terms sign sketches of [TR, TC] stacked (expr/operand.hpp, sign_sketch<TR, TC, Terms, Stack>):
/// side by side ([TR, Terms TC]) or one above the other ([Terms TR, TC]); element (r, c) of the
/// stack is element e of term t, e numbered row-major in the term, as the CPU's packing reads it
/// (eval/cpu/operand_packing.hpp, sketch_row); read transposed when Trans. Never stored.
template <std::size_t TR, std::size_t TC, std::size_t Terms, sketch_stack Stack, bool Trans>
struct sketch_operand {
  static constexpr bool transposed = Trans;
  std::uint64_t seed;
  float scale;
  std::uint32_t rounds = random::philox_default_rounds;
  SOLDER_HD SOLDER_INLINE float at(std::size_t r, std::size_t c) const {
    const std::size_t sr = Trans ? c : r, sc = Trans ? r : c;  // in the stack as stored
    const std::size_t t = Stack == sketch_stack::columns ? sc / TC : sr / TR;
    const std::size_t e = Stack == sketch_stack::columns ? sr * TC + sc % TC : (sr % TR) * TC + sc;
    return scale * random::sketch_sign(seed, t, e, rounds);
  }
  static constexpr bool cols_contiguous = !Trans;
};

/// Two operands side by side (Axis columns: [a | b], b's columns from Split) or one above the
/// other (rows: [a; b], b's rows from Split), as expr/operand.hpp's hcat and vcat: the sketched
/// layer's factors [S1 | U2] and [U1; S2], and their transposes.
template <class A, class B, sketch_stack Axis, std::size_t Split>
struct concat_operand {
  A a;
  B b;
  SOLDER_HD SOLDER_INLINE float at(std::size_t r, std::size_t c) const {
    if constexpr (Axis == sketch_stack::columns)
      return c < Split ? a.at(r, c) : b.at(r, c - Split);
    else
      return r < Split ? a.at(r, c) : b.at(r - Split, c);
  }
  /// Staged along a's contiguous index (where the two differ, b's reads are strided).
  static constexpr bool cols_contiguous = A::cols_contiguous;
};

/// A' [batch Ho Wo, Cin Kh Kw] of a convolution (one group), never stored: row r is output
/// pixel (n, ho, wo), column c = (ci Kh + kh) Kw + kw, PyTorch's order of a weight [Cout, Cin,
/// Kh, Kw], so B' = W^T is matrix_operand<true>{w, Cin Kh Kw} and C [batch Ho Wo, Cout] is the
/// output channels-last (NHWC). Element (r, c) is the input value tap (kh, kw) of window (ho, wo)
/// reads in channel ci, 0 in the padding (ops::conv2d_geometry::patch_at); the input is NCHW, or
/// NHWC when ChannelsLast. G: the convolution's geometry (H, W, strides, padding, dilation:
/// ops::conv2d_geometry).
template <class G, std::size_t Cin, std::size_t Kh, std::size_t Kw, bool ChannelsLast, std::size_t Stored = Cin>
struct im2col_operand {
  static_assert(Kh == G::kernel_height && Kw == G::kernel_width,
                "solder::eval::cuda::im2col_operand: Kh and Kw must be the geometry's kernel");
  static constexpr bool transposed = false;
  /// Staged along rows: neighbouring output pixels read neighbouring inputs (stride apart).
  static constexpr bool cols_contiguous = false;
  static constexpr std::size_t cols = Cin * Kh * Kw;
  const float* x;
  SOLDER_HD SOLDER_INLINE float at(std::size_t r, std::size_t c) const {
    return G::template patch_at<Cin, ChannelsLast, Stored>(x, r, c);
  }
};

/// A batch of NCHW images [batch, C, Ho Wo] read as the pixel matrix [batch Ho Wo, C] (Trans:
/// [C, batch Ho Wo]), expr/operand.hpp's image_pixels: a convolution's output gradient as the
/// gradient of its channels-last product, read where it lies. Element (r, c) (untransposed) is
/// channel c of pixel r % Plane of sample r / Plane; samples are Stored channels apart (a
/// group's C of them).
template <std::size_t C, std::size_t Plane, bool Trans, std::size_t Stored = C>
struct pixels_operand {
  static constexpr bool transposed = Trans;
  /// Neighbouring pixels are neighbours in memory: staged along the pixel index.
  static constexpr bool cols_contiguous = Trans;
  const float* x;
  SOLDER_HD SOLDER_INLINE float at(std::size_t r, std::size_t c) const {
    const std::size_t pixel = Trans ? c : r, channel = Trans ? r : c;
    return x[((pixel / Plane) * Stored + channel) * Plane + pixel % Plane];
  }
};

// ---------------------------------------------------------------------------------------------
// The epilogue: the write's expression with the product as a leaf
// ---------------------------------------------------------------------------------------------

/// The product's value inside an epilogue expression, of the product's shape S ([M, N], M the
/// batch when dynamic): in a thread's finish(), the accumulator of the element being stored.
template <class S>
struct accumulator_leaf {
  using expression_tag = solder::expression_tag;
  using value_type = float;
  using shape_type = S;
  using space_type = device;
  std::size_t batch_ = 1;
  std::size_t batch() const { return batch_; }
};

/// The product's value in an epilogue for a product of `batch` rows.
template <class S>
accumulator_leaf<S> product_value(std::size_t batch = 1) {
  return {batch};
}

template <class S, class Lay>
struct evaluator<accumulator_leaf<S>, Lay> {
  using value_type = float;
  float value = 0;
  explicit evaluator(const accumulator_leaf<S>&) {}
  SOLDER_HD SOLDER_INLINE void seek(std::size_t) {}
  SOLDER_HD SOLDER_INLINE float at(std::size_t) const { return value; }
  const void* address() const { return nullptr; }
};

template <class E>
inline constexpr bool device_readable_in_epilogue = device_readable<E>;
template <class S>
inline constexpr bool device_readable_in_epilogue<accumulator_leaf<S>> = true;
template <class Op, class... Args>
inline constexpr bool device_readable_in_epilogue<map_node<Op, Args...>> = (device_readable_in_epilogue<Args> && ...);

/// How many accumulator leaves E holds.
template <class E>
inline constexpr std::size_t accumulator_leaves = 0;
template <class S>
inline constexpr std::size_t accumulator_leaves<accumulator_leaf<S>> = 1;
template <class Op, class... Args>
inline constexpr std::size_t accumulator_leaves<map_node<Op, Args...>> = (accumulator_leaves<Args> + ... + 0);

/// Sets the accumulator leaf of an evaluator tree to v.
template <class R>
SOLDER_HD SOLDER_INLINE void set_accumulator(R& r, float v);

namespace detail {
template <class R, std::size_t... I>
SOLDER_HD SOLDER_INLINE void set_accumulator_args(R& r, float v, std::index_sequence<I...>) {
  (set_accumulator(solder::detail::get<I>(r.args), v), ...);
}
template <class R>
struct is_accumulator_evaluator : std::false_type {};
template <class S, class Lay>
struct is_accumulator_evaluator<evaluator<accumulator_leaf<S>, Lay>> : std::true_type {};
}  // namespace detail

template <class R>
SOLDER_HD SOLDER_INLINE void set_accumulator(R& r, float v) {
  if constexpr (detail::is_accumulator_evaluator<R>::value)
    r.value = v;
  else if constexpr (requires { r.args; })
    detail::set_accumulator_args(r, v, std::make_index_sequence<solder::detail::tuple_size_v<decltype(r.args)>>{});
}

/// Stores a write's expression at output element (row, col), given the element's accumulator.
template <class W>
struct product_epilogue;

template <class T, class S, class E>
struct product_epilogue<write_target<T, S, E, device>> {
  static_assert(S::rank == 2, "solder::eval::cuda::product: the product's output must be a matrix [rows, cols]");
  static_assert(std::is_same_v<shape_of<E>, S>,
                "solder::eval::cuda::product: the epilogue expression must have the output's shape");
  static_assert(accumulator_leaves<E> == 1,
                "solder::eval::cuda::product: the epilogue expression must read the product (product_value) exactly once");
  static_assert(device_readable_in_epilogue<E>,
                "solder::eval::cuda::product: the epilogue may hold device tensors, constants, dropout masks, "
                "elementwise ops and the product's value only");
  static constexpr std::size_t cols = S::last;
  using walk_type = walk<S, false>;  // element by element: a thread's elements are not whole mask groups
  evaluator<E, walk_type> root;
  T* out;
  std::size_t rows;

  explicit product_epilogue(const write_target<T, S, E, device>& w)
      : root(w.expr), out(w.out.data()), rows(S::extents[0] == dyn ? w.out.batch() : S::extents[0]) {}

  SOLDER_HD SOLDER_INLINE void put(std::size_t row, std::size_t col, float acc) {
    set_accumulator(root, acc);
    const std::size_t i = row * cols + col;
    out[i] = T(root.at(i));
  }
};

// ---------------------------------------------------------------------------------------------
// The product pass
// ---------------------------------------------------------------------------------------------

/// CUDA's limits on a grid's extents: x up to 2^31 - 1 blocks, y (and z) up to 65,535.
inline constexpr std::size_t max_grid_x = 2147483647, max_grid_y = 65535;

/// A product pass's launch grid, in blocks.
struct product_grid {
  std::size_t x, y;
};

/// The tile of C a block computes: column tile bx (columns bx * bn ..) and row tile by (rows
/// by * bm ..).
struct product_tile {
  unsigned bx, by;
};

/// C [M, N] = A' [M, K] B' [K, N], every element through the epilogue. Blocks of
/// Tiling::threads threads; block (bx, by) owns columns bx * bn and rows by * bm. The grid
/// (grid()) puts the ceil(M / bm) row tiles on x, which CUDA lets reach 2^31 - 1, and the
/// ceil(N / bn) column tiles (N static, so few) on y: tile_of maps a block's coordinates back.
template <class Tiling, class A, class B, class W>
struct product_pass {
  /// The tiling with its panels laid out for these operands: A' staged along k where its
  /// columns are contiguous, B' where its rows are not (panel_for).
  using tiling = typename Tiling::template with_panels<
      typename panel_for<Tiling::bm, Tiling::bk, Tiling::math, A::cols_contiguous>::type,
      typename panel_for<Tiling::bn, Tiling::bk, Tiling::math, !B::cols_contiguous>::type>;
  using panel_a = typename tiling::panel_types::a;
  using panel_b = typename tiling::panel_types::b;
  static constexpr unsigned bm = Tiling::bm, bn = Tiling::bn, bk = Tiling::bk;
  static constexpr unsigned threads = Tiling::threads;
  static constexpr unsigned shared_floats = tiling::shared_floats;
  using epilogue_type = product_epilogue<W>;
  static constexpr std::size_t N = epilogue_type::cols;

  A a;
  B b;
  epilogue_type epilogue;
  std::size_t M, K;

  using accumulators = typename tiling::accumulators;

  SOLDER_HD SOLDER_INLINE accumulators start() const { return accumulators{}; }
  SOLDER_HD std::size_t grid_cols() const { return (N + bn - 1) / bn; }
  SOLDER_HD std::size_t grid_rows() const { return (M + bm - 1) / bm; }
  SOLDER_HD std::size_t slices() const { return (K + bk - 1) / bk; }
  /// The launch grid: row tiles on x, column tiles on y.
  SOLDER_HD product_grid grid() const { return {grid_rows(), grid_cols()}; }
  /// The tile of the block at (x, y) of grid(): what the kernel passes to load and finish.
  SOLDER_HD static SOLDER_INLINE product_tile tile_of(unsigned x, unsigned y) { return {y, x}; }

  /// A thread's share of one slice's panels, held in registers between its loads from global
  /// memory and its stores to shared memory.
  static constexpr unsigned a_per = bm * bk / threads, b_per = bk * bn / threads;
  struct staged {
    float a[a_per];
    float b[b_per];
  };

  /// Thread t loads its share of slice s: A'[by * bm .., s * bk ..] and B'[s * bk .., bx * bn ..],
  /// rounded as the tiling multiplies; elements past M, N or K are zero. Consecutive threads
  /// read consecutive addresses of each operand (along whichever index is contiguous in its
  /// memory).
  SOLDER_HD SOLDER_INLINE void load(unsigned bx, unsigned by, unsigned t, std::size_t s, staged& r) const {
    const std::size_t m0 = std::size_t(by) * bm, n0 = std::size_t(bx) * bn, k0 = s * bk;
    SOLDER_UNROLL
    for (unsigned q = 0; q < a_per; ++q) {
      const unsigned m = a_row(q, t), k = a_col(q, t);
      r.a[q] = m0 + m < M && k0 + k < K ? Tiling::round(a.at(m0 + m, k0 + k)) : 0.0f;
    }
    SOLDER_UNROLL
    for (unsigned q = 0; q < b_per; ++q) {
      const unsigned k = b_row(q, t), n = b_col(q, t);
      r.b[q] = k0 + k < K && n0 + n < N ? Tiling::round(b.at(k0 + k, n0 + n)) : 0.0f;
    }
  }
  /// Where thread t stores element q of its share of A' and of B' in a panel buffer.
  SOLDER_HD static SOLDER_INLINE unsigned a_store_at(unsigned q, unsigned t) { return panel_a::at(a_row(q, t), a_col(q, t)); }
  SOLDER_HD static SOLDER_INLINE unsigned b_store_at(unsigned q, unsigned t) {
    return panel_a::floats + panel_b::at(b_col(q, t), b_row(q, t));
  }
  /// Thread t stores its loaded share into a panel buffer.
  SOLDER_HD SOLDER_INLINE void store(unsigned t, const staged& r, float* shared) const {
    SOLDER_UNROLL
    for (unsigned q = 0; q < a_per; ++q) shared[a_store_at(q, t)] = r.a[q];
    SOLDER_UNROLL
    for (unsigned q = 0; q < b_per; ++q) shared[b_store_at(q, t)] = r.b[q];
  }
  /// Phase 1 of slice s: load and store at once.
  SOLDER_HD SOLDER_INLINE void stage(unsigned bx, unsigned by, unsigned t, std::size_t s, float* shared) const {
    staged r;
    load(bx, by, t, s, r);
    store(t, r, shared);
  }

  /// Phase 2 of a slice: thread t's accumulators take the slice's products (Team: the warp's
  /// tensor-core multiplies, unused by the fp32 tiling).
  template <class Team = no_team>
  SOLDER_HD SOLDER_INLINE void accumulate(unsigned t, const float* shared, accumulators& acc, const Team& team = {}) const {
    tiling::accumulate(t, shared, acc, team);
  }

  /// Phase 3: thread t stores its elements that lie inside C through the epilogue.
  SOLDER_HD SOLDER_INLINE void finish(unsigned bx, unsigned by, unsigned t, const accumulators& acc) {
    const std::size_t m0 = std::size_t(by) * bm, n0 = std::size_t(bx) * bn;
    tiling::for_each(t, acc, [&](unsigned r, unsigned c, float v) {
      if (m0 + r < M && n0 + c < N) epilogue.put(m0 + r, n0 + c, v);
    });
  }

 private:
  /// Element q of thread t's share of a panel: its row and column in the slice, the contiguous
  /// index of the operand's memory walked fastest across threads.
  SOLDER_HD static unsigned a_row(unsigned q, unsigned t) { return A::cols_contiguous ? (q * threads + t) / bk : (q * threads + t) % bm; }
  SOLDER_HD static unsigned a_col(unsigned q, unsigned t) { return A::cols_contiguous ? (q * threads + t) % bk : (q * threads + t) / bm; }
  SOLDER_HD static unsigned b_row(unsigned q, unsigned t) { return B::cols_contiguous ? (q * threads + t) / bn : (q * threads + t) % bk; }
  SOLDER_HD static unsigned b_col(unsigned q, unsigned t) { return B::cols_contiguous ? (q * threads + t) % bn : (q * threads + t) / bk; }
};

/// The product of operands a' [M, K] and b' [K, N] through the epilogue write w, whose
/// expression reads the product as product_value<shape<M, N>>(M) (for example
/// write(y, dropout(relu(product_value<S>(M) + b), p, rng))).
template <class Tiling, class A, class B, class W>
product_pass<Tiling, A, B, W> product(const A& a, const B& b, std::size_t M, std::size_t K, const W& w) {
  product_pass<Tiling, A, B, W> p{a, b, product_epilogue<W>(w), M, K};
  if (p.epilogue.rows != M)
    solder::detail::fail("solder::eval::cuda::product: the output has " + std::to_string(p.epilogue.rows) +
                         " rows and the product " + std::to_string(M));
  return p;
}

// ---------------------------------------------------------------------------------------------
// From an expression holding matmul (expr/contract.hpp) to a product pass
// ---------------------------------------------------------------------------------------------

/// How the CUDA backend stages a product operand of expr/operand.hpp, or nothing (void) for a
/// form it does not take yet.
template <class X>
struct device_operand {
  using type = void;
};
template <class S>
struct device_operand<tensor_ref<const float, S, device>> {
  using type = matrix_operand<false>;
  static type of(const tensor_ref<const float, S, device>& t) { return {t.data(), S::last}; }
};
template <class S>
struct device_operand<transposed<S, device>> {
  using type = matrix_operand<true>;
  static type of(const transposed<S, device>& t) { return {t.ref.data(), S::last}; }
};
template <std::size_t TR, std::size_t TC, sketch_stack Stack, bool Trans>
struct device_operand<sign_sketch<TR, TC, 1, Stack, Trans>> {
  using type = sign_operand<TR, TC, Trans>;
  static type of(const sign_sketch<TR, TC, 1, Stack, Trans>& u) { return {u.seed, 0, u.scale, u.rounds}; }
};
template <class S, std::size_t C0, std::size_t C1, bool Trans>
struct device_operand<column_block<S, C0, C1, Trans, device>> {
  using type = matrix_operand<Trans>;
  static type of(const column_block<S, C0, C1, Trans, device>& t) { return {t.ref.data() + C0, S::last}; }
};
template <std::size_t TR, std::size_t TC, std::size_t Terms, sketch_stack Stack, bool Trans>
  requires(Terms > 1)
struct device_operand<sign_sketch<TR, TC, Terms, Stack, Trans>> {
  using type = sketch_operand<TR, TC, Terms, Stack, Trans>;
  static type of(const sign_sketch<TR, TC, Terms, Stack, Trans>& u) { return {u.seed, u.scale, u.rounds}; }
};
/// A batch's image patches (expr/operand.hpp): a convolution's A', or the B' of its dW = g^T A',
/// staged from the NCHW images.
template <class G, std::size_t C, std::size_t Stored>
struct device_operand<image_patches<G, C, device, Stored>> {
  using type = im2col_operand<G, C, G::kernel_height, G::kernel_width, false, Stored>;
  static type of(const image_patches<G, C, device, Stored>& p) { return {p.images}; }
};
/// A batch's images as pixel rows (expr/operand.hpp): a convolution's output gradient, the g of
/// its dW = g^T patches(x) and of its patch gradient g W.
template <std::size_t C, std::size_t Plane, bool Trans, std::size_t Stored>
struct device_operand<image_pixels<C, Plane, device, Trans, Stored>> {
  using type = pixels_operand<C, Plane, Trans, Stored>;
  static type of(const image_pixels<C, Plane, device, Trans, Stored>& p) { return {p.images}; }
};
/// hcat and vcat of two operands the backend stages: the sketched layer's factors.
template <class A, class B, sketch_stack Axis>
  requires(!std::is_void_v<typename device_operand<A>::type> && !std::is_void_v<typename device_operand<B>::type>)
struct device_operand<operand_concat<A, B, Axis>> {
  static constexpr std::size_t split =
      Axis == sketch_stack::columns ? solder::detail::operand_traits<A>::cols : solder::detail::operand_traits<A>::rows;
  using type = concat_operand<typename device_operand<A>::type, typename device_operand<B>::type, Axis, split>;
  static type of(const operand_concat<A, B, Axis>& c) { return {device_operand<A>::of(c.a), device_operand<B>::of(c.b)}; }
};

namespace detail {
template <class W>
inline constexpr bool holds_product = false;
template <class T, class S, class E>
inline constexpr bool holds_product<write_target<T, S, E, device>> = find_contract<E>::count > 0;
}  // namespace detail

/// Whether a write's expression holds a matrix product (run by product_of, not a pass).
template <class W>
inline constexpr bool holds_product = detail::holds_product<std::remove_cvref_t<W>>;

/// The tiling the CUDA backend takes for an output of N static columns (fp32: the same bits as
/// any other fp32 tiling; the tensor-core tilings are chosen by naming them).
template <std::size_t N>
using default_product_tiling = product_tiling_for<N>;

template <class T, class S, class E>
constexpr bool check_product_write() {
  using C = typename find_contract<E>::type;
  if constexpr (find_contract<E>::count != 1) {
    return diagnostic<"solder::assign (CUDA): an expression may hold one matrix product; assign the others to device tensors first", E>::reported;
  } else if constexpr (std::is_void_v<typename device_operand<typename C::a_type>::type> ||
                       std::is_void_v<typename device_operand<typename C::b_type>::type>) {
    return diagnostic<"solder::assign (CUDA): a product's operands must be device matrices, their transposes, sign sketches, hcat/vcat of them, image patches or pixels",
                      typename C::a_type, typename C::b_type>::reported;
  } else if constexpr (!std::is_same_v<typename C::shape_type, S>) {
    return diagnostic<"solder::assign (CUDA): an output holding a matrix product must have the product's shape", typename C::shape_type,
                      S>::reported;
  } else {
    return true;
  }
}

/// The product pass of a write whose expression holds one matmul: its operands staged as
/// device_operand says, the rest of the expression its epilogue. Throws solder::error where the
/// inner extents' batches differ.
template <class Tiling = void, class T, class S, class E>
auto product_of(const write_target<T, S, E, device>& w) {
  static_assert(check_product_write<T, S, E>());
  const auto& c = contract_of(w.expr);
  using C = std::remove_cvref_t<decltype(c)>;
  using A = device_operand<typename C::a_type>;
  using B = device_operand<typename C::b_type>;
  using Tl = std::conditional_t<std::is_void_v<Tiling>, default_product_tiling<S::last>, Tiling>;
  if constexpr (C::K == dyn) {
    const std::size_t ka = C::a_traits::batch(c.a), kb = C::b_traits::batch(c.b);
    if (ka != kb)
      solder::detail::fail("solder::assign (CUDA): the product's operands have batches " + std::to_string(ka) + " and " +
                           std::to_string(kb) + "; the inner extent must agree");
  }
  const std::size_t M = c.rows();
  auto epilogue = write(w.out, replace_contract(w.expr, accumulator_leaf<typename C::shape_type>{c.batch()}));
  return product<Tl>(A::of(c.a), B::of(c.b), M, c.inner(), epilogue);
}

/// The gradient of a batch's image patches written back onto its images, by the verbs of Exec
/// (executor<cuda>, or its emulation): the product into `columns` [batch Ho Wo, C Kh Kw]
/// (scratch the caller owns), then gathered per input element (col2im, no atomics: the same
/// bits every run).
template <class Exec, class G, std::size_t C, class E, std::size_t Stored>
void run_patch_gradient(const patch_gradient_write<G, C, device, E, Stored>& w, float* columns) {
  Exec::run(write(tensor_ref<float, shape<dyn, C * G::taps>, device>(columns, w.out.batch()), w.expr));
  Exec::planes(w.out.samples * C, G::height, G::width, G::in_plane,
               ops::conv2d_col2im<G, C, Stored>{columns, w.out.images});
}

}  // namespace solder::eval::cuda
