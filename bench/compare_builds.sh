#!/usr/bin/env bash
# bench/compare_builds.sh BEFORE AFTER [ROUNDS] [FILTER]: runs two solder_bench binaries (two
# builds of solder, e.g. before and after a change) alternately, ROUNDS times each (default 3),
# on the same cases, and prints each case's median over all rounds for both and after/before.
# The host's speed drifts within seconds; alternating the binaries spreads that drift over
# both, and the paired cases' ratios (solder against its floor or peer, timed call by call in
# one process) are the figures least affected by it. Single-thread cases only by default.
set -euo pipefail
before=${1:?usage: compare_builds.sh BEFORE AFTER [ROUNDS] [FILTER]}
after=${2:?usage: compare_builds.sh BEFORE AFTER [ROUNDS] [FILTER]}
rounds=${3:-3}
filter=${4:-'^(BM_bias_relu_dropout_(fwd|bwd)/(solder|copy_nt)/[0-9x]+|BM_bias_relu_dropout_(fwd|bwd)_paired/solder_vs_floor/[0-9x]+/iterations:[0-9]+|BM_linear_bias_relu_fwd/(solder|onednn_postops)/[0-9x]+|BM_linear_bias_relu_fwd_paired/solder_vs_onednn_postops/[0-9x]+/iterations:[0-9]+|BM_train_step/solder/digits_mlp/[0-9]+|BM_inference/solder/digits_mlp/[0-9]+)$'}

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
grep -m1 'model name' /proc/cpuinfo || true
for ((r = 1; r <= rounds; ++r)); do
  for side in before after; do
    bin=$before
    [[ $side == after ]] && bin=$after
    echo "round $r: $side ($bin)" >&2
    OMP_WAIT_POLICY=PASSIVE OMP_PROC_BIND=true OMP_PLACES=cores \
      "$bin" --benchmark_filter="$filter" --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
      --benchmark_enable_random_interleaving=true --benchmark_min_time=0.2 \
      --benchmark_out="$out/$side.$r.json" --benchmark_out_format=json >/dev/null
  done
done

python3 - "$out" <<'EOF'
import glob, json, statistics, sys
out = sys.argv[1]
def medians(side):
    cases = {}
    for path in sorted(glob.glob(f"{out}/{side}.*.json")):
        for b in json.load(open(path))["benchmarks"]:
            if b.get("aggregate_name") != "median":
                continue
            name = b["run_name"]
            # A paired case's figure is its ratio of speeds (solder over its floor or peer: the
            # "roofline" or "speedup" counter); any other case's, its time per call.
            ratio = b.get("roofline", b.get("speedup")) if "_paired/" in name else None
            value = ratio if ratio is not None else b["real_time"] if name.endswith("real_time") else b["cpu_time"]
            cases.setdefault(name, []).append((value, b.get("time_unit", "")))
    return {k: (statistics.median(v for v, _ in vals), vals[0][1]) for k, vals in cases.items()}
b, a = medians("before"), medians("after")
print(f"{'case':<78} {'before':>10} {'after':>10} {'after/before':>13}")
for name in sorted(set(b) & set(a)):
    (vb, unit), (va, _) = b[name], a[name]
    kind = "speed ratio to peer, higher is better" if "_paired/" in name else unit
    print(f"{name:<78} {vb:>10.4g} {va:>10.4g} {va / vb:>13.3f}  ({kind})")
EOF
