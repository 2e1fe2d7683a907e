// eval/cpu/product.hpp: writes that hold a matrix product run as ONE GEMM whose epilogue is
// the rest of their expressions. The product node is replaced by a tile leaf that reads the
// accumulator tile; every other leaf (a bias row, a residual, a dropout mask) is read by its
// usual evaluator at the tile's output coordinates, so a dropout mask inside the epilogue is
// bit for bit the mask an elementwise pass over the same output draws.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "solder/eval/cpu/gemm.hpp"
#include "solder/eval/cpu/pass.hpp"
#include "solder/eval/cpu/operand_packing.hpp"
#include "solder/expr/contract.hpp"

namespace solder::eval::cpu {

// ---------------------------------------------------------------------------------------------
// Finding and replacing the product in an expression tree
// ---------------------------------------------------------------------------------------------

template <class W>
using write_expr_t = std::remove_cvref_t<decltype(std::declval<W>().expr)>;
template <class W>
inline constexpr std::size_t contracts_in = find_contract<write_expr_t<W>>::count;

/// The product the writes hold (the first write's that holds one).
template <class... Ws>
using product_of_t = typename solder::detail::first_non_void<typename find_contract<write_expr_t<Ws>>::type...>::type;

/// True when some write of a pass holds a product: assign_all then runs assign_contract.
template <class... Ws>
inline constexpr bool has_contract = ((contracts_in<Ws> + ...) > 0);

/// Stands for the product inside an epilogue: reads the accumulator tile of the current call.
template <class S>
struct tile_leaf {
  using expression_tag = solder::expression_tag;
  using value_type = float;
  using shape_type = S;
  using space_type = host;
  std::size_t batch_ = 1;
  std::size_t batch() const { return batch_; }
};

/// e with its product replaced by a tile leaf.
template <class E>
auto with_tile(const E& e) {
  const auto& c = contract_of(e);
  return replace_contract(e, tile_leaf<typename std::remove_cvref_t<decltype(c)>::shape_type>{c.batch()});
}

/// Whole Philox groups (128 elements' 16-bit draws) kept per thread across epilogue calls: a
/// tile row reads 32 of a group's 128 draws, and the next tiles of the same row block read the
/// rest, so each group is generated once instead of once per tile.
struct philox_group_cache {
  // A prime number of slots: the rows of a tile read groups N / 128 apart, and with a power of
  // two rows 8 apart (N = 1024) would evict each other within one tile.
  static constexpr std::size_t entries = 67;
  static constexpr std::size_t group = random::bits16_group;
  struct entry {
    std::uint64_t seed = 0, offset = 0, index = 0;
    std::uint32_t rounds = 0;
    bool valid = false;
    alignas(alignment) std::uint16_t bits[group + 64] = {};  // + padding: a vector load may run past
  };
  entry slots[entries];

  static philox_group_cache& local() {
    thread_local philox_group_cache cache;
    return cache;
  }
  const std::uint16_t* group_bits(std::uint64_t seed, std::uint64_t offset, std::uint32_t rounds, std::uint64_t g) {
    entry& e = slots[g % entries];
    if (!(e.valid && e.seed == seed && e.offset == offset && e.rounds == rounds && e.index == g)) {
      philox_bits16(detail::philox_stream(seed, offset, rounds), g * group, group, e.bits);
      e.seed = seed;
      e.offset = offset;
      e.rounds = rounds;
      e.index = g;
      e.valid = true;
    }
    return e.bits;
  }
};

/// The pass context of an epilogue call: the random-bit slots, and where the tile is.
template <std::size_t Slots>
struct tile_context : pass_context<Slots> {
  const float* tile = nullptr;  // row r of the tile at tile + r * ld
  std::size_t m0 = 0, n0 = 0, ld = 0;

  /// A tile row's draws: from the thread's group cache when they lie in one group (the usual
  /// case), else generated for the segment alone.
  const std::uint16_t* bits16(std::uint64_t seed, std::uint64_t offset, std::uint32_t rounds, std::uint64_t first,
                              std::size_t len) {
    constexpr std::uint64_t group = philox_group_cache::group;
    const std::uint64_t g = first / group;
    if (len == 0 || (first + len - 1) / group != g) return this->bits16_set_up(seed, offset, rounds, first, len);
    return philox_group_cache::local().group_bits(seed, offset, rounds, g) + (first - g * group);
  }
};

template <class S, class Lay, class V>
struct evaluator<tile_leaf<S>, Lay, V> {
  const float* p = nullptr;
  explicit evaluator(const tile_leaf<S>&) {}
  template <class Ctx>
  SOLDER_INLINE void seek(const segment& s, Ctx& ctx) {
    p = ctx.tile + (s.row - ctx.m0) * ctx.ld + (s.col - ctx.n0);
  }
  SOLDER_INLINE V load(std::size_t j) const { return V::load_unaligned(p + j); }
  // The tile is always NV whole vectors wide: the lanes past the valid columns are loaded and
  // never stored.
  SOLDER_INLINE V load_partial(std::size_t j, std::size_t) const { return V::load_unaligned(p + j); }
  template <std::size_t Bytes>
  SOLDER_INLINE void prefetch(std::size_t) const {}
};

// ---------------------------------------------------------------------------------------------
// The epilogue
// ---------------------------------------------------------------------------------------------

/// Runs the writes' expressions over one tile (in an L1 buffer, row r at tile + r * ld): each
/// of its rows is one segment of the loop nest (pass.hpp), read at the output's coordinates
/// (row m, columns n0 .. n0 + nr) and stored once.
template <class V, class Evals, class Sinks>
struct expression_epilogue {
  static constexpr std::size_t slots = [] {
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (mask_slots<solder::detail::tuple_element_t<I, Evals>> + ... + 0);
    }(std::make_index_sequence<solder::detail::tuple_size_v<Evals>>{});
  }();
  Evals evals;
  Sinks sinks;

  static void rows(const void* self, const float* tile, std::size_t ld, std::size_t m0, std::size_t n0, std::size_t mr,
                   std::size_t nr) {
    const auto& me = *static_cast<const expression_epilogue*>(self);
    tile_context<slots> ctx;
    ctx.tile = tile;
    ctx.m0 = m0;
    ctx.n0 = n0;
    ctx.ld = ld;
    Evals ev = me.evals;  // locals: the stores may alias anything reached through `me`
    Sinks sk = me.sinks;
    constexpr auto writes = std::make_index_sequence<solder::detail::tuple_size_v<Evals>>{};
    for (std::size_t r = 0; r < mr; ++r) run_segment<V, 0>(segment{m0 + r, n0, nr}, ctx, ev, sk, writes, writes);
  }
  erased_epilogue erased() const { return {this, &rows}; }
};

// ---------------------------------------------------------------------------------------------
// The pass
// ---------------------------------------------------------------------------------------------

namespace contract_detail {

/// The GEMM's view of one operand: pointer, leading dimension, transposition.
template <class X>
struct operand_view;
template <class S>
struct operand_view<tensor_ref<const float, S>> {
  static constexpr bool trans = false;
  static const float* data(const tensor_ref<const float, S>& t) { return t.data(); }
  static constexpr std::size_t ld() { return S::last; }
  static std::size_t bytes(const tensor_ref<const float, S>& t) { return S::elements(t.batch()) * sizeof(float); }
};
template <class S>
struct operand_view<transposed<S>> {
  static constexpr bool trans = true;
  static const float* data(const transposed<S>& t) { return t.ref.data(); }
  static constexpr std::size_t ld() { return S::last; }
  static std::size_t bytes(const transposed<S>& t) { return S::elements(t.batch()) * sizeof(float); }
};

template <class S, std::size_t C0, std::size_t C1, bool Trans>
struct operand_view<column_block<S, C0, C1, Trans>> {
  static constexpr bool trans = Trans;
  static const float* data(const column_block<S, C0, C1, Trans>& t) { return t.ref.data() + C0; }
  static constexpr std::size_t ld() { return S::last; }
  static std::size_t bytes(const column_block<S, C0, C1, Trans>& t) { return S::elements(t.batch()) * sizeof(float) - C0 * sizeof(float); }
};

/// f(data, bytes) for every stored matrix an operand reads (none for a sign sketch or a
/// pre-packed matrix).
template <class X, class F>
void for_each_stored(const X& x, F&& f) {
  using T = solder::detail::operand_traits<X>;
  if constexpr (T::form == solder::detail::operand_form::stored) {
    f(operand_view<X>::data(x), operand_view<X>::bytes(x));
  } else if constexpr (requires { x.a; x.b; }) {
    for_each_stored(x.a, f);
    for_each_stored(x.b, f);
  }
}

/// True when [p, p + n) and [q, q + m) overlap.
inline bool overlaps(const void* p, std::size_t n, const void* q, std::size_t m) {
  const auto a = reinterpret_cast<std::uintptr_t>(p), b = reinterpret_cast<std::uintptr_t>(q);
  return a < b + m && b < a + n;
}

/// Whether two operands of one type are the same matrix: stored parts by address, pre-packed
/// matrices by address, sketches by seed and scale.
template <class X>
bool same_operand(const X& u, const X& v) {
  if constexpr (requires { u.packed; })
    return u.packed == v.packed;
  else if constexpr (requires { u.seed; })
    return u.seed == v.seed && u.scale == v.scale;
  else if constexpr (requires { u.a; u.b; })
    return same_operand(u.a, v.a) && same_operand(u.b, v.b);
  else
    return operand_view<X>::data(u) == operand_view<X>::data(v);
}

/// Whether two product nodes of one type multiply the same matrices.
template <class C>
bool same_product(const C& x, const C& y) {
  return same_operand(x.a, y.a) && same_operand(x.b, y.b) && x.rows() == y.rows();
}

}  // namespace contract_detail

/// assign_all for writes holding a product: one GEMM (eval::cpu::gemm) whose epilogue evaluates every
/// write on each tile. Every write holding a product must hold the same one; the outputs may
/// not overlap the product's operands (tiles are stored while other threads still read them).
template <class W0, class... Ws>
void assign_product(const W0& w0, const Ws&... ws) {
  static_assert(((contracts_in<W0> <= 1) && ... && (contracts_in<Ws> <= 1)),
                "solder::assign: an expression may hold one matrix product; assign the others to tensors first");
  static_assert(!write_traits<W0>::reduces && (!write_traits<Ws>::reduces && ...),
                "solder::assign_all: a reduction of a matrix product is not fused into the product; assign the "
                "product to a tensor first, then reduce it");
  using C = product_of_t<W0, Ws...>;
  using Iter = typename write_traits<W0>::iter_shape;
  static_assert(std::is_same_v<Iter, typename C::shape_type>,
                "solder::assign: an output holding a matrix product must have the product's shape");
  static_assert(std::is_same_v<write_value_t<W0>, float>, "solder::assign: products are implemented for float");
  using V = vec<float>;
  using Lay = layout<Iter, false>;

  // The product, checked to be the same in every write that holds one.
  const solder::detail::tuple<const W0&, const Ws&...> all{{{w0}, {ws}...}};
  constexpr std::size_t first = [] {
    constexpr bool holds[] = {contracts_in<W0> != 0, (contracts_in<Ws> != 0)...};
    std::size_t i = 0;
    while (!holds[i]) ++i;
    return i;
  }();
  const C& c = contract_of(solder::detail::get<first>(all).expr);
  auto check_same = [&](const auto& w) {
    if constexpr (contracts_in<std::remove_cvref_t<decltype(w)>> == 1) {
      if (!contract_detail::same_product(c, contract_of(w.expr)))
        solder::detail::fail("solder::assign_all: the writes hold different matrix products; one pass evaluates one product");
    }
  };
  check_same(w0);
  (check_same(ws), ...);
  const std::size_t batch = write_traits<W0>::batch(w0);
  ((Iter::dynamic && write_traits<Ws>::batch(ws) != batch
        ? solder::detail::fail_counts("solder::assign_all: the writes' batch sizes differ: ", batch, " vs ",
                                      write_traits<Ws>::batch(ws))
        : void()),
   ...);
  const std::size_t M = c.rows();
  if (M == 0) return;

  auto check_alias = [&](const auto& w) {
    const std::size_t out_bytes = Iter::elements(batch) * sizeof(float);
    bool alias = false;
    auto test = [&](const float* p, std::size_t bytes) { alias = alias || contract_detail::overlaps(w.out.data(), out_bytes, p, bytes); };
    contract_detail::for_each_stored(c.a, test);
    contract_detail::for_each_stored(c.b, test);
    if (alias) solder::detail::fail("solder::assign: the output of a matrix product overlaps one of its operands");
  };
  check_alias(w0);
  (check_alias(ws), ...);

  auto evals = solder::detail::make_tuple(evaluator<decltype(with_tile(w0.expr)), Lay, V>(with_tile(w0.expr)),
                               evaluator<decltype(with_tile(ws.expr)), Lay, V>(with_tile(ws.expr))...);
  auto sinks = solder::detail::make_tuple(store_sink<float, Lay, V, false>(w0.out.data()), store_sink<float, Lay, V, false>(ws.out.data())...);
  const expression_epilogue<V, decltype(evals), decltype(sinks)> expr_epi{evals, sinks};
  erased_epilogue epi = expr_epi.erased();

  constexpr std::size_t N = C::N, K = C::K;
  constexpr bool TA = C::a_traits::trans;
  using A = std::remove_cvref_t<decltype(c.a)>;
  using solder::detail::operand_form;
  using AV = contract_detail::operand_view<A>;
  if constexpr (C::a_traits::form != operand_form::stored || C::b_traits::form == operand_form::generated) {
    // Generated operands (sketches, concatenations): each packed by its rule, then the same
    // driver. Their extents are static, so K is too.
    static_assert(K != dyn);
    const auto a_source = [&] {
      if constexpr (C::a_traits::form == operand_form::stored && !TA)
        return gemm_detail::a_rows<AV::ld()>{AV::data(c.a)};
      else if constexpr (C::a_traits::form == operand_form::stored)
        return gemm_detail::a_strided{AV::data(c.a), AV::ld(), TA};
      else
        return a_operand<A>{c.a};
    }();
    gemm_from<N>(M, K, a_source, b_block_packer<N, std::remove_cvref_t<decltype(c.b)>>{c.b}, epi);
  } else if constexpr (K == dyn) {
    // K is the batch of both operands (dW = g^T x): one run-time inner extent.
    using BV = contract_detail::operand_view<std::remove_cvref_t<decltype(c.b)>>;
    const std::size_t k = c.inner();
    if (C::b_traits::batch(c.b) != k)
      solder::detail::fail_counts("solder::matmul: the operands' batch sizes differ (", k, " vs ",
                                  C::b_traits::batch(c.b), "); the product sums over the batch");
    gemm_dyn_k<N, TA, BV::trans>(M, k, AV::data(c.a), AV::ld(), BV::data(c.b), BV::ld(), epi);
  } else if constexpr (C::b_traits::form == operand_form::prepacked) {
    gemm<N, K, TA, C::b_traits::trans>(M, AV::data(c.a), AV::ld(), *c.b.packed, epi);
  } else {
    using BV = contract_detail::operand_view<std::remove_cvref_t<decltype(c.b)>>;
    gemm<N, K, TA, BV::trans>(M, AV::data(c.a), AV::ld(), BV::data(c.b), BV::ld(), epi);
  }
}

}  // namespace solder::eval::cpu
