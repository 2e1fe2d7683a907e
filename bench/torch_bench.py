#!/usr/bin/python3
"""torch_bench.py: PyTorch eager peer of bench/bias_relu_dropout.bench.cpp.

y = dropout(relu(x + b)), p = 0.1, training mode, as F.dropout(F.relu(x + b), 0.1, True);
backward through autograd for dx and db. Same shapes, thread counts, byte counts and case names
as solder_bench (impl `torch`), median of repeated timings. Debian's python3-torch imports only
under /usr/bin/python3:

    /usr/bin/python3 bench/torch_bench.py [--repetitions 5] [--min-time 0.2] [--json out.json]

Without torch it says so and exits 0, so scripts that run every bench keep going.
"""
import argparse
import json
import statistics
import sys
import time

P = 0.1
# (B, N, threads): 4 MiB per array (cache-resident), 64 MiB per array (beyond cache), 2 threads.
CASES = [(256, 4096, 1), (4096, 4096, 1), (4096, 4096, 2)]


def case_name(direction, rows, cols, threads):
    suffix = f"/threads:{threads}" if threads > 1 else ""
    return f"BM_bias_relu_dropout_{direction}/torch/{rows}x{cols}{suffix}"


def bytes_moved(direction, rows, cols):
    """Bytes that must move per pass, as in the C++ bench: fwd reads x, writes y; bwd reads dy
    and the saved activation, writes dx. Bias, db and the stored mask are not counted."""
    return (2 if direction == "fwd" else 3) * rows * cols * 4


def median_seconds(run_once, repetitions, min_time):
    """Median over `repetitions` of the mean seconds per call; each repetition makes enough calls
    to last min_time. run_once() returns the seconds of its timed part (backward excludes the
    forward that rebuilds its graph)."""
    for _ in range(3):  # warm-up: allocator caches, thread pool, first-touch of outputs
        run_once()
    once = max(run_once(), 1e-6)
    calls = max(1, int(min_time / once))
    per_call = []
    for _ in range(repetitions):
        total = sum(run_once() for _ in range(calls))
        per_call.append(total / calls)
    return statistics.median(per_call), calls


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=0.2, help="seconds per repetition")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()

    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print(f"torch_bench.py: PyTorch is not importable from {sys.executable}; nothing measured.\n"
              "  Install it with `apt-get install -y python3-torch` and run this script with /usr/bin/python3.")
        return 0

    torch.manual_seed(0)
    print(f"PyTorch {torch.__version__}, {sys.executable}; median of {args.repetitions} repetitions")
    header = f"{'Benchmark':<60} {'Time':>12} {'Iterations':>10}  GBps"
    print(header)
    print("-" * len(header))

    rows_out = []
    for direction in ("fwd", "bwd"):
        for rows, cols, threads in CASES:
            torch.set_num_threads(threads)
            x = torch.rand(rows, cols) * 2 - 1
            b = torch.rand(cols) - 0.5
            dy = torch.rand(rows, cols) * 2 - 1

            # Inputs that require grad, as activations do in training: the forward also records
            # the graph and keeps dropout's mask, which is part of its cost there.
            xg = x.clone().requires_grad_(True)
            bg = b.clone().requires_grad_(True)
            if direction == "fwd":
                def run_once():
                    t0 = time.perf_counter()
                    y = F.dropout(F.relu(xg + bg), p=P, training=True)
                    t1 = time.perf_counter()
                    del y
                    return t1 - t0
            else:
                def run_once():
                    y = F.dropout(F.relu(xg + bg), p=P, training=True)  # graph rebuilt, untimed
                    t0 = time.perf_counter()
                    dx, db = torch.autograd.grad(y, (xg, bg), dy)
                    t1 = time.perf_counter()
                    del y, dx, db
                    return t1 - t0

            seconds, calls = median_seconds(run_once, args.repetitions, args.min_time)
            gbps = bytes_moved(direction, rows, cols) / seconds * 1e-9
            name = case_name(direction, rows, cols, threads)
            print(f"{name + '_median':<60} {seconds * 1e6:>9.0f} us {calls:>10}  GBps={gbps:.3g}", flush=True)
            rows_out.append({"name": name, "aggregate": "median", "real_time_us": seconds * 1e6,
                             "GBps": gbps, "threads": threads, "repetitions": args.repetitions})

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "benchmarks": rows_out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
