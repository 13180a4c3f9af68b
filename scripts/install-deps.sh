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
  protobuf-c-compiler libprotobuf-c-dev libonnx-dev python3-onnx
  libmicrohttpd-dev curl wrk openssl
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


# ONNX Runtime for the export tests and the serving benchmark: the CPU build
# in the npm package onnxruntime-node, installed with --ignore-scripts (the
# package carries its CPU binaries; its install script would only try to
# download GPU ones) into tools/onnxruntime. Node.js comes from Debian when
# no node is installed.
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
ORT_VERSION=1.20.1
if ! command -v node > /dev/null || ! command -v npm > /dev/null; then
  echo "install-deps: installing nodejs npm"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm
fi
if ! node -e "require('$ROOT/tools/onnxruntime/node_modules/onnxruntime-node')" 2>/dev/null; then
  echo "install-deps: installing onnxruntime-node@$ORT_VERSION into tools/onnxruntime"
  mkdir -p "$ROOT/tools/onnxruntime"
  npm install --prefix "$ROOT/tools/onnxruntime" --ignore-scripts --no-audit --no-fund --silent \
    "onnxruntime-node@$ORT_VERSION"
  node -e "require('$ROOT/tools/onnxruntime/node_modules/onnxruntime-node')"
fi
