// eval/cpu/evaluator.hpp: how each expression node is read on the CPU, one xsimd vector at a
// time, inside the loop nest of eval/cpu/assign.hpp.
//
// The loop nest walks the output in segments: a run of consecutive elements of one output row
// (or of the whole output, in flat mode, when no operand is broadcast). For each segment it
// calls seek() on every evaluator, then load(j) / load_partial(j, n) for the vectors in it.
// seek() is where broadcasting is resolved: an operand's row start is computed once per
// segment, and an operand broadcast along the row is loaded once and splatted.
#pragma once

#include <array>
#include <cstring>
#include <utility>

#include "solder/eval/cpu/access.hpp"
#include "solder/eval/cpu/batch.hpp"
#include "solder/eval/cpu/philox.hpp"
#include "solder/expr/broadcast.hpp"
#include "solder/expr/expression.hpp"
#include "solder/expr/map.hpp"
#include "solder/expr/random.hpp"

namespace solder::eval::cpu {

/// A run of `len` consecutive output elements starting at column `col` of output row `row`
/// (rows are all dimensions but the last; in flat mode row is 0 and col the linear index).
struct segment {
  std::size_t row = 0, col = 0, len = 0;
};

/// Largest segment (elements) of a pass that draws random bits. Short, so that generating a
/// segment's bits (pure ALU work) and streaming its operands (memory work) interleave in the
/// core's out-of-order window: measured at 256x4096 with dropout, 2048 gave 20.4 GB/s, 512
/// 21.7, 256 23.3, 128 20.5 (seek() overhead starts to show). A multiple of 128 (one Philox
/// group) and of every vector width, so flat segments start on group and cache-line boundaries.
inline constexpr std::size_t segment_elements = 256;
/// Largest segment of any other pass: long, so the loop's exit and the per-segment seek() are
/// rare (at 64 MiB, relu(x + b) ran at 18.9 GB/s with 256-element segments).
inline constexpr std::size_t long_segment_elements = 4096;

/// Per-thread state of one pass, shared by all its evaluators: the random bits of the current
/// segment, so a mask read in several places of a fused pass (the forward value inside a
/// backward expression, the dx and db writes of one backward) is generated once per segment.
/// One slot per mask leaf of the pass (`Slots`, counted at compile time), so a slot a leaf
/// reads is never refilled by another leaf in the same segment.
template <std::size_t Slots>
struct pass_context {
  static constexpr std::size_t padding = 64;  // a vector load may run past the segment's end
  struct slot {
    std::uint64_t seed = 0, offset = 0, first = 0;
    std::uint32_t rounds = 0;
    std::size_t len = 0;
    std::size_t claimed = 0;  // the segment that last read this slot (0: none yet)
    bool used = false;
    detail::philox_stream stream{0, 0};  // the stream's set-up, redone only when it changes
    alignas(alignment) std::uint16_t bits[segment_elements + padding] = {};
  };
  std::array<slot, Slots> slots{};
  std::size_t segment = 1;  // counts the segments of the chunk

  /// Called by the loop nest before the seeks of each segment.
  void next_segment() { ++segment; }

  /// The 16-bit draws of elements [first, first + len) of stream (seed, offset, rounds).
  /// A pass's next whole segment of its one stream with the default 7 rounds is drawn inline:
  /// as a call, the generator clobbered every vector register of the loop around it (the
  /// forward at 256 x 4096 took 1.07x the time on Zen 5; docs/random.md). Everything else, and
  /// 10 rounds, go through bits16_set_up, so one pass carries one generator inline.
  SOLDER_INLINE const std::uint16_t* bits16(std::uint64_t seed, std::uint64_t offset, std::uint32_t rounds,
                                            std::uint64_t first, std::size_t len) {
    if constexpr (Slots == 1) {
      constexpr std::size_t group = random::bits16_group;
      constexpr std::size_t step = std::size_t(detail::philox_step<arch>) * group;
      slot& s = slots[0];
      if (s.used && rounds == 7 && len == segment_elements && first % step == 0 && s.seed == seed &&
          s.offset == offset && s.rounds == rounds && s.first != first) {
        s.first = first;
        s.len = len;
        s.claimed = segment;
#pragma GCC unroll 4
        for (std::size_t done = 0; done < segment_elements; done += step)
          detail::philox_groups_of<arch, detail::philox_step<arch>, 7>(s.stream, (first + done) / group, s.bits + done);
        return s.bits;
      }
    }
    return bits16_set_up(seed, offset, rounds, first, len);
  }

 protected:
  /// Any range of any stream: the slot that holds it, else one set up and drawn.
  [[gnu::noinline]] const std::uint16_t* bits16_set_up(std::uint64_t seed, std::uint64_t offset, std::uint32_t rounds,
                                                       std::uint64_t first, std::size_t len) {
    for (auto& s : slots) {
      if (s.used && s.seed == seed && s.offset == offset && s.rounds == rounds && s.first == first && s.len == len) {
        s.claimed = segment;
        return s.bits;
      }
    }
    for (auto& s : slots) {
      if (s.claimed == segment) continue;  // read by another leaf in this segment
      if (!s.used || s.seed != seed || s.offset != offset || s.rounds != rounds) {
        s.seed = seed;
        s.offset = offset;
        s.rounds = rounds;
        s.stream = detail::philox_stream(seed, offset, rounds);
        s.used = true;
      }
      s.first = first;
      s.len = len;
      s.claimed = segment;
      philox_bits16(s.stream, first, len, s.bits);
      return s.bits;
    }
    solder::detail::fail("solder: internal error: more random streams in one pass than counted");
  }
};

/// The output an expression is evaluated over: its shape, and whether it is walked flat.
template <class Out, bool Flat>
struct layout {
  using shape = Out;
  static constexpr bool flat = Flat;
};

/// True when an operand of shape L is read flat in an output of shape Out (identical shapes).
template <class L, class Out>
inline constexpr bool same_layout = std::is_same_v<L, Out>;

template <class E, class Lay, class V>
struct evaluator;

/// Prefetch distances (bytes ahead) for operands read contiguously, into L2 (the T1 hint): the
/// random-bit generation of a dropout pass is pure ALU work, and without prefetches running
/// ahead, memory sits idle while it runs. Measured with a dropout pass on this machine: no
/// prefetch 22.7 GB/s at 4 MiB and 11.7 at 64 MiB; T1 4 KiB ahead 29.2 (regular stores, 4 MiB);
/// T1 8 KiB ahead 24.8 (non-temporal stores, 64 MiB); T0 (into L1) was slower than none. On AMD
/// Zen the cached passes run without them (cpu_tuning::prefetch_cached).
inline constexpr std::size_t prefetch_bytes_cached = 4096;
inline constexpr std::size_t prefetch_bytes_streaming = 8192;

/// A tensor operand.
template <class T, class L, class Lay, class V>
struct evaluator<tensor_ref<const T, L>, Lay, V> {
  using map = broadcast_map<L, typename Lay::shape>;
  static constexpr bool contiguous = Lay::flat || map::inner;
  // Worth prefetching: an operand as large as the output streams through memory once; a
  // broadcast one (a bias row) is reused from cache.
  static constexpr bool streams = Lay::flat || std::is_same_v<L, typename Lay::shape>;

  const T* base;
  const T* p = nullptr;
  V splat{};

  explicit evaluator(const tensor_ref<const T, L>& t) : base(t.data()) {}
  template <class Ctx>
  SOLDER_INLINE void seek(const segment& s, Ctx&) {
    if constexpr (Lay::flat) {
      p = base + s.col;
    } else {
      p = base + map::row_offset(s.row) + (map::inner ? s.col : 0);
      if constexpr (!map::inner) splat = V(*p);
    }
  }
  SOLDER_INLINE V load(std::size_t j) const {
    if constexpr (contiguous)
      return V::load_unaligned(p + j);
    else
      return splat;
  }
  SOLDER_INLINE V load_partial(std::size_t j, std::size_t n) const {
    if constexpr (contiguous)
      return load_first<V>(p + j, n);
    else
      return splat;
  }
  template <std::size_t Bytes>
  SOLDER_INLINE void prefetch(std::size_t j) const {
    if constexpr (streams) prefetch_l2<Bytes>(p + j);
  }
};

/// A tagged autodiff variable reads like its tensor.
template <std::size_t Id, class T, class L, class Lay, class V>
struct evaluator<variable<Id, T, L>, Lay, V> : evaluator<tensor_ref<const T, L>, Lay, V> {
  explicit evaluator(const variable<Id, T, L>& v) : evaluator<tensor_ref<const T, L>, Lay, V>(v.ref) {}
};

/// A scalar constant: one splat for the whole evaluation.
template <class T, class Lay, class V>
struct evaluator<constant<T>, Lay, V> {
  V value;
  explicit evaluator(const constant<T>& c) : value(simd::scalar_t<V>(c.value)) {}
  template <class Ctx>
  SOLDER_INLINE void seek(const segment&, Ctx&) {}
  SOLDER_INLINE V load(std::size_t) const { return value; }
  SOLDER_INLINE V load_partial(std::size_t, std::size_t) const { return value; }
  template <std::size_t Bytes>
  SOLDER_INLINE void prefetch(std::size_t) const {}
};

/// The dropout mask: the segment's 16-bit draws come from the pass context (generated once
/// per segment, a whole Philox group of 128 elements at a time), then are compared with the
/// threshold vector by vector.
template <class L, class Lay, class V>
struct evaluator<dropout_mask<L>, Lay, V> {
  using map = broadcast_map<L, typename Lay::shape>;
  static constexpr bool contiguous = Lay::flat || map::inner;
  using A = typename V::arch_type;
  using M = xsimd::batch_bool<simd::scalar_t<V>, A>;
  static_assert(std::is_same_v<simd::scalar_t<V>, float>, "solder::dropout: masks are implemented for float tensors");

  dropout_mask<L> mask;
  const std::uint16_t* bits = nullptr;  // the segment's draws (contiguous)
  std::uint32_t row_bits = 0;           // the row's one draw (a mask broadcast along rows)

  explicit evaluator(const dropout_mask<L>& m) : mask(m) {}
  template <class Ctx>
  SOLDER_INLINE void seek(const segment& s, Ctx& ctx) {
    const std::size_t first = Lay::flat ? s.col : map::row_offset(s.row) + (map::inner ? s.col : 0);
    bits = ctx.bits16(mask.rng.seed, mask.rng.offset, mask.rng.rounds, mask.rng.first + first, contiguous ? s.len : 1);
    if constexpr (!contiguous) row_bits = bits[0];
  }
  SOLDER_INLINE M load(std::size_t j) const {
    if constexpr (contiguous)
      return keep_mask16<A>(bits + j, mask.threshold);
    else
      return keep_mask<A>(xsimd::batch<std::uint32_t, A>(row_bits), mask.threshold);
  }
  SOLDER_INLINE M load_partial(std::size_t j, std::size_t) const { return load(j); }
  template <std::size_t Bytes>
  SOLDER_INLINE void prefetch(std::size_t) const {}
};

/// An elementwise node: its operands' vectors through the op's one definition. Each call
/// expands its operands by index rather than through an apply: a prefetch has no result, and
/// GCC's IPA pure-const pass found the (not always-inline) std::apply instantiations around it
/// free of side effects and deleted the calls before they were inlined (the dropout pass at
/// 64 MiB ran without any prefetch). Expanded here, every call is inlined into the loop nest.
template <class Op, class... Args, class Lay, class V>
struct evaluator<map_node<Op, Args...>, Lay, V> {
  [[no_unique_address]] Op op;
  solder::detail::tuple<evaluator<Args, Lay, V>...> args;

  explicit evaluator(const map_node<Op, Args...>& n) : evaluator(n, operands{}) {}

  template <class Ctx>
  SOLDER_INLINE void seek(const segment& s, Ctx& ctx) {
    seek(s, ctx, operands{});
  }
  SOLDER_INLINE auto load(std::size_t j) const { return load(j, operands{}); }
  SOLDER_INLINE auto load_partial(std::size_t j, std::size_t n) const { return load_partial(j, n, operands{}); }
  template <std::size_t Bytes>
  SOLDER_INLINE void prefetch(std::size_t j) const {
    prefetch<Bytes>(j, operands{});
  }

 private:
  using operands = std::index_sequence_for<Args...>;
  template <std::size_t... I>
  evaluator(const map_node<Op, Args...>& n, std::index_sequence<I...>)
      : op(n.op), args{{{evaluator<Args, Lay, V>(solder::detail::get<I>(n.args))}...}} {}
  template <class Ctx, std::size_t... I>
  SOLDER_INLINE void seek(const segment& s, Ctx& ctx, std::index_sequence<I...>) {
    (solder::detail::get<I>(args).seek(s, ctx), ...);
  }
  template <std::size_t... I>
  SOLDER_INLINE auto load(std::size_t j, std::index_sequence<I...>) const {
    return op.forward(solder::detail::get<I>(args).load(j)...);
  }
  template <std::size_t... I>
  SOLDER_INLINE auto load_partial(std::size_t j, std::size_t n, std::index_sequence<I...>) const {
    return op.forward(solder::detail::get<I>(args).load_partial(j, n)...);
  }
  template <std::size_t Bytes, std::size_t... I>
  SOLDER_INLINE void prefetch(std::size_t j, std::index_sequence<I...>) const {
    (solder::detail::get<I>(args).template prefetch<Bytes>(j), ...);
  }
};

/// Number of dropout-mask leaves in E: the slots a pass over E needs in its pass_context.
template <class E>
inline constexpr std::size_t mask_leaves = 0;
template <class L>
inline constexpr std::size_t mask_leaves<dropout_mask<L>> = 1;
template <class Op, class... Args>
inline constexpr std::size_t mask_leaves<map_node<Op, Args...>> = (mask_leaves<Args> + ... + 0);
template <class Ev>
inline constexpr std::size_t mask_slots = 0;
template <class E, class Lay, class V>
inline constexpr std::size_t mask_slots<evaluator<E, Lay, V>> = mask_leaves<E>;

/// True when every tensor operand of E has exactly the output's shape, so the loop nest can
/// walk the output as one flat run (constants and masks of the output's shape fit too).
template <class E, class Out>
struct flat_ok : std::bool_constant<same_layout<shape_of<E>, Out>> {};
template <class T, class Out>
struct flat_ok<constant<T>, Out> : std::true_type {};
template <class Op, class... Args, class Out>
struct flat_ok<map_node<Op, Args...>, Out> : std::bool_constant<(flat_ok<Args, Out>::value && ...)> {};

}  // namespace solder::eval::cpu
