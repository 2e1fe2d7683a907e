#!/usr/bin/env bash
# scripts/demo.sh: set up, configure the release preset, build the flagship example and run it.
set -euo pipefail
demo_target=digits_mlp     # examples/<demo_target>.cpp: trains the digits MLP

cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
cmake --preset release
cmake --build --preset release --target "$demo_target"
echo "== build/release/examples/$demo_target"
exec "build/release/examples/$demo_target" "$@"
