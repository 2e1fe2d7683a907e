// eval/cuda/copy.hpp: copies between host and device memory (solder::copy, to_device, to_host),
// queued on a stream; host code.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <type_traits>

#include "solder/backend.hpp"
#include "solder/config.hpp"
#include "solder/diagnostic.hpp"
#include "solder/eval/cuda/error.hpp"
#include "solder/eval/cuda/stream.hpp"
#include "solder/eval/cuda/tensor.hpp"
#include "solder/shape.hpp"
#include "solder/tensor.hpp"

namespace solder {

namespace detail {

template <class X>
struct copy_operand {
  static constexpr bool ok = false;
};
template <class T, class S, class Space>
struct copy_operand<tensor<T, S, Space>> {
  static constexpr bool ok = true;
  static constexpr bool owns = true;  // so a const tensor is read-only, a const tensor_ref<T> is not
  using element = T;
  using shape = S;
  using space = Space;
};
template <class T, class S, class Space>
struct copy_operand<tensor_ref<T, S, Space>> : copy_operand<tensor<T, S, Space>> {
  static constexpr bool owns = false;
};

/// A tensor or tensor_ref: elements in memory, which solder::copy moves.
template <class X>
concept CopyOperand = copy_operand<std::remove_cvref_t<X>>::ok;

/// True when `Src` can be copied into `Dst` (Dst as passed: a const tensor is not writable);
/// otherwise one compile error that says why.
template <class Src, class Dst>
constexpr bool check_copy() {
  using from = copy_operand<std::remove_cvref_t<Src>>;
  using to = copy_operand<std::remove_cvref_t<Dst>>;
  constexpr bool writable =
      !std::is_const_v<typename to::element> && !(to::owns && std::is_const_v<std::remove_reference_t<Dst>>);
  if constexpr (!std::is_same_v<typename from::shape, typename to::shape>) {
    constexpr fixed_string m = [] {
      fixed_string s("solder::copy: the shapes must be the same type, not ");
      append_shape<typename from::shape>(s);
      s.append(" and ");
      append_shape<typename to::shape>(s);
      s.append("; copy moves bytes, it does not broadcast or reshape");
      return s;
    }();
    return diagnostic<m>::reported;
  } else if constexpr (!std::is_same_v<std::remove_const_t<typename from::element>,
                                       std::remove_const_t<typename to::element>>) {
    return diagnostic<"solder::copy: source and destination must hold the same element type; convert in an "
                      "expression within one memory space first",
                      typename from::element, typename to::element>::reported;
  } else if constexpr (!writable) {
    return diagnostic<"solder::copy: the destination is const; pass a mutable tensor or tensor_ref<T, ...>",
                      Dst>::reported;
  } else if constexpr (std::is_same_v<typename from::space, host> && std::is_same_v<typename to::space, host>) {
    return diagnostic<"solder::copy: both tensors are in host memory; assign one to the other (dst = src)",
                      Src, Dst>::reported;
  } else {
    return true;
  }
}

template <class From, class To>
constexpr cudaMemcpyKind copy_kind() {
  if constexpr (std::is_same_v<From, host>)
    return cudaMemcpyHostToDevice;
  else if constexpr (std::is_same_v<To, host>)
    return cudaMemcpyDeviceToHost;
  else
    return cudaMemcpyDeviceToDevice;
}

/// An owning tensor of `batch` uninitialized entries in Space.
template <class Space, class T, class S>
tensor<T, S, Space> uninitialized_tensor(std::size_t batch) {
  if constexpr (S::dynamic)
    return tensor<T, S, Space>(batch, uninitialized);
  else
    return tensor<T, S, Space>(uninitialized);
}

}  // namespace detail

/// dst = src, element for element, between host and device memory or within the device, queued
/// on `stream`: src must not change, nor dst be read, until the stream reaches the copy (a copy
/// into pageable host memory has finished on return; pinned memory needs stream synchronize()).
/// The shapes and element types must match; a dynamic batch mismatch throws solder::error before
/// anything is written.
template <detail::CopyOperand Src, detail::CopyOperand Dst>
void copy(const Src& src, Dst&& dst, cudaStream_t stream) {
  if constexpr (detail::check_copy<Src, Dst>()) {
    using from = detail::copy_operand<std::remove_cvref_t<Src>>;
    using to = detail::copy_operand<std::remove_cvref_t<Dst>>;
    if constexpr (from::shape::dynamic) {
      if (src.batch() != dst.batch())
        detail::fail("solder::copy: the source's batch size (" + std::to_string(src.batch()) +
                     ") differs from the destination's (" + std::to_string(dst.batch()) +
                     "); copy between tensors of the same batch size");
    }
    if (src.size() != dst.size())  // only a moved-from tensor holds fewer elements than its shape
      detail::fail("solder::copy: the source holds " + std::to_string(src.size()) + " elements and the destination " +
                   std::to_string(dst.size()) + " (a moved-from tensor holds none)");
    if (src.size() == 0) return;
    // An owning device tensor is freed on the stream of its last use: this copy is one.
    if constexpr (requires { src.used_on(stream); }) src.used_on(stream);
    if constexpr (requires { dst.used_on(stream); }) dst.used_on(stream);
    eval::cuda::check(cudaMemcpyAsync(dst.data(), src.data(), src.size() * sizeof(typename from::element),
                                      detail::copy_kind<typename from::space, typename to::space>(), stream),
                      "cudaMemcpyAsync");
  }
}

/// dst = src on the current stream (see copy(src, dst, stream)).
template <detail::CopyOperand Src, detail::CopyOperand Dst>
void copy(const Src& src, Dst&& dst) {
  copy(src, static_cast<Dst&&>(dst), current_stream());
}

namespace detail {

/// A new tensor in Space holding a copy of src, allocated and copied on the current stream.
template <class Space, class Src>
auto copy_into_new(const Src& src) {
  using from = copy_operand<Src>;
  using T = std::remove_const_t<typename from::element>;
  auto out = uninitialized_tensor<Space, T, typename from::shape>(src.batch());
  solder::copy(src, out);
  return out;
}

}  // namespace detail

/// A device copy of host memory, allocated and copied on the current stream.
template <class T, class S>
tensor<std::remove_const_t<T>, S, device> to_device(tensor_ref<T, S, host> src) {
  return detail::copy_into_new<device>(src);
}
template <class T, class S>
tensor<T, S, device> to_device(const tensor<T, S, host>& src) {
  return detail::copy_into_new<device>(src);
}

/// A host copy of device memory, copied on the current stream; the stream is synchronized, so
/// the result is ready on return.
template <class T, class S>
tensor<std::remove_const_t<T>, S, host> to_host(tensor_ref<T, S, device> src) {
  auto out = detail::copy_into_new<host>(src);
  eval::cuda::check(cudaStreamSynchronize(current_stream()), "cudaStreamSynchronize");
  return out;
}
template <class T, class S>
tensor<T, S, host> to_host(const tensor<T, S, device>& src) {
  auto out = detail::copy_into_new<host>(src);
  eval::cuda::check(cudaStreamSynchronize(current_stream()), "cudaStreamSynchronize");
  return out;
}

}  // namespace solder
