#!/usr/bin/env bash
# The quick start: installs the dependencies, builds, and trains an MLP on Fashion-MNIST
# with a local cluster of 2 parameter servers and 2 workers in async mode. It installs and
# builds only what it runs (tools/install-deps.sh, tools/build.sh --quick): no tests, no
# benchmarks, and the CUDA module only with PARASYNC_CUDA=AUTO (or ON) in the environment,
# e.g. `PARASYNC_CUDA=AUTO tools/run-local-cluster.sh --worker-arg=--device=cuda`.
# Extra arguments go to parasync-launch (see build/bin/parasync-launch --help), e.g.
#   tools/run-local-cluster.sh --epochs 10 --workers 4
# PARASYNC_SKIP_BUILD=1: install and build nothing, run the binaries already in
# ${BUILD_DIR:-build}/bin (the test of the README's commands, tests/tools/readme_test.py,
# runs them so against the test build); exits 2 with one line where one is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -n ${PARASYNC_SKIP_BUILD:-} ]]; then
  for binary in parasync-ps parasync-worker parasync-launch parasync-export parasync-keygen; do
    if [[ ! -x ${BUILD_DIR:-build}/bin/$binary ]]; then
      echo "run-local-cluster: PARASYNC_SKIP_BUILD is set but ${BUILD_DIR:-build}/bin/$binary is not built" >&2
      exit 2
    fi
  done
else
  tools/install-deps.sh
  tools/build.sh --quick
fi
# The defaults below apply only where the arguments do not set the flag: the launcher refuses
# a flag given twice. Logs go to runs/<YYYYmmdd-HHMMSS>, the launcher's default (or --log-dir).
defaults=()
for pair in "--ps 2" "--workers 2" "--mode async" "--epochs 5"; do
  flag=${pair%% *}
  given=0
  for arg in "$@"; do
    if [[ $arg == "$flag" || $arg == "$flag="* ]]; then given=1; fi
  done
  if [[ $given == 0 ]]; then defaults+=("$flag" "${pair#* }"); fi
done
exec "${BUILD_DIR:-build}/bin/parasync-launch" "${defaults[@]}" "$@"
