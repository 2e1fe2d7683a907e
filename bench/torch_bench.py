#!/usr/bin/env python3
"""torch_bench.py: the PyTorch peer of solder_bench, same case names and counters.

Cases (impl `torch` unless named), `/threads:<n>` appended when n > 1:

  BM_bias_relu_dropout_<fwd|bwd>/<torch|torch_compile>/<B>x<N>   y = dropout(relu(x + b)); GBps
  BM_linear_bias_relu_fwd/<torch|torch_jit|torch_compile>/<M>x<N>x<K>   y = relu(x W^T + b); GFLOPs
  BM_linear_bias_relu_dropout_<fwd|bwd>/<torch|torch_compile>/<M>x<N>x<K>
      y = dropout(relu(x W^T + b)); GFLOPs
  BM_train_step/<torch|torch_compile>/digits_mlp/<batch>   AdamW step of a 64-256-128-10 MLP
  BM_inference/<torch|torch_inference_mode|torch_compile>/digits_mlp/<batch>
  BM_sketched_linear_fwd/<impl>/<B>x<In>x<Out>_L<L>_k<k>   one thread only; GFLOPs, param_bytes
      y = 1/(2L) sum_i (x S1_i U1_i + x U2_i S2_i) + b, impl: torch_panther (Panther's bmm
      forward), torch_two_gemm (x [S1 | U2] [U1; S2], one addmm), torch_compile_panther and
      torch_compile_two_gemm (torch.compile, Inductor, where torch has it), torch_dense (F.linear)
  BM_conv_bn_relu_infer/<impl>/<N>x64x56x56                one thread only; GFLOPs
      y = relu(batch_norm(conv3x3(x))), 64 -> 64 channels, eval mode, N = 32 and 1
  BM_depthwise_separable/<impl>/32x64x56x56                one thread only; GFLOPs
      depthwise 3x3 + batch_norm + ReLU, then 1x1 64 -> 128 + batch_norm + ReLU, eval mode;
      impl of both: torch_eager_unfolded (the three modules, NCHW), torch_folded_channels_last
      (batch_norm folded into the convolution's weights, channels_last memory),
      torch_compile_frozen (torch.compile with Inductor's freezing, where torch has it)

`torch_compile` is the `torch` row's code under torch.compile (Inductor, default mode), where
this torch has it; each case resets Dynamo and compiles its own static shapes, prints the first
call's time (the compilation) in a `note:` line and checks the compiled output before timing:
  - training rows (bias_relu_dropout, linear_bias_relu_dropout): the forward function compiled;
    AOTAutograd compiles its backward too, which the bwd rows time. Compiled dropout draws
    another mask than eager, so the check is the formula: every nonzero equals the float64
    relu(...) / (1 - p), the dropped fraction of the positive outputs is p within 0.05, and
    the gradients follow the compiled forward's own mask.
  - inference rows (linear_bias_relu_fwd, inference): the module compiled under no_grad with
    Inductor's freezing (weights become constants it can prepack, as torch_compile_frozen).
  - train_step: the model's forward with the loss compiled (its backward through AOTAutograd)
    and AdamW's step compiled on its own (torch.compile(opt.step), PyTorch's recipe for
    compiling an optimizer); zero_grad stays eager. So the whole step runs compiled code, as
    two graphs: torch.compile does not trace loss.backward() into the forward's graph.

Dropout p = 0.1 in training mode. Each row is the median over repetitions of the mean time per
call (bench/README.md states what each case times). Run it with PyTorch 2.x from PyPI in the
virtual environment bench/torch_venv.sh makes (build/torch-venv):

    bench/torch_venv.sh    # once
    build/torch-venv/bin/python bench/torch_bench.py [--threads 1 [2 ...]] [--filter REGEX]
        [--repetitions 5] [--min-time 0.2] [--json out.json]

It also runs under Debian's python3-torch (1.13), which imports only under /usr/bin/python3:
`/usr/bin/python3 bench/torch_bench.py ...` (no torch_compile cases there).

Without torch it says so and exits 0, so scripts that run every bench keep going. It exits 1
when a case's output fails its check (that case is reported and not timed) or the filter
matches nothing.
"""
import argparse
import contextlib
import ctypes
import gc
import json
import math
import os
import re
import statistics
import sys
import time
import warnings

torch = F = None  # imported by load_torch, after the OpenMP environment is set

P = 0.1  # dropout probability of every dropout case
# bias_relu_dropout (B, N, threads), as solder_bench registers them: 4 MiB per array
# (cache-resident), 64 MiB per array (beyond cache), the latter also on 2 threads.
BIAS_RELU_DROPOUT_CASES = [(256, 4096, 1), (4096, 4096, 1), (4096, 4096, 2)]
LINEAR_SHAPES = [(64, 1024, 1024), (256, 1024, 2048), (1024, 4096, 4096)]  # (M, N, K), as gemm.bench.cpp
TRAIN_BATCHES = [32, 256]
INFERENCE_BATCHES = [1, 256]
CHECK_STEPS = 30  # training steps of the train-step check
# sketched linear (B, In, Out, L, k), as sketched.bench.cpp registers them (Panther's configurations)
SKETCHED_CONFIGS = ([(256, 2048, 1024, 8, 128)]
                    + [(256, 1024, 512, terms, k) for terms in (2, 4, 8) for k in (16, 32, 64)]
                    + [(256, 4096, 4096, 1, 16)])
CONV_BATCHES = [32, 1]  # N of BM_conv_bn_relu_infer, as conv.bench.cpp registers them
SEPARABLE_BATCH = 32
CONV_IMPLS = ["torch_eager_unfolded", "torch_folded_channels_last", "torch_compile_frozen"]


class CheckFailed(Exception):
    """A case's output disagrees with its reference; the case is reported and not timed."""


class Unavailable(Exception):
    """A case this torch cannot run (torch.compile failing, for one): reported and not timed, not a
    failure."""


class Case:
    """One benchmark row. setup() builds the data (only for cases the filter selects) and returns
    (run_once, counters): run_once() makes one call and returns the seconds of its timed part;
    counters(seconds per call) returns the rate counters to print."""

    def __init__(self, name, threads, setup):
        self.name, self.threads, self.setup = name, threads, setup


def cpu_has_avx512f():
    """Whether /proc/cpuinfo lists avx512f (False where there is no /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx512f" in line for line in f)
    except OSError:
        return False


def load_torch(max_threads):
    """Sets the OpenMP environment that libgomp reads once when torch loads it, then imports
    torch. Returns a line describing that environment, or None when torch is not importable."""
    global torch, F
    # On 2 threads torch's OpenMP team and OpenBLAS's own pthreads share the cores; spinning
    # OpenMP threads (libgomp's default, or ACTIVE) starve the GEMM's workers, 3-30x slower
    # here. Sleeping ones cost nothing at these sizes. One already set wins, to show the default.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env = f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}"
    if max_threads > 1 and os.environ.get("OMP_PROC_BIND", "false").lower() != "false":
        # libgomp pins the main thread when it loads, and OpenBLAS's workers, created next,
        # inherit that one core: both threads of a 2-thread GEMM would share it.
        os.environ.pop("OMP_PROC_BIND")
        os.environ.pop("OMP_PLACES", None)
        env += ", OMP_PROC_BIND/OMP_PLACES dropped (they pin OpenBLAS's threads to one core)"
    # OpenBLAS 0.3.21 picks its kernels from the CPU model when it loads, and on a model it
    # does not know (this host's family 6 model 207) it runs its Prescott (SSE3) kernels, about a
    # fifth of its AVX-512 speed. SkylakeX's are its AVX-512 ones. One already set wins.
    if "OPENBLAS_CORETYPE" not in os.environ and cpu_has_avx512f():
        os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"
        env += ", OPENBLAS_CORETYPE=SkylakeX"
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    return env


def threads_suffix(threads):
    return f"/threads:{threads}" if threads > 1 else ""


# ---------------------------------------------------------------------------------------------
# Threads: torch.set_num_threads does not reach OpenBLAS
# ---------------------------------------------------------------------------------------------

def loaded_openblas():
    """The OpenBLAS that torch loaded, or None. Debian's torch runs its float GEMMs through
    OpenBLAS (pthreads build), whose own pool starts with one thread per core and which
    torch.set_num_threads leaves alone: without this, "1-thread" GEMMs use every core. PyPI's
    torch runs them through its own MKL, which follows torch.set_num_threads; the OpenBLAS that
    numpy loads next to it is not torch's."""
    if torch.backends.mkl.is_available():
        return None
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line and ".so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
            if hasattr(lib, "openblas_set_num_threads"):
                return lib, path
        except OSError:
            continue
    return None


def set_threads(threads, openblas):
    torch.set_num_threads(threads)
    if openblas is not None:
        openblas[0].openblas_set_num_threads(threads)


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------

def median_seconds(run_once, repetitions, min_time):
    """Median over `repetitions` of the mean seconds per call; each repetition makes enough calls
    to last min_time. run_once() returns the seconds of its timed part. Python's garbage
    collector is off while timing (as in timeit): tensors are freed by reference count."""
    for _ in range(3):  # warm-up: allocator caches, thread pool, first-touch of outputs
        run_once()
    once = max(run_once(), 1e-6)
    calls = max(1, int(min_time / once))
    per_call = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(repetitions):
            total = sum(run_once() for _ in range(calls))
            per_call.append(total / calls)
    finally:
        gc.enable()
    return statistics.median(per_call), calls


def timed(fn):
    """run_once for a case that times the whole call; the result is released after the clock."""
    def run_once():
        t0 = time.perf_counter()
        out = fn()
        t1 = time.perf_counter()
        del out
        return t1 - t0
    return run_once


def uniform(*size, bound=1.0):
    return (torch.rand(*size) * 2 - 1) * bound


def compile_warm(fn, first_call, name, notes, freezing=False, warm_calls=5, reset=True):
    """torch.compile(fn) (Inductor, default mode), compiled and warmed up. Dynamo's caches are
    reset first: each case compiles its own static shapes, instead of recompiling one cached
    function with dynamic shapes (or past Dynamo's recompile limit). first_call(compiled) makes
    one call as the case will (a forward, or a forward and its backward, so that AOTAutograd's
    backward is compiled too); the first one's time, the compilation, goes into notes, then
    warm_calls more follow. freezing: compiled under no_grad with Inductor's freezing, so
    parameters become constants it folds and prepacks (inference); the compiled graph is reused
    under no_grad after the patch ends. reset=False keeps the functions a case compiled before
    this one. Raises Unavailable where this torch cannot compile."""
    if not hasattr(torch, "compile"):
        raise Unavailable("this torch has no torch.compile")
    if reset:
        torch._dynamo.reset()
    compiled = torch.compile(fn)
    grad_mode = torch.no_grad if freezing else contextlib.nullcontext
    t0 = time.perf_counter()
    try:
        if freezing:
            from torch._inductor import config as inductor_config
            with inductor_config.patch(freezing=True), torch.no_grad():
                first_call(compiled)
        else:
            first_call(compiled)
    except Exception as e:  # Inductor needs a working C++ compiler and Python headers
        first_line = str(e).splitlines()[0] if str(e) else ""
        what = "torch.compile with freezing" if freezing else "torch.compile"
        raise Unavailable(f"{what} failed: {type(e).__name__}: {first_line}")
    notes.append(f"{name}: first call (compile) {time.perf_counter() - t0:.1f} s")
    with grad_mode():
        for _ in range(warm_calls):
            first_call(compiled)
    return compiled


# ---------------------------------------------------------------------------------------------
# Checks against float64 references (a wrong result must not get a time)
# ---------------------------------------------------------------------------------------------

# float32 dot products of length K: each term rounds with relative error 2^-24 and the sum
# accumulates at most K of them; 1e-5 of sum|x_k w_k| covers any summation order up to K = 4096
# with margin (measured: at most 1.3e-7 of it, at 64x1024x1024 and 1024x4096x4096).
DOT_TOL = 1e-5


def check_close(what, got, ref, scale):
    """|got - ref| <= DOT_TOL * scale + 1e-30 elementwise, all float64; NaN fails."""
    err = (got.double() - ref).abs()
    bound = DOT_TOL * scale + 1e-30
    bad = ~(err <= bound)
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        raise CheckFailed(f"{what}: element {i} is {got.flatten()[i].item():.7g}, "
                          f"reference {ref.flatten()[i].item():.7g}")


def check_dropout_rows(got, pre, scale):
    """got = dropout(relu(pre)) for float64 pre and |.|-sums scale of the same rows: every
    nonzero equals relu(pre) / (1 - p) within DOT_TOL * scale / (1 - p) (so nothing is kept
    where pre <= 0), and the dropped fraction of the clearly positive outputs is p within 0.05
    (about 6 standard deviations at 3 rows of 1024). The mask itself is not compared: eager and
    compiled dropout draw different ones."""
    ref = pre.clamp_min(0)
    kept = got != 0
    check_close("kept y", got[kept], ref[kept] / (1 - P), scale[kept] / (1 - P))
    positive = pre > DOT_TOL * scale  # clearly positive: relu keeps them unless dropped
    if not positive.any():
        raise CheckFailed("no positive pre-activation in the checked rows")
    dropped = float((~kept & positive).sum()) / max(1, int(positive.sum()))
    if abs(dropped - P) > 0.05:
        raise CheckFailed(f"dropped fraction {dropped:.3f} of positive outputs, expected {P}")


def check_linear_rows(y, x, w, b, dropout):
    """Rows first, middle, last of y against relu(x W^T + b) in float64; with dropout as
    check_dropout_rows."""
    rows = sorted({0, y.shape[0] // 2, y.shape[0] - 1})
    xr, w64 = x.detach()[rows].double(), w.detach().double()
    pre = xr @ w64.T + b.detach().double()
    scale = xr.abs() @ w64.abs().T + b.detach().double().abs()
    got = y.detach()[rows]
    if not dropout:
        check_close("y", got, pre.clamp_min(0), scale)
        return
    check_dropout_rows(got, pre, scale)


def check_bias_relu_dropout(y, x, b):
    """Rows first, middle, last of y = dropout(relu(x + b)) as check_dropout_rows."""
    rows = sorted({0, y.shape[0] // 2, y.shape[0] - 1})
    xr, b64 = x.detach()[rows].double(), b.detach().double()
    check_dropout_rows(y.detach()[rows], xr + b64, xr.abs() + b64.abs())


def check_bias_relu_dropout_grads(y, dy, dx, db):
    """dx (rows first, middle, last) and db (four columns) of y = dropout(relu(x + b)) in
    float64 from the forward's own mask: dx = dy / (1 - p) where y != 0, db its column sums."""
    rows = sorted({0, y.shape[0] // 2, y.shape[0] - 1})
    gate = lambda r, c: (y.detach()[r][:, c] != 0).double() / (1 - P)
    every = slice(None)
    check_close("dx", dx[rows], dy[rows].double() * gate(rows, every), dy[rows].double().abs() / (1 - P))
    cols = sorted({0, y.shape[1] // 3, y.shape[1] // 2, y.shape[1] - 1})
    g = dy[:, cols].double() * gate(every, cols)
    check_close("db", db[cols], g.sum(0), g.abs().sum(0))


def check_linear_grads(y, dy, x, w, grads):
    """dx, dW, db of y = dropout(relu(x W^T + b)) in float64 from the forward's own mask: the
    gradient reaching x W^T + b is dy / (1 - p) exactly where y != 0 (kept and positive)."""
    dx, dw, db = grads
    g = dy.double() * (y.detach() != 0).double() / (1 - P)  # [M, N]
    x64, w64 = x.detach().double(), w.detach().double()
    rows = sorted({0, x.shape[0] // 2, x.shape[0] - 1})
    check_close("dx", dx[rows], g[rows] @ w64, g[rows].abs() @ w64.abs())
    cols = sorted({0, w.shape[0] // 2, w.shape[0] - 1})
    check_close("dW", dw[cols], g[:, cols].T @ x64, g[:, cols].T.abs() @ x64.abs())
    check_close("db", db[cols], g[:, cols].sum(0), g[:, cols].abs().sum(0))


# ---------------------------------------------------------------------------------------------
# bias_relu_dropout: y = dropout(relu(x + b)), memory-bound
# ---------------------------------------------------------------------------------------------

def bias_relu_dropout(x, b):
    return F.dropout(F.relu(x + b), p=P, training=True)


def bias_relu_dropout_case(impl, direction, rows, cols, threads, notes):
    # Bytes per pass as in the C++ bench: fwd reads x, writes y; bwd reads dy and the saved
    # activation, writes dx. Bias, db and the stored mask are not counted.
    moved = (2 if direction == "fwd" else 3) * rows * cols * 4
    name = f"BM_bias_relu_dropout_{direction}/{impl}/{rows}x{cols}{threads_suffix(threads)}"

    def setup():
        torch.manual_seed(0)
        # Inputs that require grad, as activations do in training: the forward also records
        # the graph and keeps dropout's mask, which is part of its cost there.
        x = uniform(rows, cols).requires_grad_(True)
        b = uniform(cols, bound=0.5).requires_grad_(True)
        dy = uniform(rows, cols)
        forward = bias_relu_dropout
        if impl == "torch_compile":
            forward = compile_warm(bias_relu_dropout, lambda f: torch.autograd.grad(f(x, b), (x, b), dy),
                                   name, notes)
        y = forward(x, b)
        check_bias_relu_dropout(y, x, b)
        check_bias_relu_dropout_grads(y, dy, *torch.autograd.grad(y, (x, b), dy))
        del y
        if direction == "fwd":
            run_once = timed(lambda: forward(x, b))
        else:
            def run_once():
                y = forward(x, b)  # graph rebuilt, untimed
                t0 = time.perf_counter()
                dx, db = torch.autograd.grad(y, (x, b), dy)
                t1 = time.perf_counter()
                del y, dx, db
                return t1 - t0
        return run_once, lambda s: {"GBps": moved / s * 1e-9}

    return Case(name, threads, setup)


# ---------------------------------------------------------------------------------------------
# linear + bias + relu (+ dropout): compute-bound
# ---------------------------------------------------------------------------------------------

def linear_data(m, n, k, requires_grad):
    """x [M, K] in [-1, 1); W [N, K] and b [N] in +-1/sqrt(K), torch.nn.Linear's init range."""
    torch.manual_seed(0)
    bound = 1 / math.sqrt(k)
    x, w, b = uniform(m, k), uniform(n, k, bound=bound), uniform(n, bound=bound)
    return [t.requires_grad_(requires_grad) for t in (x, w, b)]


def linear_relu_module(w, b):
    """relu(x W^T + b) as an eval-mode module, so freezing (TorchScript's or Inductor's) turns W
    and b into graph constants."""
    class LinearReLU(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(w, requires_grad=False)
            self.bias = torch.nn.Parameter(b, requires_grad=False)

        def forward(self, x):
            return F.relu(F.linear(x, self.weight, self.bias))

    return LinearReLU().eval()


def jit_linear_relu(w, b, x):
    """TorchScript: scripted, frozen, fusers on where this build has them. Returns the callable
    and a line saying what its optimized graph runs (the profiling executor specializes after a
    few calls, which this makes)."""
    fusers = []
    if hasattr(torch.jit, "enable_onednn_fusion"):  # oneDNN Graph: the CPU fuser that takes linear
        torch.jit.enable_onednn_fusion(True)
        fusers.append("oneDNN Graph " + ("on" if torch._C._jit_llga_enabled() else "not in this build"))
    with warnings.catch_warnings():  # torch 2.x deprecates TorchScript with a FutureWarning
        warnings.simplefilter("ignore", FutureWarning)
        fn = torch.jit.freeze(torch.jit.script(linear_relu_module(w, b)))
    with torch.no_grad():
        for _ in range(5):
            fn(x)
    ops = [node.kind() for node in torch.jit.last_executed_optimized_graph().nodes()
           if node.kind() != "prim::Constant"]
    # NNC (TensorExpr) fuses elementwise ops only, and on the CPU only with LLVM compiled in.
    fusers.append("NNC CPU fusion " + ("on" if torch._C._jit_can_fuse_on_cpu() else "off"))
    return fn, f"graph runs {', '.join(ops)}; {', '.join(fusers)}"


def linear_fwd_case(impl, m, n, k, threads, notes):
    def setup():
        x, w, b = linear_data(m, n, k, requires_grad=False)
        if impl == "torch":
            fn = lambda: F.relu(F.linear(x, w, b))
        elif impl == "torch_jit":
            jitted, note = jit_linear_relu(w, b, x)
            fn = lambda: jitted(x)
            notes.append(f"{name}: {note}")
        else:
            compiled = compile_warm(linear_relu_module(w, b), lambda f: f(x), name, notes, freezing=True)
            fn = lambda: compiled(x)
        with torch.no_grad():  # inference, as the C++ peers: no graph recorded
            check_linear_rows(fn(), x, w, b, dropout=False)

        def run_once():
            with torch.no_grad():
                return timed(fn)()
        return run_once, lambda s: {"GFLOPs": 2 * m * n * k / s * 1e-9}

    name = f"BM_linear_bias_relu_fwd/{impl}/{m}x{n}x{k}{threads_suffix(threads)}"
    return Case(name, threads, setup)


def linear_relu_dropout(x, w, b):
    return F.dropout(F.relu(F.linear(x, w, b)), p=P, training=True)


def linear_dropout_case(impl, direction, m, n, k, threads, notes):
    flops = (2 if direction == "fwd" else 4) * m * n * k  # bwd: dx = g W and dW = g^T x
    name = f"BM_linear_bias_relu_dropout_{direction}/{impl}/{m}x{n}x{k}{threads_suffix(threads)}"

    def setup():
        # Training: x, W and b require grad, so the forward records the graph and keeps the mask.
        x, w, b = linear_data(m, n, k, requires_grad=True)
        dy = uniform(m, n)
        fn = linear_relu_dropout
        if impl == "torch_compile":
            fn = compile_warm(linear_relu_dropout, lambda f: torch.autograd.grad(f(x, w, b), (x, w, b), dy),
                              name, notes)
        forward = lambda: fn(x, w, b)
        y = forward()
        check_linear_rows(y, x, w, b, dropout=True)
        check_linear_grads(y, dy, x, w, torch.autograd.grad(y, (x, w, b), dy))
        del y
        if direction == "fwd":
            run_once = timed(forward)
        else:
            def run_once():
                y = forward()  # graph rebuilt, untimed
                t0 = time.perf_counter()
                grads = torch.autograd.grad(y, (x, w, b), dy)
                t1 = time.perf_counter()
                del y, grads
                return t1 - t0
        return run_once, lambda s: {"GFLOPs": flops / s * 1e-9}

    return Case(name, threads, setup)


# ---------------------------------------------------------------------------------------------
# digits MLP: a whole training step and inference
# ---------------------------------------------------------------------------------------------

def digits_mlp():
    """64 -> 256 -> 128 -> 10, ReLU and dropout 0.1 between, torch.nn defaults for the init."""
    torch.manual_seed(0)
    nn = torch.nn
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Dropout(P),
                         nn.Linear(256, 128), nn.ReLU(), nn.Dropout(P), nn.Linear(128, 10))


def digits_data(batch):
    torch.manual_seed(1)
    return uniform(batch, 64), torch.randint(0, 10, (batch,))


def mlp_reference(model, x):
    """The eval-mode forward in float64 (dropout is the identity there)."""
    h = x.double()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            h = h @ layer.weight.detach().double().T + layer.bias.detach().double()
        elif isinstance(layer, torch.nn.ReLU):
            h = h.clamp_min(0)
    return h


def train_step_case(impl, batch, threads, notes):
    name = f"BM_train_step/{impl}/digits_mlp/{batch}{threads_suffix(threads)}"

    def setup():
        model = digits_mlp()
        x, labels = digits_data(batch)
        loss_fn = torch.nn.CrossEntropyLoss()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-2)
        forward_loss = lambda x, labels: loss_fn(model(x), labels)
        opt_step = opt.step
        if impl == "torch_compile":
            # The forward with its loss, and the optimizer step, each compiled. Compiling runs
            # forwards and backwards and one AdamW step; the check below starts after them.
            def first_call(f):
                opt.zero_grad(set_to_none=True)
                f(x, labels).backward()
            forward_loss = compile_warm(forward_loss, first_call, f"{name} (forward and loss)", notes)
            opt_step = compile_warm(opt.step, lambda f: f(), f"{name} (AdamW step)", notes,
                                    warm_calls=0, reset=False)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = forward_loss(x, labels)
            loss.backward()
            opt_step()
            return loss

        # Check: the steps train. Eval-mode loss on the batch (no dropout noise) must fall.
        eval_loss = lambda: loss_fn(mlp_reference(model, x), labels).item()
        before = eval_loss()
        model.train()
        for _ in range(CHECK_STEPS):
            step()
        after = eval_loss()
        if not after < before:
            raise CheckFailed(f"loss {before:.4f} -> {after:.4f} after {CHECK_STEPS} steps: not training")
        return timed(step), lambda s: {"samples_per_second": batch / s}

    return Case(name, threads, setup)


def inference_case(impl, batch, threads, notes):
    name = f"BM_inference/{impl}/digits_mlp/{batch}{threads_suffix(threads)}"

    def setup():
        model = digits_mlp().eval()
        x, _ = digits_data(batch)
        grad_off = torch.inference_mode if impl == "torch_inference_mode" else torch.no_grad
        run = model
        if impl == "torch_compile":
            run = compile_warm(model, lambda f: f(x), name, notes, freezing=True)
        with grad_off():
            y = run(x)
        ref = mlp_reference(model, x)
        # Three float32 layers: each relative error <= DOT_TOL of its |.|-sums, growing by the
        # layers' gains; 1e-3 of the output range covers it with margin.
        check_close("logits", y, ref, 1e2 * ref.abs().max().expand_as(ref))

        def run_once():
            with grad_off():  # entered outside the clock, as a server enters it once
                return timed(lambda: run(x))()
        return run_once, lambda s: {"samples_per_second": batch / s, "us_per_call": s * 1e6}

    return Case(name, threads, setup)


# ---------------------------------------------------------------------------------------------
# sketched linear layer: y = 1/(2L) sum_i (x S1_i U1_i + x U2_i S2_i) + b, forward, one thread
# ---------------------------------------------------------------------------------------------

def sketched_data(b, n_in, n_out, terms, k):
    """x [B, In] in [-1, 1), and the layer as Panther's SKLinear stores it: S1s [L, In, k],
    S2s [L, k, Out] (random, in +-1/sqrt(In) and +-1/sqrt(k)), U1s [L, k, Out], U2s [L, In, k]
    (random signs / sqrt(k)), bias [Out] in +-1/sqrt(In)."""
    torch.manual_seed(0)
    x = uniform(b, n_in)
    s1s = uniform(terms, n_in, k, bound=1 / math.sqrt(n_in))
    s2s = uniform(terms, k, n_out, bound=1 / math.sqrt(k))
    signs = lambda *size: (torch.randint(0, 2, size) * 2 - 1).float() / math.sqrt(k)
    u1s, u2s = signs(terms, k, n_out), signs(terms, n_in, k)
    bias = uniform(n_out, bound=1 / math.sqrt(n_in))
    return x, s1s, s2s, u1s, u2s, bias


def panther_forward(x, S1s, S2s, U1s, U2s, bias):
    """Panther's pure-PyTorch forward (FahdSeddik/panther, panther/nn/linear.py:
    SketchedLinearFunction.forward before its Triton kernels, and the CPU kernel of
    panther::forward_op since): one bmm pair per path over the expanded input."""
    num_terms = S2s.shape[0]
    input = x.unsqueeze(0).expand(num_terms, x.shape[0], x.shape[1])
    return ((input.bmm(S1s)).bmm(U1s)).mean(0) / 2 + ((input.bmm(U2s)).bmm(S2s)).mean(0) / 2 + bias


def two_gemm_operands(S1s, S2s, U1s, U2s):
    """B1 = [S1_1 .. S1_L | U2_1 .. U2_L] [In, 2Lk] and B2 = [U1_1; ..; U1_L; S2_1; ..; S2_L]
    [2Lk, Out]: x B1 B2 is the sum over both paths of every term."""
    b1 = torch.cat(list(S1s) + list(U2s), dim=1).contiguous()
    b2 = torch.cat(list(U1s) + list(S2s), dim=0).contiguous()
    return b1, b2


def two_gemm_forward(x, b1, b2, bias, alpha):
    """addmm: 1/(2L) and + b ride on the second GEMM. Measured here (torch 2.x, MKL, one thread)
    against (x @ B1) @ B2 * (1/(2L)) + b: 1.4x faster at 256x4096x4096_L1_k16, 1.1x at
    256x1024x512_L2_k16, within noise at the larger Lk."""
    return torch.addmm(bias, x @ b1, b2, alpha=alpha)


def sketched_rows_reference(x, S1s, S2s, U1s, U2s, bias, rows):
    """Rows of y in float64, term by term, from the stored parameters."""
    xr = x[rows].double()
    y = bias.double().expand(len(rows), -1).clone()
    for s1, s2, u1, u2 in zip(S1s.double(), S2s.double(), U1s.double(), U2s.double()):
        y += (xr @ s1 @ u1 + xr @ u2 @ s2) / (2 * S1s.shape[0])
    return y


SKETCH_TOL = 1e-4  # relative to max |y|: float32 sums of In, then 2Lk, terms, any order


def check_sketched(what, got, ref):
    """max |got - ref| <= SKETCH_TOL max |ref|; NaN fails."""
    err = float((got.double() - ref.double()).abs().max())
    bound = SKETCH_TOL * float(ref.double().abs().max())
    if not err <= bound:
        raise CheckFailed(f"{what}: max difference {err:.3g}, "
                          f"more than {SKETCH_TOL:g} of max |y| ({bound:.3g})")


def sketched_fwd_case(impl, b, n_in, n_out, terms, k, threads, notes):
    sketched = impl != "torch_dense"
    flops = 4 * b * terms * k * (n_in + n_out) if sketched else 2 * b * n_in * n_out
    # Panther stores S1, S2, U1, U2 and b; dense stores W and b.
    params = 2 * terms * k * (n_in + n_out) + n_out if sketched else n_in * n_out + n_out
    name = f"BM_sketched_linear_fwd/{impl}/{b}x{n_in}x{n_out}_L{terms}_k{k}{threads_suffix(threads)}"

    def setup():
        x, s1s, s2s, u1s, u2s, bias = sketched_data(b, n_in, n_out, terms, k)
        with torch.no_grad():  # inference, as the C++ peers: no graph recorded
            if not sketched:
                torch.manual_seed(1)
                w = uniform(n_out, n_in, bound=1 / math.sqrt(n_in))
                fn = lambda: F.linear(x, w, bias)
                rows = sorted({0, b // 2, b - 1})
                xr, w64 = x[rows].double(), w.double()
                check_close("y", fn()[rows], xr @ w64.T + bias.double(),
                            xr.abs() @ w64.abs().T + bias.double().abs())
            else:
                b1, b2 = two_gemm_operands(s1s, s2s, u1s, u2s)
                alpha = 1 / (2 * terms)
                panther = lambda: panther_forward(x, s1s, s2s, u1s, u2s, bias)
                two_gemm = lambda: two_gemm_forward(x, b1, b2, bias, alpha)
                y_two = two_gemm()
                rows = sorted({0, b // 2, b - 1})
                check_sketched("torch_two_gemm vs float64", y_two[rows],
                               sketched_rows_reference(x, s1s, s2s, u1s, u2s, bias, rows))
                check_sketched("torch_panther vs torch_two_gemm", panther(), y_two)
                if impl == "torch_panther":
                    fn = panther
                elif impl == "torch_two_gemm":
                    fn = two_gemm
                else:
                    fn = compiled(impl, name, x, s1s, s2s, u1s, u2s, bias, b1, b2, alpha, notes)
                    check_sketched(f"{impl} vs torch_two_gemm", fn(), y_two)

        def run_once():
            with torch.no_grad():
                return timed(fn)()
        return run_once, lambda s: {"GFLOPs": flops / s * 1e-9, "param_bytes": 4 * params}

    return Case(name, threads, setup)


def compiled(impl, name, x, s1s, s2s, u1s, u2s, bias, b1, b2, alpha, notes):
    """torch.compile (Inductor, default mode) of panther_forward or two_gemm_forward, warmed up."""
    if impl == "torch_compile_panther":
        fn, args = panther_forward, (x, s1s, s2s, u1s, u2s, bias)
    else:
        fn, args = two_gemm_forward, (x, b1, b2, bias, alpha)
    compiled_fn = compile_warm(fn, lambda f: f(*args), name, notes)
    return lambda: compiled_fn(*args)


# ---------------------------------------------------------------------------------------------
# conv + batch_norm + ReLU (ResNet's block) and the depthwise-separable pair, inference, one thread
# ---------------------------------------------------------------------------------------------

def conv_bn_relu_layers(cin, cout, k, groups):
    """Conv2d (no bias: a batch_norm follows, as torchvision's), BatchNorm2d, ReLU, with running
    statistics and affine parameters away from their starting values (the ranges conv.bench.cpp
    draws them from), so that folding changes every weight."""
    conv = torch.nn.Conv2d(cin, cout, k, padding=k // 2, groups=groups, bias=False)
    bn = torch.nn.BatchNorm2d(cout)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
        bn.running_mean.uniform_(-0.2, 0.2)
        bn.running_var.uniform_(0.5, 2.0)
    return [conv, bn, torch.nn.ReLU()]


def conv_bn_relu_reference(layers, x):
    """(y, scale) in float64 for layers [conv, bn, relu, ...] in eval mode: y the output, scale
    the sum of |terms| of every sum leading to it (|x| through |W|, |s|, |mean|, |beta|), which
    bounds each element's float32 rounding."""
    y = x.double()
    mag = torch.zeros_like(y)
    for conv, bn in zip(layers[0::3], layers[1::3]):
        w, pad, groups = conv.weight.detach().double(), conv.padding, conv.groups
        z = F.conv2d(y, w, padding=pad, groups=groups)
        zmag = F.conv2d(y.abs() + mag, w.abs(), padding=pad, groups=groups)
        per_channel = lambda t: t.detach().double()[:, None, None]
        s = per_channel(bn.weight) / torch.sqrt(per_channel(bn.running_var) + bn.eps)
        mean, beta = per_channel(bn.running_mean), per_channel(bn.bias)
        y = ((z - mean) * s + beta).clamp_min(0)
        mag = s.abs() * (zmag + mean.abs()) + beta.abs()
    return y, mag


def folded_channels_last(layers):
    """Each conv + bn as one convolution with W s and (b - mean) s + beta
    (torch.nn.utils.fusion.fuse_conv_bn_eval), then ReLU; weights in channels_last."""
    from torch.nn.utils.fusion import fuse_conv_bn_eval
    fused = []
    for conv, bn in zip(layers[0::3], layers[1::3]):
        fused += [fuse_conv_bn_eval(conv, bn), torch.nn.ReLU()]
    return torch.nn.Sequential(*fused).eval().to(memory_format=torch.channels_last)


def compile_frozen(model, x, name, notes):
    """torch.compile (Inductor) of the eval model with freezing on: parameters become constants,
    so Inductor folds the batch_norm into the convolution and prepacks its weights. Warmed up."""
    compiled_fn = compile_warm(model, lambda f: f(x), name, notes, freezing=True, warm_calls=3)
    return lambda: compiled_fn(x)


def conv_infer_case(family, impl, n, notes):
    separable = family == "BM_depthwise_separable"
    hw = 56 * 56
    # 2 N Cout H W (Cin / groups) K K per convolution, as conv.bench.cpp counts them
    flops = 2 * n * hw * (64 * 9 + 128 * 64) if separable else 2 * n * hw * 64 * 64 * 9
    name = f"{family}/{impl}/{n}x64x56x56"

    def setup():
        torch.manual_seed(0)
        layers = (conv_bn_relu_layers(64, 64, 3, 64) + conv_bn_relu_layers(64, 128, 1, 1) if separable
                  else conv_bn_relu_layers(64, 64, 3, 1))
        model = torch.nn.Sequential(*layers).eval()
        x = uniform(n, 64, 56, 56)
        if impl == "torch_eager_unfolded":
            fn = lambda: model(x)
        elif impl == "torch_folded_channels_last":
            fused = folded_channels_last(layers)
            xc = x.contiguous(memory_format=torch.channels_last)  # converted once, not timed
            fn = lambda: fused(xc)
        else:
            fn = compile_frozen(model, x, name, notes)
        with torch.no_grad():
            y = fn()
        # Samples first, middle, last: each sample's output depends on that sample alone.
        rows = sorted({0, n // 2, n - 1})
        ref, scale = conv_bn_relu_reference(layers, x[rows])
        check_close(f"{impl} vs float64", y[rows], ref, scale)

        def run_once():
            with torch.no_grad():
                return timed(fn)()
        return run_once, lambda s: {"GFLOPs": flops / s * 1e-9}

    return Case(name, 1, setup)


# ---------------------------------------------------------------------------------------------

def all_cases(threads_list, notes):
    """Every case, in the order printed: per family, per thread count, per shape."""
    compile_ = ["torch_compile"] if hasattr(torch, "compile") else []  # torch 1.13 has none
    cases = []
    for direction in ("fwd", "bwd"):
        for rows, cols, threads in BIAS_RELU_DROPOUT_CASES:
            if threads in threads_list:
                for impl in ["torch"] + compile_:
                    cases.append(bias_relu_dropout_case(impl, direction, rows, cols, threads, notes))
    jit = ["torch_jit"] if hasattr(torch, "jit") and hasattr(torch.jit, "freeze") else []
    for threads in threads_list:
        for m, n, k in LINEAR_SHAPES:
            for impl in ["torch"] + jit + compile_:
                cases.append(linear_fwd_case(impl, m, n, k, threads, notes))
        for direction in ("fwd", "bwd"):
            for m, n, k in LINEAR_SHAPES:
                for impl in ["torch"] + compile_:
                    cases.append(linear_dropout_case(impl, direction, m, n, k, threads, notes))
        for batch in TRAIN_BATCHES:
            for impl in ["torch"] + compile_:
                cases.append(train_step_case(impl, batch, threads, notes))
        grad_off = ["torch"] + (["torch_inference_mode"] if hasattr(torch, "inference_mode") else [])
        for batch in INFERENCE_BATCHES:
            for impl in grad_off + compile_:
                cases.append(inference_case(impl, batch, threads, notes))
    if 1 in threads_list:  # one thread only, as sketched.bench.cpp and conv.bench.cpp
        for config in SKETCHED_CONFIGS:
            for impl in (["torch_panther", "torch_two_gemm"]
                         + [f"{c}_{form}" for c in compile_ for form in ("panther", "two_gemm")]
                         + ["torch_dense"]):
                cases.append(sketched_fwd_case(impl, *config, 1, notes))
        for n in CONV_BATCHES:
            for impl in CONV_IMPLS:
                cases.append(conv_infer_case("BM_conv_bn_relu_infer", impl, n, notes))
        for impl in CONV_IMPLS:
            cases.append(conv_infer_case("BM_depthwise_separable", impl, SEPARABLE_BATCH, notes))
    return cases


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, nargs="+", default=[1],
                        help="thread counts to run (rows get /threads:<n> for n > 1); default 1")
    parser.add_argument("--filter", default="", help="regex; runs the cases whose name it matches (re.search)")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=0.2, help="seconds per repetition")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    try:
        pattern = re.compile(args.filter)
    except re.error as e:
        parser.error(f"--filter {args.filter!r} is not a regular expression: {e}")
    if any(t < 1 for t in args.threads):
        parser.error(f"--threads must be positive, got {args.threads}")
    if args.repetitions < 1 or not args.min_time > 0:
        parser.error("--repetitions must be at least 1 and --min-time positive")

    env = load_torch(max(args.threads))
    if env is None:
        print(f"torch_bench.py: PyTorch is not importable from {sys.executable}; nothing measured.\n"
              "  Make the venv with bench/torch_venv.sh and run this script with\n"
              "  build/torch-venv/bin/python (or install Debian's python3-torch and run it with\n"
              "  /usr/bin/python3).")
        return 0

    notes = []
    cases = [c for c in all_cases(sorted(set(args.threads)), notes) if pattern.search(c.name)]
    if not cases:
        print(f"torch_bench.py: no case matches --filter {args.filter!r}", file=sys.stderr)
        return 1

    torch.zeros(4, 4) @ torch.zeros(4, 4)  # loads the BLAS, so it can be found
    openblas = loaded_openblas()
    if openblas:
        blas = f"OpenBLAS {openblas[1]}, threads set with openblas_set_num_threads"
    elif torch.backends.mkl.is_available():
        blas = "MKL (torch's own), threads set with torch.set_num_threads"
    else:
        blas = "no OpenBLAS loaded; torch.set_num_threads only"
    print(f"PyTorch {torch.__version__}, {sys.executable}; {blas}; "
          f"{env}; "
          f"median of {args.repetitions} repetitions of >= {args.min_time} s")
    header = f"{'Benchmark':<74} {'Time':>13} {'Iterations':>10}  Counters"
    print(header)
    print("-" * len(header))

    rows_out, failed = [], 0
    for case in cases:
        set_threads(case.threads, openblas)
        try:
            run_once, counters = case.setup()
        except CheckFailed as e:
            print(f"{case.name:<74} ERROR OCCURRED: '{e}'", flush=True)
            failed += 1
            continue
        except Unavailable as e:
            print(f"{case.name:<74} SKIPPED: '{e}'", flush=True)
            continue
        seconds, calls = median_seconds(run_once, args.repetitions, args.min_time)
        values = counters(seconds)
        shown = "  ".join(f"{key}={value:.4g}" for key, value in values.items())
        print(f"{case.name + '_median':<74} {seconds * 1e6:>10.1f} us {calls:>10}  {shown}", flush=True)
        rows_out.append({"name": case.name, "aggregate": "median", "real_time_us": seconds * 1e6,
                         "iterations": calls, "threads": case.threads,
                         "repetitions": args.repetitions, **values})
        del run_once, counters

    for note in notes:
        print(f"note: {note}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "blas": blas, "environment": env, "notes": notes,
                       "benchmarks": rows_out}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
