#!/usr/bin/env bash
# torch_venv.sh: creates the virtual environment that bench/torch_bench.py runs PyTorch 2.x in.
#
# It makes build/torch-venv under the repository root (build/ is git-ignored) with
# `python3 -m venv`, using the python3 on PATH (installing Debian's python3-venv with apt-get if
# the venv module is missing), and pip-installs PyPI's default `torch` wheel (2.x) and `numpy`
# into it, and matplotlib for bench/results.py's plots. Re-running skips what is already there. It ends by printing the venv's python and its
# torch version. Then run the PyTorch peer bench with that python:
#
#     bench/torch_venv.sh
#     build/torch-venv/bin/python bench/torch_bench.py [--threads 1 [2 ...]] [--filter REGEX] ...
#
# The torch wheel and its dependencies are several GB to download.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/build/torch-venv"
py="$venv/bin/python"

if [[ ! -x "$py" ]]; then
  if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    echo "torch_venv.sh: python3 lacks venv/ensurepip; installing python3-venv" >&2
    apt-get update
    apt-get install -y python3-venv
  fi
  echo "torch_venv.sh: creating $venv with $(command -v python3) ($(python3 --version 2>&1))"
  mkdir -p "$root/build"
  python3 -m venv "$venv"
fi

# torch 2.x, numpy and matplotlib; `pip install` leaves an already satisfied requirement alone,
# the check first only saves pip's index queries on a re-run.
if ! "$py" -c 'import sys, torch, numpy, matplotlib; sys.exit(int(torch.__version__.split(".")[0]) < 2)' 2>/dev/null; then
  "$py" -m pip install --upgrade pip
  "$py" -m pip install 'torch>=2' numpy matplotlib
fi

"$py" -c 'import sys, torch, numpy, matplotlib
print(f"python {sys.executable}\ntorch {torch.__version__}\nnumpy {numpy.__version__}\nmatplotlib {matplotlib.__version__}")'
