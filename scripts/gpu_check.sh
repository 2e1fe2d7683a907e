#!/usr/bin/env bash
# gpu_check.sh: builds a self-contained bundle of the GPU tests and CUDA benchmarks, and runs it on a GPU machine.
#
#   scripts/gpu_check.sh build [DIR]        on a machine with the toolkit and the Debian packages
#   scripts/gpu_check.sh run [DIR] [OUT]    on the GPU machine (toolkit, maybe Python with PyTorch)
#
# build: configures and builds (Release, nvcc for GPU_CHECK_ARCHS, default 90: H100/H200) the GPU
#   test programs (tests/cuda, tests/dist's NCCL programs), the CUDA benchmarks (bench/cuda) and a
#   probe of the CUDA runtime, in the CMake tree GPU_CHECK_TREE (default DIR-build), with JOBS jobs
#   (default: all cores). DIR (default <repo>/build/gpu-check, at most 64 MiB) then holds, stripped:
#     bin/           the programs (gpu_check_probe first)
#     lib/           the shared libraries they need that a machine without Debian's packages may
#                    lack (libcudart, libgomp, libbenchmark); lib/compat: libstdc++ and libgcc_s,
#                    used only where the machine's own are too old
#     examples/data/digits.csv, tests/cuda/   the training tests find the data from the path of
#                    their source file, compiled in relative to the repository root (tests/cuda/..
#                    /../examples/data), and run with DIR as their working directory
#     bench/cuda/torch_bench.py   the PyTorch peer of the benchmarks
#     MANIFEST.tsv, manifest.json  the programs, what they need from outside (cuBLASLt and NCCL:
#                    too large to carry), the commit, the flags
#     gpu_check.sh   this script: `bash DIR/gpu_check.sh run` needs nothing else
#   The host code is compiled for x86-64-v3 (AVX2+FMA), not -march=native: the GPU machine's
#   processor is not this one.
#
# run: prints the GPU, then runs every test program (exit 0: pass, 77: skip, others: fail), then
#   the benchmarks with short settings, then torch_bench.py where `import torch` works; every
#   command under a timeout, the whole within GPU_CHECK_BUDGET seconds (default 330). Writes
#   OUT/gpu_check.json and OUT/gpu_check.md, full outputs under OUT/logs and the benchmarks'
#   JSON under OUT/bench. OUT defaults to $OUT when set, else DIR/results. Exit 0 when nothing
#   failed (also: no GPU, every test skipped), 1 when a test failed or timed out, 2 on bad usage.
#   Environment: GPU_CHECK_ONLY (regex: run only the programs whose name matches),
#   GPU_CHECK_BENCH=0 (no benchmarks), GPU_CHECK_TORCH=0 (no PyTorch), GPU_CHECK_TORCH_COMPILE=1
#   (also the torch.compile cases), GPU_CHECK_TEST_TIMEOUT (150 s), GPU_CHECK_BENCH_TIMEOUT (60 s),
#   GPU_CHECK_TORCH_TIMEOUT (120 s), GPU_CHECK_MIN_TIME (0.05 s per benchmark case).
set -uo pipefail

die() {
  echo "gpu_check: $*" >&2
  exit 2
}

script=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
here=$(dirname "$script")

# ---------------------------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------------------------

# A CUDA runtime probe: the tests' own check (eval::cuda::device_count) says "no device" for
# every runtime error, a driver too old for this toolkit's runtime included; this one tells them
# apart and launches one kernel, so a missing sm_XX image shows here and not as a failed test.
probe_source() {
  cat <<'EOF'
// gpu_check_probe: the CUDA runtime's view of the machine. Exit 0: a device ran a kernel;
// 77: no device; 1: a device is there but the runtime cannot use it (driver, image).
#include <cstdio>
#include <cuda_runtime.h>

__global__ void add_one(int* p) { *p += 1; }

int main() {
  int runtime = 0, driver = 0, count = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  std::printf("cuda_runtime: %d.%d\ncuda_driver: %d.%d\n", runtime / 1000, runtime % 1000 / 10, driver / 1000,
              driver % 1000 / 10);
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    std::printf("devices: 0\nerror: %s: %s\n", cudaGetErrorName(e), cudaGetErrorString(e));
    return e == cudaErrorNoDevice ? 77 : 1;
  }
  std::printf("devices: %d\n", count);
  if (count == 0) return 77;
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, d) == cudaSuccess)
      std::printf("device %d: %s, sm_%d%d, %d SMs, %.1f GiB\n", d, p.name, p.major, p.minor, p.multiProcessorCount,
                  double(p.totalGlobalMem) / (1 << 30));
  }
  int* p = nullptr;
  int host = 41;
  cudaError_t k = cudaMalloc(&p, sizeof(int));
  if (k == cudaSuccess) k = cudaMemcpy(p, &host, sizeof(int), cudaMemcpyHostToDevice);
  if (k == cudaSuccess) {
    add_one<<<1, 1>>>(p);
    k = cudaGetLastError();
  }
  if (k == cudaSuccess) k = cudaMemcpy(&host, p, sizeof(int), cudaMemcpyDeviceToHost);
  if (k != cudaSuccess || host != 42) {
    std::printf("kernel: FAILED (%s)\n", k != cudaSuccess ? cudaGetErrorString(k) : "wrong result");
    return 1;
  }
  std::printf("kernel: ran\n");
  return 0;
}
EOF
}

# Libraries every Linux machine has (glibc and the loader), and those too large to carry.
is_glibc() { [[ $1 =~ ^(linux-vdso|linux-gate|ld-linux|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libresolv\.so|libutil\.so|libmvec\.so) ]]; }
is_compat() { [[ $1 =~ ^(libstdc\+\+\.so|libgcc_s\.so) ]]; }
is_external() { [[ $1 =~ ^(libcublasLt\.so|libcublas\.so|libnccl\.so|libcuda\.so) ]]; }

json_escape() {  # JSON string body of $1, ASCII only (others become '?'), control characters dropped
  local s
  s=$(printf '%s' "$1" | LC_ALL=C tr '\200-\377' '?' | LC_ALL=C tr -d '\000-\010\013\014\016-\037\177')
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/\\n}
  s=${s//$'\r'/\\r}
  s=${s//$'\t'/\\t}
  printf '%s' "$s"
}

cmd_build() {
  local root dir tree jobs archs nvcc start
  root=$(cd "$here/.." && pwd)
  [[ -f $root/CMakeLists.txt && -d $root/tests/cuda ]] || die "build runs from the repository's scripts/ ($root is not the repository)"
  dir=${1:-$root/build/gpu-check}
  mkdir -p "$dir" || die "cannot create $dir"
  dir=$(cd "$dir" && pwd)
  tree=${GPU_CHECK_TREE:-$dir-build}
  jobs=${JOBS:-$(nproc)}
  archs=${GPU_CHECK_ARCHS:-90}
  nvcc=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
  [[ -x $nvcc ]] || die "nvcc not found (set CUDACXX)"
  [[ $dir != "$root" && $dir != "$tree" && $dir != / ]] || die "DIR must be a folder of its own"
  if [[ -n $(ls -A "$dir") && ! -f $dir/MANIFEST.tsv ]]; then
    die "$dir is not empty and holds no MANIFEST.tsv: not overwriting it"
  fi
  command -v ninja >/dev/null || die "the build needs ninja"
  start=$SECONDS

  # The prefix map makes __FILE__ relative to the repository root: the training tests find
  # examples/data/digits.csv from it, so the bundle finds it wherever it is run from.
  echo "gpu_check: configuring $tree (CUDA architectures: $archs)"
  cmake -S "$root" -B "$tree" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_COMPILER="$nvcc" -DSOLDER_BUILD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${archs// /;}" \
    -DSOLDER_BUILD_TESTS=ON -DSOLDER_TEST_NATIVE=OFF -DSOLDER_TEST_AVX2=OFF -DSOLDER_TEST_COMPILE_CHECKS=OFF \
    -DSOLDER_BUILD_BENCH=ON -DSOLDER_BUILD_EXAMPLES=OFF -DSOLDER_INSTALL=OFF -DSOLDER_NATIVE=OFF -DSOLDER_SANITIZE=OFF \
    "-DCMAKE_CXX_FLAGS=-march=x86-64-v3 -fmacro-prefix-map=$root/=" \
    "-DCMAKE_CUDA_FLAGS=-Xcompiler=-fmacro-prefix-map=$root/=" >"$tree.configure.log" 2>&1 \
    || { tail -30 "$tree.configure.log" >&2; die "configuring failed (log: $tree.configure.log)"; }
  # Every program target, built with -k 0: a program that does not compile (work in progress
  # elsewhere in the tree) is listed in the manifest as not built, and the others are bundled.
  local targets=() t
  while IFS= read -r t; do targets+=("$t"); done < <(
    ninja -C "$tree" -t targets all | sed -n 's/^\(solder_cuda_[a-z0-9_]*\|solder_dist_nccl_[a-z0-9_]*\|solder_bench_cuda_[a-z0-9_]*\): .*/\1/p' \
      | grep -vx 'solder_cuda_tests' | sort -u)
  ((${#targets[@]} > 0)) || die "no GPU test or benchmark targets in $tree (is CUDA enabled?)"
  echo "gpu_check: building ${#targets[@]} programs with $jobs jobs"
  ninja -C "$tree" -j "$jobs" -k 0 "${targets[@]}" || echo "gpu_check: WARNING: some programs did not build; see above" >&2

  local probe_flags=() a
  for a in $archs; do probe_flags+=(-gencode "arch=compute_$a,code=[sm_$a,compute_$a]"); done
  probe_source >"$tree/gpu_check_probe.cu"
  "$nvcc" -O2 -std=c++17 "${probe_flags[@]}" -cudart static "$tree/gpu_check_probe.cu" -o "$tree/gpu_check_probe" \
    || die "compiling the probe failed"

  # The programs: the probe first, then each target that builds on its own now (up to date
  # after the build above, or failing again: a binary left from an earlier build is not taken).
  local programs=("$tree/gpu_check_probe") not_built=() f name
  for t in "${targets[@]}"; do
    f=$(find "$tree/tests" "$tree/bench" -type f -name "$t" -not -path '*/CMakeFiles/*' | head -1)
    if [[ -n $f ]] && ninja -C "$tree" -j "$jobs" "$t" >"$tree/gpu_check.$t.log" 2>&1; then
      programs+=("$f")
    else
      not_built+=("$t")
      echo "gpu_check: $t did not build (log: $tree/gpu_check.$t.log); listed as not built" >&2
    fi
  done
  ((${#programs[@]} > 1)) || die "no program built in $tree"

  rm -rf "$dir"
  mkdir -p "$dir/bin" "$dir/lib/compat" "$dir/examples/data" "$dir/tests/cuda" "$dir/bench/cuda" || die "cannot fill $dir"

  local manifest="$dir/MANIFEST.tsv" kind libs soname path
  local -A bundled=() external_all=()
  printf '# kind\tprogram\tlibraries from outside the bundle\n' >"$manifest"  # first: marks the folder as a bundle
  for f in "${programs[@]}"; do
    name=$(basename "$f")
    if ! { cp "$f" "$dir/bin/$name" && strip --strip-unneeded "$dir/bin/$name"; }; then die "copying $name failed"; fi
    case $name in
      gpu_check_probe) kind=probe ;;
      solder_bench_cuda_*) kind=bench ;;
      *) kind="test" ;;
    esac
    libs=""
    while read -r soname path; do
      [[ -z $soname ]] && continue
      is_glibc "$soname" && continue
      [[ $path == not ]] && die "$name: $soname is not found here"
      if is_external "$soname"; then
        libs+="${libs:+,}$soname"
        external_all[$soname]=$path
      elif [[ -z ${bundled[$soname]:-} ]]; then
        if is_compat "$soname"; then cp -L "$path" "$dir/lib/compat/$soname"; else cp -L "$path" "$dir/lib/$soname"; fi \
          || die "copying $path failed"
        bundled[$soname]=$path
      fi
    done < <(ldd "$f" | awk '$2 == "=>" { print $1, $3 }')
    printf '%s\t%s\t%s\n' "$kind" "$name" "${libs:--}" >>"$manifest"
  done
  for t in "${not_built[@]}"; do
    case $t in solder_bench_cuda_*) kind=bench ;; *) kind="test" ;; esac
    printf '%s\t%s\t%s\n' "$kind" "$t" "not_built" >>"$manifest"
  done
  chmod u+w "$dir"/lib/*.so* "$dir"/lib/compat/*.so* 2>/dev/null
  strip --strip-unneeded "$dir"/lib/*.so* "$dir"/lib/compat/*.so* 2>/dev/null

  cp "$root/examples/data/digits.csv" "$root/examples/data/README.md" "$dir/examples/data/" || die "copying the data failed"
  printf 'The training tests reach ../../examples/data/digits.csv from here (their source path, relative);\nthis folder must exist.\n' \
    >"$dir/tests/cuda/README"
  cp "$root/bench/cuda/torch_bench.py" "$dir/bench/cuda/" || die "copying torch_bench.py failed"
  cp "$script" "$dir/gpu_check.sh"

  # What the bundled programs would still take from this machine, beyond glibc, libstdc++ and
  # the libraries the GPU machine must provide: nothing, unless a library was missed above.
  local leaks=() soname2 path2
  for f in "$dir"/bin/*; do
    while read -r soname2 path2; do
      is_glibc "$soname2" || is_compat "$soname2" || is_external "$soname2" || [[ $path2 == "$dir/lib/"* ]] \
        || leaks+=("$(basename "$f"): $soname2 from $path2")
    done < <(LD_LIBRARY_PATH=$dir/lib ldd "$f" | awk '$2 == "=>" { print $1, $3 }')
  done
  ((${#leaks[@]} == 0)) || { printf '  %s\n' "${leaks[@]}" >&2; die "these libraries would come from outside the bundle"; }

  # Programs that still name this machine's source tree (their data would not be found).
  local absolute=()
  for f in "$dir"/bin/*; do grep -qaF "$root/tests/cuda" "$f" && absolute+=("$(basename "$f")"); done

  local commit dirty glibc_max size_kib build_s
  commit=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
  dirty=$(git -C "$root" status --porcelain --untracked-files=no -- include kernels tests/cuda tests/dist bench/cuda generators \
    CMakeLists.txt tests/CMakeLists.txt bench/CMakeLists.txt 2>/dev/null | awk '{ print $2 }' | head -50)
  glibc_max=$(grep -aoh 'GLIBC_2\.[0-9]*' "$dir"/bin/* "$dir"/lib/*.so* 2>/dev/null | sort -uV | tail -1)
  size_kib=$(du -sk "$dir" | awk '{ print $1 }')
  build_s=$((SECONDS - start))

  {
    printf '{\n  "commit": "%s",\n' "$commit"
    printf '  "uncommitted_changes_in": ['
    local first=1 p
    for p in $dirty; do
      ((first)) || printf ', '
      printf '"%s"' "$(json_escape "$p")"
      first=0
    done
    printf '],\n'
    printf '  "built_at": "%s",\n  "built_on": "%s",\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(json_escape "$(uname -srm)")"
    printf '  "nvcc": "%s",\n' "$(json_escape "$("$nvcc" --version | tail -1)")"
    printf '  "cuda_architectures": "%s",\n  "host_flags": "-O3 -march=x86-64-v3",\n' "$archs"
    printf '  "glibc_required": "%s",\n  "size_kib": %s,\n  "build_seconds": %s,\n' "$glibc_max" "$size_kib" "$build_s"
    printf '  "programs": [\n'
    first=1
    local n_kind n_name n_libs
    while IFS=$'\t' read -r n_kind n_name n_libs; do
      [[ $n_kind == \#* ]] && continue
      ((first)) || printf ',\n'
      printf '    {"kind": "%s", "name": "%s", "bytes": %s, "needs": "%s"}' "$n_kind" "$n_name" \
        "$(stat -c %s "$dir/bin/$n_name" 2>/dev/null || echo null)" "$n_libs"
      first=0
    done <"$manifest"
    printf '\n  ],\n  "bundled_libraries": {'
    first=1
    for soname in $(printf '%s\n' "${!bundled[@]}" | sort); do
      ((first)) || printf ', '
      printf '"%s": "%s"' "$soname" "${bundled[$soname]}"
      first=0
    done
    printf '},\n  "libraries_from_the_machine": {'
    first=1
    for soname in $(printf '%s\n' "${!external_all[@]}" | sort); do
      ((first)) || printf ', '
      printf '"%s": "%s"' "$soname" "${external_all[$soname]}"
      first=0
    done
    printf '}\n}\n'
  } >"$dir/manifest.json"

  echo "gpu_check: bundle $dir"
  column -t -s $'\t' "$manifest" 2>/dev/null || cat "$manifest"
  echo "gpu_check: bundled libraries: $(printf '%s ' "${!bundled[@]}")"
  echo "gpu_check: from the GPU machine: $(printf '%s ' "${!external_all[@]}")(the toolkit's, or PyTorch's nvidia packages)"
  echo "gpu_check: newest glibc symbol needed: $glibc_max"
  ((${#absolute[@]} == 0)) || echo "gpu_check: WARNING: these still name $root/tests/cuda: ${absolute[*]}" >&2
  echo "gpu_check: size $((size_kib / 1024)) MiB ($size_kib KiB); built in ${build_s} s"
  ((size_kib < 64 * 1024)) || die "the bundle is over 64 MiB"
  return 0
}

# ---------------------------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------------------------

now() { printf '%s' "${EPOCHREALTIME:-$(date +%s.%N)}"; }
seconds_between() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

# The directory holding the shared library $1 on this machine: the loader's cache, the toolkit's
# usual places, then the CUDA libraries that PyTorch's wheels install (nvidia/*/lib).
find_library_dir() {
  local name=$1 d
  local -a dirs=()
  IFS=: read -r -a dirs <<<"${LD_LIBRARY_PATH:-}"
  dirs+=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/*/lib /usr/local/cuda-*/lib64
    /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib "${python_lib_dirs[@]}")
  for d in "${dirs[@]}"; do
    [[ -n $d && -e $d/$name ]] && { printf '%s' "$d"; return 0; }
  done
  d=$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n { print $NF; exit }')
  [[ -n $d ]] && { dirname "$d"; return 0; }
  return 1
}

cmd_run() {
  local dir out
  if [[ -n ${1:-} ]]; then
    dir=$1
  elif [[ -f $here/MANIFEST.tsv ]]; then
    dir=$here
  else
    dir=$here/../build/gpu-check
  fi
  [[ -f $dir/MANIFEST.tsv ]] || die "$dir holds no bundle (MANIFEST.tsv); make one with: scripts/gpu_check.sh build"
  dir=$(cd "$dir" && pwd)
  out=${2:-${OUT:-$dir/results}}
  mkdir -p "$out/logs" "$out/bench" || die "cannot create $out"
  out=$(cd "$out" && pwd)
  rm -f "$out/gpu_check.json" "$out/gpu_check.md" "$out"/logs/* "$out"/bench/*  # a previous run's must not mix in
  mkdir -p "$dir/tests/cuda" 2>/dev/null  # the data's relative path goes through it

  local budget=${GPU_CHECK_BUDGET:-330} t0=$SECONDS
  local test_timeout=${GPU_CHECK_TEST_TIMEOUT:-150} bench_timeout=${GPU_CHECK_BENCH_TIMEOUT:-60}
  local torch_timeout=${GPU_CHECK_TORCH_TIMEOUT:-120} min_time=${GPU_CHECK_MIN_TIME:-0.05}
  local only=${GPU_CHECK_ONLY:-}
  local commit
  commit=$(awk -F'"' '/"commit"/ { print $4; exit }' "$dir/manifest.json" 2>/dev/null)
  echo "gpu_check: bundle $dir (commit ${commit:-unknown}), results into $out, budget ${budget} s"

  # --- the machine ---
  local gpu_name="" driver="" smi_cuda="" smi_ok=0
  if command -v nvidia-smi >/dev/null; then
    timeout -k 5 30 nvidia-smi >"$out/logs/nvidia-smi.txt" 2>&1 </dev/null
    if timeout -k 5 30 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader \
      >"$out/logs/nvidia-smi-query.txt" 2>&1 </dev/null; then
      smi_ok=1
      gpu_name=$(head -1 "$out/logs/nvidia-smi-query.txt" | cut -d, -f1 | sed 's/^ *//; s/ *$//')
      driver=$(head -1 "$out/logs/nvidia-smi-query.txt" | cut -d, -f2 | sed 's/^ *//; s/ *$//')
      smi_cuda=$(grep -o 'CUDA Version: *[0-9.]*' "$out/logs/nvidia-smi.txt" | awk '{ print $NF }' | head -1)
    fi
  else
    echo "nvidia-smi: not found" >"$out/logs/nvidia-smi.txt"
  fi
  echo "gpu_check: GPU: ${gpu_name:-none found by nvidia-smi}${driver:+, driver $driver}${smi_cuda:+ (CUDA $smi_cuda)}"
  echo "gpu_check: host: $(uname -srm); $(nproc 2>/dev/null) cores; $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//')"

  # The host code is x86-64-v3: another processor family, or one without AVX2 and FMA, cannot run it.
  if [[ $(uname -m) != x86_64 ]]; then
    echo "gpu_check: WARNING: this machine is $(uname -m); the bundle's programs are x86-64" >&2
  elif [[ -r /proc/cpuinfo ]] && ! grep -m1 '^flags' /proc/cpuinfo | grep -qw avx2; then
    echo "gpu_check: WARNING: this processor lacks AVX2; the bundle's host code needs x86-64-v3" >&2
  fi

  # glibc cannot be carried: the programs need this machine's to be as new as the build's symbols.
  local glibc_need glibc_have
  glibc_need=$(awk -F'"' '/"glibc_required"/ { print $4; exit }' "$dir/manifest.json" 2>/dev/null | sed 's/^GLIBC_//')
  glibc_have=$(ldd --version 2>/dev/null | head -1 | awk '{ print $NF }')
  if [[ -n $glibc_need && -n $glibc_have && $(printf '%s\n%s\n' "$glibc_need" "$glibc_have" | sort -V | tail -1) != "$glibc_have" ]]; then
    echo "gpu_check: WARNING: the programs need glibc $glibc_need, this machine has $glibc_have" >&2
  fi

  # --- where the libraries come from ---
  python_lib_dirs=()
  local python=${PYTHON:-python3} sp
  if command -v "$python" >/dev/null; then
    while IFS= read -r sp; do
      [[ -d $sp ]] || continue
      for d in "$sp"/nvidia/*/lib "$sp"/torch/lib; do [[ -d $d ]] && python_lib_dirs+=("$d"); done
    done < <(timeout -k 5 30 "$python" -c 'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null </dev/null)
  fi
  local libpath="$dir/lib" soname d missing_all=""
  local -A lib_dir=()
  for soname in $(grep -v '^#' "$dir/MANIFEST.tsv" | cut -f3 | tr ',' '\n' | grep -vx -e - -e not_built | sort -u); do
    if d=$(find_library_dir "$soname"); then
      lib_dir[$soname]=$d
      [[ :$libpath: == *:"$d":* ]] || libpath+=:$d
    else
      missing_all+=" $soname"
    fi
  done
  # The bundle's libstdc++ only where this machine has none or one older than the build's (the
  # probe's loader errors below say the same where ldd is missing).
  local loader_errors="(GLIBCXX|CXXABI|GCC)_[0-9.]+' not found|lib(stdc\+\+|gcc_s)\.so[.0-9]* => not found|error while loading shared libraries: lib(stdc\+\+|gcc_s)"
  local ldd_out=""
  command -v ldd >/dev/null && ldd_out=$(LD_LIBRARY_PATH=$libpath ldd "$dir"/bin/* 2>&1)
  if grep -Eq "$loader_errors" <<<"$ldd_out"; then
    libpath="$dir/lib/compat:$libpath"
    echo "gpu_check: this machine's libstdc++ is missing or older than the build's: using the bundle's"
  fi
  export LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  for soname in "${!lib_dir[@]}"; do echo "gpu_check: $soname from ${lib_dir[$soname]}"; done
  [[ -z $missing_all ]] || echo "gpu_check: not found on this machine:$missing_all (the programs needing them are not run)"

  # --- the runs ---
  local -a r_kind=() r_name=() r_status=() r_rc=() r_seconds=() r_note=()
  record() {  # kind name status rc seconds note
    r_kind+=("$1"); r_name+=("$2"); r_status+=("$3"); r_rc+=("$4"); r_seconds+=("$5"); r_note+=("$6")
    printf 'gpu_check: %-6s %-40s %-8s %7s s  %s\n' "$1" "$2" "$3" "$5" "$6"
  }
  # run_one kind name timeout command...: output into logs/<name>.log, working directory the bundle.
  local run_rc run_seconds run_timeout
  run_one() {
    local kind=$1 name=$2 limit=$3 start
    shift 3
    local left=$((budget - (SECONDS - t0)))
    run_timeout=$((limit < left ? limit : left))
    if ((left < 10)); then
      run_rc=-1 run_seconds=0
      return 1
    fi
    start=$(now)
    (cd "$dir" && timeout -k 10 "$run_timeout" "$@" </dev/null >"$out/logs/$name.log" 2>&1)
    run_rc=$?
    run_seconds=$(seconds_between "$start" "$(now)")
    return 0
  }
  missing_for() {  # the libraries of program $1 not found here
    local needs s m=""
    needs=$(awk -F'\t' -v n="$1" '$2 == n { print $3 }' "$dir/MANIFEST.tsv")
    for s in ${needs//,/ }; do [[ $s != - && $s != not_built && -z ${lib_dir[$s]:-} ]] && m+=" $s"; done
    printf '%s' "$m"
  }

  # The probe.
  local probe_rc=1 gpu_found=0
  run_one probe gpu_check_probe 60 "$dir/bin/gpu_check_probe"
  if grep -Eq "$loader_errors" "$out/logs/gpu_check_probe.log" && [[ $LD_LIBRARY_PATH != "$dir/lib/compat:"* ]]; then
    export LD_LIBRARY_PATH="$dir/lib/compat:$LD_LIBRARY_PATH"
    echo "gpu_check: the probe did not load: using the bundle's libstdc++"
    run_one probe gpu_check_probe 60 "$dir/bin/gpu_check_probe"
  fi
  probe_rc=$run_rc
  sed 's/^/  probe: /' "$out/logs/gpu_check_probe.log"
  ((probe_rc == 0)) && gpu_found=1

  # status and note from the last run's exit code; a log line matching $2 means the program
  # found no device, whatever its exit code ($3 says so).
  classify() {  # log [no-device pattern] [note]
    if [[ -n ${2:-} ]] && grep -q "$2" "$1"; then
      status=skip note=$3
      return
    fi
    case $run_rc in
      0) status=pass note="" ;;
      77) status=skip note="no CUDA device (exit 77)" ;;
      124 | 137) status=timeout note="killed after ${run_timeout} s" ;;
      *) status=fail note="exit $run_rc" ;;
    esac
  }

  local kind name m note status
  # Tests.
  while IFS=$'\t' read -r kind name _; do
    [[ $kind == test ]] || continue
    if [[ -n $only && ! $name =~ $only ]]; then
      continue
    fi
    if [[ ! -x $dir/bin/$name ]]; then
      record test "$name" not_run "" 0 "did not build when the bundle was made"
      continue
    fi
    m=$(missing_for "$name")
    if [[ -n $m ]]; then
      record test "$name" not_run "" 0 "missing:$m"
      continue
    fi
    if ! run_one test "$name" "$test_timeout" "$dir/bin/$name"; then
      record test "$name" not_run "" 0 "time budget spent"
      continue
    fi
    classify "$out/logs/$name.log"
    record test "$name" "$status" "$run_rc" "$run_seconds" "$note"
  done <"$dir/MANIFEST.tsv"

  # Benchmarks: one repetition, short cases; without a device they print one line and exit 0.
  local -a bench_json=()
  if [[ ${GPU_CHECK_BENCH:-1} != 0 ]]; then
    while IFS=$'\t' read -r kind name _; do
      [[ $kind == bench ]] || continue
      [[ -n $only && ! $name =~ $only ]] && continue
      if [[ ! -x $dir/bin/$name ]]; then
        record bench "$name" not_run "" 0 "did not build when the bundle was made"
        continue
      fi
      m=$(missing_for "$name")
      if [[ -n $m ]]; then
        record bench "$name" not_run "" 0 "missing:$m"
        continue
      fi
      rm -f "$out/bench/$name.json"
      # shellcheck disable=SC2086  # GPU_CHECK_BENCH_ARGS is a word list
      if ! run_one bench "$name" "$bench_timeout" "$dir/bin/$name" --benchmark_min_time="$min_time" \
        --benchmark_repetitions=1 --benchmark_out="$out/bench/$name.json" --benchmark_out_format=json \
        ${GPU_CHECK_BENCH_ARGS:-}; then
        record bench "$name" not_run "" 0 "time budget spent"
        continue
      fi
      classify "$out/logs/$name.log" 'no CUDA device' "no CUDA device"
      [[ $status == timeout ]] && note+="; the cases that finished are in the log"
      grep -q 'ERROR OCCURRED' "$out/logs/$name.log" && note+="${note:+; }some cases reported errors"
      [[ $status == pass && -s $out/bench/$name.json ]] && bench_json+=(--solder-json "$out/bench/$name.json")
      record bench "$name" "$status" "$run_rc" "$run_seconds" "$note"
    done <"$dir/MANIFEST.tsv"

    # The PyTorch peer, where PyTorch imports and sees the device.
    if [[ ${GPU_CHECK_TORCH:-1} != 0 && ( -z $only || torch_bench =~ $only ) ]]; then
      if ! command -v "$python" >/dev/null; then
        record bench torch_bench skip "" 0 "no $python"
      elif ((budget - (SECONDS - t0) < 40)); then
        record bench torch_bench not_run "" 0 "time budget spent"
      elif ! timeout -k 5 60 "$python" -c 'import torch' </dev/null >"$out/logs/torch_import.log" 2>&1; then
        record bench torch_bench skip "" 0 "import torch failed: $(tail -1 "$out/logs/torch_import.log")"
      else
        local compile_flag=(--no-compile)
        [[ ${GPU_CHECK_TORCH_COMPILE:-0} == 1 ]] && compile_flag=()
        if ! run_one bench torch_bench "$torch_timeout" env PYTHONUNBUFFERED=1 "$python" "$dir/bench/cuda/torch_bench.py" \
          --repetitions 1 --min-time "$min_time" "${compile_flag[@]}" --json "$out/bench/torch_bench.json" "${bench_json[@]}"; then
          record bench torch_bench not_run "" 0 "time budget spent"
        else
          classify "$out/logs/torch_bench.log" 'sees no CUDA device' "PyTorch sees no CUDA device"
          record bench torch_bench "$status" "$run_rc" "$run_seconds" "$note"
        fi
      fi
    fi
  fi

  # --- the verdict ---
  local i n_pass=0 n_fail=0 n_skip=0 n_not_run=0 verdict
  for i in "${!r_name[@]}"; do
    [[ ${r_kind[$i]} == test ]] || continue
    case ${r_status[$i]} in
      pass) ((n_pass++)) ;;
      skip) ((n_skip++)) ;;
      not_run) ((n_not_run++)) ;;
      *) ((n_fail++)) ;;
    esac
  done
  if ((n_fail > 0)); then
    verdict=fail
  elif ((!gpu_found && smi_ok)); then
    verdict=gpu_unusable   # nvidia-smi sees a GPU that the bundle's CUDA runtime cannot use
  elif ((!gpu_found)); then
    verdict=no_gpu
  elif ((n_skip > 0 || n_not_run > 0)); then
    verdict=incomplete
  else
    verdict=pass
  fi
  local total_s=$((SECONDS - t0))
  echo "gpu_check: tests: $n_pass passed, $n_fail failed or timed out, $n_skip skipped, $n_not_run not run; verdict: $verdict; ${total_s} s"

  # --- the results file ---
  local json="$out/gpu_check.json" repo_commit=""
  repo_commit=$(timeout 10 git -C "$dir" rev-parse HEAD 2>/dev/null </dev/null)
  {
    printf '{\n  "verdict": "%s",\n  "gpu_found": %s,\n' "$verdict" "$( ((gpu_found)) && echo true || echo false)"
    printf '  "gpu": {"name": "%s", "driver": "%s", "driver_cuda": "%s", "nvidia_smi": "%s"},\n' \
      "$(json_escape "$gpu_name")" "$(json_escape "$driver")" "$(json_escape "$smi_cuda")" \
      "$(json_escape "$(head -1 "$out/logs/nvidia-smi-query.txt" 2>/dev/null || cat "$out/logs/nvidia-smi.txt")")"
    printf '  "probe": {"exit": %s, "output": "%s"},\n' "${probe_rc}" "$(json_escape "$(cat "$out/logs/gpu_check_probe.log")")"
    printf '  "bundle_commit": "%s",\n  "checkout_commit": "%s",\n' "$(json_escape "$commit")" "$(json_escape "$repo_commit")"
    printf '  "host": "%s",\n  "started_at": "%s",\n  "seconds": %s,\n' "$(json_escape "$(uname -srm); $(nproc 2>/dev/null) cores")" \
      "$(date -u -d "@$(($(date +%s) - total_s))" +%Y-%m-%dT%H:%M:%SZ 2>/dev/null)" "$total_s"
    printf '  "library_path": "%s",\n' "$(json_escape "$LD_LIBRARY_PATH")"
    printf '  "glibc": {"machine": "%s", "required": "%s"},\n' "$(json_escape "$glibc_have")" "$(json_escape "$glibc_need")"
    printf '  "libraries_not_found": "%s",\n' "$(json_escape "${missing_all# }")"
    printf '  "counts": {"pass": %d, "fail": %d, "skip": %d, "not_run": %d},\n' "$n_pass" "$n_fail" "$n_skip" "$n_not_run"
    local section first
    for section in test bench; do
      printf '  "%s": [' "$([[ $section == test ]] && echo tests || echo benches)"
      first=1
      for i in "${!r_name[@]}"; do
        [[ ${r_kind[$i]} == "$section" ]] || continue
        ((first)) || printf ','
        first=0
        local tail_text=""
        [[ -f $out/logs/${r_name[$i]}.log ]] && tail_text=$(tail -c 4000 "$out/logs/${r_name[$i]}.log" | tail -n 40)
        printf '\n    {"name": "%s", "status": "%s", "exit": %s, "seconds": %s, "note": "%s", "log": "logs/%s.log", "output_tail": "%s"}' \
          "${r_name[$i]}" "${r_status[$i]}" "${r_rc[$i]:-null}" "${r_seconds[$i]}" "$(json_escape "${r_note[$i]}")" \
          "${r_name[$i]}" "$(json_escape "$tail_text")"
      done
      printf '\n  ]%s\n' "$([[ $section == test ]] && echo ,)"
    done
    printf '}\n'
  } >"$json"

  # The benchmarks' figures from their JSON (or, for a run cut short, from the console lines),
  # added where Python is present; the file above stands without them.
  if command -v "$python" >/dev/null; then
    timeout -k 5 60 "$python" - "$json" "$out" <<'EOF' || echo "gpu_check: adding the benchmark figures failed; they are in $out/bench and $out/logs" >&2
import json, os, re, sys

path, out = sys.argv[1], sys.argv[2]
with open(path) as f:
    results = json.load(f)

# Google Benchmark's own fields; every other key of a row is a counter of the case.
STANDARD = {"name", "family_index", "per_family_instance_index", "run_name", "run_type", "repetitions",
            "repetition_index", "threads", "iterations", "real_time", "cpu_time", "time_unit", "label",
            "error_occurred", "error_message", "aggregate_name", "aggregate_unit", "real_time_us", "aggregate"}

def from_json(file):
    with open(file) as f:
        data = json.load(f)
    rows = []
    for b in data.get("benchmarks", []):
        row = {"name": b.get("name")}
        if "real_time" in b:
            row["time"] = b["real_time"]
            row["unit"] = b.get("time_unit", "ns")
        elif "real_time_us" in b:
            row["time"] = b["real_time_us"]
            row["unit"] = "us"
        for key, value in b.items():
            if key not in STANDARD and isinstance(value, (int, float)):
                row[key] = value
        if b.get("error_occurred") or b.get("error_message"):
            row["error"] = b.get("error_message", "error")
        rows.append(row)
    return rows

LINE = re.compile(r"^(BM_\S+)\s+([0-9.]+) (ns|us|ms|s)\s+(.*)$")
def from_log(file):
    rows = []
    with open(file, errors="replace") as f:
        for line in f:
            m = LINE.match(line.strip())
            if m:
                row = {"name": m.group(1), "time": float(m.group(2)), "unit": m.group(3)}
                for key, value in re.findall(r"(\w+)=([0-9.eE+-]+[kMGTmu]?)", m.group(4)):
                    row[key] = value
                rows.append(row)
            elif "ERROR OCCURRED" in line:
                rows.append({"name": line.split()[0], "error": line.split("ERROR OCCURRED:", 1)[-1].strip()})
    return rows

md_rows = []
for bench in results["benches"]:
    file = os.path.join(out, "bench", bench["name"] + ".json")
    log = os.path.join(out, "logs", bench["name"] + ".log")
    rows = None
    try:
        rows = from_json(file)
    except Exception:
        if os.path.exists(log):
            rows = from_log(log)
    bench["figures"] = rows
    for row in rows or []:
        md_rows.append((bench["name"], row))
with open(path, "w") as f:
    json.dump(results, f, indent=1)

with open(os.path.join(out, "gpu_check.md"), "a") as f:
    if md_rows:
        f.write("\n## Benchmark figures\n\n| program | case | time | figures |\n|---|---|---|---|\n")
        for program, row in md_rows:
            figures = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                for k, v in row.items() if k not in ("name", "time", "unit", "error"))
            if "error" in row:
                figures = "error: " + row["error"]
            time = f"{row['time']:.4g} {row['unit']}" if "time" in row else ""
            f.write(f"| {program} | {row['name']} | {time} | {figures} |\n")
EOF
  fi

  # The same, for a reader.
  {
    printf '# GPU check\n\n'
    printf -- '- verdict: **%s** (tests: %d passed, %d failed or timed out, %d skipped, %d not run; %d s)\n' \
      "$verdict" "$n_pass" "$n_fail" "$n_skip" "$n_not_run" "$total_s"
    printf -- '- GPU: %s; driver %s (CUDA %s)\n' "${gpu_name:-none found}" "${driver:-?}" "${smi_cuda:-?}"
    printf -- '- probe (exit %s): %s\n' "$probe_rc" "$(tr '\n' ';' <"$out/logs/gpu_check_probe.log")"
    printf -- '- bundle commit: %s\n\n| kind | program | status | seconds | note |\n|---|---|---|---|---|\n' "${commit:-unknown}"
    for i in "${!r_name[@]}"; do
      printf '| %s | %s | %s | %s | %s |\n' "${r_kind[$i]}" "${r_name[$i]}" "${r_status[$i]}" "${r_seconds[$i]}" "${r_note[$i]}"
    done
  } >"$out/gpu_check.md.head"
  if [[ -f $out/gpu_check.md ]]; then cat "$out/gpu_check.md" >>"$out/gpu_check.md.head"; fi
  mv "$out/gpu_check.md.head" "$out/gpu_check.md"
  echo "gpu_check: wrote $json and $out/gpu_check.md"
  ((n_fail == 0)) && return 0
  return 1
}

case ${1:-} in
  build) shift; (($# <= 1)) || die "usage: $0 build [DIR]"; cmd_build "$@" ;;
  run) shift; (($# <= 2)) || die "usage: $0 run [DIR] [OUT]"; cmd_run "$@" ;;
  *) die "usage: $0 build [DIR] | run [DIR] [OUT]" ;;
esac
