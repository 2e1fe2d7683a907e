// tensor.hpp: the owning tensor<T, Shape, Space> (64-byte aligned, on the heap when large) and
// the non-owning tensor_ref<T, Shape, Space>; both are expression leaves. Space says where the
// elements live (host by default, device for CUDA memory), and so which backend evaluates an
// assignment to them (backend.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iosfwd>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

#include "solder/backend.hpp"
#include "solder/config.hpp"
#include "solder/memory.hpp"
#include "solder/shape.hpp"

namespace solder {

/// Tag: construct a tensor without zero-filling it (the caller writes every element).
struct uninitialized_t {
  explicit uninitialized_t() = default;
};
inline constexpr uninitialized_t uninitialized{};

/// Tag type every expression node and leaf carries (`using expression_tag = expression_tag;`).
struct expression_tag {};

/// True for expression nodes and tensor leaves (see expr/expression.hpp for the concept).
template <class E>
concept ExpressionType = requires { typename std::remove_cvref_t<E>::expression_tag; };

namespace detail {

/// Batch check shared by tensor and tensor_ref: a dynamic shape needs a batch of at least 1.
template <class S>
void check_batch(std::size_t batch) {
  if constexpr (S::dynamic)
    SOLDER_ASSERT(batch >= 1, "solder::tensor: a dynamic batch size must be at least 1");
}

/// One element as a std::ostream writes it by default (six significant digits), right-aligned
/// in ten characters. (Formatted here so that printing needs only <iosfwd> of the stream.)
template <class T>
void format_element(char (&text)[32], T v) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T>)
    std::snprintf(text, sizeof text, "%10lld", static_cast<long long>(v));
  else if constexpr (std::is_integral_v<T>)
    std::snprintf(text, sizeof text, "%10llu", static_cast<unsigned long long>(v));
  else  // floating point, or a number type that converts to double
    std::snprintf(text, sizeof text, "%10g", double(v));
}

template <class T, class S, class Stream>
void print(Stream& os, const T* data, std::size_t batch) {
  constexpr std::size_t last = S::last;
  const std::size_t n = S::elements(batch);
  const std::size_t rows = n / last;
  constexpr std::size_t show = 6;  // rows and columns shown at each end, as NumPy abbreviates
  os << "tensor" << to_string<S>(batch).c_str() << "\n";
  char text[32];
  auto row = [&](std::size_t r) {
    os << "  [";
    for (std::size_t j = 0; j < last; ++j) {
      if (last > 2 * show && j == show) {
        os << ", ...";
        j = last - show;
      }
      format_element(text, data[r * last + j]);
      os << (j ? ", " : "") << text;
    }
    os << "]\n";
  };
  for (std::size_t r = 0; r < rows; ++r) {
    if (rows > 2 * show && r == show) {
      os << "  ...\n";
      r = rows - show;
    }
    row(r);
  }
}

}  // namespace detail

template <class T, class S, class Space = host>
class tensor;

/// A view of contiguous row-major memory with shape S in memory space Space; T may be const.
/// Does not own the data.
template <class T, class S, class Space = host>
class tensor_ref {
  static_assert(Shape<S>, "solder::tensor_ref: extents must be >= 1, and `dyn` may only be the leading extent");
  static_assert(MemorySpace<Space>, "solder::tensor_ref: the space must be solder::host or solder::device");

 public:
  using expression_tag = solder::expression_tag;
  using value_type = std::remove_const_t<T>;
  using shape_type = S;
  using space_type = Space;
  using element_type = T;

  tensor_ref() = default;
  tensor_ref(const tensor_ref&) = default;  // copies the view; assignment copies the elements
  /// A view of `data`; for a dynamic shape, `batch` is the leading extent.
  explicit tensor_ref(T* data, std::size_t batch = S::dynamic ? 0 : 1) : data_(data), batch_(S::dynamic ? batch : 1) {
    detail::check_batch<S>(batch_);
  }
  /// A const view of a mutable view.
  template <class U>
    requires(std::is_const_v<T> && std::is_same_v<const U, T>)
  tensor_ref(const tensor_ref<U, S, Space>& other) : data_(other.data()), batch_(other.batch()) {}

  T* data() const { return data_; }
  std::size_t batch() const { return batch_; }
  std::size_t size() const { return S::elements(batch_); }
  static constexpr std::size_t rank() { return S::rank; }

  T& operator[](std::size_t i) const { return data_[i]; }
  /// Element at (i0, i1, ...): one index per dimension.
  template <class... I>
    requires(sizeof...(I) == S::rank && (std::is_integral_v<I> && ...))
  T& operator()(I... idx) const {
    std::size_t i = 0, d = 0;
    ((i += std::size_t(idx) * S::strides[d++]), ...);
    return data_[i];
  }

  T* begin() const { return data_; }
  T* end() const { return data_ + size(); }

  void fill(value_type v) const
    requires(!std::is_const_v<T> && std::is_same_v<Space, host>)
  {
    std::fill(begin(), end(), v);
  }

  /// Evaluates an expression into this view (one fused pass), by the backend of Space.
  template <ExpressionType E>
  const tensor_ref& operator=(const E& e) const
    requires(!std::is_const_v<T>)
  {
    executor<backend_of_t<Space>>::assign(*this, e);
    return *this;
  }
  const tensor_ref& operator=(const tensor_ref& other) const
    requires(!std::is_const_v<T>)
  {
    executor<backend_of_t<Space>>::assign(*this, other);
    return *this;
  }

  template <class Char, class Traits>
  friend std::basic_ostream<Char, Traits>& operator<<(std::basic_ostream<Char, Traits>& os, const tensor_ref& t)
    requires std::is_same_v<Space, host>
  {
    detail::print<value_type, S>(os, t.data_, t.batch_);
    return os;
  }

 private:
  T* data_ = nullptr;
  std::size_t batch_ = 1;
};

/// An owning tensor of T with shape S: 64-byte aligned, zero-filled unless constructed with
/// `solder::uninitialized`. Small static tensors live inline; anything over 1 KiB, and every
/// dynamic tensor, lives on the heap (a 4096x4096 tensor never touches the stack).
template <class T, class S, class Space>
class tensor {
  static_assert(Shape<S>, "solder::tensor: extents must be >= 1, and `dyn` may only be the leading extent");
  static_assert(std::is_arithmetic_v<T>, "solder::tensor: the element type must be arithmetic (float, double, int...)");
  static_assert(std::is_same_v<Space, host>,
                "solder::tensor: this header defines owning tensors of host memory only; include solder/device.hpp "
                "(or solder/cuda.hpp) for tensor<T, S, solder::device>");

  static constexpr std::size_t inline_limit_bytes = 1024;
  static constexpr bool on_heap = S::dynamic || S::size * sizeof(T) > inline_limit_bytes;

 public:
  using expression_tag = solder::expression_tag;
  using value_type = T;
  using shape_type = S;
  using space_type = Space;
  using element_type = T;

  /// Zero-filled tensor (static shape).
  tensor()
    requires(!S::dynamic)
  : tensor(uninitialized) {
    fill(T(0));
  }
  tensor(uninitialized_t)
    requires(!S::dynamic)
  {
    if constexpr (on_heap) heap_ = allocate_aligned<T>(S::size);
  }
  /// Zero-filled tensor with a runtime batch size (dynamic shape).
  explicit tensor(std::size_t batch)
    requires(S::dynamic)
  : tensor(batch, uninitialized) {
    fill(T(0));
  }
  tensor(std::size_t batch, uninitialized_t)
    requires(S::dynamic)
  : batch_(batch) {
    detail::check_batch<S>(batch);
    heap_ = allocate_aligned<T>(S::elements(batch));
  }
  /// Evaluates an expression into a new tensor.
  template <ExpressionType E>
    requires(!std::is_same_v<std::remove_cvref_t<E>, tensor>)
  tensor(const E& e) : tensor(make_for(e)) {  // NOLINT: implicit, as Eigen's Matrix m = expr
    executor<backend_of_t<Space>>::assign(ref(), e);
  }

  tensor(const tensor& other) : tensor(make_like(other)) { std::memcpy(data(), other.data(), size() * sizeof(T)); }
  tensor(tensor&& other) noexcept = default;
  tensor& operator=(const tensor& other) {
    if (this != &other) {
      if (size() != other.size()) *this = make_like(other);
      batch_ = other.batch_;
      std::memcpy(data(), other.data(), size() * sizeof(T));
    }
    return *this;
  }
  tensor& operator=(tensor&& other) noexcept = default;
  /// Evaluates an expression into this tensor (one fused pass).
  template <ExpressionType E>
    requires(!std::is_same_v<std::remove_cvref_t<E>, tensor>)
  tensor& operator=(const E& e) {
    executor<backend_of_t<Space>>::assign(ref(), e);
    return *this;
  }

  T* data() { return on_heap ? heap_.get() : inline_; }
  const T* data() const { return on_heap ? heap_.get() : inline_; }
  std::size_t batch() const { return batch_; }
  /// Elements held: 0 for a moved-from tensor whose heap storage went with the move.
  std::size_t size() const { return on_heap && !heap_ ? 0 : S::elements(batch_); }
  static constexpr std::size_t rank() { return S::rank; }

  tensor_ref<T, S> ref() { return tensor_ref<T, S>(data(), batch_); }
  tensor_ref<const T, S> ref() const { return tensor_ref<const T, S>(data(), batch_); }
  operator tensor_ref<T, S>() { return ref(); }
  operator tensor_ref<const T, S>() const { return ref(); }

  T& operator[](std::size_t i) { return data()[i]; }
  const T& operator[](std::size_t i) const { return data()[i]; }
  template <class... I>
    requires(sizeof...(I) == S::rank && (std::is_integral_v<I> && ...))
  T& operator()(I... idx) {
    return ref()(idx...);
  }
  template <class... I>
    requires(sizeof...(I) == S::rank && (std::is_integral_v<I> && ...))
  const T& operator()(I... idx) const {
    return ref()(idx...);
  }

  T* begin() { return data(); }
  T* end() { return data() + size(); }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size(); }

  void fill(T v) { std::fill(begin(), end(), v); }

  template <class Char, class Traits>
  friend std::basic_ostream<Char, Traits>& operator<<(std::basic_ostream<Char, Traits>& os, const tensor& t) {
    return os << t.ref();
  }

 private:
  static tensor make_like(const tensor& other) {
    if constexpr (S::dynamic)
      return tensor(other.batch_, uninitialized);
    else
      return tensor(uninitialized);
  }
  template <class E>
  static tensor make_for(const E& e) {
    if constexpr (S::dynamic)
      return tensor(e.batch(), uninitialized);
    else
      return tensor(uninitialized);
  }

  aligned_array<T> heap_;
  alignas(alignment) T inline_[on_heap ? 1 : S::size]{};
  std::size_t batch_ = 1;
};

}  // namespace solder
