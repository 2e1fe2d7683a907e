// eval/cpu/assign.hpp: assignment. Assigning expressions runs ONE pass over the output (the
// loop nest of loop.hpp), or, when the expressions hold a matrix product, one GEMM whose
// epilogue evaluates them on each register tile (contract.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "solder/eval/cpu/contract.hpp"
#include "solder/eval/cpu/loop.hpp"

namespace solder {

namespace cpu {

/// The elementwise pass of assign_all.
template <class W0, class... Ws>
void assign_elementwise(const W0& w0, const Ws&... ws) {
  using T = cpu::write_value_t<W0>;
  using Iter = typename cpu::write_traits<W0>::iter_shape;
  using V = cpu::vec<T>;
  constexpr std::size_t W = V::size;

  const std::size_t batch = cpu::write_traits<W0>::batch(w0);
  ((Iter::dynamic && cpu::write_traits<Ws>::batch(ws) != batch
        ? solder::detail::fail("solder::assign_all: the writes' batch sizes differ: " + std::to_string(batch) + " vs " +
                       std::to_string(cpu::write_traits<Ws>::batch(ws)))
        : void()),
   ...);
  const std::size_t elements = Iter::elements(batch);

  constexpr bool flat = Iter::rank >= 1 && cpu::write_traits<W0>::template flat<Iter> &&
                        (cpu::write_traits<Ws>::template flat<Iter> && ...);
  using Lay = cpu::layout<Iter, flat>;
  constexpr bool draws = (cpu::mask_slots<decltype(cpu::make_eval<Lay, V>(w0))> + ... +
                         cpu::mask_slots<decltype(cpu::make_eval<Lay, V>(ws))>) > 0;
  const cpu::partition part(elements, flat ? elements : Iter::last,
                            draws ? cpu::segment_elements : cpu::long_segment_elements);

  // Streaming stores need every store aligned to a vector: flat runs (segments are multiples
  // of the vector) or rows that are, over outputs that are too big for the cache.
  constexpr bool any_store = !cpu::write_traits<W0>::reduces || (!cpu::write_traits<Ws>::reduces || ...);
  constexpr bool rows_aligned = flat || Iter::last % W == 0;
  constexpr bool may_stream = any_store && rows_aligned && (Iter::dynamic || Iter::size * sizeof(T) >= cpu::stream_min_bytes);
  auto aligned = [](const auto& w) {
    return cpu::write_traits<std::remove_cvref_t<decltype(w)>>::reduces ||
           reinterpret_cast<std::uintptr_t>(w.out.data()) % alignment == 0;
  };
  if constexpr (may_stream) {
    if (elements * sizeof(T) >= cpu::stream_min_bytes && aligned(w0) && (aligned(ws) && ...)) {
      cpu::run_writes<Lay, V, true>(part, batch, w0, ws...);
      return;
    }
  }
  cpu::run_writes<Lay, V, false>(part, batch, w0, ws...);
}

}  // namespace cpu

/// Evaluates several writes in ONE pass over their common shape, e.g. a gradient and its
/// bias reduction: assign_all(write(dx, g), write(db, sum<0>(g))). Writes holding a matrix
/// product (matmul) run as that product with the writes as its epilogue.
template <class W0, class... Ws>
void assign_all(const W0& w0, const Ws&... ws) {
  static_assert(cpu::write_traits<W0>::checked && (cpu::write_traits<Ws>::checked && ...));
  static_assert(cpu::check_same_iteration<W0, Ws...>());
  static_assert((std::is_same_v<cpu::write_value_t<Ws>, cpu::write_value_t<W0>> && ...),
                "solder::assign_all: every output of one pass must have the same element type");
  if constexpr (cpu::has_contract<W0, Ws...>)
    cpu::assign_contract(w0, ws...);
  else
    cpu::assign_elementwise(w0, ws...);
}

/// out = e in one pass (e elementwise, broadcast to out's shape, or a reduction).
template <class T, class S, class E>
void assign(tensor_ref<T, S> out, const E& e) {
  static_assert(!std::is_const_v<T>, "solder::assign: cannot assign to a view of const elements");
  assign_all(write(out, e));
}
template <class T, class S, class E>
void assign(tensor<T, S>& out, const E& e) {
  assign(out.ref(), e);
}

}  // namespace solder
