#!/usr/bin/env bash
# scripts/demo.sh: set up, configure the release preset, build the flagship example and run it.
set -euo pipefail
demo_target=bias_relu_dropout_demo     # examples/<demo_target>.cpp

cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
cmake --preset release
cmake --build --preset release --target "$demo_target"
echo "== build/release/examples/$demo_target"
exec "build/release/examples/$demo_target" "$@"
