// dist/mpi.hpp: processes training together through MPI (Open MPI): MPI set up and torn down, a
// communicator, and the fixed-order reduction of gradient buckets (dist/reduction.hpp), moved
// on while the backward runs. Ranks that share one machine reduce through an MPI shared-memory
// window (a few copies); others through MPI's non-blocking all-to-all and all-gather. Both
// routes give the same bits.
#pragma once

// The C API only: the deprecated C++ bindings that mpi.h would pull in are not used.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "solder/config.hpp"
#include "solder/dist/bucket.hpp"
#include "solder/dist/reduction.hpp"

namespace solder::dist {

namespace detail {
/// Throws solder::error naming the MPI call and MPI's own text for a failed call (the
/// communicators here return errors instead of aborting: MPI_ERRORS_RETURN).
inline void mpi_check(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  solder::detail::fail(std::string("solder::dist::mpi: ") + call + " failed: " + std::string(text, std::size_t(len)));
}
}  // namespace detail

/// MPI for the life of the object: initializes it (threads: only the main thread calls MPI;
/// OpenMP threads inside a rank compute only) unless the program already did, and finalizes
/// what it initialized. Make one in main, before any communicator.
class mpi_session {
 public:
  mpi_session(int* argc = nullptr, char*** argv = nullptr) {
    int done = 0;
    MPI_Initialized(&done);
    if (done) return;
    int provided = 0;
    detail::mpi_check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    owner = true;
  }
  mpi_session(const mpi_session&) = delete;
  mpi_session& operator=(const mpi_session&) = delete;
  ~mpi_session() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owner && !finalized) MPI_Finalize();
  }

 private:
  bool owner = false;
};

struct mpi_options {
  /// When every rank runs on one machine, buckets are reduced through an MPI shared-memory window:
  /// each rank copies its bucket in, sums the chunk it owns from every rank's copy and copies
  /// the owners' sums out, which costs a few memory copies where the message route costs many
  /// more. Otherwise, or when any rank sets this false, through MPI's all-to-all and all-gather.
  bool shared_memory = true;
};

/// A group of ranks (a duplicate of MPI_COMM_WORLD by default, so solder's messages never meet
/// the program's own). Errors are returned, and thrown as solder::error, not fatal aborts.
class mpi_communicator {
 public:
  /// Collective over parent's ranks.
  explicit mpi_communicator(MPI_Comm parent = MPI_COMM_WORLD, mpi_options options = {}) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized)
      solder::detail::fail("solder::dist::mpi_communicator: MPI is not initialized; make a solder::dist::mpi_session first");
    detail::mpi_check(MPI_Comm_dup(parent, &comm), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
    if (size_ > 1) {
      // The shared route only when all ranks are on this machine and all of them want it: the
      // ranks must agree, or one would wait in a window the others never make.
      MPI_Comm node = MPI_COMM_NULL;
      detail::mpi_check(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
      int node_size = 0;
      MPI_Comm_size(node, &node_size);
      MPI_Comm_free(&node);
      shared_ = min(options.shared_memory && node_size == size_ ? 1 : 0) == 1;
    }
  }
  mpi_communicator(const mpi_communicator&) = delete;
  mpi_communicator& operator=(const mpi_communicator&) = delete;
  ~mpi_communicator() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm handle() const { return comm; }
  /// True when buckets go through shared memory (mpi_options::shared_memory), false when
  /// through messages.
  bool shared_memory() const { return shared_; }

  /// One bucket's reduction in flight: started by start(), moved on by progress(), ended by
  /// finish(). Its buffers are sized once and reused by later steps of the same bucket.
  /// Messages: it runs on a communicator of its own (duplicated at its first start), since a
  /// rank may begin one bucket's gather before or after the next bucket's exchange, and
  /// collectives on one communicator must begin in the same order on every rank. Shared
  /// memory: it owns a window (made at its first start, collectively) holding each rank's copy
  /// of the bucket and the chunk it owns reduced, with counters that say how far each rank is.
  class reduction {
   public:
    reduction() = default;
    reduction(const reduction&) = delete;
    reduction& operator=(const reduction&) = delete;
    reduction(reduction&& o) noexcept { *this = std::move(o); }
    reduction& operator=(reduction&& o) noexcept {
      if (this != &o) {
        phase = std::exchange(o.phase, idle);
        request = std::exchange(o.request, MPI_REQUEST_NULL);
        comm = std::exchange(o.comm, MPI_COMM_NULL);
        pieces = std::move(o.pieces);
        weights = std::move(o.weights);
        n = o.n;
        failed = o.failed;
        send = std::move(o.send);
        parts = std::move(o.parts);
        reduced = std::move(o.reduced);
        gathered = std::move(o.gathered);
        sources = std::move(o.sources);
        statuses = std::move(o.statuses);
        win = std::exchange(o.win, MPI_WIN_NULL);
        segments = std::move(o.segments);
        segment_n = o.segment_n;
        epoch = o.epoch;
        summed = o.summed;
      }
      return *this;
    }
    ~reduction() {
      // A reduction abandoned in flight (an exception between start and finish) is waited for:
      // MPI still writes into its buffers.
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (finalized) return;
      if (request != MPI_REQUEST_NULL) MPI_Wait(&request, MPI_STATUS_IGNORE);
      if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
      if (win != MPI_WIN_NULL) MPI_Win_free(&win);
    }
    bool active() const { return phase != idle; }

   private:
    friend class mpi_communicator;
    enum stage { idle, exchanging, gathering };
    stage phase = idle;
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_Comm comm = MPI_COMM_NULL;
    std::vector<std::span<float>> pieces;  // the bucket: these spans, one after the other
    std::vector<double> weights;
    std::size_t n = 0;
    int failed = -1;  // one rank: its own status
    std::vector<float> send, parts, reduced, gathered;
    std::vector<const float*> sources;  // the owner's sum: where each rank's copy of the chunk is
    std::vector<float> statuses;        // each owner's reduced status
    // Shared memory: every rank's segment of the window, the bucket size it was made for, the
    // number of starts so far (the same on every rank) and whether this rank's chunk is summed.
    MPI_Win win = MPI_WIN_NULL;
    std::vector<std::byte*> segments;
    std::size_t segment_n = 0;
    std::uint64_t epoch = 0;
    bool summed = false;
  };

  /// Starts reducing data (n floats, the same n on every rank): afterwards every rank's data
  /// holds sum_j weights[j] * data_j, ranks in order, and finish() returns the lowest rank whose
  /// status was status_failed (or -1). weights must be the same on every rank (size() of them).
  void start(reduction& r, std::span<float> data, std::span<const double> weights, float status = status_ok) {
    const std::span<float> one[] = {data};
    start(r, std::span<const std::span<float>>(one), weights, status);
  }
  /// start for a bucket made of several spans (a model's gradient tensors), reduced as if they
  /// were one array, one after the other: packed from them and written back into them, with no
  /// copy of the whole bucket in between.
  void start(reduction& r, std::span<const std::span<float>> pieces, std::span<const double> weights,
             float status = status_ok) {
    if (r.active()) solder::detail::fail("solder::dist::mpi_communicator::start: the reduction is still in flight");
    if (weights.size() != std::size_t(size_))
      solder::detail::fail("solder::dist::mpi_communicator::start: got " + std::to_string(weights.size()) +
                           " weights for " + std::to_string(size_) + " ranks");
    r.pieces.assign(pieces.begin(), pieces.end());
    r.n = 0;
    for (const auto& piece : pieces) r.n += piece.size();
    if (size_ == 1) {
      // One rank: the sum is w[0] * data, which leaves data's values as they are for the weight
      // 1 a whole batch gets; nothing to send.
      if (weights[0] != 1.0)
        for (const auto& piece : pieces)
          for (float& v : piece) v = weighted_sum_at(&v, 1, weights.data(), 1, 0);
      r.failed = status != status_ok ? 0 : -1;
      r.phase = reduction::gathering;
      return;
    }
    r.weights.assign(weights.begin(), weights.end());
    r.sources.resize(std::size_t(size_));
    r.statuses.resize(std::size_t(size_));
    if (shared_) {
      start_shared(r, status);
      return;
    }
    const std::size_t P = std::size_t(size_), c = chunk_floats(r.n, P), stride = chunk_stride(r.n, P);
    if (r.comm == MPI_COMM_NULL) {
      detail::mpi_check(MPI_Comm_dup(comm, &r.comm), "MPI_Comm_dup");
      MPI_Comm_set_errhandler(r.comm, MPI_ERRORS_RETURN);
    }
    r.send.resize(P * stride);
    r.parts.resize(P * stride);
    r.reduced.resize(stride);
    r.gathered.resize(P * stride);
    // bucket.hpp's pack_body, a run of one piece at a time: element e of the bucket goes to
    // chunk e / c, position e % c; then the last chunk's padding and every chunk's status.
    walk_chunks(r.pieces, c, stride, [&](float* piece, std::size_t at, std::size_t len) {
      std::memcpy(r.send.data() + at, piece, len * sizeof(float));
    });
    for (std::size_t j = 0; j < P; ++j) {
      const std::size_t filled = std::min(c, r.n - std::min(r.n, j * c));
      std::fill(r.send.data() + j * stride + filled, r.send.data() + j * stride + c, 0.0f);
      r.send[j * stride + c] = status;
    }
    detail::mpi_check(MPI_Ialltoall(r.send.data(), int(stride), MPI_FLOAT, r.parts.data(), int(stride), MPI_FLOAT, r.comm,
                                    &r.request),
                      "MPI_Ialltoall");
    r.phase = reduction::exchanging;
  }

  /// Moves r on without waiting (MPI's non-blocking collectives advance inside MPI calls):
  /// when the exchange is done, sums this rank's chunk and starts the gather. True when r has
  /// nothing left but finish().
  bool progress(reduction& r) {
    if (!r.active()) return true;
    if (shared_) {
      if (!r.summed && all_reached(r, arrived_at)) sum_shared(r);
      return r.summed && all_reached(r, summed_at);
    }
    int done = 0;
    detail::mpi_check(MPI_Test(&r.request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (!done) return false;
    if (r.phase == reduction::exchanging) {
      sum_and_gather(r);
      return false;
    }
    return true;
  }

  /// Waits for r and writes the result into its data. Returns -1, or the lowest failed rank
  /// (data is then not meaningful).
  int finish(reduction& r) {
    if (!r.active()) solder::detail::fail("solder::dist::mpi_communicator::finish: no reduction in flight");
    if (size_ == 1) {
      r.phase = reduction::idle;
      return r.failed;
    }
    if (shared_) return finish_shared(r);
    if (r.phase == reduction::exchanging) {
      detail::mpi_check(MPI_Wait(&r.request, MPI_STATUS_IGNORE), "MPI_Wait");
      sum_and_gather(r);
    }
    detail::mpi_check(MPI_Wait(&r.request, MPI_STATUS_IGNORE), "MPI_Wait");
    r.phase = reduction::idle;
    const std::size_t P = std::size_t(size_), c = chunk_floats(r.n, P), stride = c + 1;
    // bucket.hpp's unpack_body, a run of one piece at a time.
    walk_chunks(r.pieces, c, stride, [&](float* piece, std::size_t at, std::size_t len) {
      std::memcpy(piece, r.gathered.data() + at, len * sizeof(float));
    });
    return failed_rank(r.gathered.data() + c, stride, P);
  }

  /// Blocking: every rank's data replaced by the weighted sum (start + finish).
  int reduce(std::span<float> data, std::span<const double> weights, float status = status_ok) {
    reduction r;
    start(r, data, weights, status);
    return finish(r);
  }

  /// The smallest of every rank's value (exact for integers: no rounding to depend on order).
  std::int64_t min(std::int64_t v) const {
    std::int64_t out = 0;
    detail::mpi_check(MPI_Allreduce(&v, &out, 1, MPI_INT64_T, MPI_MIN, comm), "MPI_Allreduce");
    return out;
  }
  std::int64_t max(std::int64_t v) const {
    std::int64_t out = 0;
    detail::mpi_check(MPI_Allreduce(&v, &out, 1, MPI_INT64_T, MPI_MAX, comm), "MPI_Allreduce");
    return out;
  }
  /// root's text on every rank.
  std::string broadcast(const std::string& text, int root) const {
    std::uint64_t len = text.size();
    detail::mpi_check(MPI_Bcast(&len, 1, MPI_UINT64_T, root, comm), "MPI_Bcast");
    std::string out = rank_ == root ? text : std::string(len, '\0');
    if (len) detail::mpi_check(MPI_Bcast(out.data(), int(len), MPI_CHAR, root, comm), "MPI_Bcast");
    return out;
  }
  void barrier() const { detail::mpi_check(MPI_Barrier(comm), "MPI_Barrier"); }

 private:
  /// f(p, at, len) for every run of len bucket elements that lie in one piece (from p) and one
  /// chunk (at packed position at: chunk e / c, offset e % c, chunks stride apart).
  template <class F>
  static void walk_chunks(const std::vector<std::span<float>>& pieces, std::size_t c, std::size_t stride, F&& f) {
    std::size_t e = 0;
    for (const auto& piece : pieces) {
      for (std::size_t i = 0; i < piece.size();) {
        const std::size_t k = (e + i) % c, len = std::min(piece.size() - i, c - k);
        f(piece.data() + i, (e + i) / c * stride + k, len);
        i += len;
      }
      e += piece.size();
    }
  }

  void sum_and_gather(reduction& r) {
    // sum_body's values by weighted_sum_run (tests/dist checks the bits against reduce_on_host,
    // which runs sum_body itself).
    const std::size_t P = std::size_t(size_), c = chunk_floats(r.n, P), stride = c + 1;
    for (std::size_t j = 0; j < P; ++j) r.sources[j] = r.parts.data() + j * stride;
    weighted_sum_run(r.sources.data(), r.weights.data(), P, c, r.reduced.data());
    r.reduced[c] = reduced_status(r.parts.data(), stride, P, c);
    detail::mpi_check(MPI_Iallgather(r.reduced.data(), int(stride), MPI_FLOAT, r.gathered.data(), int(stride), MPI_FLOAT,
                                     r.comm, &r.request),
                      "MPI_Iallgather");
    r.phase = reduction::gathering;
  }

  // The shared route. A rank's segment of the window: two counters (each on its own cache line),
  // its copy of the bucket (n floats and its status), and the chunk it owns reduced (chunk floats
  // and the reduced status). A counter holds the number of the last start that reached it: the
  // copy written (arrived_at), the owned chunk summed (summed_at). The counters are C++ atomics
  // on memory every rank maps: lock-free atomics are address-free, so they order the copies
  // between processes as between threads.
  static constexpr std::size_t arrived_at = 0, summed_at = 64, copy_at = 128;
  static constexpr std::size_t line(std::size_t bytes) { return (bytes + 63) / 64 * 64; }
  static std::size_t sums_at(std::size_t n) { return copy_at + line((n + 1) * sizeof(float)); }
  static std::atomic_ref<std::uint64_t> counter(std::byte* segment, std::size_t at) {
    static_assert(std::atomic_ref<std::uint64_t>::is_always_lock_free,
                  "the shared route needs lock-free 64-bit atomics");
    return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(segment + at));
  }
  static float* floats(std::byte* segment, std::size_t at) { return reinterpret_cast<float*>(segment + at); }

  bool all_reached(reduction& r, std::size_t at) const {
    for (std::byte* segment : r.segments)
      if (counter(segment, at).load(std::memory_order_acquire) < r.epoch) return false;
    return true;
  }
  /// Spins (yielding the core after a while: ranks may outnumber cores) until every rank's
  /// counter at `at` reaches this start.
  void wait_for_all(reduction& r, std::size_t at) const {
    for (unsigned spins = 0; !all_reached(r, at); ++spins)
      if (spins >= 64) std::this_thread::yield();
  }

  /// The window for buckets of r.n floats: made (collectively) at r's first start, remade when
  /// the size changes (every rank reduces the same n, so all of them remake it together).
  void make_window(reduction& r) {
    if (r.win != MPI_WIN_NULL && r.segment_n == r.n) return;
    if (r.win != MPI_WIN_NULL) detail::mpi_check(MPI_Win_free(&r.win), "MPI_Win_free");
    const std::size_t P = std::size_t(size_), c = chunk_floats(r.n, P);
    const std::size_t bytes = sums_at(r.n) + line((c + 1) * sizeof(float));
    MPI_Info info = MPI_INFO_NULL;
    MPI_Info_create(&info);
    MPI_Info_set(info, "alloc_shared_noncontig", "true");  // each segment near its own rank
    void* base = nullptr;
    const int made = MPI_Win_allocate_shared(MPI_Aint(bytes), 1, info, comm, &base, &r.win);
    MPI_Info_free(&info);
    detail::mpi_check(made, "MPI_Win_allocate_shared");
    r.segments.assign(P, nullptr);
    for (int j = 0; j < size_; ++j) {
      MPI_Aint size = 0;
      int unit = 0;
      void* at = nullptr;
      detail::mpi_check(MPI_Win_shared_query(r.win, j, &size, &unit, &at), "MPI_Win_shared_query");
      r.segments[std::size_t(j)] = static_cast<std::byte*>(at);
    }
    r.segment_n = r.n;
    r.epoch = 0;
    std::byte* mine = r.segments[std::size_t(rank_)];
    counter(mine, arrived_at).store(0, std::memory_order_relaxed);
    counter(mine, summed_at).store(0, std::memory_order_relaxed);
    // No rank reads a counter before every rank has zeroed its own.
    detail::mpi_check(MPI_Barrier(comm), "MPI_Barrier");
  }

  void start_shared(reduction& r, float status) {
    make_window(r);
    ++r.epoch;
    r.summed = false;
    std::byte* mine = r.segments[std::size_t(rank_)];
    float* copy = floats(mine, copy_at);
    for (const auto& piece : r.pieces) {
      std::memcpy(copy, piece.data(), piece.size() * sizeof(float));
      copy += piece.size();
    }
    *copy = status;
    counter(mine, arrived_at).store(r.epoch, std::memory_order_release);
    r.phase = reduction::exchanging;
  }

  /// This rank's chunk of every rank's copy, summed in rank order into its segment's sums.
  void sum_shared(reduction& r) {
    const std::size_t P = std::size_t(size_), c = chunk_floats(r.n, P), first = std::size_t(rank_) * c;
    const std::size_t len = std::min(c, r.n - std::min(r.n, first));
    float status = status_ok;
    for (std::size_t j = 0; j < P; ++j) {
      const float* copy = floats(r.segments[j], copy_at);
      r.sources[j] = copy + first;
      if (status == status_ok && copy[r.n] != status_ok) status = float(j + 1);  // reduced_status
    }
    float* sums = floats(r.segments[std::size_t(rank_)], sums_at(r.n));
    weighted_sum_run(r.sources.data(), r.weights.data(), P, len, sums);
    sums[c] = status;
    counter(r.segments[std::size_t(rank_)], summed_at).store(r.epoch, std::memory_order_release);
    r.summed = true;
    r.phase = reduction::gathering;
  }

  int finish_shared(reduction& r) {
    if (!r.summed) {
      wait_for_all(r, arrived_at);
      sum_shared(r);
    }
    wait_for_all(r, summed_at);
    const std::size_t P = std::size_t(size_), c = chunk_floats(r.n, P), stride = c + 1;
    walk_chunks(r.pieces, c, stride, [&](float* piece, std::size_t at, std::size_t len) {
      std::memcpy(piece, floats(r.segments[at / stride], sums_at(r.n)) + at % stride, len * sizeof(float));
    });
    for (std::size_t j = 0; j < P; ++j) r.statuses[j] = floats(r.segments[j], sums_at(r.n))[c];
    r.phase = reduction::idle;
    return failed_rank(r.statuses.data(), 1, P);
  }

  MPI_Comm comm = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  bool shared_ = false;
};

}  // namespace solder::dist
