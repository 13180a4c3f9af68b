#!/usr/bin/env bash
# Installs what is missing, builds Tessera and runs the main job: the
# Fashion-MNIST MLP trained by a scheduler, 2 parameter-server shards and 2
# workers, each its own process (examples/mlp_fashion_ps.json).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build -j "$(nproc)"
exec ./build/bin/tessera-run examples/mlp_fashion_ps.json "$@"
