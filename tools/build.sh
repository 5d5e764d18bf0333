#!/usr/bin/env bash
# Configures and builds parasync into ${BUILD_DIR:-build} (Ninja, RelWithDebInfo).
#
#   tools/build.sh [CMAKE_ARGS...]           everything: the binaries, the tests, the
#                                            fuzz replay, the benchmarks and, where nvcc
#                                            and cuDNN are found, the CUDA module
#   tools/build.sh --quick [CMAKE_ARGS...]   only what a user runs: parasync-ps,
#                                            parasync-worker, parasync-launch,
#                                            parasync-export, parasync-keygen (tests off;
#                                            the CUDA module only with PARASYNC_CUDA=AUTO
#                                            or ON in the environment)
#   tools/build.sh --python [CMAKE_ARGS...]  what --quick builds, and the Python package
#                                            for PyTorch workers: <build>/python/parasync
#                                            with libparasync_client.so beside it (where
#                                            parasync-launch finds it); first installs
#                                            Debian's PyTorch on OpenBLAS where missing
#                                            (python3-torch libopenblas0-pthread)
# Extra arguments go to CMake's configure step, e.g. -DPARASYNC_CUDA=OFF. Each form sets
# the options it depends on, so one build directory serves both.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
targets=()
if [[ ${1:-} == --quick || ${1:-} == --python ]]; then
  form=$1
  shift
  cuda=${PARASYNC_CUDA:-OFF}
  configure=(-DPARASYNC_BUILD_TESTS=OFF "-DPARASYNC_CUDA=$cuda")
  targets=(parasync-ps parasync-worker parasync-launch parasync-export parasync-keygen)
  if [[ $form == --python ]]; then
    # Debian's python3-torch alone runs on the reference BLAS, 10-20x slower
    # (docs/dependencies.md): OpenBLAS with it.
    tools/install-deps.sh python3-torch libopenblas0-pthread
    targets+=(parasync_python)
  fi
else
  configure=(-DPARASYNC_BUILD_TESTS=ON "-DPARASYNC_CUDA=${PARASYNC_CUDA:-AUTO}")
fi
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${configure[@]}" "$@"
# The CUDA module, when asked for and configured (nvcc and cuDNN found).
if [[ ${#targets[@]} -gt 0 && ${cuda:-OFF} != OFF ]] &&
   ninja -C "$build_dir" -t targets all 2>/dev/null | grep -q '^parasync_cuda:'; then
  targets+=(parasync_cuda)
fi
cmake --build "$build_dir" --parallel "$(nproc)" ${targets[@]:+--target "${targets[@]}"}
