// nn/sample_shape.hpp: the shape of one sample as a chain sees it ([features] or [C, H, W]),
// a constexpr value the planner computes layer by layer (never a template argument: nvcc's
// front end cannot pass a class with constructors as one), and the tensor shape it stands for.
#pragma once

#include <array>
#include <cstddef>

#include "solder/diagnostic.hpp"
#include "solder/shape.hpp"

namespace solder::nn {

/// The extents of one sample, rank 1 to 4: [features] for a linear layer's activations,
/// [C, H, W] for an image. Rank 0 means "not fixed" (a layer that takes any shape).
struct sample_shape {
  static constexpr std::size_t max_rank = 4;
  std::size_t rank = 0;
  std::array<std::size_t, max_rank> dims{};

  constexpr sample_shape() = default;
  template <class... N>
  constexpr explicit sample_shape(N... n) : rank(sizeof...(N)), dims{std::size_t(n)...} {
    static_assert(sizeof...(N) <= max_rank, "solder::nn::sample_shape: at most 4 extents");
  }

  /// Elements of one sample (0 when the shape is not fixed).
  constexpr std::size_t size() const {
    if (rank == 0) return 0;
    std::size_t n = 1;
    for (std::size_t d = 0; d < rank; ++d) n *= dims[d];
    return n;
  }
  constexpr std::size_t operator[](std::size_t d) const { return dims[d]; }
  constexpr bool fixed() const { return rank != 0; }
  friend constexpr bool operator==(const sample_shape& a, const sample_shape& b) {
    if (a.rank != b.rank) return false;
    for (std::size_t d = 0; d < a.rank; ++d)
      if (a.dims[d] != b.dims[d]) return false;
    return true;
  }
};

/// "[16, 6, 6]" at compile time.
constexpr void append_sample_shape(fixed_string& s, const sample_shape& shape) {
  s.append("[");
  for (std::size_t d = 0; d < shape.rank; ++d) {
    if (d) s.append(", ");
    s.append(shape.dims[d]);
  }
  s.append("]");
}

namespace detail {
/// shape<dyn, D0, ..., D(Rank - 1)>: a batch of samples of shape [D0, ...].
template <std::size_t Rank, std::size_t D0, std::size_t D1, std::size_t D2, std::size_t D3>
struct batched;
template <std::size_t D0, std::size_t D1, std::size_t D2, std::size_t D3>
struct batched<1, D0, D1, D2, D3> {
  using type = shape<dyn, D0>;
};
template <std::size_t D0, std::size_t D1, std::size_t D2, std::size_t D3>
struct batched<2, D0, D1, D2, D3> {
  using type = shape<dyn, D0, D1>;
};
template <std::size_t D0, std::size_t D1, std::size_t D2, std::size_t D3>
struct batched<3, D0, D1, D2, D3> {
  using type = shape<dyn, D0, D1, D2>;
};
template <std::size_t D0, std::size_t D1, std::size_t D2, std::size_t D3>
struct batched<4, D0, D1, D2, D3> {
  using type = shape<dyn, D0, D1, D2, D3>;
};
}  // namespace detail

/// The sample shape of a batched tensor shape shape<dyn or B, E...>: [E...].
template <class S>
constexpr sample_shape sample_of() {
  sample_shape s;
  s.rank = S::rank - 1;
  for (std::size_t d = 1; d < S::rank; ++d) s.dims[d - 1] = S::extents[d];
  return s;
}

}  // namespace solder::nn
