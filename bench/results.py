#!/usr/bin/env python3
"""results.py: measures the named cases and rewrites docs/PERFORMANCE.md's tables and plots.

    bash bench/results.sh [--quick] [--from-json] [--no-build] [--no-torch]

(bench/results.sh runs this under build/torch-venv/bin/python, which has matplotlib, in
its own scheduling group (setsid) at the top scheduling weight.) Steps:

  1. builds solder_bench (the release preset) unless --no-build;
  2. runs it on the named cases (NAMED_FILTER), one process, peers interleaved at random, one
     thread per core pinned (OMP_WAIT_POLICY=PASSIVE OMP_PROC_BIND=true OMP_PLACES=cores, and
     OPENBLAS_CORETYPE=SkylakeX on an AVX-512 CPU, as bench/README.md prescribes);
  3. runs bench/torch_bench.py under build/torch-venv on one thread, then on two for the cases
     the C++ bench also runs on two (skipped with --no-torch or where the venv is missing);
  4. stores both outputs, the host and the commands as docs/results/<host>.json, where <host>
     is vendor-family-model (intel-6-207), so each kind of CPU keeps its own file;
  5. from every docs/results/*.json: draws docs/img/<host>-<case>.png and rewrites the text
     between `<!-- results:begin NAME -->` and `<!-- results:end -->` in docs/PERFORMANCE.md,
     leaving everything outside the markers as it is.

--from-json skips 1-4 and redraws from the stored files. --quick measures 1 repetition of at
least 0.05 s per case instead of 5 of 0.2 s (a check that the machinery works; its figures
are marked as such). A host's file also holds the git commit it was measured at, and whether
the tree had uncommitted changes.
"""
import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(ROOT, "docs", "results")
IMG_DIR = os.path.join(ROOT, "docs", "img")
PAGE = os.path.join(ROOT, "docs", "PERFORMANCE.md")

# The cases the page shows; solder_bench's --benchmark_filter (a regex over the case names).
NAMED_FILTER = ("^(BM_peak_fma|BM_philox_bits16|BM_bias_relu_dropout_|BM_linear_bias_relu_|BM_gemm_parts/"
                "|BM_train_step/|BM_inference/|BM_sketched_linear_|BM_conv_|BM_depthwise_separable)")
# torch_bench.py on two threads: the families the C++ bench also registers with /threads:2.
TORCH_THREADS2_FILTER = "^(BM_bias_relu_dropout_|BM_linear_bias_relu_)"

FULL = {"repetitions": 5, "min_time": 0.2}
QUICK = {"repetitions": 1, "min_time": 0.05}

BRD_SHAPES = [("256x4096", 1), ("4096x4096", 1), ("4096x4096", 2)]
LINEAR_SHAPES = ["64x1024x1024", "256x1024x2048", "1024x4096x4096"]
SKETCHED_CONFIGS = (["256x2048x1024_L8_k128"]
                    + [f"256x1024x512_L{terms}_k{k}" for terms in (2, 4, 8) for k in (16, 32, 64)]
                    + ["256x4096x4096_L1_k16"])


# ---------------------------------------------------------------------------------------------
# The host
# ---------------------------------------------------------------------------------------------

def this_host():
    """vendor, family, model, model name and vector width from /proc/cpuinfo; slug names the
    host's file and images."""
    fields, flags = {}, set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key == "flags" and not flags:
                flags = set(value.split())
            elif key in ("vendor_id", "cpu family", "model", "model name") and key not in fields:
                fields[key] = value
    vendor = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}.get(fields.get("vendor_id", ""),
                                                                   fields.get("vendor_id", "cpu").lower())
    family, model = fields.get("cpu family", "0"), fields.get("model", "0")
    vectors = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "SSE"
    return {"slug": f"{vendor}-{family}-{model}", "vendor": vendor, "family": int(family),
            "model": int(model), "model_name": fields.get("model name", "?"), "vectors": vectors,
            "cpus": os.cpu_count()}


def host_label(host):
    """A short name for captions and plot titles: the model name without its (R) marks."""
    name = re.sub(r"\((R|TM)\)", "", host["model_name"]).replace("  ", " ").strip()
    name = re.sub(r"\s+(Processor|CPU)\b.*$", "", name) or name
    return f"{name}, family {host['family']} model {host['model']}"


def git(*args):
    return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True).stdout.strip()


def first_line(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True).stdout.splitlines()[0]
    except (OSError, IndexError):
        return ""


# ---------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------

def run(cmd, env=None):
    print("+ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    subprocess.run(cmd, check=True, env=env, cwd=ROOT)


def measure(args, host):
    """Runs the benches; returns the record stored as docs/results/<slug>.json."""
    plan = QUICK if args.quick else FULL
    bench = args.solder_bench
    if not args.no_build:
        if not os.path.exists(os.path.join(ROOT, "build", "release", "CMakeCache.txt")):
            run(["cmake", "--preset", "release"])
        run(["cmake", "--build", "--preset", "release", "--target", "solder_bench"])
    if not os.access(bench, os.X_OK):
        sys.exit(f"results.py: {bench} is not built (drop --no-build, or build it: "
                 "cmake --preset release && cmake --build --preset release --target solder_bench)")
    commands, record = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OMP_PROC_BIND="true", OMP_PLACES="cores")
        bench_env = ["OMP_WAIT_POLICY=PASSIVE", "OMP_PROC_BIND=true", "OMP_PLACES=cores"]
        if host["vectors"] == "AVX-512" and "OPENBLAS_CORETYPE" not in os.environ:
            # OpenBLAS 0.3.21 runs SSE3 kernels on AVX-512 CPUs it does not know (bench/README.md)
            env["OPENBLAS_CORETYPE"] = "SkylakeX"
            bench_env.insert(0, "OPENBLAS_CORETYPE=SkylakeX")
        out = os.path.join(tmp, "solder.json")
        cmd = [bench, f"--benchmark_filter={NAMED_FILTER}",
               f"--benchmark_repetitions={plan['repetitions']}",
               "--benchmark_report_aggregates_only=true", "--benchmark_enable_random_interleaving=true",
               f"--benchmark_min_time={plan['min_time']}",
               f"--benchmark_out={out}", "--benchmark_out_format=json"]
        run(cmd, env=env)
        with open(out) as f:
            record["solder"] = json.load(f)
        commands.append(" ".join(bench_env + [os.path.relpath(bench, ROOT)]
                                 + [shlex.quote(c) for c in cmd[1:-2]]))
        record["torch"] = []
        python = args.torch_python
        if args.no_torch:
            print("results.py: --no-torch: PyTorch not measured", flush=True)
        elif not os.access(python, os.X_OK):
            print(f"results.py: {python} missing (bash bench/torch_venv.sh makes it): PyTorch not measured",
                  flush=True)
        else:
            for threads, filt in ((1, ""), (2, TORCH_THREADS2_FILTER)):
                out = os.path.join(tmp, f"torch{threads}.json")
                cmd = [python, os.path.join(ROOT, "bench", "torch_bench.py"), "--threads", str(threads),
                       "--repetitions", str(plan["repetitions"]), "--min-time", str(plan["min_time"])]
                if filt:
                    cmd += ["--filter", filt]
                # No OMP_PROC_BIND here: torch_bench.py sets its own environment (bench/README.md).
                result = subprocess.run(cmd + ["--json", out], cwd=ROOT)
                if result.returncode != 0:
                    print(f"results.py: torch_bench.py exited {result.returncode} (a failed check is "
                          "reported in its output; the other rows are kept)", flush=True)
                if os.path.exists(out):
                    with open(out) as f:
                        record["torch"].append(json.load(f))
                commands.append(" ".join([os.path.relpath(python, ROOT), "bench/torch_bench.py"]
                                         + [shlex.quote(c) for c in cmd[2:]]))
    record.update({
        "host": host,
        "commit": git("rev-parse", "--short=10", "HEAD"),
        "uncommitted_changes": bool(git("status", "--porcelain", "--untracked-files=no")),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "run": "quick" if args.quick else "full",
        "plan": plan,
        "compiler": first_line(["g++", "--version"]),
        "commands": commands,
    })
    return record


# ---------------------------------------------------------------------------------------------
# Reading the stored results
# ---------------------------------------------------------------------------------------------

TIME_UNIT = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
NOT_COUNTERS = {"name", "run_name", "run_type", "aggregate_name", "aggregate_unit", "family_index",
                "per_family_instance_index", "repetitions", "repetition_index", "threads",
                "iterations", "real_time", "cpu_time", "time_unit", "label", "error_occurred",
                "error_message", "real_time_us", "aggregate"}


def case_key(name):
    """A case's name without what Google Benchmark appends (iterations, real_time, aggregate)."""
    name = re.sub(r"_(median|mean|stddev|cv)$", "", name)
    return re.sub(r"/(iterations:\d+|real_time|min_time:[0-9.]+s?|repeats:\d+)", "", name)


def solder_cases(raw):
    """case -> {"seconds": median real time per iteration, counters..., "label"} from Google
    Benchmark's JSON: the median aggregate, or the median over repetitions where only those
    were written (a run of 1 repetition writes no aggregates)."""
    medians, reps = {}, {}
    for b in raw.get("benchmarks", []):
        key = case_key(b.get("run_name", b["name"]))
        if b.get("error_occurred"):
            medians[key] = {"error": b.get("error_message", "error")}
            continue
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                medians[key] = b
        else:
            reps.setdefault(key, []).append(b)
    out = {}
    for key in set(medians) | set(reps):
        b = medians.get(key)
        if b is None:
            runs = sorted(reps[key], key=lambda r: r.get("real_time") or 0)
            b = runs[len(runs) // 2]
        if "error" in b:
            out[key] = b
            continue
        row = {k: v for k, v in b.items() if k not in NOT_COUNTERS and isinstance(v, (int, float))}
        if b.get("real_time") is not None:
            row["seconds"] = b["real_time"] * TIME_UNIT[b.get("time_unit", "ns")]
        if b.get("label"):
            row["label"] = b["label"]
        out[key] = row
    return out


def torch_cases(raws):
    out = {}
    for raw in raws:
        for b in raw.get("benchmarks", []):
            row = {k: v for k, v in b.items() if k not in NOT_COUNTERS and isinstance(v, (int, float))}
            row["seconds"] = b["real_time_us"] * 1e-6
            out[case_key(b["name"])] = row
    return out


class Host:
    """One stored file: the host, how it was measured and every case's row."""

    def __init__(self, path):
        with open(path) as f:
            self.record = json.load(f)
        self.info = self.record["host"]
        self.slug = self.info["slug"]
        self.label = host_label(self.info)
        self.cases = solder_cases(self.record.get("solder", {}))
        self.cases.update(torch_cases(self.record.get("torch", [])))
        self.torch_version = next((t.get("torch") for t in self.record.get("torch", []) if t.get("torch")), None)

    def get(self, name, counter=None):
        row = self.cases.get(name)
        if row is None or "error" in row:
            return None
        return row if counter is None else row.get(counter)

    def has(self, *prefixes):
        """Whether any case of this host starts with one of prefixes."""
        return any(name.startswith(prefixes) for name in self.cases)

    def peak(self, threads):
        return self.get("BM_peak_fma" + ("/threads:2" if threads == 2 else ""), "GFLOPs")

    def caption(self):
        r = self.record
        when = f"commit {r.get('commit', '?')}"
        if r.get("uncommitted_changes"):
            when += " with uncommitted changes"
        parts = [f"**{self.label}** (`{self.info['model_name']}`, {self.info['vectors']})", when,
                 r.get("date", "")]
        if r.get("transcribed"):
            parts.append("figures transcribed from an earlier run, not by bench/results.sh (see Hosts)")
        elif r.get("run") == "quick":
            parts.append("quick run (1 repetition of 0.05 s: a check of the machinery, not figures to quote)")
        else:
            plan = r.get("plan", FULL)
            parts.append(f"medians of {plan['repetitions']} repetitions of >= {plan['min_time']} s")
        return ", ".join(p for p in parts if p) + "."


def load_hosts():
    paths = sorted(os.path.join(RESULTS_DIR, p) for p in os.listdir(RESULTS_DIR) if p.endswith(".json"))
    hosts = [Host(p) for p in paths]
    # measured hosts first (the one with the most cases), transcribed ones after
    return sorted(hosts, key=lambda h: (bool(h.record.get("transcribed")), -len(h.cases), h.slug))


# ---------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------

DASH = "–"


def num(v, digits=None):
    if v is None:
        return DASH
    if digits is None:
        digits = 0 if abs(v) >= 1000 else 1 if abs(v) >= 10 else 2
    return f"{v:,.{digits}f}"


def with_frac(value, ref, digits=None):
    """'24.7 (0.86)': a rate and its fraction of ref."""
    if value is None:
        return DASH
    if not ref:
        return num(value, digits)
    return f"{num(value, digits)} ({value / ref:.2f})"


def table(header, rows):
    """A markdown table; the first column left-aligned, the others right-aligned. Rows whose
    cells are all empty are left out, and a table without rows is empty text."""
    rows = [r for r in rows if any(c != DASH for c in r[1:])]
    if not rows:
        return ""
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join(["---"] + ["---:"] * (len(header) - 1)) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def suffix(threads):
    return "/threads:2" if threads == 2 else ""


def shape_header(shape, threads):
    return shape + (", 2 threads" if threads == 2 else "")


def brd_floor(h, direction, shape, threads):
    rates = [h.get(f"BM_bias_relu_dropout_{direction}/{impl}/{shape}{suffix(threads)}", "GBps")
             for impl in ("memcpy", "copy_nt")]
    rates = [r for r in rates if r]
    return max(rates) if rates else None


BRD_ROWS = {
    "fwd": [("memcpy", "memcpy (floor: glibc copy of x into y)"),
            ("copy_nt", "copy_nt (floor: AVX copy, streaming stores beyond the cache)"),
            ("philox", "Philox bits alone (floor: the mask drawn, nothing written; `BM_philox_bits16`)"),
            ("solder", "**solder**: one fused pass, Philox mask drawn in the pass"),
            ("paired", "solder, paired call by call with the faster floor (median per-pair ratio)"),
            ("unfused", "solder unfused: three passes, two temporaries"),
            ("eigen", "Eigen: one expression per row, mask precomputed"),
            ("xtensor", "xtensor: one lazy expression, mask precomputed"),
            ("torch", "PyTorch eager"),
            ("torch_compile", "PyTorch torch.compile (Inductor)")],
    "bwd": [("memcpy", "memcpy-style floor: `out = a * b`, 2 reads 1 write"),
            ("copy_nt", "copy_nt floor: the same in AVX, streaming stores beyond the cache"),
            ("solder", "**solder**: dx and db in one pass from the saved output y"),
            ("paired", "solder, paired call by call with the faster floor (median per-pair ratio)"),
            ("solder_from_input", "solder from the input x, mask regenerated"),
            ("unfused", "solder unfused: mask, gate and db passes"),
            ("eigen", "Eigen, mask precomputed"),
            ("xtensor", "xtensor, mask precomputed"),
            ("torch", "PyTorch eager autograd"),
            ("torch_compile", "PyTorch torch.compile (Inductor) backward")],
}


def brd_cell(h, direction, impl, shape, threads):
    floor = brd_floor(h, direction, shape, threads)
    if impl == "philox":
        if threads != 1:
            return DASH
        return with_frac(h.get(f"BM_philox_bits16/{shape}", "GBps"), floor)
    if impl == "paired":
        row = h.get(f"BM_bias_relu_dropout_{direction}_paired/solder_vs_floor/{shape}{suffix(threads)}")
        if not row or "roofline" not in row:
            return DASH
        return f"{num(row.get('GBps'))} ({row['roofline']:.2f})"
    return with_frac(h.get(f"BM_bias_relu_dropout_{direction}/{impl}/{shape}{suffix(threads)}", "GBps"), floor)


def per_host(hosts, prefixes, text, plot):
    """For each host that measured a case starting with one of `prefixes`: its caption, text(h)
    and plot(h); "(no host measured these cases yet)" when none did."""
    parts = []
    for h in hosts:
        if h.has(*prefixes):
            parts.append(h.caption() + "\n\n" + text(h))
            parts.append(plot(h))
    return "\n".join(p for p in parts if p) or "(no host measured these cases yet)"


def render_brd(hosts, direction):
    def text(h):
        header = ["GB/s (fraction of the copy floor)"] + [shape_header(s, t) for s, t in BRD_SHAPES]
        rows = [[label] + [brd_cell(h, direction, impl, s, t) for s, t in BRD_SHAPES]
                for impl, label in BRD_ROWS[direction]]
        return table(header, rows)
    return per_host(hosts, (f"BM_bias_relu_dropout_{direction}",), text,
                    lambda h: image(h, f"bias_relu_dropout_{direction}"))


LINEAR_COLUMNS = [(s, t) for t in (1, 2) for s in LINEAR_SHAPES]


def gflops_row(h, label, name_of, shapes=LINEAR_COLUMNS):
    cells = []
    for shape, threads in shapes:
        cells.append(with_frac(h.get(name_of(shape, threads), "GFLOPs"), h.peak(threads)))
    return [label] + cells


def speedup_row(h, label, name_of, shapes=LINEAR_COLUMNS):
    cells = []
    for shape, threads in shapes:
        v = h.get(name_of(shape, threads), "speedup")
        cells.append(DASH if v is None else f"{v:.3f}")
    return [label] + cells


def linear_header(first):
    return [first] + [f"({s.replace('x', ', ')})" + (", 2 threads" if t == 2 else "") for s, t in LINEAR_COLUMNS]


def render_linear(hosts):
    def text(h):
        fam = "BM_linear_bias_relu_fwd"
        impls = [("solder", "**solder**: `nn::dense<linear, relu>`, generic expression epilogue"),
                 ("solder_kernel", "solder GEMM with the hand-written bias+ReLU epilogue"),
                 ("onednn_postops", "oneDNN matmul, bias and ReLU post-ops, weights prepacked"),
                 ("openblas_then_epilogue", "OpenBLAS sgemm, then a bias+ReLU pass"),
                 ("eigen", "Eigen product, then the epilogue"),
                 ("torch", "PyTorch eager (`F.relu(F.linear(...))`, no_grad)"),
                 ("torch_jit", "PyTorch TorchScript, frozen"),
                 ("torch_compile", "PyTorch torch.compile with freezing")]
        peak = ["`BM_peak_fma` (the FMA peak)"] + [num(h.peak(t)) for _, t in LINEAR_COLUMNS]
        rows = [peak] + [gflops_row(h, label, lambda s, t, i=impl: f"{fam}/{i}/{s}{suffix(t)}")
                         for impl, label in impls]
        rows.append(speedup_row(h, "solder vs oneDNN, paired: oneDNN's time / solder's",
                                lambda s, t: f"{fam}_paired/solder_vs_onednn_postops/{s}{suffix(t)}"))
        rows.append(speedup_row(h, "solder vs its hand-written epilogue, paired",
                                lambda s, t: f"{fam}_paired/solder_vs_solder_kernel/{s}{suffix(t)}"))
        text = table(linear_header("GFLOP/s (fraction of the FMA peak), (M, N, K)"), rows)
        gp = h.get("BM_gemm_parts/64x1024x1024")
        if gp:
            text += (f"\n`BM_gemm_parts/64x1024x1024` (docs/gemm.md, \"What bounds M = 64\"): the call at "
                     f"{gp['full_roofline']:.3f} of the FMA peak, the same call with B kept in L2 at "
                     f"{gp['kernel_roofline']:.3f} (the call takes {gp['kernel_speedup']:.3f}x its time), "
                     f"packing A {gp['pack_a_share']:.4f} of the call.\n")
        return text
    return per_host(hosts, ("BM_linear_bias_relu_fwd",), text,
                    lambda h: image(h, "linear_bias_relu"))


def render_linear_dropout(hosts):
    def text(h):
        rows = []
        for direction, what in (("fwd", "forward"), ("bwd", "backward (dx and dW)")):
            fam = f"BM_linear_bias_relu_dropout_{direction}"
            for impl, label in (("solder", f"**solder** {what}: `nn::dense<linear, relu, dropout>`"),
                                ("unfused", f"solder unfused {what}: GEMM, then one pass per op"),
                                ("torch", f"PyTorch eager {what}"),
                                ("torch_compile", f"PyTorch torch.compile {what}")):
                rows.append(gflops_row(h, label, lambda s, t, f=fam, i=impl: f"{f}/{i}/{s}{suffix(t)}"))
        return table(linear_header("GFLOP/s (fraction of the FMA peak), (M, N, K)"), rows)
    return per_host(hosts, ("BM_linear_bias_relu_dropout_",), text,
                    lambda h: image(h, "linear_bias_relu_dropout"))


def time_us(h, name):
    s = h.get(name, "seconds")
    return None if s is None else s * 1e6


def ratio(x):
    return f"{x:.1f}x" if x >= 10 else f"{x:.2f}x"


def times_row(h, label, names, ref_names):
    """'110 (1.00x)': microseconds per call and the time over solder's."""
    cells = []
    for name, ref in zip(names, ref_names):
        t, r = time_us(h, name), time_us(h, ref)
        cells.append(DASH if t is None else f"{num(t)} ({ratio(t / r)})" if r else num(t))
    return [label] + cells


def render_mlp(hosts):
    def text(h):
        train = [("solder", "**solder**: the fused chain's `train_step`"),
                 ("unfused", "solder, one kernel per layer"),
                 ("torch", "PyTorch eager"),
                 ("torch_compile", "PyTorch torch.compile (forward+loss, AdamW step)")]
        rows = [times_row(h, label, [f"BM_train_step/{i}/digits_mlp/{b}" for b in (32, 256)],
                          [f"BM_train_step/solder/digits_mlp/{b}" for b in (32, 256)]) for i, label in train]
        text = table(["training step, us (time over solder's)", "batch 32", "batch 256"], rows)
        infer = [("solder", "**solder**: the frozen chain's `forward`"),
                 ("unfused", "solder, one kernel per layer"),
                 ("torch", "PyTorch eager, no_grad"),
                 ("torch_inference_mode", "PyTorch eager, inference_mode"),
                 ("torch_compile", "PyTorch torch.compile with freezing")]
        rows = [times_row(h, label, [f"BM_inference/{i}/digits_mlp/{b}" for b in (1, 256)],
                          [f"BM_inference/solder/digits_mlp/{b}" for b in (1, 256)]) for i, label in infer]
        text += "\n" + table(["inference, us per call (time over solder's)", "batch 1", "batch 256"], rows)
        return text
    return per_host(hosts, ("BM_train_step/", "BM_inference/"), text,
                    lambda h: image(h, "digits_mlp"))


def render_sketched(hosts):
    def text(h):
        fwd = "BM_sketched_linear_fwd"
        cols = [("solder", "solder"), ("solder_folded", "solder folded"), ("dense", "solder dense"),
                ("torch_panther", "Panther eager"), ("torch_two_gemm", "torch two-GEMM"),
                ("torch_compile_panther", "Panther compiled"), ("torch_compile_two_gemm", "two-GEMM compiled"),
                ("torch_dense", "torch dense")]
        header = ["forward, ms per call; B x In x Out, L, k", "solder GFLOP/s (of peak)"] + [c[1] for c in cols]
        rows = []
        for cfg in SKETCHED_CONFIGS:
            solder = h.get(f"{fwd}/solder/{cfg}")
            cells = [with_frac(solder and solder.get("GFLOPs"), h.peak(1))]
            for impl, _ in cols:
                t = h.get(f"{fwd}/{impl}/{cfg}", "seconds")
                cells.append(DASH if t is None else num(t * 1e3, 3))
            rows.append([cfg.replace("_L", ", L ").replace("_k", ", k ")] + cells)
        text = table(header, rows)
        bwd = "BM_sketched_linear_bwd"
        rows = []
        for cfg in SKETCHED_CONFIGS:
            solder = h.get(f"{bwd}/solder/{cfg}")
            dense = h.get(f"{bwd}/dense/{cfg}", "seconds")
            rows.append([cfg.replace("_L", ", L ").replace("_k", ", k "),
                         DASH if solder is None or "seconds" not in solder else num(solder["seconds"] * 1e3, 3),
                         with_frac(solder and solder.get("GFLOPs"), h.peak(1)),
                         DASH if dense is None else num(dense * 1e3, 3)])
        text += "\n" + table(["backward, ms per call", "solder", "solder GFLOP/s (of peak)", "solder dense"], rows)
        return text
    return per_host(hosts, ("BM_sketched_linear_",), text,
                    lambda h: image(h, "sketched_linear"))


CONV_IMPLS = [("solder_folded", "**solder**, folded, NCHW in and out"),
              ("solder_folded_channels_last", "**solder**, folded, channels-last in and out"),
              ("solder_unfolded", "solder unfolded: convolution, normalization, ReLU"),
              ("onednn_postops_nchw", "oneDNN, nchw, ReLU post-op"),
              ("onednn_postops_blocked", "oneDNN, its blocked layouts, ReLU post-op"),
              ("torch_eager_unfolded", "PyTorch eager, the three modules, NCHW"),
              ("torch_folded_channels_last", "PyTorch, folded, channels_last"),
              ("torch_compile_frozen", "PyTorch torch.compile with freezing")]
CONV_PAIRS = [("solder_folded_channels_last_vs_onednn_postops_blocked", "solder channels-last vs oneDNN blocked"),
              ("solder_folded_vs_onednn_postops_blocked", "solder NCHW vs oneDNN blocked"),
              ("solder_folded_vs_onednn_postops_nchw", "solder NCHW vs oneDNN nchw"),
              ("solder_folded_vs_solder_unfolded", "solder folded vs unfolded, NCHW"),
              ("solder_folded_channels_last_vs_solder_unfolded", "solder folded channels-last vs unfolded"),
              ("solder_folded_vs_onednn_postops_blocked", "depthwise-separable: solder folded vs oneDNN blocked"),
              ("solder_folded_vs_solder_unfolded", "depthwise-separable: solder folded vs unfolded"),
              ("solder_vs_solder_unfused", "training step: the block vs one kernel per layer"),
              ("solder_vs_onednn_blocked", "dW of the 3x3 layer vs oneDNN's backward-weights, blocked"),
              ("solder_vs_onednn_nchw", "dW of the 3x3 layer vs oneDNN's backward-weights, nchw"),
              ("solder_epilogue_vs_solder_separate", "relu(conv(x) + shortcut) in the epilogue vs a separate pass")]


def render_conv(hosts):
    def text(h):
        cols = [("BM_conv_bn_relu_infer", "32x64x56x56"), ("BM_conv_bn_relu_infer", "1x64x56x56"),
                ("BM_depthwise_separable", "32x64x56x56")]
        header = ["GFLOP/s (fraction of the FMA peak)", "conv+BN+ReLU, N = 32", "conv+BN+ReLU, N = 1",
                  "depthwise-separable, N = 32"]
        rows = []
        for impl, label in CONV_IMPLS:
            cells = []
            for fam, shape in cols:
                row = h.get(f"{fam}/{impl}/{shape}")
                cells.append(with_frac(row and row.get("GFLOPs"), h.peak(1)))
            kernel = next((h.get(f"{fam}/{impl}/{shape}", "label") for fam, shape in cols
                           if impl.startswith("onednn") and h.get(f"{fam}/{impl}/{shape}")), None)
            rows.append([label + (f" (`{kernel}`)" if kernel else "")] + cells)
        text = table(header, rows)
        prow = []
        for pair, label in CONV_PAIRS:
            if label.startswith("depthwise"):
                names = [f"BM_depthwise_separable_paired/{pair}/32x64x56x56"]
            elif label.startswith("training"):
                names = [f"BM_conv_bn_relu_train_paired/{pair}/32x64x56x56"]
            elif label.startswith("dW"):
                names = [f"BM_conv_weight_grad_paired/{pair}/32x64x56x56"]
            elif label.startswith("relu(conv"):
                names = [f"BM_conv_residual_relu_paired/{pair}/32x64x56x56"]
            else:
                names = [f"BM_conv_bn_relu_infer_paired/{pair}/{n}x64x56x56" for n in (32, 1)]
            vals = [h.get(n, "speedup") for n in names] + [None] * (2 - len(names))
            prow.append([label] + [DASH if v is None else f"{v:.3f}" for v in vals])
        text += "\n" + table(["paired: the peer's time / solder's", "N = 32", "N = 1"], prow)
        train = [h.get(f"BM_conv_bn_relu_train/{i}/32x64x56x56") for i in ("solder", "solder_unfused")]
        if any(train):
            text += ("\nTraining step, N = 32 (forward, dx, dW, the normalization's and ReLU's gradients; "
                     "GFLOP/s of the three products): "
                     + "; ".join(f"{name} {num(r['seconds'] * 1e3)} ms, {num(r.get('GFLOPs'))} GFLOP/s"
                                 + (f" ({r['GFLOPs'] / h.peak(1):.2f} of the peak)" if h.peak(1) and r.get("GFLOPs") else "")
                                 for name, r in zip(("the block", "one kernel per layer"), train) if r) + ".\n")
        return text
    return per_host(hosts, ("BM_conv_", "BM_depthwise_separable"), text,
                    lambda h: image(h, "conv"))


def render_hosts(hosts):
    rows, notes = [], []
    for h in hosts:
        r = h.record
        copy = lambda shape: brd_floor(h, "fwd", shape, 1)
        rows.append([f"[{h.label}](results/{h.slug}.json)", h.info["vectors"],
                     f"{r.get('commit', '?')}{'+' if r.get('uncommitted_changes') else ''}", r.get("date", ""),
                     "transcribed" if r.get("transcribed") else r.get("run", "?"), num(h.peak(1)), num(h.peak(2)), num(copy("256x4096")),
                     num(copy("4096x4096")), h.torch_version or DASH])
        cmds = r.get("commands")
        if cmds:
            notes.append(f"{h.label}, measured by `bash bench/results.sh{' --quick' if r.get('run') == 'quick' else ''}`, "
                         "which ran:\n\n```sh\n" + "\n".join(cmds) + "\n```\n")
        elif r.get("transcribed"):
            notes.append(f"{h.label}: {r['transcribed']}.\n")
    header = ["host", "vectors", "commit", "date", "run", "FMA peak, GFLOP/s", "2 threads",
              "copy floor 4 MiB, GB/s", "64 MiB", "PyTorch"]
    return (table(header, rows) + "\nA + after the commit: the tree had uncommitted changes when it was measured.\n\n"
            + "\n".join(notes))


# ---------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------

COLORS = {"floor": "#9e9e9e", "floor2": "#bdbdbd", "bits": "#757575", "solder": "#1f5fa8",
          "solder2": "#6b9bd1", "solder3": "#a9c6e8", "onednn": "#2e8b57", "openblas": "#8fbc8f",
          "eigen": "#7b4fa0", "xtensor": "#b39ddb", "torch": "#e07b00", "torch2": "#f4b35e",
          "torch3": "#c0392b", "torch4": "#f1948a"}


def image(h, name):
    path = os.path.join(IMG_DIR, f"{h.slug}-{name}.png")
    if not os.path.exists(path):
        return ""
    return f"![{name}, {h.label}](img/{h.slug}-{name}.png)\n"


def bars(ax, groups, series, ylabel, lines=None, log=False, value_digits=None):
    """Grouped bars: groups (x labels), series [(label, color, [value or None per group])];
    lines: [(label, [value per group])] drawn as short dashed segments over each group."""
    import numpy as np
    keep = [g for g in range(len(groups)) if any(values[g] is not None for _, _, values in series)]
    groups = [groups[g] for g in keep]
    series = [(label, color, [values[g] for g in keep]) for label, color, values in series]
    lines = [(label, [values[g] for g in keep]) for label, values in lines or []]
    n = len(series)
    width = 0.8 / max(n, 1)
    x = np.arange(len(groups))
    for i, (label, color, values) in enumerate(series):
        xs = [x[g] - 0.4 + width * (i + 0.5) for g in range(len(groups)) if values[g] is not None]
        vs = [v for v in values if v is not None]
        if not vs:
            continue
        rects = ax.bar(xs, vs, width * 0.92, label=label, color=color, edgecolor="white", linewidth=0.3)
        for rect, v in zip(rects, vs):
            text = (f"{v / 1e6:.2f}M" if v >= 1e6 else f"{v / 1e3:.0f}k" if v >= 1e4 else f"{v:.0f}" if v >= 100
                    else f"{v:.1f}" if v >= 1 else f"{v:.2f}")
            ax.annotate(text, (rect.get_x() + rect.get_width() / 2, rect.get_height()), ha="center",
                        va="bottom", fontsize=6, rotation=90, xytext=(0, 1), textcoords="offset points")
    for label, values in lines:
        first = True
        for g, v in enumerate(values):
            if v is None:
                continue
            ax.hlines(v, x[g] - 0.45, x[g] + 0.45, colors="black", linestyles="dashed", linewidth=1,
                      label=label if first else None)
            first = False
    ax.set_xticks(x)
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
        ax.set_ylim(top=ax.get_ylim()[1] * 2.5)  # room for the value labels
    else:
        tops = [v for _, _, values in series for v in values if v is not None]
        tops += [v for _, values in lines for v in values if v is not None]
        ax.set_ylim(0, max(tops) * 1.2)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def legend(ax):
    """The legend right of the axes, where it hides no bar."""
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def save(fig, h, name):
    os.makedirs(IMG_DIR, exist_ok=True)
    fig.savefig(os.path.join(IMG_DIR, f"{h.slug}-{name}.png"), dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)


def title(h, what):
    run = "" if h.record.get("run") == "full" or h.record.get("transcribed") else " (quick run)"
    return f"{what}\n{h.label}, commit {h.record.get('commit', '?')}{run}"


def plot_brd(h, direction):
    import matplotlib.pyplot as plt
    groups = [shape_header(s, t).replace(", ", "\n") for s, t in BRD_SHAPES]
    colors = {"memcpy": "floor", "copy_nt": "floor2", "philox": "bits", "solder": "solder",
              "solder_from_input": "solder2", "unfused": "solder3", "eigen": "eigen", "xtensor": "xtensor",
              "torch": "torch", "torch_compile": "torch3"}
    series = []
    for impl, _ in BRD_ROWS[direction]:
        if impl == "paired":
            continue
        if impl == "philox":
            values = [h.get(f"BM_philox_bits16/{s}", "GBps") if t == 1 else None for s, t in BRD_SHAPES]
            label = "Philox bits alone (floor)"
        else:
            values = [h.get(f"BM_bias_relu_dropout_{direction}/{impl}/{s}{suffix(t)}", "GBps") for s, t in BRD_SHAPES]
            label = impl + (" (floor)" if impl in ("memcpy", "copy_nt") else "")
        if any(v is not None for v in values):
            series.append((label, COLORS[colors[impl]], values))
    if not series:
        return
    fig, ax = plt.subplots(figsize=(10, 4.8))
    what = ("y = dropout(relu(x + b)) forward: reads x, writes y" if direction == "fwd"
            else "its backward: reads dy and the saved activation, writes dx (and db)")
    bars(ax, groups, series, "GB/s (bytes that must move / time)")
    ax.set_title(title(h, what), fontsize=10)
    legend(ax)
    save(fig, h, f"bias_relu_dropout_{direction}")


def plot_linear(h):
    import matplotlib.pyplot as plt
    fam = "BM_linear_bias_relu_fwd"
    groups = [f"{s}" + ("\n2 threads" if t == 2 else "") for s, t in LINEAR_COLUMNS]
    impls = [("solder", "solder"), ("solder_kernel", "solder2"), ("onednn_postops", "onednn"),
             ("openblas_then_epilogue", "openblas"), ("eigen", "eigen"), ("torch", "torch"),
             ("torch_jit", "torch2"), ("torch_compile", "torch3")]
    series = [(i, COLORS[c], [h.get(f"{fam}/{i}/{s}{suffix(t)}", "GFLOPs") for s, t in LINEAR_COLUMNS])
              for i, c in impls]
    series = [s for s in series if any(v is not None for v in s[2])]
    if not series:
        return
    fig, ax = plt.subplots(figsize=(11, 4.8))
    bars(ax, groups, series, "GFLOP/s (2MNK / time)",
         lines=[("BM_peak_fma (FMA peak)", [h.peak(t) for _, t in LINEAR_COLUMNS])])
    ax.set_title(title(h, "y = relu(x W^T + b), M x N x K"), fontsize=10)
    legend(ax)
    save(fig, h, "linear_bias_relu")


def plot_linear_dropout(h):
    import matplotlib.pyplot as plt
    groups = [f"{s}" + ("\n2 threads" if t == 2 else "") for s, t in LINEAR_COLUMNS]
    fig, axes = plt.subplots(2, 1, figsize=(11, 7.5), sharex=True)
    drawn = False
    for ax, direction in zip(axes, ("fwd", "bwd")):
        fam = f"BM_linear_bias_relu_dropout_{direction}"
        series = [(i, COLORS[c], [h.get(f"{fam}/{i}/{s}{suffix(t)}", "GFLOPs") for s, t in LINEAR_COLUMNS])
                  for i, c in (("solder", "solder"), ("unfused", "solder3"), ("torch", "torch"),
                               ("torch_compile", "torch3"))]
        series = [s for s in series if any(v is not None for v in s[2])]
        if not series:
            continue
        drawn = True
        bars(ax, groups, series, "GFLOP/s (2MNK fwd, 4MNK bwd)",
             lines=[("BM_peak_fma (FMA peak)", [h.peak(t) for _, t in LINEAR_COLUMNS])])
        ax.set_title("forward" if direction == "fwd" else "backward (dx, dW, db)", fontsize=9)
        legend(ax)
    if not drawn:
        plt.close(fig)
        return
    fig.suptitle(title(h, "y = dropout(relu(x W^T + b)), p = 0.1, M x N x K"), fontsize=10)
    save(fig, h, "linear_bias_relu_dropout")


def plot_mlp(h):
    import matplotlib.pyplot as plt
    groups = ["train step\nbatch 32", "train step\nbatch 256", "inference\nbatch 1", "inference\nbatch 256"]
    names = [("BM_train_step", 32), ("BM_train_step", 256), ("BM_inference", 1), ("BM_inference", 256)]
    series = []
    for impl, color in (("solder", "solder"), ("unfused", "solder3"), ("torch", "torch"),
                        ("torch_inference_mode", "torch2"), ("torch_compile", "torch3")):
        values = []
        for fam, b in names:
            s = h.get(f"{fam}/{impl}/digits_mlp/{b}", "seconds")
            values.append(None if s is None else b / s)
        if any(v is not None for v in values):
            series.append((impl, COLORS[color], values))
    if not series:
        return
    fig, ax = plt.subplots(figsize=(10, 4.8))
    bars(ax, groups, series, "samples per second (log scale)", log=True)
    ax.set_title(title(h, "digits MLP 64-256-128-10: AdamW training step and inference"), fontsize=10)
    legend(ax)
    save(fig, h, "digits_mlp")


def plot_sketched(h):
    import matplotlib.pyplot as plt
    fam = "BM_sketched_linear_fwd"
    groups = [c.replace("_L", "\nL").replace("_k", " k").replace("256x", "") for c in SKETCHED_CONFIGS]
    series = [(label, COLORS[c], [h.get(f"{fam}/{i}/{cfg}", "GFLOPs") for cfg in SKETCHED_CONFIGS])
              for i, label, c in (("solder", "solder", "solder"), ("torch_panther", "Panther eager", "torch"),
                                  ("torch_two_gemm", "torch two-GEMM", "torch2"),
                                  ("torch_compile_panther", "Panther compiled", "torch3"),
                                  ("torch_compile_two_gemm", "two-GEMM compiled", "torch4"))]
    series = [s for s in series if any(v is not None for v in s[2])]
    if not series:
        return
    fig, ax = plt.subplots(figsize=(13, 4.8))
    bars(ax, groups, series, "GFLOP/s (4 B L k (In + Out) / time)",
         lines=[("BM_peak_fma (FMA peak)", [h.peak(1)] * len(groups))])
    ax.set_title(title(h, "sketched linear forward, B = 256, In x Out, L terms, rank k: the same FLOPs in every form"),
                 fontsize=10)
    legend(ax)
    save(fig, h, "sketched_linear")


def plot_conv(h):
    import matplotlib.pyplot as plt
    cols = [("BM_conv_bn_relu_infer", "32x64x56x56", "conv3x3+BN+ReLU\nN = 32"),
            ("BM_conv_bn_relu_infer", "1x64x56x56", "conv3x3+BN+ReLU\nN = 1"),
            ("BM_depthwise_separable", "32x64x56x56", "depthwise-separable\nN = 32")]
    colors = ["solder", "solder2", "solder3", "openblas", "onednn", "torch", "torch2", "torch3"]
    series = [(impl, COLORS[c], [h.get(f"{fam}/{impl}/{shape}", "GFLOPs") for fam, shape, _ in cols])
              for (impl, _), c in zip(CONV_IMPLS, colors)]
    series = [s for s in series if any(v is not None for v in s[2])]
    if not series:
        return
    fig, ax = plt.subplots(figsize=(10, 4.8))
    bars(ax, [c[2] for c in cols], series, "GFLOP/s (the convolutions' 2 N Cout Ho Wo Cin/G Kh Kw)",
         lines=[("BM_peak_fma (FMA peak)", [h.peak(1)] * len(cols))])
    ax.set_title(title(h, "inference, 64 channels, 56x56, one thread"), fontsize=10)
    legend(ax)
    save(fig, h, "conv")


def draw(hosts):
    import matplotlib
    matplotlib.use("Agg")
    for h in hosts:
        for old in os.listdir(IMG_DIR) if os.path.isdir(IMG_DIR) else []:
            if old.startswith(h.slug + "-") and old.endswith(".png"):
                os.remove(os.path.join(IMG_DIR, old))  # a plot no longer drawn must not stay linked
        plot_brd(h, "fwd")
        plot_brd(h, "bwd")
        plot_linear(h)
        plot_linear_dropout(h)
        plot_mlp(h)
        plot_sketched(h)
        plot_conv(h)


# ---------------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------------

BLOCKS = {
    "hosts": render_hosts,
    "bias_relu_dropout_fwd": lambda hosts: render_brd(hosts, "fwd"),
    "bias_relu_dropout_bwd": lambda hosts: render_brd(hosts, "bwd"),
    "linear_bias_relu": render_linear,
    "linear_bias_relu_dropout": render_linear_dropout,
    "digits_mlp": render_mlp,
    "sketched_linear": render_sketched,
    "conv": render_conv,
}
MARKER = re.compile(r"(<!-- results:begin (\S+) -->\n)(.*?)(<!-- results:end -->)", re.S)


def rewrite_page(hosts):
    with open(PAGE) as f:
        page = f.read()
    seen = set()

    def fill(m):
        name = m.group(2)
        if name not in BLOCKS:
            sys.exit(f"results.py: docs/PERFORMANCE.md has a block {name!r}; known: {', '.join(BLOCKS)}")
        seen.add(name)
        body = ("<!-- generated by bench/results.py from docs/results/*.json; edits here are overwritten -->\n\n"
                + BLOCKS[name](hosts).rstrip() + "\n\n")
        return m.group(1) + body + m.group(4)

    page = MARKER.sub(fill, page)
    for name in sorted(set(BLOCKS) - seen):
        print(f"results.py: no block {name!r} in docs/PERFORMANCE.md; nothing written for it", file=sys.stderr)
    with open(PAGE, "w") as f:
        f.write(page)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 repetition of >= 0.05 s per case")
    parser.add_argument("--from-json", action="store_true", help="only redraw from docs/results/*.json")
    parser.add_argument("--no-build", action="store_true", help="use the solder_bench that is built")
    parser.add_argument("--no-torch", action="store_true", help="leave PyTorch out of the measurement")
    parser.add_argument("--solder-bench", default=os.path.join(ROOT, "build", "release", "bench", "solder_bench"))
    parser.add_argument("--torch-python", default=os.path.join(ROOT, "build", "torch-venv", "bin", "python"))
    args = parser.parse_args()

    host = this_host()
    print(f"results.py: {host['model_name']} (family {host['family']} model {host['model']}, {host['vectors']})",
          flush=True)
    os.makedirs(RESULTS_DIR, exist_ok=True)
    if not args.from_json:
        record = measure(args, host)
        path = os.path.join(RESULTS_DIR, f"{host['slug']}.json")
        with open(path, "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")
        print(f"results.py: wrote {os.path.relpath(path, ROOT)}", flush=True)
    hosts = load_hosts()
    if not hosts:
        sys.exit("results.py: no docs/results/*.json to draw from; run without --from-json first")
    draw(hosts)
    rewrite_page(hosts)
    print(f"results.py: rewrote docs/PERFORMANCE.md and docs/img/ from {len(hosts)} host(s): "
          + ", ".join(h.slug for h in hosts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
