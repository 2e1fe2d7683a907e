// eval/cpu/chunking.hpp: how the CPU backend cuts work into pieces, once for every loop. The
// pieces depend on the sizes alone, never on the thread count, so a result (a reduction's
// partial sums above all) is bitwise the same for any number of threads: threads only choose
// who runs which piece.
#pragma once

#include <algorithm>
#include <cstddef>

#include "solder/eval/cpu/batch.hpp"
#include "solder/eval/cpu/parallel.hpp"

namespace solder::eval::cpu {

/// Below this many elements a loop runs on the calling thread alone: waking a worker costs more
/// than it saves.
inline constexpr std::size_t parallel_min_elements = std::size_t(1) << 16;
/// A pass is cut into at most this many chunks, each with its own partial reductions.
inline constexpr std::size_t max_chunks = 32;
/// A chunk holds at least this many elements (a quarter of parallel_min_elements), so a chunk's
/// partial results are few next to the work that produced them.
inline constexpr std::size_t min_chunk_elements = parallel_min_elements / 4;

/// Threads for a loop over `elements` elements: all of solder's threads, or 1 when it is small.
inline int threads_for(std::size_t elements) { return elements >= parallel_min_elements ? num_threads() : 1; }

/// `items` consecutive items of `item_elements` elements each, cut into `count` chunks of
/// `per_chunk` items (the last one shorter): at most max_chunks chunks of at least
/// min_chunk_elements elements, fixed by the sizes alone.
struct chunking {
  std::size_t items = 0, per_chunk = 1, count = 0;

  chunking(std::size_t n_items, std::size_t item_elements) : items(n_items) {
    const std::size_t len = std::max<std::size_t>(item_elements, 1);
    per_chunk = std::max({(items + max_chunks - 1) / max_chunks, (min_chunk_elements + len - 1) / len, std::size_t(1)});
    count = (items + per_chunk - 1) / per_chunk;
  }
  std::size_t begin(std::size_t c) const { return c * per_chunk; }
  std::size_t end(std::size_t c) const { return std::min(items, (c + 1) * per_chunk); }
};

/// f(c) for every chunk c of `parts`, on up to threads_for(total elements) threads.
template <class F>
void for_chunks(const chunking& parts, std::size_t item_elements, const F& f) {
  parallel_for(parts.count, threads_for(parts.items * item_elements), f);
}

/// f(r) for every row r of [0, rows), rows of `row_elements` elements. Rows are independent,
/// so how they are split among threads cannot change a result.
template <class F>
void for_rows(std::size_t rows, std::size_t row_elements, const F& f) {
  const chunking parts(rows, row_elements);
  for_chunks(parts, row_elements, [&](std::size_t c) {
    for (std::size_t r = parts.begin(c); r < parts.end(c); ++r) f(r);
  });
}

/// The sum over rows of f(r) (a double): each chunk sums its rows in order, then the chunks
/// are added in order. The same bits for any thread count.
template <class F>
double sum_rows(std::size_t rows, std::size_t row_elements, const F& f) {
  const chunking parts(rows, row_elements);
  double partial[max_chunks] = {};
  for_chunks(parts, row_elements, [&](std::size_t c) {
    const F body = f;  // a local copy: the row's stores cannot alias its captured state
    double acc = 0;
    for (std::size_t r = parts.begin(c); r < parts.end(c); ++r) acc += body(r);
    partial[c] = acc;
  });
  double total = 0;
  for (std::size_t c = 0; c < parts.count; ++c) total += partial[c];
  return total;
}

/// f.template operator()<V>(i) for every element index i of [0, n): V = vec<float> over whole
/// vectors, V = float over the tail, in blocks of min_chunk_elements (a multiple of every vector
/// width). Elementwise, so the thread count never changes a result.
template <class F>
void for_each_element(std::size_t n, const F& f) {
  using V = vec<float>;
  const std::size_t blocks = (n + min_chunk_elements - 1) / min_chunk_elements;
  parallel_for(blocks, threads_for(n), [&](std::size_t b) {
    const F body = f;  // a local copy: the stores cannot alias its captured pointers and scalars
    const std::size_t end = std::min(n, (b + 1) * min_chunk_elements);
    std::size_t i = b * min_chunk_elements;
    for (; i + V::size <= end; i += V::size) body.template operator()<V>(i);
    for (; i < end; ++i) body.template operator()<float>(i);
  });
}

}  // namespace solder::eval::cpu
