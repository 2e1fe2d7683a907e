// eval/cuda/evaluator.hpp: how each expression node is read by the CUDA backend, one element or
// one 16-byte vector of four at a flat output index. Host+device code with no CUDA header, so
// the CPU test suite runs the same evaluators over a whole grid (tests/support/grid.hpp).
//
// A pass walks its output in items (eval/cuda/pass.hpp): the 32 elements base + 16k + 4t + j
// (k < 8, j < 4) of a 128-element tile, t the item's quarter of the tile. For each item the
// evaluators are told the tile (seek), then read the four consecutive elements of each k.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "solder/config.hpp"
#include "solder/expr/broadcast.hpp"
#include "solder/expr/expression.hpp"
#include "solder/expr/map.hpp"
#include "solder/expr/random.hpp"
#include "solder/random/philox.hpp"

namespace solder::eval::cuda {

/// Elements of a tile: one bits16 group of the dropout generator (random/philox.hpp), so a
/// tile's masks come from 16 Philox blocks, each giving 8 elements' bits.
inline constexpr std::size_t tile = 128;
/// Threads per tile: each takes 4 Philox blocks (lanes 4t..4t+3 of the group) and the 32
/// elements they cover, in 8 vectors of 4.
inline constexpr unsigned quarters = 4;

/// Four consecutive elements of one value type: what one 16-byte access reads.
template <class T>
struct lanes4 {
  T v[4];
};

/// p[0..4): one 16-byte load where p is aligned and T is float (Vec), else four loads.
template <bool Vec, class T>
SOLDER_HD SOLDER_INLINE lanes4<std::remove_const_t<T>> load4(const T* p) {
#if defined(__CUDA_ARCH__)
  if constexpr (Vec && std::is_same_v<std::remove_const_t<T>, float>) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    return {{q.x, q.y, q.z, q.w}};
  }
#endif
  return {{p[0], p[1], p[2], p[3]}};
}

/// p[0..4) = v: one 16-byte store where p is aligned and T is float (Vec), else four stores.
template <bool Vec, class T>
SOLDER_HD SOLDER_INLINE void store4(T* p, const lanes4<T>& v) {
#if defined(__CUDA_ARCH__)
  if constexpr (Vec && std::is_same_v<T, float>) {
    *reinterpret_cast<float4*>(p) = make_float4(v.v[0], v.v[1], v.v[2], v.v[3]);
    return;
  }
#endif
  p[0] = v.v[0];
  p[1] = v.v[1];
  p[2] = v.v[2];
  p[3] = v.v[3];
}

/// The output a pass walks: its shape, and whether every tile starts on a multiple of 128 in
/// the flat index (always in a flat walk; in a walk by rows, when the rows are whole tiles).
template <class Out, bool Grouped>
struct walk {
  using shape = Out;
  static constexpr bool grouped = Grouped;
};

/// Where an operand of shape L is read for flat output index i of an output of shape Out:
/// i itself when the shapes are the same, else its broadcast position (expr/broadcast.hpp).
template <class L, class Out>
struct position {
  using map = broadcast_map<L, Out>;
  /// Same shape: flat indices coincide.
  static constexpr bool same = std::is_same_v<L, Out>;
  /// Four consecutive output elements are four consecutive operand elements (same shape, or
  /// the operand varies along the row); otherwise one operand element is splatted over them.
  static constexpr bool contiguous = same || map::inner;
  SOLDER_HD static SOLDER_INLINE std::size_t at(std::size_t i) {
    if constexpr (same) {
      return i;
    } else {
      constexpr std::size_t n = Out::rank == 0 ? 1 : Out::last;
      return map::row_offset(i / n) + (map::inner ? i % n : 0);
    }
  }
};

template <class E, class Lay>
struct evaluator;

/// r.seek(base, t) for evaluators that use the item's quarter (masks), r.seek(base) otherwise.
template <class R>
SOLDER_HD SOLDER_INLINE void seek_evaluator(R& r, std::size_t base, unsigned t) {
  if constexpr (requires { r.seek(base, t); })
    r.seek(base, t);
  else
    r.seek(base);
}

/// A tensor in device memory.
template <class T, class L, class Lay>
struct evaluator<tensor_ref<const T, L, device>, Lay> {
  using pos = position<L, typename Lay::shape>;
  using value_type = T;
  const T* p;
  explicit evaluator(const tensor_ref<const T, L, device>& t) : p(t.data()) {}

  SOLDER_HD SOLDER_INLINE void seek(std::size_t) {}
  SOLDER_HD SOLDER_INLINE T at(std::size_t i) const { return p[pos::at(i)]; }
  template <bool Vec>
  SOLDER_HD SOLDER_INLINE lanes4<T> at4(std::size_t i) const {
    if constexpr (pos::contiguous) {
      return load4<Vec>(p + pos::at(i));
    } else {
      const T x = p[pos::at(i)];
      return {{x, x, x, x}};
    }
  }
  /// The operand's address, for the launch's alignment check.
  const void* address() const { return p; }
};

/// A tagged autodiff variable reads like its tensor.
template <std::size_t Id, class T, class L, class Lay>
struct evaluator<variable<Id, T, L, device>, Lay> : evaluator<tensor_ref<const T, L, device>, Lay> {
  explicit evaluator(const variable<Id, T, L, device>& v) : evaluator<tensor_ref<const T, L, device>, Lay>(v.ref) {}
};

/// A scalar constant.
template <class T, class Lay>
struct evaluator<constant<T>, Lay> {
  using value_type = T;
  T value;
  explicit evaluator(const constant<T>& c) : value(c.value) {}
  SOLDER_HD SOLDER_INLINE void seek(std::size_t) {}
  SOLDER_HD SOLDER_INLINE T at(std::size_t) const { return value; }
  template <bool Vec>
  SOLDER_HD SOLDER_INLINE lanes4<T> at4(std::size_t) const {
    return {{value, value, value, value}};
  }
  const void* address() const { return nullptr; }
};

/// Word w of a Philox block, by selects: a variable index would put the block in local memory.
SOLDER_HD SOLDER_INLINE std::uint32_t word(const random::philox_ctr& c, unsigned w) {
  return w == 0 ? c.v[0] : w == 1 ? c.v[1] : w == 2 ? c.v[2] : c.v[3];
}

/// The dropout mask. When it has the output's shape (the mask of a dropout layer) and the
/// tiles are bits16 groups, seek() draws the item's 4 Philox blocks once: 8 elements' bits per
/// block, as the CPU's group generator does. Otherwise each element draws its block alone.
template <class L, class Lay>
struct evaluator<dropout_mask<L>, Lay> {
  using pos = position<L, typename Lay::shape>;
  static constexpr bool grouped = pos::same && Lay::grouped;
  using value_type = bool;
  std::uint64_t seed, offset, first;
  std::uint32_t threshold, rounds;
  // A mask whose element 0 draws a counter off a group boundary (rng.first not a multiple of
  // 128) is read element by element: its tiles straddle two groups.
  bool aligned;
  random::philox_ctr blocks[grouped ? 4 : 1] = {};

  explicit evaluator(const dropout_mask<L>& m)
      : seed(m.rng.seed), offset(m.rng.offset), first(m.rng.first), threshold(m.threshold), rounds(m.rng.rounds),
        aligned(m.rng.first % tile == 0) {}

  /// base: the tile's first flat index (a multiple of 128 when grouped), t: the item's quarter.
  SOLDER_HD SOLDER_INLINE void seek(std::size_t base, unsigned t = 0) {
    if constexpr (grouped) {
      if (!aligned) return;
      const std::uint64_t block0 = (((first + base) / tile) << 4) | (4u * t);
      const random::philox_key key{{std::uint32_t(seed), std::uint32_t(seed >> 32)}};
      for (unsigned j = 0; j < 4; ++j) {
        const std::uint64_t b = block0 + j;
        blocks[j] = random::philox4x32_rounds(
            {{std::uint32_t(b), std::uint32_t(b >> 32), std::uint32_t(offset), std::uint32_t(offset >> 32)}}, key, rounds);
      }
    }
  }
  /// Element i's keep bit; when grouped, i must lie in the sought item.
  SOLDER_HD SOLDER_INLINE bool at(std::size_t i) const {
    if constexpr (grouped) {
      if (!aligned) return random::bits16(seed, offset, first + pos::at(i), rounds) >= threshold;
      // Selected by value: a reference to a runtime-chosen block would put the blocks in
      // local memory.
      const unsigned j = unsigned(i) & 3u, k = unsigned(i >> 4) & 7u;
      const std::uint32_t w0 = word(blocks[0], k >> 1), w1 = word(blocks[1], k >> 1), w2 = word(blocks[2], k >> 1),
                          w3 = word(blocks[3], k >> 1);
      const std::uint32_t w = j == 0 ? w0 : j == 1 ? w1 : j == 2 ? w2 : w3;
      return ((w >> (16u * (k & 1u))) & 0xFFFFu) >= threshold;
    } else {
      return random::bits16(seed, offset, first + pos::at(i), rounds) >= threshold;
    }
  }
  /// Elements i..i+3 (i a multiple of 4 when grouped: lane j is block j, no runtime index).
  template <bool Vec>
  SOLDER_HD SOLDER_INLINE lanes4<bool> at4(std::size_t i) const {
    if constexpr (grouped)
      if (aligned) return {{keep(blocks[0], i), keep(blocks[1], i), keep(blocks[2], i), keep(blocks[3], i)}};
    return {{at(i), at(i + 1), at(i + 2), at(i + 3)}};
  }
  const void* address() const { return nullptr; }

 private:
  /// The keep bit of element i from its block: half (k & 1) of word k >> 1, k = (i >> 4) & 7.
  SOLDER_HD SOLDER_INLINE bool keep(const random::philox_ctr& b, std::size_t i) const {
    const unsigned k = unsigned(i >> 4) & 7u;
    return ((word(b, k >> 1) >> (16u * (k & 1u))) & 0xFFFFu) >= threshold;
  }
};

/// An elementwise node: its operands' values through the op's one definition, lane by lane.
template <class Op, class... Args, class Lay>
struct evaluator<map_node<Op, Args...>, Lay> {
  using value_type = value_of<map_node<Op, Args...>>;
  [[no_unique_address]] Op op;
  solder::detail::tuple<evaluator<Args, Lay>...> args;

  explicit evaluator(const map_node<Op, Args...>& n) : evaluator(n, std::index_sequence_for<Args...>{}) {}

  SOLDER_HD SOLDER_INLINE void seek(std::size_t base, unsigned t = 0) { seek_all(base, t, std::index_sequence_for<Args...>{}); }
  SOLDER_HD SOLDER_INLINE value_type at(std::size_t i) const { return at_all(i, std::index_sequence_for<Args...>{}); }
  template <bool Vec>
  SOLDER_HD SOLDER_INLINE lanes4<value_type> at4(std::size_t i) const {
    return at4_all<Vec>(i, std::index_sequence_for<Args...>{});
  }

 private:
  template <std::size_t... I>
  evaluator(const map_node<Op, Args...>& n, std::index_sequence<I...>)
      : op(n.op), args{{{evaluator<Args, Lay>(solder::detail::get<I>(n.args))}...}} {}
  template <std::size_t... I>
  SOLDER_HD SOLDER_INLINE void seek_all(std::size_t base, unsigned t, std::index_sequence<I...>) {
    (seek_evaluator(solder::detail::get<I>(args), base, t), ...);
  }
  template <std::size_t... I>
  SOLDER_HD SOLDER_INLINE value_type at_all(std::size_t i, std::index_sequence<I...>) const {
    return op.forward(solder::detail::get<I>(args).at(i)...);
  }
  template <bool Vec, std::size_t... I>
  SOLDER_HD SOLDER_INLINE lanes4<value_type> at4_all(std::size_t i, std::index_sequence<I...>) const {
    const auto in = solder::detail::make_tuple(solder::detail::get<I>(args).template at4<Vec>(i)...);
    lanes4<value_type> out;
    for (unsigned j = 0; j < 4; ++j) out.v[j] = op.forward(solder::detail::get<I>(in).v[j]...);
    return out;
  }
};

/// Visits the address of every tensor operand of an evaluator tree (the launch checks that all
/// are 16-byte aligned before it picks the vector kernel).
template <class R, class F>
void for_each_address(const R& r, const F& f) {
  if constexpr (requires { r.args; })
    solder::detail::apply([&](const auto&... a) { (for_each_address(a, f), ...); }, r.args);
  else
    f(r.address());
}

/// True when every tensor operand of E has exactly shape Out (constants and same-shape masks
/// fit too): four consecutive output elements then never mix rows of a broadcast operand.
template <class E, class Out>
inline constexpr bool all_same_shape = std::is_same_v<shape_of<E>, Out>;
template <class T, class Out>
inline constexpr bool all_same_shape<constant<T>, Out> = true;
template <class Op, class... Args, class Out>
inline constexpr bool all_same_shape<map_node<Op, Args...>, Out> = (all_same_shape<Args, Out> && ...);

/// Whether E is made of leaves the CUDA backend reads (device tensors, constants, masks) and
/// elementwise nodes; anything else is reported by the executor with one message.
template <class E>
inline constexpr bool device_readable = false;
template <class T, class L>
inline constexpr bool device_readable<tensor_ref<const T, L, device>> = true;
template <std::size_t Id, class T, class L>
inline constexpr bool device_readable<variable<Id, T, L, device>> = true;
template <class T>
inline constexpr bool device_readable<constant<T>> = true;
template <class L>
inline constexpr bool device_readable<dropout_mask<L>> = true;
template <class Op, class... Args>
inline constexpr bool device_readable<map_node<Op, Args...>> = (device_readable<Args> && ...);

}  // namespace solder::eval::cuda
