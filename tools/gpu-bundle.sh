#!/usr/bin/env bash
# tools/gpu-bundle.sh: packs what the GPU checks need into .gpubundle/ (git-ignored, ~45 MB,
# under the device tool's 64 MiB carry limit), for a machine that has CUDA but none of our
# Debian libraries (the device tool's GPU machine):
#   payload.tar.xz       bin/   parasync-ps, -worker, -launch, -bench-compute, the gpu tests
#                        lib/   libparasync_cuda.so (found by the binaries as ../lib)
#                        deps/  every shared library they load that a bare system lacks
#                               (ldd), except the CUDA runtime and cuBLAS, which it has, and
#                               cuDNN (about 480 MB), which the GPU machine's PyTorch brings
#                        tools/ bench-worker, install-deps.sh and benchmarks/torch_model.py
#   data/                Fashion-MNIST (already gzip: not packed again)
#   run-gpu-checks.sh    unpacks, runs the gpu tests (with the GPU cluster) and bench-worker
# Then, with the device tool: carry [".gpubundle"], command "bash .gpubundle/run-gpu-checks.sh"
# (arguments go to bench-worker); it copies the benchmark table to $OUT/bench-worker.md.
#
# Uses BUILD_DIR (default build/), which must have been configured with CUDA on and an
# architecture the GPU runs (the default, 80;90, covers A100, H100 and H200).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
out=.gpubundle
[[ -f "$build/lib/libparasync_cuda.so" ]] || {
  echo "gpu-bundle: $build/lib/libparasync_cuda.so missing: build with PARASYNC_CUDA=ON" >&2
  exit 2
}
rm -rf "$out"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$out/data" "$stage/bin" "$stage/lib" "$stage/deps" "$stage/tools/benchmarks"
bins=(parasync-ps parasync-worker parasync-launch parasync-bench-compute cuda_backend_test
      gpu_integration_test backend_factory_test)
for b in "${bins[@]}"; do
  strip --strip-debug -o "$stage/bin/$b" "$build/bin/$b"
done
strip --strip-debug -o "$stage/lib/libparasync_cuda.so" "$build/lib/libparasync_cuda.so"
# Everything ldd resolves, except the C runtime every Linux has and the CUDA libraries.
for f in "$stage"/bin/* "$stage/lib/libparasync_cuda.so"; do
  ldd "$f" | awk '/=> \// {print $3}'
done | sort -u | grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libcudart|libcublas|libcublasLt|libcudnn[a-z_]*)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/deps/"; done
strip --strip-debug "$stage"/deps/*.so* 2>/dev/null || true
cp tools/bench-worker "$stage/tools/"
cp tools/install-deps.sh "$stage/tools/"
cp tools/benchmarks/torch_model.py "$stage/tools/benchmarks/"
echo "gpu-bundle: compressing (about 20 s) ..." >&2
tar -C "$stage" -cJf "$out/payload.tar.xz" .
cp /usr/share/datasets/fashion-mnist/*.gz "$out/data/"
cat >"$out/run-gpu-checks.sh" <<'RUN'
#!/usr/bin/env bash
# Runs on the GPU machine from the repository root: the gpu tests, then the benchmark.
set -uo pipefail
bundle=$(cd "$(dirname "$0")" && pwd)
here=$(mktemp -d /tmp/parasync-gpu.XXXXXX)
trap 'rm -rf "$here"' EXIT
tar -C "$here" -xJf "$bundle/payload.tar.xz"
export LD_LIBRARY_PATH="$here/deps${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# cuDNN 9: the one of the machine's PyTorch wheel (nvidia-cudnn), when the system has none.
cudnn=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null || true)
if [[ -n "$cudnn" && -d "$cudnn" ]]; then
  echo "run-gpu-checks: cuDNN from $cudnn: $(ls "$cudnn" | tr '\n' ' ')"
  export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$cudnn"
fi
export PARASYNC_BIN_DIR="$here/bin" PARASYNC_DATA_DIR="$bundle/data"
# Here a skipped GPU test is a failure: the point is to run them.
export PARASYNC_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
rc=0
for t in backend_factory_test cuda_backend_test gpu_integration_test; do
  "$here/bin/$t" || rc=1
done
cd "$here"
BUILD_DIR="$here" tools/bench-worker "$@" | tee "${OUT:-/tmp}/bench-worker.md" || rc=1
exit $rc
RUN
chmod +x "$out/run-gpu-checks.sh"
du -sh "$out"
