// dist/nccl.hpp: data-parallel gradient reduction over NCCL, one rank per GPU: nccl_communicator
// and a bucket's fixed-order reduction on a stream (the kernels run dist/bucket.hpp's bodies;
// all-to-all by grouped ncclSend/ncclRecv, an in-place ncclAllGather). nvcc only; programs link
// libnccl and CUDA::cudart.
//
// NCCL's own reductions are not used: their order depends on the algorithm NCCL picks. Here
// NCCL only moves bits, and each owner sums its chunk in rank order (dist/reduction.hpp), so for
// a fixed world size the reduced bucket has the same bits every run, and the bits that
// dist::reduce_on_host computes.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <map>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "solder/config.hpp"
#include "solder/dist/bucket.hpp"
#include "solder/dist/reduction.hpp"
#include "solder/eval/cuda/error.hpp"
#include "solder/eval/cuda/memory.hpp"
#include "solder/eval/cuda/row_kernels.hpp"

namespace solder {

/// An NCCL call failed; what() names the call, NCCL's message and, where NCCL kept one, its
/// last error's text.
struct nccl_error : error {
  ncclResult_t code;
  nccl_error(ncclResult_t c, const std::string& what) : error(what), code(c) {}
};

namespace dist {

namespace detail {

/// Throws nccl_error "solder: <what> failed: <NCCL's message> (<NCCL's last error>)" unless `r`
/// is ncclSuccess.
inline void check_nccl(ncclResult_t r, const char* what, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess) return;
  std::string message = std::string("solder: ") + what + " failed: " + ncclGetErrorString(r);
  if (const char* last = ncclGetLastError(comm); last && *last) message += std::string(" (") + last + ")";
  throw nccl_error(r, message);
}

/// Makes `device` current while alive, and the previous device again after.
class device_scope {
 public:
  explicit device_scope(int device) {
    eval::cuda::check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (device != previous_) eval::cuda::check(cudaSetDevice(device), "cudaSetDevice");
    changed_ = device != previous_;
  }
  ~device_scope() {
    if (changed_ && cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
  }
  device_scope(const device_scope&) = delete;
  device_scope& operator=(const device_scope&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

/// ncclGroupStart now, ncclGroupEnd at end() (checked) or, after an exception, on destruction:
/// NCCL then drops the group's calls if one of them failed, and a group is never left open.
class nccl_group {
 public:
  nccl_group() { check_nccl(ncclGroupStart(), "ncclGroupStart"); }
  void end() {
    open_ = false;
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  }
  ~nccl_group() {
    if (open_) (void)ncclGroupEnd();
  }
  nccl_group(const nccl_group&) = delete;
  nccl_group& operator=(const nccl_group&) = delete;

 private:
  bool open_ = true;
};

/// n elements of T in pinned host memory (cudaMallocHost), which asynchronous copies need.
template <class T>
class pinned_array {
 public:
  explicit pinned_array(std::size_t n) {
    eval::cuda::check(cudaMallocHost(reinterpret_cast<void**>(&p_), (n ? n : 1) * sizeof(T)), "cudaMallocHost");
  }
  ~pinned_array() {
    if (p_ && cudaFreeHost(p_) != cudaSuccess) (void)cudaGetLastError();
  }
  pinned_array(const pinned_array&) = delete;
  pinned_array& operator=(const pinned_array&) = delete;
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
};

/// The buffers of one bucket reduction in flight: packed, received and gathered buckets
/// (packed_floats(n, P) each) and the weights on the device, the weights and the owners'
/// statuses in pinned host memory. Made once per bucket size (and per reduction of that size in
/// flight at the same time) and reused.
struct nccl_staging {
  nccl_staging(std::size_t n, std::size_t ranks)
      : packed(eval::cuda::device_array<float>::allocate(packed_floats(n, ranks), nullptr)),
        received(eval::cuda::device_array<float>::allocate(packed_floats(n, ranks), nullptr)),
        gathered(eval::cuda::device_array<float>::allocate(packed_floats(n, ranks), nullptr)),
        weights(eval::cuda::device_array<double>::allocate(ranks, nullptr)),
        host_weights(ranks),
        host_status(ranks) {
    // Allocated on the default stream: once that is done, any stream of the device may use them.
    eval::cuda::check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize after allocating NCCL staging buffers");
  }

  eval::cuda::device_array<float> packed, received, gathered;
  eval::cuda::device_array<double> weights;
  pinned_array<double> host_weights;
  pinned_array<float> host_status;
  bool busy = false;
};

}  // namespace detail

class nccl_communicator;

/// A bucket reduction queued on a stream by nccl_communicator::start; its communicator's
/// finish() waits for it and says whether a rank failed. Movable, not copyable. A reduction
/// dropped unfinished keeps its buffers out of reuse (the device may still be using them).
class nccl_reduction {
 public:
  nccl_reduction() = default;
  nccl_reduction(nccl_reduction&& other) noexcept { *this = std::move(other); }
  nccl_reduction& operator=(nccl_reduction&& other) noexcept {
    if (this != &other) {
      staging_ = std::exchange(other.staging_, nullptr);
      comm_ = other.comm_;
      bucket_ = other.bucket_;
      n_ = other.n_;
      stream_ = other.stream_;
    }
    return *this;
  }
  nccl_reduction(const nccl_reduction&) = delete;
  nccl_reduction& operator=(const nccl_reduction&) = delete;

  /// Queued and not yet finished.
  bool pending() const noexcept { return staging_ != nullptr; }
  /// Floats in the bucket being reduced.
  std::size_t size() const noexcept { return n_; }

 private:
  friend class nccl_communicator;
  nccl_reduction(detail::nccl_staging* s, ncclComm_t comm, float* bucket, std::size_t n, cudaStream_t stream)
      : staging_(s), comm_(comm), bucket_(bucket), n_(n), stream_(stream) {
    staging_->busy = true;
  }

  detail::nccl_staging* staging_ = nullptr;
  ncclComm_t comm_ = nullptr;
  float* bucket_ = nullptr;
  std::size_t n_ = 0;
  cudaStream_t stream_ = nullptr;
};

/// One rank of a data-parallel world on one GPU: an NCCL communicator (blocking, the default
/// config) and the staging buffers of its bucket reductions. Movable, not copyable; used by one
/// thread at a time. Every reduction it started must be finished before it is destroyed. After an
/// exception from start or finish the world's ranks may be out of step: abort the communicator.
class nccl_communicator {
 public:
  /// Uses `comm`, which the caller keeps and destroys after this communicator.
  explicit nccl_communicator(ncclComm_t comm) : nccl_communicator(comm, false) {}
  /// Takes `comm`: ncclCommDestroy when this communicator is destroyed.
  static nccl_communicator adopt(ncclComm_t comm) { return nccl_communicator(comm, true); }

  /// One process, one rank per GPU: communicators of ranks 0, 1, ... on `devices` in that order
  /// (ncclCommInitAll), each owning its comm. Throws cuda_error without a device.
  static std::vector<nccl_communicator> for_local_devices(std::span<const int> devices) {
    eval::cuda::require_device();
    SOLDER_ASSERT(!devices.empty(), "solder::dist::nccl_communicator::for_local_devices: no devices; pass at least one");
    std::vector<ncclComm_t> comms(devices.size(), nullptr);
    detail::check_nccl(ncclCommInitAll(comms.data(), int(devices.size()), devices.data()), "ncclCommInitAll");
    std::vector<nccl_communicator> out;
    out.reserve(comms.size());
    std::size_t adopted = 0;
    try {
      for (; adopted < comms.size(); ++adopted) out.push_back(adopt(comms[adopted]));
    } catch (...) {
      for (std::size_t i = adopted + 1; i < comms.size(); ++i) (void)ncclCommDestroy(comms[i]);
      throw;
    }
    return out;
  }
  /// The first `count` devices, as above.
  static std::vector<nccl_communicator> for_local_devices(int count) {
    SOLDER_ASSERT(count > 0 && count <= eval::cuda::device_count(),
                  "solder::dist::nccl_communicator::for_local_devices: count must be between 1 and the number of "
                  "CUDA devices present");
    std::vector<int> devices(std::size_t(count), 0);
    std::iota(devices.begin(), devices.end(), 0);
    return for_local_devices(std::span<const int>(devices));
  }

  ~nccl_communicator() { reset(); }
  nccl_communicator(nccl_communicator&& other) noexcept { *this = std::move(other); }
  nccl_communicator& operator=(nccl_communicator&& other) noexcept {
    if (this != &other) {
      reset();
      comm_ = std::exchange(other.comm_, nullptr);
      owns_ = std::exchange(other.owns_, false);
      rank_ = other.rank_;
      size_ = other.size_;
      device_ = other.device_;
      staging_ = std::move(other.staging_);
    }
    return *this;
  }
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  /// The CUDA device of this rank; buckets and streams passed to start must be on it.
  int device() const noexcept { return device_; }
  ncclComm_t get() const noexcept { return comm_; }

  /// Queues on `stream` the reduction of this rank's bucket (n floats on the device): every
  /// rank's bucket becomes sum over ranks j (ascending, in double, rounded once) of
  /// weights[j] * rank j's bucket. `weights` (size() values, host memory, the same on every rank)
  /// is copied before start returns; `status` is status_ok, or status_failed when this rank's
  /// step failed (its values are then meaningless). Every rank must start its buckets in the same
  /// order with the same n. Returns at once; finish() waits.
  nccl_reduction start(float* device_bucket, std::size_t n, std::span<const double> weights, float status,
                       cudaStream_t stream) {
    nccl_reduction r = prepare(device_bucket, n, weights, status, stream);
    {
      detail::nccl_group group;
      post_exchange(r);
      group.end();
    }
    sum(r);
    {
      detail::nccl_group group;
      post_gather(r);
      group.end();
    }
    complete(r);
    return r;
  }

  /// One thread driving several ranks of the world (for_local_devices): start on every
  /// communicator of `comms` at once, rank i reducing buckets[i] on streams[i] with status
  /// statuses[i]. Its NCCL calls are grouped across the communicators, as NCCL requires of one
  /// thread driving several devices. Finish each with its communicator.
  static std::vector<nccl_reduction> start_all(std::span<nccl_communicator> comms, std::span<float* const> device_buckets,
                                               std::size_t n, std::span<const double> weights,
                                               std::span<const float> statuses, std::span<const cudaStream_t> streams) {
    SOLDER_ASSERT(device_buckets.size() == comms.size() && statuses.size() == comms.size() &&
                      streams.size() == comms.size(),
                  "solder::dist::nccl_communicator::start_all: one bucket, status and stream per communicator are "
                  "needed");
    std::vector<nccl_reduction> out;
    out.reserve(comms.size());
    for (std::size_t i = 0; i < comms.size(); ++i)
      out.push_back(comms[i].prepare(device_buckets[i], n, weights, statuses[i], streams[i]));
    {
      detail::nccl_group group;
      for (std::size_t i = 0; i < comms.size(); ++i) comms[i].post_exchange(out[i]);
      group.end();
    }
    for (std::size_t i = 0; i < comms.size(); ++i) comms[i].sum(out[i]);
    {
      detail::nccl_group group;
      for (std::size_t i = 0; i < comms.size(); ++i) comms[i].post_gather(out[i]);
      group.end();
    }
    for (std::size_t i = 0; i < comms.size(); ++i) comms[i].complete(out[i]);
    return out;
  }

  /// Waits for `r` (started by this communicator) and returns the lowest rank whose status said
  /// it failed, or -1 when none did; the bucket then holds the reduced values (when a rank
  /// failed, they are meaningless). Throws cuda_error or nccl_error when the device or NCCL
  /// reported an error.
  int finish(nccl_reduction& r) {
    SOLDER_ASSERT(r.pending(), "solder::dist::nccl_communicator::finish: the reduction is not pending; finish each "
                               "reduction start returned once");
    SOLDER_ASSERT(r.comm_ == comm_, "solder::dist::nccl_communicator::finish: the reduction was started by another "
                                    "communicator; finish it with that one");
    eval::cuda::check(cudaStreamSynchronize(r.stream_), "cudaStreamSynchronize of a bucket reduction");
    ncclResult_t async = ncclSuccess;
    detail::check_nccl(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError", comm_);
    detail::check_nccl(async, "a bucket reduction's NCCL transfers", comm_);
    const int failed = failed_rank(r.staging_->host_status.get(), 1, std::size_t(size_));
    std::exchange(r.staging_, nullptr)->busy = false;
    return failed;
  }

 private:
  nccl_communicator(ncclComm_t comm, bool owns) : comm_(comm), owns_(owns) {
    SOLDER_ASSERT(comm != nullptr, "solder::dist::nccl_communicator: the comm is null; pass an initialized ncclComm_t");
    try {
      detail::check_nccl(ncclCommUserRank(comm, &rank_), "ncclCommUserRank", comm);
      detail::check_nccl(ncclCommCount(comm, &size_), "ncclCommCount", comm);
      detail::check_nccl(ncclCommCuDevice(comm, &device_), "ncclCommCuDevice", comm);
    } catch (...) {
      reset();
      throw;
    }
  }

  void reset() noexcept {
    if (!staging_.empty()) {
      // The buffers are freed on this rank's device (errors ignored: at process exit the
      // runtime may already be unloaded).
      try {
        const detail::device_scope on(device_);
        staging_.clear();
      } catch (...) {
        staging_.clear();
      }
    }
    if (comm_ && owns_) (void)ncclCommDestroy(comm_);
    comm_ = nullptr;
    owns_ = false;
  }

  /// A free staging of this bucket size, made when there is none.
  detail::nccl_staging* staging_for(std::size_t n) {
    auto& pool = staging_[n];
    for (const auto& s : pool)
      if (!s->busy) return s.get();
    pool.push_back(std::make_unique<detail::nccl_staging>(n, std::size_t(size_)));
    return pool.back().get();
  }

  // The phases of start, apart so that start_all can group each one's NCCL calls across
  // communicators; each makes this rank's device current. P = size(), r = rank(),
  // stride = chunk_stride(n, P).

  /// The weights to the device, the pack, and this rank's own chunk into its received slot.
  nccl_reduction prepare(float* bucket, std::size_t n, std::span<const double> weights, float status,
                         cudaStream_t stream) {
    SOLDER_ASSERT(comm_ != nullptr, "solder::dist::nccl_communicator::start: the communicator was moved from");
    SOLDER_ASSERT(weights.size() == std::size_t(size_),
                  "solder::dist::nccl_communicator::start: one weight per rank is needed (weights.size() == size())");
    SOLDER_ASSERT(bucket != nullptr || n == 0, "solder::dist::nccl_communicator::start: the bucket is null");
    const detail::device_scope on(device_);
    const std::size_t P = std::size_t(size_), r = std::size_t(rank_), stride = chunk_stride(n, P);
    nccl_reduction out(staging_for(n), comm_, bucket, n, stream);
    detail::nccl_staging& s = *out.staging_;
    // The staging buffers are freed on the stream of their last use (eval/cuda/memory.hpp).
    s.packed.used_on(stream);
    s.received.used_on(stream);
    s.gathered.used_on(stream);
    s.weights.used_on(stream);
    for (std::size_t j = 0; j < P; ++j) s.host_weights.get()[j] = weights[j];
    eval::cuda::check(cudaMemcpyAsync(s.weights.data(), s.host_weights.get(), P * sizeof(double),
                                      cudaMemcpyHostToDevice, stream),
                      "cudaMemcpyAsync of the reduction weights");
    const pack_body pack{bucket, s.packed.data(), n, P, status};
    eval::cuda::detail::launch_elements(pack, pack.elements(), stream,
                                        "solder::dist::nccl_communicator::start: launching the pack");
    eval::cuda::check(cudaMemcpyAsync(s.received.data() + r * stride, s.packed.data() + r * stride,
                                      stride * sizeof(float), cudaMemcpyDeviceToDevice, stream),
                      "cudaMemcpyAsync of this rank's own chunk");
    return out;
  }

  /// All-to-all (inside a group): chunk j of the packed bucket to rank j, rank j's chunk r into
  /// received slot j.
  void post_exchange(const nccl_reduction& red) {
    const detail::device_scope on(device_);
    const std::size_t stride = chunk_stride(red.n_, std::size_t(size_));
    detail::nccl_staging& s = *red.staging_;
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      detail::check_nccl(ncclSend(s.packed.data() + std::size_t(j) * stride, stride, ncclFloat, j, comm_, red.stream_),
                         "ncclSend of a bucket chunk", comm_);
      detail::check_nccl(ncclRecv(s.received.data() + std::size_t(j) * stride, stride, ncclFloat, j, comm_, red.stream_),
                         "ncclRecv of a bucket chunk", comm_);
    }
  }

  /// The owner's sum of its chunk, into its slot of the gathered bucket.
  void sum(const nccl_reduction& red) {
    const detail::device_scope on(device_);
    const std::size_t P = std::size_t(size_), stride = chunk_stride(red.n_, P);
    detail::nccl_staging& s = *red.staging_;
    const sum_body body{s.received.data(), s.gathered.data() + std::size_t(rank_) * stride, s.weights.data(), red.n_, P};
    eval::cuda::detail::launch_elements(body, body.elements(), red.stream_,
                                        "solder::dist::nccl_communicator::start: launching the sum");
  }

  /// The owners' sums to every rank: an in-place all-gather (bits moved, nothing added).
  void post_gather(const nccl_reduction& red) {
    const detail::device_scope on(device_);
    const std::size_t stride = chunk_stride(red.n_, std::size_t(size_));
    float* gathered = red.staging_->gathered.data();
    detail::check_nccl(ncclAllGather(gathered + std::size_t(rank_) * stride, gathered, stride, ncclFloat, comm_,
                                     red.stream_),
                       "ncclAllGather of the reduced chunks", comm_);
  }

  /// The unpack into the bucket, and the owners' statuses to the host.
  void complete(const nccl_reduction& red) {
    const detail::device_scope on(device_);
    const std::size_t P = std::size_t(size_), stride = chunk_stride(red.n_, P);
    detail::nccl_staging& s = *red.staging_;
    const unpack_body unpack{s.gathered.data(), red.bucket_, red.n_, P};
    eval::cuda::detail::launch_elements(unpack, unpack.elements(), red.stream_,
                                        "solder::dist::nccl_communicator::start: launching the unpack");
    eval::cuda::check(cudaMemcpy2DAsync(s.host_status.get(), sizeof(float), s.gathered.data() + (stride - 1),
                                        stride * sizeof(float), sizeof(float), P, cudaMemcpyDeviceToHost, red.stream_),
                      "cudaMemcpy2DAsync of the reduced statuses");
  }

  ncclComm_t comm_ = nullptr;
  bool owns_ = false;
  int rank_ = 0, size_ = 0, device_ = 0;
  std::map<std::size_t, std::vector<std::unique_ptr<detail::nccl_staging>>> staging_;
};

}  // namespace dist
}  // namespace solder
