// bias_relu_dropout.bench.cpp: y = dropout(relu(x + b)), p = 0.1, training mode, forward and
// backward, for every implementation in the table at the bottom, against the copy floors.
//
// Cases: BM_bias_relu_dropout_{fwd,bwd}/<impl>/<B>x<N>[/threads:2]; see bench/README.md for the
// method, what each implementation is and how roofline is computed. BM_philox_bits16/<B>x<N>:
// the forward's random-bit floor (the mask drawn and compared, nothing read or written), with
// the default 7 Philox rounds; BM_philox_bits16_r10: the same with a 10-round stream.
#include <xtensor/xmath.hpp>
#include <xtensor/xnoalias.hpp>
#include <xtensor/xoperation.hpp>
#include <xtensor/xreducer.hpp>
#include <xtensor/xtensor.hpp>
#include <xtensor/xview.hpp>

#if SOLDER_BENCH_HAS_EIGEN
#include <Eigen/Core>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <utility>

#include "common.hpp"
#include "solder/nn/elementwise_block.hpp"

namespace {

using namespace solder_bench;

constexpr float drop_p = 0.1f;
constexpr float keep_scale = 1.0f / (1.0f - drop_p);
constexpr int max_threads = 2;

/// Seeds of the data, fixed so every run and every implementation sees the same numbers.
enum seed : std::uint64_t { seed_x = 1, seed_b = 2, seed_keep = 3, seed_dy = 4 };

/// Everything one shape needs, built once (outside any timing) and shared by every
/// implementation. Row-major: element (r, c) of a [B, N] array is at r * N + c.
struct problem {
  std::int64_t rows, cols;                     // B, N
  aligned_buffer<float> x, b, y;               // forward: x [B, N], b [N] -> y [B, N]
  aligned_buffer<std::uint8_t> keep;           // [B, N] precomputed dropout keep mask, 1 = kept
  aligned_buffer<float> pre;                   // [B, N] saved for backward: x + b
  aligned_buffer<float> dy, dx, db;            // backward: dy [B, N] -> dx [B, N], db [N]
  std::vector<aligned_buffer<float>> db_part;  // [max_threads][N] per-thread partial db

  // The same data in xtensor's own containers (xtensor allocates them; huge pages advised too).
  struct xtensor_data {
    xt::xtensor<float, 2> x, y, pre, dy, dx;
    xt::xtensor<float, 1> b, db;
    xt::xtensor<std::uint8_t, 2> keep;
  } xt;

  problem(std::int64_t B, std::int64_t N)
      : rows(B), cols(N), x(B * N), b(N), y(B * N), keep(B * N), pre(B * N), dy(B * N), dx(B * N), db(N) {
    fill_uniform(x.span(), seed_x);
    fill_uniform(b.span(), seed_b, -0.5f, 0.5f);
    fill_keep_mask(keep.span(), seed_keep, drop_p);
    fill_uniform(dy.span(), seed_dy);
    for (std::int64_t r = 0; r < B; ++r)
      for (std::int64_t c = 0; c < N; ++c) {
        const std::int64_t i = r * N + c;
        pre[i] = x[i] + b[c];
      }
    for (int t = 0; t < max_threads; ++t) db_part.emplace_back(N);
    xt.x = to_xtensor(x);
    xt.y = to_xtensor(y);
    xt.pre = to_xtensor(pre);
    xt.dy = to_xtensor(dy);
    xt.dx = to_xtensor(dx);
    xt.keep = to_xtensor(keep);
    xt.b = xt::xtensor<float, 1>::from_shape({static_cast<std::size_t>(N)});
    std::copy(b.data(), b.data() + N, xt.b.data());
    xt.db = xt::xtensor<float, 1>::from_shape({static_cast<std::size_t>(N)});
  }

  template <class T>
  xt::xtensor<T, 2> to_xtensor(const aligned_buffer<T>& a) const {
    auto t = xt::xtensor<T, 2>::from_shape({static_cast<std::size_t>(rows), static_cast<std::size_t>(cols)});
    advise_huge_pages(t.data(), t.size() * sizeof(T));  // before the first touch, as for ours
    std::copy(a.data(), a.data() + a.size(), t.data());
    return t;
  }
};

/// The problem of shape B x N, built on first use and kept for the whole run.
problem& problem_for(std::int64_t B, std::int64_t N) {
  static std::map<std::pair<std::int64_t, std::int64_t>, std::unique_ptr<problem>> problems;
  auto& p = problems[{B, N}];
  if (!p) p = std::make_unique<problem>(B, N);
  return *p;
}

/// A forward or backward pass over a problem with `threads` OpenMP threads splitting the rows.
using pass_fn = std::function<void(problem&, int threads)>;

enum class direction { fwd, bwd };

/// Copies an implementation's outputs of one direction into problem::y (fwd) or problem::dx and
/// problem::db (bwd), for the check; for implementations that keep their own containers.
using export_fn = std::function<void(problem&, direction)>;

// ---------------------------------------------------------------------------------------------
// Floors: the same bytes moved with no arithmetic (bench/README.md, "Floors")
// ---------------------------------------------------------------------------------------------

/// fwd floor, regular stores: y = x with glibc memcpy.
void memcpy_fwd(problem& pb, int threads) {
  parallel_blocks(threads, pb.rows, [&](std::int64_t r0, std::int64_t r1) {
    copy_memcpy(pb.x.data() + r0 * pb.cols, pb.y.data() + r0 * pb.cols, (r1 - r0) * pb.cols);
  });
}

/// fwd floor, fastest: y = x, the widest vectors, streaming stores + prefetch when y is beyond cache.
void copy_nt_fwd(problem& pb, int threads) {
  const bool streaming = pb.y.bytes() >= streaming_store_min_bytes;  // decided by the whole output
  parallel_blocks(threads, pb.rows, [&](std::int64_t r0, std::int64_t r1) {
    const float* x = pb.x.data() + r0 * pb.cols;
    float* y = pb.y.data() + r0 * pb.cols;
    if (streaming)
      copy_nt<true>(x, y, (r1 - r0) * pb.cols);
    else
      copy_nt<false>(x, y, (r1 - r0) * pb.cols);
  });
}

/// bwd floor, regular stores: dx = dy * pre, the plainest 2-read 1-write loop.
void memcpy_bwd(problem& pb, int threads) {
  parallel_blocks(threads, pb.rows, [&](std::int64_t r0, std::int64_t r1) {
    const std::int64_t o = r0 * pb.cols;
    mul_plain(pb.dy.data() + o, pb.pre.data() + o, pb.dx.data() + o, (r1 - r0) * pb.cols);
  });
}

/// bwd floor, fastest: dx = dy * pre, the widest vectors, streaming stores + prefetch beyond cache.
void copy_nt_bwd(problem& pb, int threads) {
  const bool streaming = pb.dx.bytes() >= streaming_store_min_bytes;
  parallel_blocks(threads, pb.rows, [&](std::int64_t r0, std::int64_t r1) {
    const std::int64_t o = r0 * pb.cols, n = (r1 - r0) * pb.cols;
    if (streaming)
      mul_nt<true>(pb.dy.data() + o, pb.pre.data() + o, pb.dx.data() + o, n);
    else
      mul_nt<false>(pb.dy.data() + o, pb.pre.data() + o, pb.dx.data() + o, n);
  });
}

// ---------------------------------------------------------------------------------------------
// xtensor: one lazy expression for the chain, mask precomputed (xtensor has no counter-based RNG)
// ---------------------------------------------------------------------------------------------

template <class Y, class K, class X, class Bias>
void xtensor_forward(Y&& y, const K& keep, const X& x, const Bias& b) {
  xt::noalias(y) = xt::where(keep > 0, xt::maximum(x + b, 0.0f) * keep_scale, 0.0f);
}

template <class DX, class K, class DY, class Pre>
void xtensor_dx(DX&& dx, const K& keep, const DY& dy, const Pre& pre) {
  xt::noalias(dx) = xt::where(keep > 0, dy * keep_scale, 0.0f) * (pre > 0.0f);
}

void xtensor_export(problem& pb, direction dir) {
  auto& d = pb.xt;
  if (dir == direction::fwd) return void(std::copy(d.y.begin(), d.y.end(), pb.y.data()));
  std::copy(d.dx.begin(), d.dx.end(), pb.dx.data());
  std::copy(d.db.begin(), d.db.end(), pb.db.data());
}

void xtensor_fwd(problem& pb, int threads) {
  auto& d = pb.xt;
  if (threads == 1) return xtensor_forward(d.y, d.keep, d.x, d.b);
  parallel_blocks(threads, pb.rows, [&](std::int64_t r0, std::int64_t r1) {
    xtensor_forward(xt::view(d.y, xt::range(r0, r1), xt::all()), xt::view(d.keep, xt::range(r0, r1), xt::all()),
                    xt::view(d.x, xt::range(r0, r1), xt::all()), d.b);
  });
}

// db is a second statement, as a user writes it; `immediate` makes xtensor reduce row by row
// (the default lazy reducer walks each column down 4096 rows and runs 1.5x slower).
void xtensor_bwd(problem& pb, int threads) {
  auto& d = pb.xt;
  if (threads == 1) {
    xtensor_dx(d.dx, d.keep, d.dy, d.pre);
    xt::noalias(d.db) = xt::sum(d.dx, {0}, xt::evaluation_strategy::immediate);
    return;
  }
  parallel_blocks(threads, pb.rows, [&](std::int64_t r0, std::int64_t r1) {
    xtensor_dx(xt::view(d.dx, xt::range(r0, r1), xt::all()), xt::view(d.keep, xt::range(r0, r1), xt::all()),
               xt::view(d.dy, xt::range(r0, r1), xt::all()), xt::view(d.pre, xt::range(r0, r1), xt::all()));
  });
  parallel_blocks(threads, pb.cols, [&](std::int64_t c0, std::int64_t c1) {
    xt::noalias(xt::view(d.db, xt::range(c0, c1))) =
        xt::sum(xt::view(d.dx, xt::all(), xt::range(c0, c1)), {0}, xt::evaluation_strategy::immediate);
  });
}

// ---------------------------------------------------------------------------------------------
// Eigen 3.4: one fused array expression per row (the form that vectorizes; `X.rowwise() + b`
// does not in 3.4), over Maps of the shared buffers, mask precomputed
// ---------------------------------------------------------------------------------------------

#if SOLDER_BENCH_HAS_EIGEN
using eigen_row = Eigen::Map<Eigen::ArrayXf>;
using eigen_const_row = Eigen::Map<const Eigen::ArrayXf>;
using eigen_mask_row = Eigen::Map<const Eigen::Array<std::uint8_t, Eigen::Dynamic, 1>>;

// Measured alternatives: keep.cast<float>() * scale and the scale inside select within 5% of this
// one; a float mask holding 0 or 1/(1-p) 20% slower at 4 MiB (4 mask bytes per element, not 1).
void eigen_fwd(problem& pb, int threads) {
  const std::int64_t N = pb.cols;
  const eigen_const_row b(pb.b.data(), N);
  parallel_blocks(threads, pb.rows, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::int64_t o = r * N;
      eigen_row(pb.y.data() + o, N) = (eigen_mask_row(pb.keep.data() + o, N) != 0)
                                          .select((eigen_const_row(pb.x.data() + o, N) + b).max(0.0f), 0.0f) *
                                      keep_scale;
    }
  });
}

// dx row by row, each row added to db while it is still in L1; one partial db per thread.
void eigen_bwd(problem& pb, int threads) {
  const std::int64_t N = pb.cols;
  if (threads > 1)
    for (int t = 0; t < threads; ++t) eigen_row(pb.db_part[t].data(), N).setZero();  // threads <= max_threads
  parallel_blocks(threads, pb.rows, [&](std::int64_t r0, std::int64_t r1) {
    eigen_row db(threads == 1 ? pb.db.data() : pb.db_part[omp_get_thread_num()].data(), N);
    if (threads == 1) db.setZero();
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::int64_t o = r * N;
      eigen_row dx(pb.dx.data() + o, N);
      dx = (eigen_const_row(pb.pre.data() + o, N) > 0.0f && eigen_mask_row(pb.keep.data() + o, N) != 0)
               .select(eigen_const_row(pb.dy.data() + o, N) * keep_scale, 0.0f);
      db += dx;
    }
  });
  if (threads > 1) {
    eigen_row db(pb.db.data(), N);
    db = eigen_const_row(pb.db_part[0].data(), N);
    for (int t = 1; t < threads; ++t) db += eigen_const_row(pb.db_part[t].data(), N);
  }
}
#endif

// ---------------------------------------------------------------------------------------------
// solder: the fused layer (one pass each way; the backward reads the saved output), the backward
// from the input (mask regenerated), and solder run op by op (unfused)
// ---------------------------------------------------------------------------------------------

/// solder's passes for one static shape; the bench's runtime shapes dispatch to these.
template <std::size_t B, std::size_t N>
struct solder_impl {
  using S = solder::shape<B, N>;
  using in = solder::tensor_ref<const float, S>;
  using out = solder::tensor_ref<float, S>;
  using layer_type = solder::nn::bias_relu_dropout<N, drop_p>;

  static layer_type& layer(const problem& pb) {
    static layer_type l = [&] {
      layer_type made;
      std::copy(pb.b.data(), pb.b.data() + N, made.template layer<0>().value.data());
      return made;
    }();
    return l;
  }
  static solder::tensor_ref<const float, solder::shape<N>> bias(const problem& pb) {
    return solder::tensor_ref<const float, solder::shape<N>>(pb.b.data());
  }
  /// The stream the layer's last forward used; the unfused version draws from it too.
  static solder::philox_state rng(const problem& pb) { return layer(pb).template layer<2>().rng; }

  static void fused_fwd(problem& pb, int threads) {
    solder::set_num_threads(threads);
    layer(pb).forward(in(pb.x.data()), out(pb.y.data()));
  }
  /// The layer's backward as a chain runs it: from the saved output y of its own forward (which
  /// the next layer keeps as its input anyway), one pass over y and dy, no random bits.
  static void fused_bwd(problem& pb, int threads) {
    solder::set_num_threads(threads);
    layer(pb).backward_from_output(saved_output(pb), in(pb.dy.data()), out(pb.dx.data()));
  }
  /// The backward from the input x: the dropout mask regenerated from its counter (16 Philox bits
  /// per element), for a layer whose output is not kept.
  static void from_input_bwd(problem& pb, int threads) {
    solder::set_num_threads(threads);
    layer(pb).backward(in(pb.x.data()), in(pb.dy.data()), out(pb.dx.data()));
  }
  /// y of one training forward of the layer, made on first use (outside any timing).
  static solder::tensor_ref<const float, S> saved_output(const problem& pb) {
    static const solder::tensor<float, S> y = [&] {
      solder::tensor<float, S> made;
      layer(pb).forward(in(pb.x.data()), made.ref());
      return made;
    }();
    return y.ref();
  }
  static void fused_export(problem& pb, direction dir) {
    if (dir == direction::bwd) {
      const auto& db = layer(pb).template layer<0>().grad;
      std::copy(db.begin(), db.end(), pb.db.data());
    }
  }

  /// Three passes and two temporaries forward, as an eager framework runs the chain; backward
  /// reads the saved pre-activation, as autograd does: mask pass, relu-gate pass, db pass.
  static solder::tensor<float, S>& temporary(int k) {
    static solder::tensor<float, S> t[2];
    return t[k];
  }
  static void unfused_fwd(problem& pb, int threads) {
    solder::set_num_threads(threads);
    auto& t1 = temporary(0);
    auto& t2 = temporary(1);
    t1 = in(pb.x.data()) + bias(pb);
    t2 = relu(t1);
    out(pb.y.data()) = solder::dropout(t2, drop_p, rng(pb));
  }
  static void unfused_bwd(problem& pb, int threads) {
    solder::set_num_threads(threads);
    auto& g = temporary(0);
    g = solder::dropout(in(pb.dy.data()), drop_p, rng(pb));
    out dx(pb.dx.data());
    dx = where(in(pb.pre.data()) > 0.0f, g, 0.0f);
    solder::tensor_ref<float, solder::shape<N>>(pb.db.data()) = solder::sum<0>(dx);
  }

};

/// Runs F for the problem's static shape.
template <template <std::size_t, std::size_t> class Impl, class F>
void dispatch(problem& pb, F&& f) {
  if (pb.rows == 256 && pb.cols == 4096)
    f(Impl<256, 4096>{});
  else if (pb.rows == 4096 && pb.cols == 4096)
    f(Impl<4096, 4096>{});
  else
    throw std::runtime_error("solder bench: no static instantiation for this shape");
}

void solder_fwd(problem& pb, int t) { dispatch<solder_impl>(pb, [&](auto i) { i.fused_fwd(pb, t); }); }
void solder_bwd(problem& pb, int t) { dispatch<solder_impl>(pb, [&](auto i) { i.fused_bwd(pb, t); }); }
void solder_export(problem& pb, direction d) { dispatch<solder_impl>(pb, [&](auto i) { i.fused_export(pb, d); }); }
void unfused_fwd(problem& pb, int t) { dispatch<solder_impl>(pb, [&](auto i) { i.unfused_fwd(pb, t); }); }
void unfused_bwd(problem& pb, int t) { dispatch<solder_impl>(pb, [&](auto i) { i.unfused_bwd(pb, t); }); }
void from_input_bwd(problem& pb, int t) { dispatch<solder_impl>(pb, [&](auto i) { i.from_input_bwd(pb, t); }); }

// ---------------------------------------------------------------------------------------------
// Checks, run before each case's timing: a wrong implementation is reported, not timed
// ---------------------------------------------------------------------------------------------

/// Relative tolerance of an output element: the chain is 1 add, 1 max, 1 multiply in float, and an
/// implementation may fold the scale differently (x * s + b * s), so a few ulps apart.
constexpr float element_rel_tol = 1e-5f;
/// Relative tolerance of db against a double sum: B = 4096 float additions in any order.
constexpr double column_sum_rel_tol = 1e-4;

/// How a checked implementation draws its dropout mask.
enum class mask_source {
  precomputed,  // reads problem::keep: output must match it exactly
  own_rng,      // draws its own: only the keep fraction is checked (1 - p within 0.05)
};

/// "" when the rows checked hold y = dropout(relu(x + b)) (fwd) or dx, db (bwd); else the problem.
std::string check(const problem& pb, bool backward, mask_source mask) {
  const std::int64_t N = pb.cols, sample_rows[] = {0, pb.rows / 2, pb.rows - 1};
  std::int64_t positive = 0, kept = 0;
  for (std::int64_t r : sample_rows)
    for (std::int64_t c = 0; c < N; ++c) {
      const std::int64_t i = r * N + c;
      const float got = backward ? pb.dx[i] : pb.y[i];
      const float full = backward ? pb.dy[i] * keep_scale : std::max(pb.pre[i], 0.0f) * keep_scale;
      const bool is_kept = got != 0.0f;
      if (is_kept && (pb.pre[i] <= 0.0f || std::abs(got - full) > element_rel_tol * std::abs(full)))
        return "wrong value at row " + std::to_string(r) + ", column " + std::to_string(c);
      if (mask == mask_source::precomputed && pb.pre[i] > 0.0f && is_kept != (pb.keep[i] != 0))
        return "does not follow the precomputed keep mask at row " + std::to_string(r) + ", column " +
               std::to_string(c);
      positive += pb.pre[i] > 0.0f;
      kept += is_kept;
    }
  const double fraction = static_cast<double>(kept) / static_cast<double>(positive);
  if (std::abs(fraction - (1.0 - drop_p)) > 0.05) return "keeps " + std::to_string(fraction) + " of the elements";
  if (backward)
    for (std::int64_t c : {std::int64_t{0}, std::int64_t{1}, N / 2, N - 1}) {
      double sum = 0, magnitude = 0;
      for (std::int64_t r = 0; r < pb.rows; ++r) {
        sum += pb.dx[r * N + c];
        magnitude += std::abs(pb.dx[r * N + c]);
      }
      if (std::abs(pb.db[c] - sum) > column_sum_rel_tol * magnitude)
        return "db is not the column sum of dx at column " + std::to_string(c);
    }
  return "";
}

// ---------------------------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------------------------

struct shape {
  std::int64_t rows, cols;
  int threads;
};

/// The shapes every implementation runs: 4 MiB per array (stays in cache across iterations) and
/// 64 MiB per array (beyond cache by itself), the latter also on 2 threads.
constexpr shape shapes[] = {{256, 4096, 1}, {4096, 4096, 1}, {4096, 4096, 2}};

/// Bytes that must move per pass: fwd reads x, writes y; bwd reads dy and pre (or the saved
/// output), writes dx. Bias, db and any mask an implementation reads are not counted.
double bytes_moved(direction dir, const shape& s) {
  return (dir == direction::fwd ? 2.0 : 3.0) * static_cast<double>(s.rows * s.cols) * sizeof(float);
}

std::string case_suffix(const shape& s) {
  return shape_name(s.rows, s.cols) + (s.threads > 1 ? "/threads:" + std::to_string(s.threads) : "");
}

/// One implementation of the chain. A null pass skips that direction.
struct impl {
  std::string name;
  pass_fn fwd, bwd;
  bool is_floor = false;  // floors compute no chain: not checked
  mask_source mask = mask_source::precomputed;
  export_fn export_outputs;  // null when it writes problem's own buffers
};

std::vector<impl>& impls() {
  static std::vector<impl> table;
  return table;
}

/// Adds an implementation; cases are created for it by register_cases().
void register_impl(std::string name, pass_fn fwd, pass_fn bwd, mask_source mask = mask_source::precomputed,
                   export_fn export_outputs = nullptr) {
  impls().push_back({std::move(name), std::move(fwd), std::move(bwd), false, mask, std::move(export_outputs)});
}

void register_floor(std::string name, pass_fn fwd, pass_fn bwd) {
  impls().push_back({std::move(name), std::move(fwd), std::move(bwd), true, mask_source::precomputed, nullptr});
}

/// The fastest floor for this direction, shape and thread count, measured once (common.hpp).
double floor_for(problem& pb, direction dir, const shape& s) {
  const double bytes = bytes_moved(dir, s);
  std::vector<floor_measure> floors;
  for (const impl& f : impls()) {
    if (!f.is_floor) continue;
    const pass_fn& pass = dir == direction::fwd ? f.fwd : f.bwd;
    floors.push_back(
        [&pb, &pass, bytes, threads = s.threads] { return measure_gbps([&] { pass(pb, threads); }, bytes); });
  }
  const std::string key = std::string(dir == direction::fwd ? "fwd/" : "bwd/") + case_suffix(s);
  return floor_gbps(key, floors);
}

void run_case(benchmark::State& state, const impl& im, direction dir, shape s) {
  problem& pb = problem_for(s.rows, s.cols);
  const pass_fn& pass = dir == direction::fwd ? im.fwd : im.bwd;
  const double floor = floor_for(pb, dir, s);
  pass(pb, s.threads);  // warm-up: output pages touched, caches and TLB warm for this case
  if (!im.is_floor) {
    if (im.export_outputs) im.export_outputs(pb, dir);
    if (const std::string err = check(pb, dir == direction::bwd, im.mask); !err.empty()) {
      state.SkipWithError((im.name + ": " + err).c_str());
      return;
    }
  }
  float* out = dir == direction::fwd ? pb.y.data() : pb.dx.data();
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    pass(pb, s.threads);
    benchmark::DoNotOptimize(out);
    benchmark::ClobberMemory();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  set_memory_counters(state, bytes_moved(dir, s), seconds, floor);
}

/// solder against the faster floor of its direction, shape and threads, call by call
/// (time_pairs): roofline = median over the pairs of the floor's time / solder's time. The
/// floor is whichever of memcpy and copy_nt measures faster here, just before the pairs.
void paired_case(benchmark::State& state, const impl& solder_impl, direction dir, shape s) {
  problem& pb = problem_for(s.rows, s.cols);
  const double bytes = bytes_moved(dir, s);
  const impl* floor = nullptr;
  double best = 0;
  for (const impl& f : impls()) {
    if (!f.is_floor) continue;
    const pass_fn& pass = dir == direction::fwd ? f.fwd : f.bwd;
    const double g = measure_gbps([&] { pass(pb, s.threads); }, bytes);
    if (g > best) best = g, floor = &f;
  }
  const pass_fn& a = dir == direction::fwd ? solder_impl.fwd : solder_impl.bwd;
  const pass_fn& b = dir == direction::fwd ? floor->fwd : floor->bwd;
  a(pb, s.threads);  // warm-up, and the output that is checked
  if (solder_impl.export_outputs) solder_impl.export_outputs(pb, dir);
  if (const std::string err = check(pb, dir == direction::bwd, solder_impl.mask); !err.empty()) {
    state.SkipWithError((solder_impl.name + ": " + err).c_str());
    return;
  }
  b(pb, s.threads);
  const paired_times t = time_pairs(state, [&] { a(pb, s.threads); }, [&] { b(pb, s.threads); });
  state.counters["roofline"] = t.speedup_of_a();
  state.counters["GBps"] = bytes / paired_times::median(t.a) * 1e-9;
  state.counters["floor_GBps"] = bytes / paired_times::median(t.b) * 1e-9;
  state.SetLabel("floor: " + floor->name);
}

/// The random-bit floor of the fused forward: the keep mask of B x N elements drawn and
/// compared as solder's pass draws it (Philox 16-bit draws for segments of segment_elements,
/// compared with the threshold vector by vector) and counted, nothing written. GBps: the
/// forward's bytes (x read, y written) over this time, so it reads as a floor beside the
/// pass's GBps; the pass's floor is the slower of this and the memory copy.
void philox_bits_case(benchmark::State& state, shape s, std::uint32_t rounds) {
  namespace cpu = solder::eval::cpu;
  using V = cpu::vec<float>;
  const std::size_t n = std::size_t(s.rows * s.cols);
  constexpr std::size_t seg = cpu::segment_elements;
  const cpu::detail::philox_stream stream(seed_keep, 0, rounds);
  const std::uint32_t threshold = solder::random::threshold16(drop_p);
  alignas(64) std::uint16_t bits[seg + 64] = {};
  double kept = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    V count(0.0f);
    for (std::size_t i0 = 0; i0 < n; i0 += seg) {
      const std::size_t len = std::min(seg, n - i0);
      cpu::philox_bits16(stream, i0, len, bits);
      for (std::size_t j = 0; j < len; j += V::size)
        count += xsimd::select(cpu::keep_mask16(bits + j, threshold), V(1.0f), V(0.0f));
    }
    kept = double(xsimd::hadd(count));
    benchmark::DoNotOptimize(kept);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  state.counters["Gelem_per_s"] = double(n) * double(state.iterations()) / seconds * 1e-9;
  state.counters["GBps"] = bytes_moved(direction::fwd, s) * double(state.iterations()) / seconds * 1e-9;
  state.counters["kept"] = kept / double(n);  // 0.9 for p = 0.1: the draws are compared, not skipped
}

/// Creates the cases, grouped by direction then shape, implementations in table order inside a
/// group, so the peers of one comparison run back to back.
void register_cases() {
  for (const shape& s : shapes) {
    if (s.threads > 1) continue;
    for (std::uint32_t rounds : {solder::random::philox_default_rounds, 10u}) {
      const std::string name = std::string(rounds == 10 ? "BM_philox_bits16_r10/" : "BM_philox_bits16/") + case_suffix(s);
      benchmark::RegisterBenchmark(name.c_str(), philox_bits_case, s, rounds)->Unit(benchmark::kMicrosecond);
    }
  }
  for (direction dir : {direction::fwd, direction::bwd})
    for (const shape& s : shapes)
      for (const impl& im : impls()) {
        if (!(dir == direction::fwd ? im.fwd : im.bwd)) continue;
        const std::string name = std::string("BM_bias_relu_dropout_") + (dir == direction::fwd ? "fwd/" : "bwd/") +
                                 im.name + "/" + case_suffix(s);
        auto* b = benchmark::RegisterBenchmark(name.c_str(), run_case, im, dir, s);
        b->Unit(benchmark::kMicrosecond);
        // The team's wall time is what matters; Google Benchmark then appends "/real_time".
        if (s.threads > 1) b->UseRealTime();
      }
  for (const impl& im : impls()) {
    if (im.name != "solder") continue;
    for (direction dir : {direction::fwd, direction::bwd})
      for (const shape& s : shapes) {
        const std::string name = std::string("BM_bias_relu_dropout_") + (dir == direction::fwd ? "fwd" : "bwd") +
                                 "_paired/solder_vs_floor/" + case_suffix(s);
        auto* b = benchmark::RegisterBenchmark(name.c_str(), paired_case, im, dir, s);
        // About 1 s of pairs: a 64 MiB pass takes 5-10 ms, a 4 MiB one 0.3-0.6 ms.
        b->Unit(benchmark::kMicrosecond)->Iterations(s.rows * s.cols >= (std::int64_t{1} << 24) ? 100 : 1000);
        if (s.threads > 1) b->UseRealTime();
      }
  }
}

// =============================================================================================
// The implementation table. To add one, write its fwd and bwd passes above (signature
// `void(problem&, int threads)`, splitting rows with parallel_blocks) and add a line here:
//
//   register_impl("name", name_fwd, name_bwd, mask_source::own_rng);
//
// mask_source::own_rng for one that draws its mask (Philox) instead of reading problem::keep (its
// backward must then regenerate the same mask, or read its own forward's output).
// =============================================================================================
const bool registered = [] {
  register_floor("memcpy", memcpy_fwd, memcpy_bwd);
  register_floor("copy_nt", copy_nt_fwd, copy_nt_bwd);
  register_impl("solder", solder_fwd, solder_bwd, mask_source::own_rng, solder_export);
  register_impl("solder_from_input", nullptr, from_input_bwd, mask_source::own_rng, solder_export);
  register_impl("unfused", unfused_fwd, unfused_bwd, mask_source::own_rng);
  register_impl("xtensor", xtensor_fwd, xtensor_bwd, mask_source::precomputed, xtensor_export);
#if SOLDER_BENCH_HAS_EIGEN
  register_impl("eigen", eigen_fwd, eigen_bwd);
#endif
  register_cases();
  return true;
}();

}  // namespace
