// interop/xtensor.hpp: solder tensors to and from xtensor (xtensor, xtensor_fixed, xarray):
// copies in both directions, and views of solder storage as xtensor adaptors (no copy).
#pragma once

#include <algorithm>
#include <array>
#include <string>

#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xfixed.hpp>
#include <xtensor/xtensor.hpp>

#include "solder/tensor.hpp"

namespace solder {

namespace detail {

template <class S>
std::array<std::size_t, S::rank> runtime_extents(std::size_t batch) {
  std::array<std::size_t, S::rank> e{};
  for (std::size_t d = 0; d < S::rank; ++d) e[d] = S::extents[d] == dyn ? batch : S::extents[d];
  return e;
}

template <class S, std::size_t... I>
auto xshape_of(std::index_sequence<I...>) -> xt::xshape<S::extents[I]...>;

}  // namespace detail

/// A copy as xt::xtensor<T, rank> (dynamic extents, static rank).
template <class T, class S>
xt::xtensor<std::remove_const_t<T>, S::rank> to_xtensor(tensor_ref<T, S> t) {
  xt::xtensor<std::remove_const_t<T>, S::rank> out(detail::runtime_extents<S>(t.batch()));
  std::copy(t.begin(), t.end(), out.begin());
  return out;
}
template <class T, class S>
auto to_xtensor(const tensor<T, S>& t) {
  return to_xtensor(t.ref());
}

/// A copy as xt::xarray<T> (dynamic rank).
template <class T, class S>
xt::xarray<std::remove_const_t<T>> to_xarray(tensor_ref<T, S> t) {
  auto e = detail::runtime_extents<S>(t.batch());
  xt::xarray<std::remove_const_t<T>> out(std::vector<std::size_t>(e.begin(), e.end()));
  std::copy(t.begin(), t.end(), out.begin());
  return out;
}
template <class T, class S>
auto to_xarray(const tensor<T, S>& t) {
  return to_xarray(t.ref());
}

/// A copy as xt::xtensor_fixed<T, xshape<Ns...>> (static shapes only).
template <class T, class S>
  requires(!S::dynamic)
auto to_xtensor_fixed(tensor_ref<T, S> t) {
  using X = decltype(detail::xshape_of<S>(std::make_index_sequence<S::rank>{}));
  xt::xtensor_fixed<std::remove_const_t<T>, X> out;
  std::copy(t.begin(), t.end(), out.begin());
  return out;
}
template <class T, class S>
  requires(!S::dynamic)
auto to_xtensor_fixed(const tensor<T, S>& t) {
  return to_xtensor_fixed(t.ref());
}

/// Copies an xtensor expression (xtensor, xtensor_fixed, xarray, or any lazy expression) into
/// `out`; its shape must equal out's (a dynamic leading extent must equal out's batch).
template <class T, class S, class X>
void copy_from(const xt::xexpression<X>& src, tensor_ref<T, S> out) {
  const auto& x = src.derived_cast();
  const auto want = detail::runtime_extents<S>(out.batch());
  const bool same = x.dimension() == S::rank && std::equal(want.begin(), want.end(), x.shape().begin());
  if (!same) {
    std::string got = "[";
    for (std::size_t d = 0; d < x.dimension(); ++d) got += (d ? ", " : "") + std::to_string(x.shape()[d]);
    detail::fail("solder::copy_from: the xtensor expression has shape " + got + "], the tensor " + to_string<S>(out.batch()));
  }
  // Evaluate row-major whatever the source's layout.
  xt::xtensor<std::remove_const_t<T>, S::rank, xt::layout_type::row_major> tmp = x;
  std::copy(tmp.begin(), tmp.end(), out.begin());
}
template <class T, class S, class X>
void copy_from(const xt::xexpression<X>& src, tensor<T, S>& out) {
  copy_from(src, out.ref());
}

/// A new solder tensor holding a copy of an xtensor expression (for a dynamic shape, the batch
/// is the expression's leading extent).
template <class S, class T = float, class X>
tensor<T, S> from_xtensor(const xt::xexpression<X>& src) {
  if constexpr (S::dynamic) {
    const auto& x = src.derived_cast();
    SOLDER_ASSERT(x.dimension() == S::rank, "solder::from_xtensor: the expression's rank differs from the shape's");
    tensor<T, S> out(x.shape()[0], uninitialized);
    copy_from(src, out);
    return out;
  } else {
    tensor<T, S> out(uninitialized);
    copy_from(src, out);
    return out;
  }
}

/// An xtensor view of solder storage (no copy): writes through it change the tensor.
/// Static shapes give an xtensor_fixed adaptor, dynamic ones an xtensor adaptor.
template <class T, class S>
auto as_xtensor(tensor_ref<T, S> t) {
  if constexpr (S::dynamic) {
    return xt::adapt(t.data(), t.size(), xt::no_ownership(), detail::runtime_extents<S>(t.batch()));
  } else {
    using X = decltype(detail::xshape_of<S>(std::make_index_sequence<S::rank>{}));
    return xt::adapt(t.data(), X{});
  }
}
template <class T, class S>
auto as_xtensor(tensor<T, S>& t) {
  return as_xtensor(t.ref());
}
template <class T, class S>
auto as_xtensor(const tensor<T, S>& t) {
  return as_xtensor(t.ref());
}

}  // namespace solder
