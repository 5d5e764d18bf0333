#!/usr/bin/env bash
# Installs the dependencies, builds everything (the CUDA module too where nvcc exists) and
# runs the whole test suite with CTest: unit tests and multi-process integration tests.
# No GPU is needed; tests labelled gpu skip themselves without one.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
tools/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure --parallel "$(nproc)" --timeout 600
