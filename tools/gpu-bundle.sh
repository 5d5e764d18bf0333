#!/usr/bin/env bash
# tools/gpu-bundle.sh: packs what the GPU checks need into .gpubundle/ (git-ignored, 43 MB,
# under the device tool's 64 MiB carry limit), for a machine that has CUDA but none of our
# Debian libraries (the device tool's GPU machine):
#   payload.tar.xz       bin/   parasync-ps, -worker, -launch, -bench-compute, the gpu tests
#                        lib/   libparasync_cuda.so (found by the binaries as ../lib)
#                        deps/  every shared library they load that a bare system lacks
#                               (ldd), except the CUDA runtime and cuBLAS, which it has, and
#                               cuDNN (about 480 MB), which the GPU machine's PyTorch brings
#                        python/ the parasync package with libparasync_client.so (the
#                               launcher puts it on a --worker-command's PYTHONPATH)
#                        tools/ bench-worker, bench-cluster, install-deps.sh and
#                               benchmarks/torch_model.py, torch_env.py
#   data/                Fashion-MNIST (already gzip: not packed again)
#   run-gpu-checks.sh    tools/gpu-checks.sh: unpacks, then runs the phases it is given
#                        (tests, sanitize, bench, cluster, profile), each fitting one call
# Then, with the device tool: carry [".gpubundle"], command
# "bash .gpubundle/run-gpu-checks.sh tests sanitize" (then "bench", then "cluster profile");
# each phase leaves its log or table in $OUT (tools/gpu-checks.sh --help).
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
mkdir -p "$stage/python/parasync"
cp "$build"/python/parasync/*.py "$stage/python/parasync/"
strip --strip-debug -o "$stage/python/parasync/libparasync_client.so" \
  "$build/python/parasync/libparasync_client.so"
# Everything ldd resolves, except the C runtime every Linux has and the CUDA libraries.
for f in "$stage"/bin/* "$stage/lib/libparasync_cuda.so" "$stage/python/parasync/libparasync_client.so"; do
  ldd "$f" | awk '/=> \// {print $3}'
done | sort -u | grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libcudart|libcublas|libcublasLt|libcudnn[a-z_]*)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/deps/"; done
strip --strip-debug "$stage"/deps/*.so* 2>/dev/null || true
cp tools/bench-worker tools/bench-cluster "$stage/tools/"
cp tools/install-deps.sh "$stage/tools/"
cp tools/benchmarks/torch_model.py tools/benchmarks/torch_env.py "$stage/tools/benchmarks/"
echo "gpu-bundle: compressing (about 20 s) ..." >&2
tar -C "$stage" -cJf "$out/payload.tar.xz" .
cp /usr/share/datasets/fashion-mnist/*.gz "$out/data/"
cp tools/gpu-checks.sh "$out/run-gpu-checks.sh"
chmod +x "$out/run-gpu-checks.sh"
du -sh "$out"
