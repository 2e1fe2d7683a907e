#!/usr/bin/env bash
# bench/data_parallel.sh [build dir] [rounds]: data-parallel scaling on this machine. Runs
# solder_bench_data_parallel with 1 and with 2 ranks of one thread each (2 ranks through shared
# memory, then through messages), alternated for `rounds` rounds (the host is shared: runs
# measured close together, ratios per round), then the bucket size sweep at 2 ranks and the
# reduction alone by both routes. Prints the CPU model first.
set -euo pipefail
build=${1:-build/release}
rounds=${2:-5}
bin="$build/bench/solder_bench_data_parallel"
[[ -x $bin ]] || { echo "data_parallel.sh: $bin not built (cmake --build --preset release --target solder_bench_data_parallel)" >&2; exit 1; }
# Open MPI refuses to run as root unless told (CI machines and containers run as root).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
run() { mpirun --oversubscribe -np "$1" "$bin" "${@:2}"; }
speed() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])["us_per_step"])' "$1"; }

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc --all) cores; $(date -u +%Y-%m-%dT%H:%MZ)"
for model in digits wide; do
  echo "== $model MLP, global batch 512: 1 rank vs 2 ranks (one thread each) through shared memory and through messages"
  ratios=()
  for ((r = 1; r <= rounds; ++r)); do
    one=$(run 1 --model "$model")
    two=$(run 2 --model "$model")
    msg=$(run 2 --model "$model" --messages)
    printf '%s\n' "$one" "$two" "$msg"
    python3 -c 'import sys; a, b, c = map(float, sys.argv[1:]); print(f"   round: speed-up {a/b:.2f}x (scaling efficiency {a/b/2:.2f}); through messages {a/c:.2f}x")' \
      "$(speed "$one")" "$(speed "$two")" "$(speed "$msg")"
    ratios+=("$(python3 -c 'import sys; print(float(sys.argv[1]) / float(sys.argv[2]))' "$(speed "$one")" "$(speed "$two")")")
  done
  python3 -c 'import statistics, sys; print(f"   median speed-up over {len(sys.argv) - 1} rounds: {statistics.median(map(float, sys.argv[1:])):.2f}x")' "${ratios[@]}"
done
echo "== bucket size, digits MLP, 2 ranks"
for bytes in 0 16384 65536 262144 1048576; do run 2 --bucket-bytes "$bytes"; done
echo "== the reduction alone, 2 ranks, through shared memory and through messages"
run 2 --reduce
run 2 --reduce --messages
