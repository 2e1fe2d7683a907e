#!/usr/bin/env bash
# scripts/test.sh [preset]: set up, configure, build (-j2) and run ctest for one preset
# (release by default; see CMakePresets.json). Reuses build/<preset> on a second run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

preset=${1:-release}
bash scripts/setup.sh "$preset"
cmake --preset "$preset"
cmake --build --preset "$preset"     # -j2: "jobs" in the build preset
ctest --preset "$preset"             # -j2, output on failure: the test preset
