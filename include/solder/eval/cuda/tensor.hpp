// eval/cuda/tensor.hpp: tensor<T, Shape, device>, the owning tensor of device memory; host code,
// allocating, filling and copying on the current stream (stream.hpp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <type_traits>

#include "solder/backend.hpp"
#include "solder/diagnostic.hpp"
#include "solder/eval/cuda/error.hpp"
#include "solder/eval/cuda/memory.hpp"
#include "solder/eval/cuda/stream.hpp"
#include "solder/shape.hpp"
#include "solder/tensor.hpp"

namespace solder {

namespace detail {

/// executor<backend_of_t<Space>>, named through E so that it is looked up where an assignment
/// is instantiated, not where tensor<T, S, device> is defined: executor<cuda> comes later.
template <class Space, class E>
struct executor_for {
  using type = executor<backend_of_t<Space>>;
};

/// True unless E reads host memory, which a device tensor takes by copy, not by evaluation;
/// otherwise one compile error that says so.
template <class E>
constexpr bool check_device_source() {
  if constexpr (requires { requires std::is_same_v<typename E::space_type, host>; })
    return diagnostic<"solder::tensor: an expression over host memory cannot be evaluated into device memory; "
                      "copy it with solder::to_device or solder::copy",
                      E>::reported;
  else
    return true;
}

}  // namespace detail

/// An owning tensor of T with shape S in device memory, allocated on the current stream and
/// zero-filled unless constructed with `solder::uninitialized`. Its elements are read on the
/// host through solder::to_host or solder::copy (copy.hpp).
///
/// Streams: taking its memory (data(), ref(), the conversions to tensor_ref) notes a use on the
/// calling thread's current stream, where solder queues the work that follows. The tensor is
/// freed on the stream of its last noted use, after waiting for events that capture its uses
/// on every other stream (eval::cuda::stream_ledger), so a tensor made on one stream and last
/// used on another is never freed while the other may still read it. That stream must outlive
/// the tensor. A tensor_ref kept and used later on another stream is not noted: take the
/// memory again there. Using the tensor on a stream other than the one that wrote it still
/// needs the usual ordering (an event or a synchronization) between the two. Noting a use
/// updates the tensor's record, so two host threads may not take one tensor's memory at once.
template <class T, class S>
class tensor<T, S, device> {
  static_assert(Shape<S>, "solder::tensor: extents must be >= 1, and `dyn` may only be the leading extent");
  static_assert(std::is_arithmetic_v<T>, "solder::tensor: the element type must be arithmetic (float, double, int...)");

 public:
  using expression_tag = solder::expression_tag;
  using value_type = T;
  using shape_type = S;
  using space_type = device;
  using element_type = T;

  /// Zero-filled tensor (static shape).
  tensor()
    requires(!S::dynamic)
  : tensor(uninitialized) {
    zero();
  }
  tensor(uninitialized_t)
    requires(!S::dynamic)
  : data_(allocate(S::size)) {}
  /// Zero-filled tensor with a runtime batch size (dynamic shape).
  explicit tensor(std::size_t batch)
    requires(S::dynamic)
  : tensor(batch, uninitialized) {
    zero();
  }
  tensor(std::size_t batch, uninitialized_t)
    requires(S::dynamic)
  : batch_(checked(batch)), data_(allocate(S::elements(batch))) {}
  /// Evaluates an expression into a new tensor (by executor<cuda>, solder/cuda.hpp).
  template <ExpressionType E>
    requires(!std::is_same_v<std::remove_cvref_t<E>, tensor>)
  tensor(const E& e) : tensor(make_for(e)) {  // NOLINT: implicit, as the host tensor
    if constexpr (detail::check_device_source<E>()) detail::executor_for<device, E>::type::assign(ref(), e);
  }

  /// A device-to-device copy, queued on the current stream.
  tensor(const tensor& other) : batch_(other.batch_), data_(allocate(other.size())) { copy_elements(other); }
  tensor(tensor&& other) noexcept = default;
  tensor& operator=(const tensor& other) {
    if (this != &other) {
      if (size() != other.size()) return *this = tensor(other);
      batch_ = other.batch_;
      copy_elements(other);
    }
    return *this;
  }
  tensor& operator=(tensor&& other) noexcept = default;
  /// Evaluates an expression into this tensor (one fused pass, by executor<cuda>).
  template <ExpressionType E>
    requires(!std::is_same_v<std::remove_cvref_t<E>, tensor>)
  tensor& operator=(const E& e) {
    if constexpr (detail::check_device_source<E>()) detail::executor_for<device, E>::type::assign(ref(), e);
    return *this;
  }

  /// Device pointers: dereferenced by kernels only. Notes a use on the current stream.
  T* data() {
    data_.used_on(current_stream());
    return data_.data();
  }
  const T* data() const {
    data_.used_on(current_stream());
    return data_.data();
  }
  std::size_t batch() const { return batch_; }
  /// Notes a use on stream s, for work queued there with the memory taken under another
  /// current stream (an operation given an explicit stream).
  void used_on(cudaStream_t s) const { data_.used_on(s); }
  /// The stream the tensor will be freed on: that of its last noted use.
  cudaStream_t last_stream() const noexcept { return data_.stream(); }
  /// Elements held: 0 for a moved-from tensor.
  std::size_t size() const { return data_.size(); }
  static constexpr std::size_t rank() { return S::rank; }

  tensor_ref<T, S, device> ref() { return tensor_ref<T, S, device>(data(), batch_); }
  tensor_ref<const T, S, device> ref() const { return tensor_ref<const T, S, device>(data(), batch_); }
  operator tensor_ref<T, S, device>() { return ref(); }
  operator tensor_ref<const T, S, device>() const { return ref(); }

 private:
  static std::size_t checked(std::size_t batch) {
    detail::check_batch<S>(batch);
    return batch;
  }
  static eval::cuda::device_array<T> allocate(std::size_t n) {
    return eval::cuda::device_array<T>::allocate(n, current_stream());
  }
  // All-zero bytes are 0 for every arithmetic type (IEEE 754 +0.0 for floats).
  void zero() {
    eval::cuda::check(cudaMemsetAsync(data(), 0, size() * sizeof(T), current_stream()), "cudaMemsetAsync");
  }
  void copy_elements(const tensor& other) {
    if (size() == 0) return;  // a copy of a moved-from tensor
    eval::cuda::check(
        cudaMemcpyAsync(data(), other.data(), size() * sizeof(T), cudaMemcpyDeviceToDevice, current_stream()),
        "cudaMemcpyAsync (device to device)");
  }
  template <class E>
  static tensor make_for(const E& e) {
    if constexpr (S::dynamic)
      return tensor(e.batch(), uninitialized);
    else
      return tensor(uninitialized);
  }

  std::size_t batch_ = 1;  // before data_: a dynamic batch is checked before anything is allocated
  eval::cuda::device_array<T> data_;
};

}  // namespace solder
