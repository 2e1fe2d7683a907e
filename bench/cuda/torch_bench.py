#!/usr/bin/env python3
"""bench/cuda/torch_bench.py: the PyTorch peer of solder_bench_cuda_bias_relu_dropout and
solder_bench_cuda_linear_bias_relu_dropout, on a CUDA device.

Cases, at B x N = 4096x4096 and 16384x16384 float32, p = 0.1, training mode:

  BM_cuda_copy/torch/<B>x<N>                       y.copy_(x): the floor, measured in this process
  BM_cuda_bias_relu_dropout_fwd/<impl>/<B>x<N>     y = dropout(relu(x + b)), x and b requiring grad
  BM_cuda_bias_relu_dropout_bwd/<impl>/<B>x<N>     dx and db

  impl  torch                       eager; bwd: torch.autograd.grad(y, (x, b), dy)
        torch_compile               torch.compile (Inductor); bwd: autograd through the compiled graph
        torch_from_output           bwd only, eager: g = where(y > 0, dy / (1 - p), 0); dx = g, db = g.sum(0)
        torch_compile_from_output   bwd only, the same function compiled

Counters as the C++ binary: bytes (fwd and copy: 2 B N 4, bwd: 3 B N 4), GBps, roofline (GBps /
this process's copy GBps for the shape), peak_fraction (GBps / 2 x memory clock x bus width, where
pynvml reads them).

Linear cases, y = dropout(relu(x W^T + b)), p = 0.1, training mode, at (M, N, K) = (4096, 4096,
4096) and (256, 2048, 1024): M batch rows, N out features, K in features; x [M, K], W [N, K], b [N]:

  BM_cuda_gemm_peak/torch_<prec>/8192x8192x8192              torch.mm(a, w.t()): the measured peak of
                                                             prec (fp32, tf32, bf16: bf16 tensors)
  BM_cuda_linear_bias_relu_dropout_fwd/<impl>_<math>/<M>x<N>x<K>
      F.dropout(torch.relu(F.linear(x, W, b)), 0.1), x, W and b requiring grad

  impl  torch, torch_compile (Inductor)
  math  fp32            torch.backends.cuda.matmul.allow_tf32 = False
        tf32            allow_tf32 = True
        bf16_autocast   under torch.autocast("cuda", torch.bfloat16): x, W, b cast to bf16 in the
                        call, y bf16

Counters: flops (2 M N K), TFLOPs, peak_TFLOPs (the peak row of the same precision, measured in
this process) and peak_fraction = TFLOPs / peak_TFLOPs. Each call is timed alone with CUDA events, queued behind a spin kernel so host
overhead is not counted; see bench/README.md, "CUDA benchmarks".

    python3 bench/cuda/torch_bench.py [--filter REGEX] [--repetitions 5] [--min-time 0.2]
        [--no-compile] [--json out.json]

Exits 0 with a message where torch or a CUDA device is missing; 1 when a case fails its check.
"""
import argparse
import collections
import gc
import json
import math
import platform
import re
import statistics
import sys

torch = F = None

P = 0.1
SHAPES = [(4096, 4096), (16384, 16384)]
LINEAR_SHAPES = [(4096, 4096, 4096), (256, 2048, 1024)]  # (M, N, K): batch rows, out features, in features
LINEAR_MATHS = {"fp32": "fp32", "tf32": "tf32", "bf16_autocast": "bf16"}  # row's math -> its peak's precision
PEAK_EXTENT = 8192  # the square GEMM whose rate is the measured peak
ROTATION_L2_MULTIPLE = 2  # data passing through L2 between two uses of one buffer set, in L2 sizes
HOLD_SECONDS = 200e-6  # first length of the spin kernel; doubled while the host falls behind it


class CheckFailed(Exception):
    """A case's output disagrees with the formula; the case is reported and not timed."""


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def peak_gbps():
    """2 x memory clock x bus width, from NVML (pynvml); None where it is not available."""
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        mhz = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)
        bits = pynvml.nvmlDeviceGetMemoryBusWidth(h)
        return 2 * mhz * 1e6 * bits / 8 * 1e-9
    except Exception:  # no pynvml, or an NVML without the call
        return None


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------

class GpuTimer:
    """Times one call on the GPU: a spin kernel (torch.cuda._sleep) holds the stream while the
    host queues the start event, the call and the stop event, so the time between the events is
    the call's kernels alone. When the host took longer than the spin (the start event had
    already passed once the stop event was queued), the spin doubles and the call is redone."""

    def __init__(self):
        self.start = torch.cuda.Event(enable_timing=True)
        self.stop = torch.cuda.Event(enable_timing=True)
        cycles = 10 ** 6
        torch.cuda._sleep(cycles)
        self.start.record()
        torch.cuda._sleep(cycles)
        self.stop.record()
        self.stop.synchronize()
        self.cycles_per_second = cycles / (self.start.elapsed_time(self.stop) * 1e-3)
        self.hold = int(HOLD_SECONDS * self.cycles_per_second)

    def seconds(self, call):
        """(seconds, result) of call()."""
        while True:
            torch.cuda._sleep(self.hold)
            self.start.record()
            out = call()
            self.stop.record()
            late = self.start.query()
            self.stop.synchronize()
            if not late:
                return self.start.elapsed_time(self.stop) * 1e-3, out
            del out
            self.hold *= 2


def median_seconds(timer, run_once, warmup, repetitions, min_time):
    """Median over repetitions of the mean seconds per call; each repetition makes enough calls
    to last min_time. run_once(timer) returns the seconds of its timed part."""
    for _ in range(warmup):
        run_once(timer)
    once = max(run_once(timer), 1e-6)
    calls = max(1, int(min_time / once))
    per_call = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(repetitions):
            per_call.append(sum(run_once(timer) for _ in range(calls)) / calls)
    finally:
        gc.enable()
    return statistics.median(per_call), calls


def rotation_sets(set_bytes, l2_bytes):
    """Sets cycled so that ROTATION_L2_MULTIPLE x L2 of other data passes between two uses of one."""
    return 1 + max(1, math.ceil(ROTATION_L2_MULTIPLE * l2_bytes / set_bytes))


def uniform(*size, bound=1.0):
    return (torch.rand(*size, device="cuda") * 2 - 1) * bound


# ---------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------

ELEMENT_REL_TOL = 1e-5  # an add, a max and a multiply in float: a few ulps apart
COLUMN_SUM_REL_TOL = 1e-4  # db against a double column sum, relative to the sum of |terms|


def check_forward(x, b, y):
    rows = sorted({0, x.shape[0] // 2, x.shape[0] - 1})
    pre = x.detach()[rows].double() + b.detach().double()
    got = y.detach()[rows].double()
    kept = got != 0
    want = pre / (1 - P)
    bad = kept & ((pre <= 0) | ((got - want).abs() > ELEMENT_REL_TOL * want.abs()))
    if bad.any():
        raise CheckFailed(f"{int(bad.sum())} kept elements differ from relu(x + b) / (1 - p)")
    fraction = float((kept & (pre > 0)).sum()) / max(1, int((pre > 0).sum()))
    if abs(fraction - (1 - P)) > 0.05:
        raise CheckFailed(f"keeps {fraction:.3f} of the positive elements, expected {1 - P}")


def check_backward(y, dy, dx, db):
    rows = sorted({0, y.shape[0] // 2, y.shape[0] - 1})
    want = torch.where(y.detach()[rows] > 0, dy[rows].double() / (1 - P), 0.0)
    if ((dx[rows].double() - want).abs() > ELEMENT_REL_TOL * want.abs()).any():
        raise CheckFailed("dx differs from (y > 0 ? dy / (1 - p) : 0)")
    cols = sorted({0, 1, y.shape[1] // 2, y.shape[1] - 1})
    col = dx[:, cols].double()
    if ((db[cols].double() - col.sum(0)).abs() > COLUMN_SUM_REL_TOL * col.abs().sum(0)).any():
        raise CheckFailed("db is not the column sum of dx")


def linear_tol(math_name, k):
    """Tolerance of an element of x W^T + b relative to sum_k |x_k W_nk| + |b_n| (as the C++
    binary's): fp32 K roundings of 2^-24; tensor cores 4 ulps per addition (their own order and
    width) plus the inputs' rounding: TF32 up to 2^-10 per input (truncated), BF16 2^-8."""
    accumulation = (k + 1) * 2.0 ** -22
    if math_name == "fp32":
        return (k + 1) * 2.0 ** -24
    if math_name == "tf32":
        return 2.0 ** -9 + 2.0 ** -20 + accumulation
    return 2.0 ** -7 + 2.0 ** -16 + accumulation


def check_linear(x, w, b, y, math_name):
    """Rows first, middle and last of y against relu(x W^T + b) / (1 - p) in float64 where
    nonzero (bf16 autocast: plus two bf16 roundings of the result, the linear's and dropout's),
    zero where x W^T + b is clearly negative, and the dropped fraction of the clearly positive
    ones p within 0.05. Torch draws its own mask, so masks are not compared with solder's."""
    rows = sorted({0, x.shape[0] // 2, x.shape[0] - 1})
    xr, wd, bd = x.detach()[rows].double(), w.detach().double(), b.detach().double()
    pre = xr @ wd.t() + bd
    band = linear_tol(math_name, x.shape[1]) * (xr.abs() @ wd.abs().t() + bd.abs())
    got = y.detach()[rows].double()
    scale = 1 / (1 - P)
    want = pre.clamp(min=0) * scale
    out_rel = 2.0 ** -7 if math_name == "bf16_autocast" else 0.0
    kept = got != 0
    bad = kept & ((got - want).abs() > band * scale + out_rel * want.abs())
    if bad.any():
        raise CheckFailed(f"{int(bad.sum())} kept elements differ from relu(x W^T + b) / (1 - p)")
    if (kept & (pre < -band)).any():
        raise CheckFailed("nonzero elements where x W^T + b is negative")
    positive = pre > band
    fraction = float((~kept & positive).sum()) / max(1, int(positive.sum()))
    if abs(fraction - P) > 0.05:
        raise CheckFailed(f"drops {fraction:.3f} of the positive elements, expected {P}")


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------

def forward(x, b):
    return F.dropout(F.relu(x + b), p=P, training=True)


def from_output(y, dy):
    g = torch.where(y > 0, dy * (1 / (1 - P)), 0.0)
    return g, g.sum(0)


def linear_forward(x, w, b):
    return F.dropout(torch.relu(F.linear(x, w, b)), p=P, training=True)


def linear_forward_bf16(x, w, b):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return linear_forward(x, w, b)


class Case:
    """setup(l2_bytes) returns (run_once, warm-up calls); run_once(timer) makes one call and
    returns the seconds of its timed part. A case with flops reports TFLOP/s against the peak
    row of its precision instead of GB/s."""

    def __init__(self, name, bytes_moved, shape, setup, flops=None, precision=None):
        self.name, self.bytes, self.shape, self.setup = name, bytes_moved, shape, setup
        self.flops, self.precision = flops, precision


def copy_case(rows, cols):
    moved = 2 * rows * cols * 4

    def setup(l2):
        sets = [uniform(rows, cols) for _ in range(rotation_sets(moved, l2))]
        outs = [torch.empty_like(sets[0]) for _ in sets]
        k = [0]

        def run_once(timer):
            i = k[0] = (k[0] + 1) % len(sets)
            return timer.seconds(lambda: outs[i].copy_(sets[i]))[0]
        return run_once, 2 * len(sets)
    return Case(f"BM_cuda_copy/torch/{rows}x{cols}", moved, (rows, cols), setup)


def fwd_case(impl, rows, cols):
    moved = 2 * rows * cols * 4  # reads x, writes y

    def setup(l2):
        torch.manual_seed(0)
        fn = torch.compile(forward, dynamic=False) if impl == "torch_compile" else forward
        b = uniform(cols, bound=0.5).requires_grad_(True)
        xs = [uniform(rows, cols).requires_grad_(True) for _ in range(rotation_sets(moved, l2))]
        check_forward(xs[0], b, fn(xs[0], b))
        # The outputs of the last len(xs) calls stay alive, so a call's y is not written where
        # the previous call's was (the caching allocator would hand that block straight back).
        outs = collections.deque(maxlen=len(xs))
        k = [0]

        def run_once(timer):
            i = k[0] = (k[0] + 1) % len(xs)
            s, y = timer.seconds(lambda: fn(xs[i], b))
            outs.append(y)
            return s
        return run_once, 2 * len(xs)
    return Case(f"BM_cuda_bias_relu_dropout_fwd/{impl}/{rows}x{cols}", moved, (rows, cols), setup)


def bwd_case(impl, rows, cols):
    moved = 3 * rows * cols * 4  # reads y and dy, writes dx

    def setup(l2):
        torch.manual_seed(0)
        compiled = impl.startswith("torch_compile")
        b = uniform(cols, bound=0.5).requires_grad_(True)
        n = rotation_sets(moved, l2)
        dys = [uniform(rows, cols) for _ in range(n)]
        outs = collections.deque(maxlen=n)
        k = [0]
        if impl.endswith("from_output"):
            fn = torch.compile(from_output, dynamic=False) if compiled else from_output
            with torch.no_grad():
                x = uniform(rows, cols)
                ys = [forward(x, b) for _ in range(n)]  # saved outputs, a mask each
                del x
            check_backward(ys[0], dys[0], *fn(ys[0], dys[0]))

            def run_once(timer):
                i = k[0] = (k[0] + 1) % n
                s, grads = timer.seconds(lambda: fn(ys[i], dys[i]))
                outs.append(grads)
                return s
        else:
            if compiled:
                # The timed call may run again (retain_graph below): a compiled backward that
                # donates its saved buffers refuses that.
                import torch._functorch.config as functorch_config
                functorch_config.donated_buffer = False
            fwd = torch.compile(forward, dynamic=False) if compiled else forward
            xs = [uniform(rows, cols).requires_grad_(True) for _ in range(n)]
            y = fwd(xs[0], b)
            check_backward(y, dys[0], *torch.autograd.grad(y, (xs[0], b), dys[0]))
            del y
            # Written over between the forward and the timed backward, so the forward's outputs
            # are not in L2 (as the saved output of the C++ case is not).
            flush = torch.empty(ROTATION_L2_MULTIPLE * l2 // 4, device="cuda")

            def run_once(timer):
                i = k[0] = (k[0] + 1) % n
                y = fwd(xs[i], b)  # the graph, rebuilt untimed
                flush.zero_()
                # retain_graph: the timer runs the call again when the host fell behind.
                s, grads = timer.seconds(lambda: torch.autograd.grad(y, (xs[i], b), dys[i], retain_graph=True))
                outs.append(grads)
                return s
        return run_once, 2 * n
    return Case(f"BM_cuda_bias_relu_dropout_bwd/{impl}/{rows}x{cols}", moved, (rows, cols), setup)


def peak_case(precision):
    e = PEAK_EXTENT
    size = 2 if precision == "bf16" else 4
    moved = e * e * (2 * size + size)  # reads a and w, writes the product

    def setup(l2):
        torch.manual_seed(0)
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        sets = [(uniform(e, e).to(dtype), uniform(e, e, bound=e ** -0.5).to(dtype))
                for _ in range(rotation_sets(moved, l2))]
        outs = collections.deque(maxlen=len(sets))
        k = [0]

        def run_once(timer):
            i = k[0] = (k[0] + 1) % len(sets)
            a, w = sets[i]
            s, y = timer.seconds(lambda: torch.mm(a, w.t()))
            outs.append(y)
            return s
        return run_once, 2 * len(sets)
    return Case(f"BM_cuda_gemm_peak/torch_{precision}/{e}x{e}x{e}", moved, (e, e, e), setup,
                flops=2 * e ** 3, precision=precision)


def linear_case(math_name, compiled, m, n, k):
    impl = ("torch_compile_" if compiled else "torch_") + math_name
    moved = 4 * (m * k + n * k + n + m * n)  # reads x, W, b, writes y: sizes the rotation

    def setup(l2):
        torch.manual_seed(0)
        torch.backends.cuda.matmul.allow_tf32 = math_name == "tf32"
        fn = linear_forward_bf16 if math_name == "bf16_autocast" else linear_forward
        if compiled:
            torch._dynamo.reset()  # compiled again under this case's allow_tf32
            fn = torch.compile(fn, dynamic=False)
        # x in [-1, 1), W in +-1/sqrt(K) (nn.Linear's range), b in [-0.5, 0.5), as the C++ cases.
        sets = [(uniform(m, k).requires_grad_(True), uniform(n, k, bound=k ** -0.5).requires_grad_(True),
                 uniform(n, bound=0.5).requires_grad_(True)) for _ in range(rotation_sets(moved, l2))]
        check_linear(*sets[0], fn(*sets[0]), math_name)
        # The last len(sets) outputs stay alive, so a call's y is not written where the previous
        # call's was.
        outs = collections.deque(maxlen=len(sets))
        i_ = [0]

        def run_once(timer):
            i = i_[0] = (i_[0] + 1) % len(sets)
            s, y = timer.seconds(lambda: fn(*sets[i]))
            outs.append(y)
            return s
        return run_once, 2 * len(sets)
    return Case(f"BM_cuda_linear_bias_relu_dropout_fwd/{impl}/{m}x{n}x{k}", moved, (m, n, k), setup,
                flops=2 * m * n * k, precision=LINEAR_MATHS[math_name])


def all_cases(compile_too):
    compiled = ["torch_compile"] if compile_too else []
    cases = []
    for rows, cols in SHAPES:
        cases.append(copy_case(rows, cols))  # first: the others compare with its rate
        for impl in ["torch"] + compiled:
            cases.append(fwd_case(impl, rows, cols))
        for impl in ["torch"] + compiled + ["torch_from_output"] + [c + "_from_output" for c in compiled]:
            cases.append(bwd_case(impl, rows, cols))
    cases += [peak_case(p) for p in ["fp32", "tf32", "bf16"]]  # first: the linear rows divide by them
    for m, n, k in LINEAR_SHAPES:
        for compiled in [False] + ([True] if compile_too else []):
            cases += [linear_case(math_name, compiled, m, n, k) for math_name in LINEAR_MATHS]
    return cases


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--filter", default="", help="regex; runs the cases whose name it matches (re.search)")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=0.2, help="seconds per repetition")
    parser.add_argument("--no-compile", action="store_true", help="leave out the torch.compile cases")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    try:
        pattern = re.compile(args.filter)
    except re.error as e:
        parser.error(f"--filter {args.filter!r} is not a regular expression: {e}")
    if args.repetitions < 1 or not args.min_time > 0:
        parser.error("--repetitions must be at least 1 and --min-time positive")

    global torch, F
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print(f"torch_bench.py: PyTorch is not importable from {sys.executable}; nothing measured")
        return 0
    if not torch.cuda.is_available():
        print(f"torch_bench.py: PyTorch {torch.__version__} sees no CUDA device; nothing measured")
        return 0

    cases = [c for c in all_cases(not args.no_compile) if pattern.search(c.name)]
    if not cases:
        print(f"torch_bench.py: no case matches --filter {args.filter!r}", file=sys.stderr)
        return 1
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    peak = peak_gbps()
    timer = GpuTimer()
    context = {"torch": torch.__version__, "cuda": torch.version.cuda, "cuda_device": props.name,
               "cuda_peak_GBps": round(peak) if peak else None, "cuda_l2_MiB": l2 >> 20,
               "cuda_multiprocessors": props.multi_processor_count, "cpu_model": cpu_model(),
               "repetitions": args.repetitions, "min_time": args.min_time}
    for key, value in context.items():
        print(f"{key}: {value}")
    header = f"{'Benchmark':<88} {'Time':>13} {'Iterations':>10}  Counters"
    print(header)
    print("-" * len(header))

    copy_rate, peak_tflops, rows_out, failed = {}, {}, [], 0
    for case in cases:
        error = None
        try:
            run_once, warmup = case.setup(l2)
            seconds, calls = median_seconds(timer, run_once, warmup, args.repetitions, args.min_time)
        except CheckFailed as e:
            error = str(e)
        except Exception as e:  # torch.compile without its toolchain, out of memory: reported, not fatal
            error = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
        run_once = None  # the case's buffers, released before the next case allocates its own
        gc.collect()
        torch.cuda.empty_cache()
        if error is not None:
            print(f"{case.name:<88} ERROR OCCURRED: '{error}'", flush=True)
            failed += 1
            continue
        if case.flops:
            tflops = case.flops / seconds * 1e-12
            if case.name.startswith("BM_cuda_gemm_peak/"):
                peak_tflops[case.precision] = tflops
            values = {"flops": case.flops, "TFLOPs": tflops}
            if case.precision in peak_tflops:
                values["peak_TFLOPs"] = peak_tflops[case.precision]
                values["peak_fraction"] = tflops / peak_tflops[case.precision]
        else:
            gbps = case.bytes / seconds * 1e-9
            if case.name.startswith("BM_cuda_copy/"):
                copy_rate[case.shape] = gbps
            values = {"bytes": case.bytes, "GBps": gbps}
            if case.shape in copy_rate:
                values["copy_GBps"] = copy_rate[case.shape]
                values["roofline"] = gbps / copy_rate[case.shape]
            if peak:
                values["peak_fraction"] = gbps / peak
        shown = "  ".join(f"{key}={value:.4g}" for key, value in values.items())
        print(f"{case.name + '_median':<88} {seconds * 1e6:>10.1f} us {calls:>10}  {shown}", flush=True)
        rows_out.append({"name": case.name, "aggregate": "median", "real_time_us": seconds * 1e6,
                         "iterations": calls, "repetitions": args.repetitions, **values})

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"context": context, "benchmarks": rows_out}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
