#!/usr/bin/env python3
"""bench/cuda/torch_bench.py: the PyTorch peer of solder_bench_cuda_bias_relu_dropout,
solder_bench_cuda_linear_bias_relu_dropout, solder_bench_cuda_digits_train_step and
solder_bench_cuda_conv_bn_relu, on a CUDA device.

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

Digits MLP training step (64 -> 256 -> 128 -> 10, ReLU and dropout 0.1 after the first two; softmax
cross-entropy; AdamW lr 2e-3, weight decay 1e-2), at batch 256 and 1024:

  BM_cuda_train_step/<impl>/digits_mlp/<batch>

  impl  torch_eager                    zero_grad, forward, loss, backward, opt.step() (AdamW's default
                                       implementation); the loss stays on the device
        torch_cuda_graph               the same step captured once in a CUDA graph (capturable AdamW,
                                       static input buffers); a step copies the batch in and replays
        <either>_loss_to_host          the same, then loss.item() every step, as solder's train_step
                                       returns the loss

Timed as the C++ binary times it: CUDA events around bursts of 20 consecutive steps, host work
included (Time is per step). Counters: us_per_step, samples_per_second.

conv3x3 + batch_norm + ReLU in inference (nn.Conv2d without bias, BatchNorm2d in eval mode, ReLU),
C -> C channels, stride 1, padding 1, channels_last, at N x C x H x W = 32x64x56x56 and 32x128x28x28:

  BM_cuda_conv_bn_relu_infer/<impl>_<math>/<N>x<C>x<H>x<W>

  impl  torch_cudnn_channels_last   eager under torch.inference_mode(): cuDNN's convolution, then
                                    batch norm and ReLU
        torch_compile_frozen        torch.compile with torch._inductor.config.freezing = True (the
                                    batch norm folded into the convolution's weights and bias)
  math  fp32    torch.backends.cudnn.allow_tf32 = False (and matmul's)
        tf32    allow_tf32 = True
        bf16    module and input in bfloat16 (y bf16)

Counters: flops (2 N Ho Wo Cout Cin 9), TFLOPs, peak_TFLOPs and peak_fraction as the linear cases,
bytes (x read and y written once) and GBps.

    python3 bench/cuda/torch_bench.py [--filter REGEX] [--repetitions 5] [--min-time 0.2]
        [--no-compile] [--json out.json] [--solder-json solder.json ...]

--solder-json: Google Benchmark JSON files of the C++ binaries (bench/cuda/run.sh passes them);
after its own rows the script prints torch / solder per case of the same family, shape and
precision (above 1: solder's is faster).

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
TRAIN_BATCHES = [256, 1024]
TRAIN_STEPS_PER_BURST = 20  # steps between one pair of events, as the C++ binary's
TRAIN_CHECK_STEPS = 30  # steps on one batch before timing; the loss must fall below this fraction:
TRAIN_CHECK_LOSS_FRACTION = 0.8  # 30 AdamW steps take the loss from 2.30 to 0.53 (256) / 0.61 (1024) of it
ADAMW = {"lr": 2e-3, "weight_decay": 1e-2}  # the demo's (examples/digits_mlp.cpp)
CONV_SHAPES = [(32, 64, 56, 56), (32, 128, 28, 28)]  # N, C (in and out), H, W
CONV_MATHS = ["fp32", "tf32", "bf16"]
BN_EPS = 1e-5


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


def median_seconds(timer, run_once, warmup, repetitions, min_time, steps_per_call=1):
    """Median over repetitions of the mean seconds per call; each repetition makes enough calls
    to last min_time. run_once(timer) returns the seconds of its timed part (per step where one
    call runs steps_per_call steps)."""
    for _ in range(warmup):
        run_once(timer)
    once = max(run_once(timer), 1e-6)
    calls = max(1, int(min_time / (once * steps_per_call)))
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
    row of its precision instead of GB/s; one with neither flops nor bytes its extra counters."""

    def __init__(self, name, bytes_moved, shape, setup, flops=None, precision=None, extra=None):
        self.name, self.bytes, self.shape, self.setup = name, bytes_moved, shape, setup
        self.flops, self.precision = flops, precision
        # extra(seconds): more counters; with neither bytes nor flops, the only ones.
        self.extra = extra
        self.steps_per_call = 1  # a call of run_once runs this many steps and returns seconds per step


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


# ---------------------------------------------------------------------------------------------
# Digits MLP training step
# ---------------------------------------------------------------------------------------------

def digits_mlp():
    nn = torch.nn
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Dropout(0.1), nn.Linear(256, 128), nn.ReLU(),
                         nn.Dropout(0.1), nn.Linear(128, 10)).cuda().train()


def burst_seconds(step, count):
    """Seconds per step of `count` consecutive calls of step(i), between CUDA events, host work
    included (a training loop's rate), as the C++ binary's bursts."""
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(count):
        step(i)
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) * 1e-3 / count


def train_step_case(impl, batch):
    graph = impl.startswith("torch_cuda_graph")
    loss_to_host = impl.endswith("_loss_to_host")

    def setup(l2):
        torch.manual_seed(0)
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 products, as solder's kernels
        model = digits_mlp()
        # x in [0, 1) (the digits' pixels / 16 lie there); labels the index of the largest of the
        # first 10 features, a rule the model learns (the check below), as the C++ binary's.
        n = rotation_sets(batch * (64 * 4 + 8), l2)
        xs = torch.rand(n, batch, 64, device="cuda")
        labels = xs[:, :, :10].argmax(2)
        if graph:
            opt = torch.optim.AdamW(model.parameters(), **ADAMW, capturable=True)
            static_x, static_t = xs[0].clone(), labels[0].clone()
            # PyTorch's recipe for capturing a whole training step: warm up on a side stream,
            # grads set to None before capture so the graph allocates them in its pool.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    opt.zero_grad(set_to_none=True)
                    F.cross_entropy(model(static_x), static_t).backward()
                    opt.step()
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            opt.zero_grad(set_to_none=True)
            with torch.cuda.graph(g):
                static_loss = F.cross_entropy(model(static_x), static_t)
                static_loss.backward()
                opt.step()

            def step(k):
                static_x.copy_(xs[k])
                static_t.copy_(labels[k])
                g.replay()
                return static_loss
        else:
            opt = torch.optim.AdamW(model.parameters(), **ADAMW)

            def step(k):
                opt.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(xs[k]), labels[k])
                loss.backward()
                opt.step()
                return loss
        timed_step = (lambda k: step(k).item()) if loss_to_host else step

        # Check: the steps train. On one batch, the loss must fall well below its first value.
        first = step(0).item()
        for _ in range(TRAIN_CHECK_STEPS - 2):
            step(0)
        last = step(0).item()
        if not (math.isfinite(first) and last < TRAIN_CHECK_LOSS_FRACTION * first):
            raise CheckFailed(f"loss {first:.4f} -> {last:.4f} after {TRAIN_CHECK_STEPS} steps on one batch: not training")
        k = [0]

        def run_once(timer):
            def one(_):
                timed_step(k[0])
                k[0] = (k[0] + 1) % n
            return burst_seconds(one, TRAIN_STEPS_PER_BURST)
        return run_once, math.ceil(n / TRAIN_STEPS_PER_BURST)  # warm-up: every batch once

    extra = lambda s: {"us_per_step": s * 1e6, "samples_per_second": batch / s}
    case = Case(f"BM_cuda_train_step/{impl}/digits_mlp/{batch}", None, (batch,), setup, extra=extra)
    case.steps_per_call = TRAIN_STEPS_PER_BURST
    return case


# ---------------------------------------------------------------------------------------------
# conv3x3 + batch_norm + ReLU, inference
# ---------------------------------------------------------------------------------------------

# An element of y against the float64 unfolded layer, relative to its magnitude sum |x W'| + |b'|:
# the product's tolerance (linear_tol, K = 9 C), plus 2^-10 for cuDNN's choice of algorithm
# (Winograd and FFT convolutions round their transforms too), plus for bf16 two roundings of
# intermediates to bf16 (the convolution's output and the batch norm's), 2^-8 each.
CONV_ALGORITHM_TOL = 2.0 ** -10
CONV_BF16_INTERMEDIATE_TOL = 2.0 ** -7


def conv_bn_relu(c):
    nn = torch.nn
    torch.manual_seed(0)
    conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
    bn = nn.BatchNorm2d(c, eps=BN_EPS)
    bound = (9 * c) ** -0.5
    with torch.no_grad():
        # As the C++ binary: W in +-1/sqrt(9 C), gamma in [0.5, 1.5), beta in [-0.5, 0.5),
        # running mean in [-0.2, 0.2), running var in [0.5, 2).
        conv.weight.uniform_(-bound, bound)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
        bn.running_mean.uniform_(-0.2, 0.2)
        bn.running_var.uniform_(0.5, 2.0)
    return nn.Sequential(conv, bn, nn.ReLU()).cuda().eval()


def check_conv(model, x, y, math_name):
    """Image 0 of y against the float64 unfolded layer: relu((conv(x, W) - mean) g / sqrt(var +
    eps) + beta), within the tolerance above of sum |x W'| + |b'|."""
    conv, bn = model[0], model[1]
    x0 = x[:1].double()
    w = conv.weight.detach().double()
    scale = bn.weight.detach().double() / torch.sqrt(bn.running_var.double() + BN_EPS)
    shift = bn.bias.detach().double() - bn.running_mean.double() * scale
    z = F.conv2d(x0, w, padding=1)
    want = (z * scale[None, :, None, None] + shift[None, :, None, None]).clamp(min=0)
    magnitude = F.conv2d(x0.abs(), w.abs(), padding=1) * scale.abs()[None, :, None, None] + shift.abs()[None, :, None, None]
    tol = linear_tol(math_name, 9 * x.shape[1]) + CONV_ALGORITHM_TOL
    if math_name == "bf16":
        tol += CONV_BF16_INTERMEDIATE_TOL
    bad = (y[:1].double() - want).abs() > tol * magnitude
    if bad.any():
        raise CheckFailed(f"{int(bad.sum())} elements of image 0 differ from relu(batch_norm(conv2d(x, W)))")


def conv_case(impl, math_name, n, c, h, w):
    compiled = impl == "torch_compile_frozen"
    size = 2 if math_name == "bf16" else 4
    moved = size * n * c * h * w * 2  # x read, y written (Ho = H, Wo = W)

    def setup(l2):
        torch.backends.cudnn.allow_tf32 = math_name == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = math_name == "tf32"
        dtype = torch.bfloat16 if math_name == "bf16" else torch.float32
        model = conv_bn_relu(c).to(dtype=dtype, memory_format=torch.channels_last)
        xs = [torch.empty(n, c, h, w, device="cuda").uniform_(-1, 1).to(dtype=dtype, memory_format=torch.channels_last)
              for _ in range(rotation_sets(moved, l2))]
        fn = model
        with torch.inference_mode():
            if compiled:
                import torch._inductor.config as inductor_config
                torch._dynamo.reset()  # compiled again under this case's flags
                fn = torch.compile(model, dynamic=False)
                with inductor_config.patch(freezing=True):
                    y = fn(xs[0])  # the compilation, with the batch norm folded
            else:
                y = fn(xs[0])
        check_conv(model, xs[0], y, math_name)
        outs = collections.deque(maxlen=len(xs))
        k = [0]

        def run_once(timer):
            i = k[0] = (k[0] + 1) % len(xs)
            with torch.inference_mode():  # entered outside the clock, as a server enters it once
                s, y = timer.seconds(lambda: fn(xs[i]))
            outs.append(y)
            return s
        return run_once, 2 * len(xs)

    extra = lambda s: {"bytes": moved, "GBps": moved / s * 1e-9}
    return Case(f"BM_cuda_conv_bn_relu_infer/{impl}_{math_name}/{n}x{c}x{h}x{w}", moved, (n, c, h, w), setup,
                flops=2 * n * h * w * c * c * 9, precision=math_name, extra=extra)


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
    for batch in TRAIN_BATCHES:
        cases += [train_step_case(impl, batch) for impl in
                  ["torch_eager", "torch_eager_loss_to_host", "torch_cuda_graph", "torch_cuda_graph_loss_to_host"]]
    for shape in CONV_SHAPES:
        for impl in ["torch_cudnn_channels_last"] + (["torch_compile_frozen"] if compile_too else []):
            cases += [conv_case(impl, math_name, *shape) for math_name in CONV_MATHS]
    return cases


# ---------------------------------------------------------------------------------------------
# torch / solder
# ---------------------------------------------------------------------------------------------

TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
PRECISIONS = {"fp32", "tf32", "bf16"}


def split_name(name):
    """(family, impl, shape) of BM_<family>/<impl>/<shape...>; C++ names without an impl
    (BM_cuda_copy/4096x4096) are solder's."""
    parts = name.split("/manual_time")[0].split("/")
    if len(parts) == 2:
        return parts[0], "solder", parts[1]
    return parts[0], parts[1], "/".join(parts[2:])


def precision_of(impl):
    return next((t for t in impl.split("_") if t in PRECISIONS), None)


def solder_seconds(paths):
    """name -> seconds per call of the solder rows in Google Benchmark JSON files: the medians
    where the run has aggregates, else the mean of the runs."""
    medians, runs = {}, collections.defaultdict(list)
    for path in paths:
        with open(path) as f:
            rows = json.load(f).get("benchmarks", [])
        for row in rows:
            if row.get("error_occurred"):
                continue
            name = row.get("run_name", row["name"])
            if not split_name(name)[1].startswith("solder"):
                continue
            seconds = row["real_time"] * TIME_UNITS[row.get("time_unit", "ns")]
            if row.get("run_type") == "aggregate":
                if row.get("aggregate_name") == "median":
                    medians[name] = seconds
            else:
                runs[name].append(seconds)
    for name, values in runs.items():
        medians.setdefault(name, statistics.mean(values))
    return medians


def print_ratios(torch_rows, paths):
    """torch / solder for every torch row and every solder row of the same family and shape whose
    precision agrees (or either has none)."""
    try:
        solder = solder_seconds(paths)
    except (OSError, ValueError, KeyError) as e:
        print(f"torch_bench.py: reading {paths}: {e}; no ratios", file=sys.stderr)
        return
    lines = []
    for row in torch_rows:
        family, impl, shape = split_name(row["name"])
        for name, seconds in sorted(solder.items()):
            s_family, s_impl, s_shape = split_name(name)
            if (s_family, s_shape) != (family, shape):
                continue
            p, q = precision_of(impl), precision_of(s_impl)
            if p and q and p != q:
                continue
            ratio = row["real_time_us"] * 1e-6 / seconds
            lines.append(f"{family + '/' + shape:<52} {impl:<34} {s_impl:<26} {ratio:>8.3f}")
    if lines:
        print()
        print(f"{'torch / solder (time; above 1: solder is faster)':<52} {'torch':<34} {'solder':<26} {'ratio':>8}")
        for line in lines:
            print(line)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--filter", default="", help="regex; runs the cases whose name it matches (re.search)")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=0.2, help="seconds per repetition")
    parser.add_argument("--no-compile", action="store_true", help="leave out the torch.compile cases")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--solder-json", action="append", default=[], metavar="FILE",
                        help="a C++ binary's --benchmark_out JSON; prints torch / solder per matching case (repeatable)")
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
            seconds, calls = median_seconds(timer, run_once, warmup, args.repetitions, args.min_time,
                                            case.steps_per_call)
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
        if case.flops is None and case.bytes is None:
            values = {}
        elif case.flops:
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
        if case.extra:
            values.update(case.extra(seconds))
        shown = "  ".join(f"{key}={value:.4g}" for key, value in values.items())
        print(f"{case.name + '_median':<88} {seconds * 1e6:>10.1f} us {calls:>10}  {shown}", flush=True)
        rows_out.append({"name": case.name, "aggregate": "median", "real_time_us": seconds * 1e6,
                         "iterations": calls, "repetitions": args.repetitions, **values})

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"context": context, "benchmarks": rows_out}, f, indent=1)
    if args.solder_json:
        print_ratios(rows_out, args.solder_json)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
