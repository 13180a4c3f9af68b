#!/usr/bin/env bash
# Installs every Debian package Tessera needs; does nothing when all are present.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config clang libclang-rt-14-dev libomp-dev
  libopenblas-dev zlib1g-dev libjansson-dev
  libzmq3-dev libmsgpack-dev libuv1-dev libcmocka-dev
  libopenmpi-dev openmpi-bin iproute2
  python3-torch gnuplot-nox
  dataset-fashion-mnist fortunes
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -ne 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The PyTorch parity tests and benchmarks run Debian's torch, which only the
# system interpreter imports.
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "install-deps: /usr/bin/python3 cannot import torch (package python3-torch)" >&2
  exit 1
fi

