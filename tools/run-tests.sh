#!/usr/bin/env bash
# Installs the dependencies, builds everything (the CUDA module too where nvcc exists) and
# runs the whole test suite with CTest: unit tests and multi-process integration tests.
# No GPU is needed; tests labelled gpu skip themselves without one.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
# The deploy/ validators' npm packages (ctest check_manifests), pinned by package-lock.json;
# refreshed only when the lock file is newer than the install. Node.js comes with npm where
# it is nodesource's; Debian's nodejs needs its npm package.
if ! command -v npm >/dev/null 2>&1; then tools/install-deps.sh npm; fi
if [[ ! tests/deploy/manifests/node_modules/.package-lock.json -nt tests/deploy/manifests/package-lock.json ]]; then
  npm ci --prefix tests/deploy/manifests --no-audit --no-fund ||
    npm ci --prefix tests/deploy/manifests --no-audit --no-fund
fi
tools/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure --parallel "$(nproc)" --timeout 600
