#!/usr/bin/env bash
# bench/compare_torch.sh SOLDER_FILTER TORCH_FILTER [ROUNDS]: runs solder_bench and
# bench/torch_bench.py alternately, ROUNDS times each (default 5), and prints every case's time
# per round, then each torch case's time over each solder case's, per round and as the median of
# those per-round ratios. The two run in separate processes, so no pairing call by call is
# possible; alternating them round after round puts both under the same drift of a shared host,
# and the per-round ratios show how far that drift moves the comparison.
#   SOLDER_BENCH (default build/release/bench/solder_bench), TORCH_PYTHON (default
#   build/torch-venv/bin/python) name the two programs. One thread.
set -euo pipefail
solder_filter=${1:?usage: compare_torch.sh SOLDER_FILTER TORCH_FILTER [ROUNDS]}
torch_filter=${2:?usage: compare_torch.sh SOLDER_FILTER TORCH_FILTER [ROUNDS]}
rounds=${3:-5}
here=$(cd "$(dirname "$0")" && pwd)
solder_bench=${SOLDER_BENCH:-$here/../build/release/bench/solder_bench}
torch_python=${TORCH_PYTHON:-$here/../build/torch-venv/bin/python}

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
grep -m1 'model name' /proc/cpuinfo || true
for ((r = 1; r <= rounds; ++r)); do
  echo "round $r" >&2
  OMP_WAIT_POLICY=PASSIVE OMP_PROC_BIND=true OMP_PLACES=cores \
    "$solder_bench" --benchmark_filter="$solder_filter" --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true --benchmark_min_time=0.2 \
    --benchmark_out="$out/solder.$r.json" --benchmark_out_format=json >/dev/null 2>&1
  "$torch_python" "$here/torch_bench.py" --filter "$torch_filter" --repetitions 3 \
    --json "$out/torch.$r.json" >/dev/null
done

python3 - "$out" "$rounds" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def solder_round(r):
    rows = json.load(open(f"{out}/solder.{r}.json"))["benchmarks"]
    scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
    return {b["run_name"]: b["real_time"] * scale[b["time_unit"]]
            for b in rows if b.get("aggregate_name") == "median"}
def torch_round(r):
    return {b["name"]: b["real_time_us"] for b in json.load(open(f"{out}/torch.{r}.json"))["benchmarks"]}
s = [solder_round(r) for r in range(1, rounds + 1)]
t = [torch_round(r) for r in range(1, rounds + 1)]
print(f"{'case (us per call, one column a round)':<64}" + "".join(f"{r:>10}" for r in range(1, rounds + 1)))
for side in (s, t):
    for name in sorted(side[0]):
        print(f"{name:<64}" + "".join(f"{rnd.get(name, float('nan')):>10.1f}" for rnd in side))
print()
# A torch case is set against each solder case of the same family and shape: the names
# family/impl/shape... that differ in the impl alone.
def family_shape(name):
    parts = name.split("/")
    return (parts[0], "/".join(parts[2:])) if len(parts) > 2 else (name, "")
print(f"{'torch case / solder case (higher: solder faster)':<64}" + "".join(f"{r:>10}" for r in range(1, rounds + 1)) + f"{'median':>10}")
for tn in sorted(t[0]):
    for sn in sorted(s[0]):
        if family_shape(tn) != family_shape(sn):
            continue
        ratios = [tr[tn] / sr[sn] for tr, sr in zip(t, s) if tn in tr and sn in sr]
        print(f"{tn.split('/')[1] + ' / ' + sn:<64}" + "".join(f"{x:>10.3f}" for x in ratios)
              + f"{statistics.median(ratios):>10.3f}")
peak = "BM_peak_fma"
if all(peak in rnd for rnd in s):
    print()
    print(f"{'fraction of BM_peak_fma (its GFLOP/s in the same round)':<64}")
    for sn in sorted(s[0]):
        if sn == peak:
            continue
        rows = [json.load(open(f"{out}/solder.{r}.json"))["benchmarks"] for r in range(1, rounds + 1)]
        def gflops(rs, name):
            return next(b["GFLOPs"] for b in rs if b["run_name"] == name and b.get("aggregate_name") == "median" and "GFLOPs" in b)
        try:
            fr = [gflops(rs, sn) / gflops(rs, peak) for rs in rows]
        except StopIteration:
            continue
        print(f"{sn:<64}" + "".join(f"{x:>10.3f}" for x in fr) + f"{statistics.median(fr):>10.3f}")
EOF
