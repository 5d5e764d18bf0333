#!/usr/bin/env bash
# Installs what parasync needs from Debian's packages. Idempotent: installs only what is
# missing, and runs `apt-get update` only then. Needs root (or sudo).
#
#   tools/install-deps.sh            what builds the binaries and runs the quick start
#                                    (tools/run-local-cluster.sh): compilers, the libraries,
#                                    Debian's Fashion-MNIST
#   tools/install-deps.sh --tests    that, and what the test suite uses besides
#                                    (tools/run-tests.sh): GoogleTest, the Prometheus server,
#                                    Python with matplotlib and PyTorch (on OpenBLAS),
#                                    the shellcheck linter, Node.js, curl, git,
#                                    universal-ctags
#   tools/install-deps.sh --engines  that of --tests, and the deployment engines the stage
#                                    `engines` runs deploy/ on: Slurm and munge, Docker
#                                    (docker.io, docker-compose) and debootstrap for its
#                                    base image
#   tools/install-deps.sh PKG ...    that, and extra packages a tool needs only for itself,
#                                    e.g. `tools/install-deps.sh chromium`
# PARASYNC_NO_INSTALL=1: installs nothing; names what is missing and exits 1 if anything is
# (how the tools that install for themselves, e.g. tools/bench-worker, are run without it).
set -euo pipefail

# The build and the quick start. (tests/deploy/manifests/check-dockerfile.mjs reads this
# list: the image's build stage must install all of it but the data set.)
packages=(
  build-essential cmake ninja-build pkg-config
  libzmq3-dev cppzmq-dev libflatbuffers-dev flatbuffers-compiler librocksdb-dev
  prometheus-cpp-dev libcli11-dev libspdlog-dev nlohmann-json3-dev zlib1g-dev libdnnl-dev
  ocl-icd-opencl-dev dataset-fashion-mnist
)
# The test suite's own needs: unit tests, the real Prometheus of the integration tests,
# tools/compare's plots, the deploy checks' shellcheck and Node.js validators, the scripts,
# tools/function-lengths.sh's ctags, and PyTorch for the tests that parasync and
# tools/benchmarks/torch_model.py build the same model (with OpenBLAS: Debian's python3-torch
# otherwise runs on the reference BLAS).
test_packages=(
  libgtest-dev libgmock-dev prometheus python3 python3-matplotlib shellcheck nodejs curl git
  universal-ctags python3-torch libopenblas0-pthread iproute2
)
# The deployment engines (tests/deploy/slurm_test.py, docker_test.py, systemd_test.py), and
# nft to remove the tables dockerd makes. The tests start and stop daemons of their own (a
# host running systemd starts docker and munge on install; the tests then use the running
# dockerd and leave it).
engine_packages=(slurm-wlm munge docker.io docker-compose debootstrap nftables)
if [[ ${1:-} == --tests ]]; then
  shift
  packages+=("${test_packages[@]}")
elif [[ ${1:-} == --engines ]]; then
  shift
  packages+=("${test_packages[@]}" "${engine_packages[@]}")
fi
packages+=("$@")

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages already installed"
  exit 0
fi

if [[ -n ${PARASYNC_NO_INSTALL:-} ]]; then
  echo "install-deps: missing ${missing[*]}; not installing (PARASYNC_NO_INSTALL is set)" >&2
  exit 1
fi
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "install-deps: missing ${missing[*]}; run this script as root (no sudo found)" >&2
    exit 1
  fi
  sudo_cmd=(sudo)
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Wait for another apt (e.g. unattended-upgrades on a fresh machine) instead of failing.
apt_opts=(-q -o DPkg::Lock::Timeout=600)
"${sudo_cmd[@]}" apt-get "${apt_opts[@]}" update
"${sudo_cmd[@]}" apt-get "${apt_opts[@]}" install -y --no-install-recommends "${missing[@]}"
