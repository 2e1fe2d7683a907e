#!/usr/bin/env bash
# run.sh: builds (where needed) and runs the CUDA benchmarks and their PyTorch peer, results into a folder.
#
#   bench/cuda/run.sh OUT_DIR [BUILD_DIR]
#
# BUILD_DIR (default: $SOLDER_BUILD_DIR, else <repo>/build/bench-cuda) is configured when it holds
# no CMakeCache.txt, then the target solder_bench_cuda is built. When that build fails but the
# binary is already there (a build directory made on another machine and copied here, whose
# cache names another source path), the binary is run as it is, with a warning.
# Environment: REPETITIONS (5), PYTHON (python3), TORCH_ARGS (extra arguments of torch_bench.py,
# e.g. --no-compile), BENCH_ARGS (extra arguments of the C++ binary, e.g. --benchmark_filter=fwd).
# BENCHES: the binaries to run, by name (default: bias_relu_dropout linear_bias_relu_dropout
# digits_train_step conv_bn_relu).
# Writes OUT_DIR/nvidia-smi.txt, OUT_DIR/<name>.{txt,json} per binary, and OUT_DIR/torch.{txt,json};
# torch.txt ends with torch / solder per matching case (torch_bench.py --solder-json).
# linear_bias_relu_dropout and conv_bn_relu need CUDA 13's libcublasLt.so.13 (from the toolkit's
# lib directory, which their RPATH names, or LD_LIBRARY_PATH).
# BUILD_DIR may also be a bundle made by `scripts/gpu_check.sh build` (it holds MANIFEST.tsv): then
# nothing is built, the binaries come from BUILD_DIR/bin and their libraries from BUILD_DIR/lib.
set -uo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: $0 OUT_DIR [BUILD_DIR]" >&2
  exit 2
fi
out=$1
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${2:-${SOLDER_BUILD_DIR:-$root/build/bench-cuda}}
repetitions=${REPETITIONS:-5}
python=${PYTHON:-python3}
read -r -a benches <<<"${BENCHES:-bias_relu_dropout linear_bias_relu_dropout digits_train_step conv_bn_relu}"
mkdir -p "$out"
out=$(cd "$out" && pwd)

bin_dir=$build/bench/cuda
if [[ -f $build/MANIFEST.tsv ]]; then
  bin_dir=$build/bin
  export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  for name in "${benches[@]}"; do
    [[ -x $bin_dir/solder_bench_cuda_$name ]] || { echo "run.sh: the bundle $build has no solder_bench_cuda_$name" >&2; exit 1; }
  done
elif [[ ! -f $build/CMakeCache.txt ]]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DSOLDER_BUILD_TESTS=OFF -DSOLDER_BUILD_EXAMPLES=OFF \
    -DSOLDER_BUILD_BENCH=ON -DSOLDER_BUILD_CUDA=ON || { echo "run.sh: configuring $build failed" >&2; exit 1; }
fi
if [[ ! -f $build/MANIFEST.tsv ]] && ! cmake --build "$build" --target solder_bench_cuda -j "$(nproc)"; then
  for name in "${benches[@]}"; do
    bin=$bin_dir/solder_bench_cuda_$name
    if [[ ! -x $bin ]]; then
      echo "run.sh: building in $build failed and there is no $bin" >&2
      exit 1
    fi
  done
  echo "run.sh: WARNING: building in $build failed; running the binaries already there, which may predate the sources" >&2
fi

if command -v nvidia-smi >/dev/null; then
  nvidia-smi -q >"$out/nvidia-smi.txt" 2>&1 || true
fi

status=0
solder_json=()
for name in "${benches[@]}"; do
  rm -f "$out/$name.json"  # a previous run's must not stand in for this one's in the ratios
  # shellcheck disable=SC2086  # BENCH_ARGS and TORCH_ARGS are word lists
  "$bin_dir/solder_bench_cuda_$name" --benchmark_repetitions="$repetitions" --benchmark_report_aggregates_only=true \
    --benchmark_out="$out/$name.json" --benchmark_out_format=json ${BENCH_ARGS:-} \
    2>&1 | tee "$out/$name.txt" || status=1
  [[ -s $out/$name.json ]] && solder_json+=(--solder-json "$out/$name.json")
done
# shellcheck disable=SC2086
PYTHONUNBUFFERED=1 "$python" "$root/bench/cuda/torch_bench.py" --repetitions "$repetitions" \
  --json "$out/torch.json" "${solder_json[@]}" ${TORCH_ARGS:-} 2>&1 | tee "$out/torch.txt" || status=1
exit $status
