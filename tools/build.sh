#!/usr/bin/env bash
# Configures and builds parasync into ${BUILD_DIR:-build} (Ninja, RelWithDebInfo).
# Extra arguments go to CMake's configure step, e.g. -DPARASYNC_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
cmake --build "$build_dir" --parallel "$(nproc)"
