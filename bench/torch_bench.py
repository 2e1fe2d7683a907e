#!/usr/bin/python3
"""torch_bench.py: the PyTorch peer of solder_bench, same case names and counters.

Cases (impl `torch` unless named), `/threads:<n>` appended when n > 1:

  BM_bias_relu_dropout_<fwd|bwd>/torch/<B>x<N>             y = dropout(relu(x + b)); GBps
  BM_linear_bias_relu_fwd/<torch|torch_jit>/<M>x<N>x<K>    y = relu(x W^T + b); GFLOPs
  BM_linear_bias_relu_dropout_<fwd|bwd>/torch/<M>x<N>x<K>  y = dropout(relu(x W^T + b)); GFLOPs
  BM_train_step/torch/digits_mlp/<batch>                   AdamW step of a 64-256-128-10 MLP
  BM_inference/<torch|torch_inference_mode>/digits_mlp/<batch>

Dropout p = 0.1 in training mode. Each row is the median over repetitions of the mean time per
call (bench/README.md states what each case times). Debian's python3-torch imports only under
/usr/bin/python3:

    /usr/bin/python3 bench/torch_bench.py [--threads 1 [2 ...]] [--filter REGEX]
        [--repetitions 5] [--min-time 0.2] [--json out.json]

Without torch it says so and exits 0, so scripts that run every bench keep going. It exits 1
when a case's output fails its check (that case is reported and not timed) or the filter
matches nothing.
"""
import argparse
import ctypes
import gc
import json
import math
import os
import re
import statistics
import sys
import time

torch = F = None  # imported by load_torch, after the OpenMP environment is set

P = 0.1  # dropout probability of every dropout case
# bias_relu_dropout (B, N, threads), as solder_bench registers them: 4 MiB per array
# (cache-resident), 64 MiB per array (beyond cache), the latter also on 2 threads.
BIAS_RELU_DROPOUT_CASES = [(256, 4096, 1), (4096, 4096, 1), (4096, 4096, 2)]
LINEAR_SHAPES = [(64, 1024, 1024), (256, 1024, 2048), (1024, 4096, 4096)]  # (M, N, K), as gemm.bench.cpp
TRAIN_BATCHES = [32, 256]
INFERENCE_BATCHES = [1, 256]
CHECK_STEPS = 30  # training steps of the train-step check


class CheckFailed(Exception):
    """A case's output disagrees with its reference; the case is reported and not timed."""


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
    torch.set_num_threads leaves alone: without this, "1-thread" GEMMs use every core."""
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


def check_linear_rows(y, x, w, b, dropout):
    """Rows first, middle, last of y against relu(x W^T + b) in float64; with dropout every
    nonzero must equal it / (1 - p) and the dropped fraction of the positive outputs must be
    p within 0.05 (about 6 standard deviations at N = 1024)."""
    rows = sorted({0, y.shape[0] // 2, y.shape[0] - 1})
    xr, w64 = x.detach()[rows].double(), w.detach().double()
    pre = xr @ w64.T + b.detach().double()
    scale = xr.abs() @ w64.abs().T + b.detach().double().abs()
    ref = pre.clamp_min(0)
    got = y.detach()[rows]
    if not dropout:
        check_close("y", got, ref, scale)
        return
    kept = got != 0
    check_close("kept y", got[kept], ref[kept] / (1 - P), scale[kept] / (1 - P))
    positive = pre > DOT_TOL * scale  # clearly positive: relu keeps them unless dropped
    if not positive.any():
        raise CheckFailed("no positive pre-activation in the checked rows")
    dropped = float((~kept & positive).sum()) / max(1, int(positive.sum()))
    if abs(dropped - P) > 0.05:
        raise CheckFailed(f"dropped fraction {dropped:.3f} of positive outputs, expected {P}")


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

def bias_relu_dropout_case(direction, rows, cols, threads):
    # Bytes per pass as in the C++ bench: fwd reads x, writes y; bwd reads dy and the saved
    # activation, writes dx. Bias, db and the stored mask are not counted.
    moved = (2 if direction == "fwd" else 3) * rows * cols * 4

    def setup():
        torch.manual_seed(0)
        # Inputs that require grad, as activations do in training: the forward also records
        # the graph and keeps dropout's mask, which is part of its cost there.
        x = uniform(rows, cols).requires_grad_(True)
        b = uniform(cols, bound=0.5).requires_grad_(True)
        dy = uniform(rows, cols)
        if direction == "fwd":
            run_once = timed(lambda: F.dropout(F.relu(x + b), p=P, training=True))
        else:
            def run_once():
                y = F.dropout(F.relu(x + b), p=P, training=True)  # graph rebuilt, untimed
                t0 = time.perf_counter()
                dx, db = torch.autograd.grad(y, (x, b), dy)
                t1 = time.perf_counter()
                del y, dx, db
                return t1 - t0
        return run_once, lambda s: {"GBps": moved / s * 1e-9}

    name = f"BM_bias_relu_dropout_{direction}/torch/{rows}x{cols}{threads_suffix(threads)}"
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


def jit_linear_relu(w, b, x):
    """TorchScript: scripted, frozen, fusers on where this build has them. Returns the callable
    and a line saying what its optimized graph runs (the profiling executor specializes after a
    few calls, which this makes)."""
    class LinearReLU(torch.nn.Module):
        """relu(x W^T + b) as a module, so freezing turns W and b into graph constants."""

        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(w, requires_grad=False)
            self.bias = torch.nn.Parameter(b, requires_grad=False)

        def forward(self, x):
            return F.relu(F.linear(x, self.weight, self.bias))

    fusers = []
    if hasattr(torch.jit, "enable_onednn_fusion"):  # oneDNN Graph: the CPU fuser that takes linear
        torch.jit.enable_onednn_fusion(True)
        fusers.append("oneDNN Graph " + ("on" if torch._C._jit_llga_enabled() else "not in this build"))
    fn = torch.jit.freeze(torch.jit.script(LinearReLU().eval()))
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
        else:
            jitted, note = jit_linear_relu(w, b, x)
            fn = lambda: jitted(x)
            notes.append(f"{name}: {note}")
        with torch.no_grad():  # inference, as the C++ peers: no graph recorded
            check_linear_rows(fn(), x, w, b, dropout=False)

        def run_once():
            with torch.no_grad():
                return timed(fn)()
        return run_once, lambda s: {"GFLOPs": 2 * m * n * k / s * 1e-9}

    name = f"BM_linear_bias_relu_fwd/{impl}/{m}x{n}x{k}{threads_suffix(threads)}"
    return Case(name, threads, setup)


def linear_dropout_case(direction, m, n, k, threads):
    flops = (2 if direction == "fwd" else 4) * m * n * k  # bwd: dx = g W and dW = g^T x

    def setup():
        # Training: x, W and b require grad, so the forward records the graph and keeps the mask.
        x, w, b = linear_data(m, n, k, requires_grad=True)
        forward = lambda: F.dropout(F.relu(F.linear(x, w, b)), p=P, training=True)
        dy = uniform(m, n)
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

    name = f"BM_linear_bias_relu_dropout_{direction}/torch/{m}x{n}x{k}{threads_suffix(threads)}"
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


def train_step_case(batch, threads):
    def setup():
        model = digits_mlp()
        x, labels = digits_data(batch)
        loss_fn = torch.nn.CrossEntropyLoss()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-2)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), labels)
            loss.backward()
            opt.step()
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

    name = f"BM_train_step/torch/digits_mlp/{batch}{threads_suffix(threads)}"
    return Case(name, threads, setup)


def inference_case(impl, batch, threads):
    def setup():
        model = digits_mlp().eval()
        x, _ = digits_data(batch)
        grad_off = torch.no_grad if impl == "torch" else torch.inference_mode
        with grad_off():
            y = model(x)
        ref = mlp_reference(model, x)
        # Three float32 layers: each relative error <= DOT_TOL of its |.|-sums, growing by the
        # layers' gains; 1e-3 of the output range covers it with margin.
        check_close("logits", y, ref, 1e2 * ref.abs().max().expand_as(ref))

        def run_once():
            with grad_off():  # entered outside the clock, as a server enters it once
                return timed(lambda: model(x))()
        return run_once, lambda s: {"samples_per_second": batch / s, "us_per_call": s * 1e6}

    name = f"BM_inference/{impl}/digits_mlp/{batch}{threads_suffix(threads)}"
    return Case(name, threads, setup)


# ---------------------------------------------------------------------------------------------

def all_cases(threads_list, notes):
    """Every case, in the order printed: per family, per thread count, per shape."""
    cases = []
    for direction in ("fwd", "bwd"):
        for rows, cols, threads in BIAS_RELU_DROPOUT_CASES:
            if threads in threads_list:
                cases.append(bias_relu_dropout_case(direction, rows, cols, threads))
    jit = ["torch_jit"] if hasattr(torch, "jit") and hasattr(torch.jit, "freeze") else []
    for threads in threads_list:
        for m, n, k in LINEAR_SHAPES:
            for impl in ["torch"] + jit:
                cases.append(linear_fwd_case(impl, m, n, k, threads, notes))
        for direction in ("fwd", "bwd"):
            for m, n, k in LINEAR_SHAPES:
                cases.append(linear_dropout_case(direction, m, n, k, threads))
        for batch in TRAIN_BATCHES:
            cases.append(train_step_case(batch, threads))
        grad_off = ["torch"] + (["torch_inference_mode"] if hasattr(torch, "inference_mode") else [])
        for batch in INFERENCE_BATCHES:
            for impl in grad_off:
                cases.append(inference_case(impl, batch, threads))
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
              "  Install it with `apt-get install -y python3-torch` and run this script with /usr/bin/python3.")
        return 0

    notes = []
    cases = [c for c in all_cases(sorted(set(args.threads)), notes) if pattern.search(c.name)]
    if not cases:
        print(f"torch_bench.py: no case matches --filter {args.filter!r}", file=sys.stderr)
        return 1

    torch.zeros(4, 4) @ torch.zeros(4, 4)  # loads the BLAS, so it can be found
    openblas = loaded_openblas()
    blas = (f"OpenBLAS {openblas[1]}, threads set with openblas_set_num_threads" if openblas
            else "no OpenBLAS loaded; torch.set_num_threads only")
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
