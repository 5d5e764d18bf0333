#!/usr/bin/env bash
# Builds the ps-lite anchor: ps-lite itself (from a checkout of github.com/dmlc/ps-lite the
# caller provides: it is not a Debian package) against Debian's ZeroMQ and protobuf, and
# kv_bench.cc beside it.
#
#   tools/benchmarks/pslite/build.sh PSLITE_SOURCE [OUT_DIR]    (OUT_DIR: build/pslite)
#
# Installs libzmq3-dev, libprotobuf-dev and protobuf-compiler when missing (root). Prints
# the path of the kv_bench binary on its last line. Exit 2 for a missing or wrong source.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
src=${1:-}
out=${2:-$root/build/pslite}
if [[ -z $src || ! -f $src/include/ps/ps.h || ! -f $src/CMakeLists.txt ]]; then
  echo "build.sh: give a ps-lite checkout (github.com/dmlc/ps-lite), got '${src}'" >&2
  exit 2
fi
need=()
for pkg in libzmq3-dev libprotobuf-dev protobuf-compiler; do
  dpkg -s "$pkg" > /dev/null 2>&1 || need+=("$pkg")
done
if [[ ${#need[@]} -gt 0 ]]; then
  apt-get install -y "${need[@]}" > /dev/null || { apt-get update > /dev/null && apt-get install -y "${need[@]}" > /dev/null; }
fi
mkdir -p "$out"
cmake -S "$src" -B "$out/ps-lite" -G Ninja -DCMAKE_BUILD_TYPE=Release > "$out/configure.log"
ninja -C "$out/ps-lite" pslite > "$out/build.log"
c++ -std=c++17 -O2 -o "$out/kv_bench" "$here/kv_bench.cc" -I "$src/include" \
  "$out/ps-lite/libpslite.a" -lprotobuf -lzmq -lpthread
echo "$out/kv_bench"
