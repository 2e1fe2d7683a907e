// optim/schedule.hpp: learning-rate schedules as pure functions of the step, usable in
// constant expressions; the closed forms of torch.optim.lr_scheduler's StepLR, ExponentialLR,
// CosineAnnealingLR, LinearLR and SequentialLR.
//
// A schedule is called with the number of steps taken so far (torch's last_epoch, counting
// scheduler.step() calls) and gives the rate of the next step:
//   opt.set_lr(schedule(opt.steps()));  opt.step();
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <type_traits>

#include "solder/config.hpp"

namespace solder::optim {

namespace detail {

/// x^k for k >= 0 by repeated squaring (usable in constant expressions).
constexpr double power(double x, std::int64_t k) {
  double r = 1.0;
  for (; k > 0; k >>= 1, x *= x)
    if (k & 1) r *= x;
  return r;
}

/// cos(pi t / T) for integer t, T >= 1. t is first reduced to [0, T] with the cosine's period
/// 2T and symmetry, exactly in integers; std::cos at run time, a Taylor series (error below
/// 1e-16) in constant expressions.
constexpr double cos_pi_ratio(std::int64_t t, std::int64_t period) {
  t %= 2 * period;
  if (t < 0) t += 2 * period;
  if (t > period) t = 2 * period - t;  // cos(pi (2T - t) / T) = cos(pi t / T)
  if (!std::is_constant_evaluated()) return std::cos(std::numbers::pi * double(t) / double(period));
  // Fold to [0, pi/2]: cos(pi - x) = -cos(x); there the series converges fast.
  double sign = 1.0;
  if (2 * t > period) {
    t = period - t;
    sign = -1.0;
  }
  const double x = std::numbers::pi * double(t) / double(period), x2 = x * x;
  double term = 1.0, sum = 1.0;
  for (int n = 1; n < 14; ++n) {  // the next term after x^26 / 26! is below 1e-19 on [0, pi/2]
    term *= -x2 / double((2 * n - 1) * (2 * n));
    sum += term;
  }
  return sign * sum;
}

inline void fail_schedule(const char* who, const char* what, std::int64_t got) {
  solder::detail::fail_message({who, ": ", what, ", got ", got});
}

}  // namespace detail

/// torch.optim.lr_scheduler.StepLR: lr(t) = base_lr gamma^floor(t / step_size).
struct step_lr {
  double base_lr;
  std::int64_t step_size;
  double gamma = 0.1;
  constexpr float operator()(std::int64_t t) const {
    if (step_size < 1) detail::fail_schedule("solder::optim::step_lr", "step_size must be >= 1", step_size);
    if (t < 0) detail::fail_schedule("solder::optim::step_lr", "the step must be >= 0", t);
    return float(base_lr * detail::power(gamma, t / step_size));
  }
};

/// torch.optim.lr_scheduler.ExponentialLR: lr(t) = base_lr gamma^t.
struct exponential_lr {
  double base_lr;
  double gamma;
  constexpr float operator()(std::int64_t t) const {
    if (t < 0) detail::fail_schedule("solder::optim::exponential_lr", "the step must be >= 0", t);
    return float(base_lr * detail::power(gamma, t));
  }
};

/// torch.optim.lr_scheduler.CosineAnnealingLR, closed form:
///   lr(t) = eta_min + (base_lr - eta_min) (1 + cos(pi t / t_max)) / 2
/// base_lr at t = 0, eta_min at t = t_max. Past t_max the cosine goes on (rising back to
/// base_lr at 2 t_max), as PyTorch's does; stop at t_max or restart to hold eta_min.
struct cosine_annealing_lr {
  double base_lr;
  std::int64_t t_max;
  double eta_min = 0.0;
  constexpr float operator()(std::int64_t t) const {
    if (t_max < 1) detail::fail_schedule("solder::optim::cosine_annealing_lr", "t_max must be >= 1", t_max);
    if (t < 0) detail::fail_schedule("solder::optim::cosine_annealing_lr", "the step must be >= 0", t);
    return float(eta_min + (base_lr - eta_min) * (1.0 + detail::cos_pi_ratio(t, t_max)) / 2.0);
  }
};

/// torch.optim.lr_scheduler.LinearLR: the factor goes linearly from start_factor to
/// end_factor over total_iters steps, then stays:
///   lr(t) = base_lr (start_factor + (end_factor - start_factor) min(t, total_iters) / total_iters)
/// A linear warmup is linear_lr{base_lr, small start_factor, 1.0, warmup_steps}.
struct linear_lr {
  double base_lr;
  double start_factor = 1.0 / 3.0;
  double end_factor = 1.0;
  std::int64_t total_iters = 5;
  constexpr float operator()(std::int64_t t) const {
    if (total_iters < 1) detail::fail_schedule("solder::optim::linear_lr", "total_iters must be >= 1", total_iters);
    if (t < 0) detail::fail_schedule("solder::optim::linear_lr", "the step must be >= 0", t);
    const std::int64_t done = t < total_iters ? t : total_iters;
    return float(base_lr * (start_factor + (end_factor - start_factor) * double(done) / double(total_iters)));
  }
};

/// torch.optim.lr_scheduler.SequentialLR with one milestone: `first` for t < milestone, then
/// `second` started afresh, second(t - milestone).
template <class First, class Second>
struct sequential_lr {
  First first;
  Second second;
  std::int64_t milestone;
  constexpr float operator()(std::int64_t t) const { return t < milestone ? first(t) : second(t - milestone); }
};
template <class First, class Second>
sequential_lr(First, Second, std::int64_t) -> sequential_lr<First, Second>;

/// Linear warmup from start_factor base_lr to base_lr over warmup_steps, then cosine
/// annealing to eta_min at total_steps: SequentialLR([LinearLR(start_factor, 1.0,
/// warmup_steps), CosineAnnealingLR(total_steps - warmup_steps, eta_min)], [warmup_steps]).
/// PyTorch's LinearLR wants start_factor in (0, 1]; 0 (warmup from zero) works here too.
constexpr sequential_lr<linear_lr, cosine_annealing_lr> warmup_cosine_lr(double base_lr, std::int64_t warmup_steps,
                                                                         std::int64_t total_steps,
                                                                         double start_factor,
                                                                         double eta_min = 0.0) {
  if (warmup_steps < 1) detail::fail_schedule("solder::optim::warmup_cosine_lr", "warmup_steps must be >= 1", warmup_steps);
  if (total_steps <= warmup_steps)
    detail::fail_schedule("solder::optim::warmup_cosine_lr", "total_steps must exceed warmup_steps", total_steps);
  return {linear_lr{base_lr, start_factor, 1.0, warmup_steps}, cosine_annealing_lr{base_lr, total_steps - warmup_steps, eta_min},
          warmup_steps};
}

}  // namespace solder::optim
