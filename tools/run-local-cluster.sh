#!/usr/bin/env bash
# The quick start: installs the dependencies, builds, and trains an MLP on Fashion-MNIST
# with a local cluster of 2 parameter servers and 2 workers in async mode.
# Extra arguments go to parasync-launch (see build/bin/parasync-launch --help), e.g.
#   tools/run-local-cluster.sh --epochs 10 --workers 4
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
tools/build.sh
# Logs go to runs/<YYYYmmdd-HHMMSS>, the launcher's default (or --log-dir DIR).
exec "${BUILD_DIR:-build}/bin/parasync-launch" --ps 2 --workers 2 --mode async --epochs 5 "$@"
