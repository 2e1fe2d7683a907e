#!/usr/bin/env bash
# bench/results.sh [--quick] [--from-json] [--no-build] [--no-torch]: measures the cases of
# docs/PERFORMANCE.md on this host and rewrites its tables and plots (bench/results.py says how).
#
# It makes build/torch-venv first where it is missing or lacks matplotlib (bench/torch_venv.sh),
# then runs bench/results.py with that python in its own scheduling group (setsid) at the top autogroup
# weight and nice level (root only; elsewhere at the normal ones), as bench/README.md's
# measurement commands do: processes of other scheduling groups (a compiler) then take little of
# the cores.
# A full run takes about 20 minutes (--quick about 5); run it on a quiet host.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$root/build/torch-venv/bin/python"
if [[ ! -x "$py" ]] || ! "$py" -c 'import matplotlib' 2>/dev/null; then
  bash "$root/bench/torch_venv.sh"
fi
# (Without root, nice warns that it cannot raise the priority and runs the command anyway.)
exec setsid -w bash -c 'echo -20 > /proc/self/autogroup 2>/dev/null; exec nice -n -20 "$@"' \
  results.sh "$py" "$root/bench/results.py" "$@"
