#!/usr/bin/env bash
# Installs what is missing, builds Tessera and runs the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build -j "$(nproc)"
exec ./build/bin/tessera-run examples/mlp_fashion.json "$@"
