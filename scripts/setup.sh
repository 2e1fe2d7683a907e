#!/usr/bin/env bash
# scripts/setup.sh: install solder's build dependencies from Debian's packages.
# Idempotent and fast: when every package is already installed it does not touch apt at all;
# otherwise it runs `apt-get update` once and installs only what is missing.
# Needs root (or sudo) only when something is missing. The CUDA toolkit is not an apt
# package here: SOLDER_BUILD_CUDA turns itself on when nvcc is found (/usr/local/cuda).
set -euo pipefail

packages=(
  cmake ninja-build g++ make pkg-config
  libxsimd-dev xtl-dev libxtensor-dev libboost-dev nlohmann-json3-dev catch2
  libbenchmark-dev libeigen3-dev libopenblas-dev libdnnl-dev
  # Data-parallel training across processes (solder/dist/mpi.hpp, tests/dist, the dp example).
  libopenmpi-dev openmpi-bin
  # Debian's dnnl-config.cmake requires OpenCL (its GPU runtime) but the package only
  # recommends it, and recommends are not installed below.
  ocl-icd-opencl-dev
)

# `setup.sh clang` and `setup.sh asan` (scripts/test.sh clang|asan): Clang 19, its OpenMP
# runtime and its sanitizer runtimes as well.
if [[ ${1:-} == clang || ${1:-} == asan ]]; then
  packages+=(clang-19 libomp-19-dev libclang-rt-19-dev)
fi

if ! command -v dpkg-query >/dev/null; then
  echo "setup: not a Debian system; install the equivalents of: ${packages[*]}" >&2
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [[ $status == installed ]] || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages present; nothing to do"
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo=()
if ((EUID != 0)); then
  command -v sudo >/dev/null || { echo "setup: need root or sudo to install ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
