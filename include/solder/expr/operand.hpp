// expr/operand.hpp: what a matrix product may multiply. An operand is anything a backend can
// pack a panel [k0, k1) x [n0, n1) of: a stored matrix, a block of its columns, either read
// transposed, a pre-packed weight (the backend's), a generated matrix of random signs (a
// sketch: regenerated from Philox while packing, never stored), an image's columns or a batch's
// patches (a convolution's operand, read from the images), a batch's images read as pixel rows
// (the convolution's output gradient), and two operands side by side or one above the other.
// Transposing any of them is a view: transposes move to the leaves. The images under a batch's
// patches are also the output of the patch matrix's gradient (image_patches_grad: col2im).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "solder/backend.hpp"
#include "solder/expr/expression.hpp"
#include "solder/random/philox.hpp"
#include "solder/shape.hpp"
#include "solder/tensor.hpp"

namespace solder {

/// B' [K, N] packed once into the GEMM's layout (a weight reused by every call); defined by
/// the backend that packs it.
template <std::size_t N, std::size_t K, bool TransB>
class packed_matrix;

/// A stored [R, C] matrix read as its transpose [C, R] (a view; nothing is copied), in host or
/// device memory. Only a product's operand may be transposed: the product reads it transposed
/// while packing or staging. R may be the dynamic batch, which then becomes the product's inner
/// extent.
template <class S, class Space = host>
struct transposed {
  static_assert(S::rank == 2, "solder::transpose: only a [rows, cols] matrix can be transposed (a product's operand)");
  using stored_shape = S;
  using space_type = Space;
  tensor_ref<const float, S, Space> ref;
  std::size_t batch() const { return ref.batch(); }
};

/// Columns [C0, C1) of a stored [R, C] matrix (R may be the batch) in memory of Space, read as
/// they are or (Trans) transposed: a view with the matrix's row stride.
template <class S, std::size_t C0, std::size_t C1, bool Trans = false, class Space = host>
struct column_block {
  static_assert(S::rank == 2, "solder::columns: only a [rows, cols] matrix has column blocks");
  static_assert(C0 < C1 && C1 <= S::last, "solder::columns: the block [C0, C1) must be a non-empty range of the columns");
  using stored_shape = S;
  using space_type = Space;
  static constexpr std::size_t first = C0, count = C1 - C0;
  tensor_ref<const float, S, Space> ref;
  std::size_t batch() const { return ref.batch(); }
};

/// A pre-packed matrix as a product's right operand.
template <std::size_t N, std::size_t K, bool TransB>
struct prepacked {
  using space_type = host;
  const packed_matrix<N, K, TransB>* packed;
};

/// How the terms of a sketch stack: side by side ([TR, Terms * TC]) or one above the other
/// ([Terms * TR, TC]).
enum class sketch_stack { columns, rows };

/// Terms sketches of [TR, TC], stacked, each entry +scale or -scale: element e = r * TC + c of
/// term t has the sign random::sketch_sign(seed, t, e, rounds). Read transposed when Trans.
/// Generated while a product packs it; nothing is stored but the seed, the scale and the
/// stream's Philox rounds (random::philox_default_rounds, or 10).
template <std::size_t TR, std::size_t TC, std::size_t Terms, sketch_stack Stack, bool Trans = false>
struct sign_sketch {
  static_assert(TR >= 1 && TC >= 1 && Terms >= 1, "solder::sign_sketch: extents and terms must be at least 1");
  using space_type = any_space;  // regenerated wherever it is read
  static constexpr std::size_t term_rows = TR, term_cols = TC, terms = Terms;
  static constexpr sketch_stack stack = Stack;
  static constexpr std::size_t stored_rows = Stack == sketch_stack::rows ? Terms * TR : TR;
  static constexpr std::size_t stored_cols = Stack == sketch_stack::columns ? Terms * TC : TC;
  std::uint64_t seed = 0;
  float scale = 1.0f;
  std::uint32_t rounds = random::philox_default_rounds;
};

/// One sample's image, C planes [H, W] from `image` (a sample of a batch [N, C, H, W], or one
/// group's channels of it), read as the column matrix [C Kh Kw, Ho Wo] of a convolution of
/// geometry G (ops::conv2d_geometry): entry ((c Kh + kh) Kw + kw, ho Wo + wo) =
/// x[c][ho S + kh D - P][wo S + kw D - P], 0 in the padding (G::im2col_at). Packed from the
/// image while a product reads it; no column matrix is stored.
template <class G, std::size_t C, class Space = host>
struct im2col {
  static_assert(C >= 1, "solder::im2col: an image has at least one channel");
  using geometry = G;
  using space_type = Space;
  static constexpr std::size_t channels = C;
  static constexpr std::size_t rows = C * G::taps, cols = G::out_plane;
  const float* image;
};

/// im2col<G, C>(x, n, c0): sample n of x [N, C', H, W], channels [c0, c0 + C), as G's columns.
template <class G, std::size_t C, class T, class S, class Space>
im2col<G, C, Space> image_columns(tensor_ref<T, S, Space> x, std::size_t n, std::size_t c0 = 0) {
  static_assert(S::rank == 4 && S::extents[2] == G::height && S::extents[3] == G::width,
                "solder::image_columns: x must be [batch, C, H, W] with the geometry's H and W");
  static_assert(C <= S::extents[1], "solder::image_columns: more channels than the image has");
  return {x.data() + (n * S::extents[1] + c0) * G::in_plane};
}

/// A batch of images x [batch, C, H, W] in memory of Space, read as the patch matrix [batch Ho
/// Wo, C Kh Kw] of a convolution of geometry G with one group: row n Ho Wo + ho Wo + wo is
/// output pixel (ho, wo) of sample n, column (c Kh + kh) Kw + kw its tap (kh, kw) of channel c
/// (G::patch_at, 0 in the padding), torch's order of a weight [Cout, C, Kh, Kw], so
/// matmul(patches, transpose(w)) is the convolution's output channels-last [batch Ho Wo, Cout].
/// Its rows are the run-time batch Ho Wo. Staged from the images while a product reads it; no
/// patch matrix is stored. A backend that stages it maps it in its product; one that runs
/// convolutions by kernels of its own may refuse it. Stored: the channels of a stored sample,
/// when the C read are one group's (`images` points at the group's first channel).
template <class G, std::size_t C, class Space, std::size_t Stored = C>
struct image_patches {
  static_assert(C >= 1 && C <= Stored, "solder::image_patches: an image has at least one channel, and a group no more than the image");
  using geometry = G;
  using space_type = Space;
  static constexpr std::size_t channels = C, stored_channels = Stored;
  static constexpr std::size_t cols = C * G::taps;
  const float* images;
  std::size_t samples;  // images in the batch
  /// The patch matrix's rows: batch Ho Wo.
  std::size_t batch() const { return samples * G::out_plane; }
};

/// A batch of images [batch, C, Ho, Wo] (NCHW) in memory of Space, read as the pixel matrix
/// [batch Ho Wo, C] (Trans: its transpose [C, batch Ho Wo]): row n Ho Wo + p is pixel p of
/// sample n, column c its channel c. A convolution's output gradient dy as the gradient of its
/// product patches(x) W^T, which is channels-last: the product rules read dy where it lies.
/// Plane: Ho Wo. Its rows are the run-time batch Ho Wo. Stored: the channels of a stored
/// sample, when the C read are one group's (`images` points at the group's first channel).
template <std::size_t C, std::size_t Plane, class Space = host, bool Trans = false, std::size_t Stored = C>
struct image_pixels {
  static_assert(C >= 1 && Plane >= 1 && C <= Stored,
                "solder::image_pixels: an image has at least one channel and one pixel, and a group no more than the image");
  using space_type = Space;
  static constexpr std::size_t stored_channels = Stored;
  const float* images;
  std::size_t samples;  // images in the batch
  /// The pixel matrix's rows: batch Ho Wo.
  std::size_t batch() const { return samples * Plane; }
};

/// The images [batch, C, H, W] in memory of Space that image_patches<G, C, Space, Stored>
/// reads, as a write's output for the gradient of that patch matrix: a [batch Ho Wo, C Kh Kw]
/// expression written to it is summed onto the pixels each of its entries was read from
/// (col2im, the adjoint of image_patches): dx = col2im(g W) is write(image_patches_grad{dx,
/// batch}, g W). Every element of the C channels is written, 0 where no window reads it.
template <class G, std::size_t C, class Space = host, std::size_t Stored = C>
struct image_patches_grad {
  static_assert(C >= 1 && C <= Stored, "solder::image_patches_grad: an image has at least one channel, and a group no more than the image");
  float* images;
  std::size_t samples;
  /// The patch matrix's rows: batch Ho Wo.
  std::size_t batch() const { return samples * G::out_plane; }
};

/// Two operands side by side (Axis columns: [R, CA + CB]) or one above the other (rows:
/// [RA + RB, C]).
template <class A, class B, sketch_stack Axis>
struct operand_concat;

namespace detail {

/// What a product operand is: its extents as the product reads it (`rows` x `cols`, either
/// may be dyn: the run-time batch), how it is read (form), whether a stored one is transposed,
/// and its run-time batch.
enum class operand_form {
  stored,     // a pointer and a row stride: a tensor, its transpose, a block of columns
  prepacked,  // the backend's packed panels
  generated,  // packed from a rule: signs, an image's columns, concatenations
};

template <class X>
struct operand_traits;
template <class S, class Space>
struct operand_traits<tensor_ref<const float, S, Space>> {
  static constexpr std::size_t rank = S::rank;
  static constexpr std::size_t rows = S::extents[0], cols = S::last;
  static constexpr bool trans = false;
  static constexpr operand_form form = operand_form::stored;
  static std::size_t batch(const tensor_ref<const float, S, Space>& t) { return t.batch(); }
};
template <class S, class Space>
struct operand_traits<transposed<S, Space>> {
  static constexpr std::size_t rank = 2;
  static constexpr std::size_t rows = S::extents[1], cols = S::extents[0];
  static constexpr bool trans = true;
  static constexpr operand_form form = operand_form::stored;
  static std::size_t batch(const transposed<S, Space>& t) { return t.batch(); }
};
template <class S, std::size_t C0, std::size_t C1, bool Trans, class Space>
struct operand_traits<column_block<S, C0, C1, Trans, Space>> {
  static constexpr std::size_t rank = 2;
  static constexpr std::size_t rows = Trans ? C1 - C0 : S::extents[0];
  static constexpr std::size_t cols = Trans ? S::extents[0] : C1 - C0;
  static constexpr bool trans = Trans;
  static constexpr operand_form form = operand_form::stored;
  static std::size_t batch(const column_block<S, C0, C1, Trans, Space>& t) { return t.batch(); }
};
template <std::size_t N, std::size_t K, bool TransB>
struct operand_traits<prepacked<N, K, TransB>> {
  static constexpr std::size_t rank = 2;
  static constexpr std::size_t rows = K, cols = N;
  static constexpr bool trans = TransB;
  static constexpr operand_form form = operand_form::prepacked;
  static std::size_t batch(const prepacked<N, K, TransB>&) { return 1; }
};
template <std::size_t TR, std::size_t TC, std::size_t Terms, sketch_stack Stack, bool Trans>
struct operand_traits<sign_sketch<TR, TC, Terms, Stack, Trans>> {
  using U = sign_sketch<TR, TC, Terms, Stack, Trans>;
  static constexpr std::size_t rank = 2;
  static constexpr std::size_t rows = Trans ? U::stored_cols : U::stored_rows;
  static constexpr std::size_t cols = Trans ? U::stored_rows : U::stored_cols;
  static constexpr bool trans = Trans;
  static constexpr operand_form form = operand_form::generated;
  static std::size_t batch(const U&) { return 1; }
};
template <class G, std::size_t C, class Space>
struct operand_traits<im2col<G, C, Space>> {
  static constexpr std::size_t rank = 2;
  static constexpr std::size_t rows = im2col<G, C, Space>::rows, cols = im2col<G, C, Space>::cols;
  static constexpr bool trans = false;
  static constexpr operand_form form = operand_form::generated;
  static std::size_t batch(const im2col<G, C, Space>&) { return 1; }
};
template <class G, std::size_t C, class Space, std::size_t Stored>
struct operand_traits<image_patches<G, C, Space, Stored>> {
  static constexpr std::size_t rank = 2;
  static constexpr std::size_t rows = dyn, cols = C * G::taps;
  static constexpr bool trans = false;
  static constexpr operand_form form = operand_form::generated;
  static std::size_t batch(const image_patches<G, C, Space, Stored>& p) { return p.batch(); }
};
template <std::size_t C, std::size_t Plane, class Space, bool Trans, std::size_t Stored>
struct operand_traits<image_pixels<C, Plane, Space, Trans, Stored>> {
  static constexpr std::size_t rank = 2;
  static constexpr std::size_t rows = Trans ? C : dyn, cols = Trans ? dyn : C;
  static constexpr bool trans = Trans;
  static constexpr operand_form form = operand_form::generated;
  static std::size_t batch(const image_pixels<C, Plane, Space, Trans, Stored>& p) { return p.batch(); }
};
template <class A, class B, sketch_stack Axis>
struct operand_traits<operand_concat<A, B, Axis>> {
  static constexpr std::size_t rank = 2;
  static constexpr std::size_t rows = Axis == sketch_stack::rows ? operand_traits<A>::rows + operand_traits<B>::rows
                                                                 : operand_traits<A>::rows;
  static constexpr std::size_t cols = Axis == sketch_stack::columns ? operand_traits<A>::cols + operand_traits<B>::cols
                                                                    : operand_traits<A>::cols;
  static constexpr bool trans = false;
  static constexpr operand_form form = operand_form::generated;
  static std::size_t batch(const operand_concat<A, B, Axis>&) { return 1; }
};

template <class T, class S, class Space>
tensor_ref<const float, S, Space> as_operand(tensor_ref<T, S, Space> t) {
  static_assert(std::is_same_v<std::remove_const_t<T>, float>, "solder::matmul: products are implemented for float");
  return tensor_ref<const float, S, Space>(t);
}
template <class T, class S, class Space>
tensor_ref<const float, S, Space> as_operand(const tensor<T, S, Space>& t) {
  return as_operand(t.ref());
}
template <std::size_t N, std::size_t K, bool TransB>
prepacked<N, K, TransB> as_operand(const packed_matrix<N, K, TransB>& p) {
  return {&p};
}
template <class X>
  requires requires { operand_traits<X>::rank; }
X as_operand(const X& x) {
  return x;
}

}  // namespace detail

template <class A, class B, sketch_stack Axis>
struct operand_concat {
  using a_traits = detail::operand_traits<A>;
  using b_traits = detail::operand_traits<B>;
  static_assert(a_traits::form != detail::operand_form::prepacked && b_traits::form != detail::operand_form::prepacked,
                "solder::concat: a pre-packed matrix cannot be part of a concatenation");
  static_assert(a_traits::rows != dyn && a_traits::cols != dyn && b_traits::rows != dyn && b_traits::cols != dyn,
                "solder::concat: concatenated operands need static extents");
  static_assert(Axis != sketch_stack::columns || a_traits::rows == b_traits::rows,
                "solder::hcat: operands side by side must have the same number of rows");
  static_assert(Axis != sketch_stack::rows || a_traits::cols == b_traits::cols,
                "solder::vcat: operands one above the other must have the same number of columns");
  using space_type = common_space_t<space_of<A>, space_of<B>>;
  static constexpr sketch_stack axis = Axis;
  A a;
  B b;
};

/// [a | b]: a and b side by side, as one product operand.
template <class A, class B>
auto hcat(const A& a, const B& b) {
  using OA = decltype(detail::as_operand(a));
  using OB = decltype(detail::as_operand(b));
  return operand_concat<OA, OB, sketch_stack::columns>{detail::as_operand(a), detail::as_operand(b)};
}
/// [a; b]: a above b, as one product operand.
template <class A, class B>
auto vcat(const A& a, const B& b) {
  using OA = decltype(detail::as_operand(a));
  using OB = decltype(detail::as_operand(b));
  return operand_concat<OA, OB, sketch_stack::rows>{detail::as_operand(a), detail::as_operand(b)};
}

/// columns<C0, C1>(x): columns [C0, C1) of a stored matrix x [R, C] as a product operand.
template <std::size_t C0, std::size_t C1, class T, class S, class Space>
column_block<S, C0, C1, false, Space> columns(tensor_ref<T, S, Space> t) {
  return {detail::as_operand(t)};
}
template <std::size_t C0, std::size_t C1, class T, class S, class Space>
column_block<S, C0, C1, false, Space> columns(const tensor<T, S, Space>& t) {
  return {detail::as_operand(t)};
}

/// transpose(w) for a matrix operand of matmul: w [N, K] (PyTorch's linear weight) read as [K, N].
template <class S, class Space>
transposed<S, Space> transpose(const tensor<float, S, Space>& t) {
  return {t.ref()};
}
template <class T, class S, class Space>
transposed<S, Space> transpose(tensor_ref<T, S, Space> t) {
  static_assert(std::is_same_v<std::remove_const_t<T>, float>, "solder::transpose: products are implemented for float");
  return {tensor_ref<const float, S, Space>(t)};
}
template <class S, class Space>
tensor_ref<const float, S, Space> transpose(const transposed<S, Space>& t) {
  return t.ref;
}
template <class S, std::size_t C0, std::size_t C1, bool Trans, class Space>
column_block<S, C0, C1, !Trans, Space> transpose(const column_block<S, C0, C1, Trans, Space>& t) {
  return {t.ref};
}
template <std::size_t TR, std::size_t TC, std::size_t Terms, sketch_stack Stack, bool Trans>
sign_sketch<TR, TC, Terms, Stack, !Trans> transpose(const sign_sketch<TR, TC, Terms, Stack, Trans>& u) {
  return {u.seed, u.scale, u.rounds};
}
template <std::size_t C, std::size_t Plane, class Space, bool Trans, std::size_t Stored>
image_pixels<C, Plane, Space, !Trans, Stored> transpose(const image_pixels<C, Plane, Space, Trans, Stored>& p) {
  return {p.images, p.samples};
}
/// [a | b]^T = [a^T; b^T], [a; b]^T = [a^T | b^T].
template <class A, class B, sketch_stack Axis>
auto transpose(const operand_concat<A, B, Axis>& c) {
  if constexpr (Axis == sketch_stack::columns)
    return vcat(transpose(c.a), transpose(c.b));
  else
    return hcat(transpose(c.a), transpose(c.b));
}

}  // namespace solder
