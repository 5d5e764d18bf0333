#!/usr/bin/env bash
# Takes docs/metrics-screenshot.png: a real local run (2 PS, 2 workers) scraped by
# Debian's Prometheus, photographed on Prometheus' own graph page by headless Chromium —
# global examples/sec and the chief's test accuracy. Installs chromium when it is missing.
# Usage: tools/screenshot-metrics.sh [OUT.png] [--mode MODE] [--epochs N]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
out="$root/docs/metrics-screenshot.png"
mode=async
epochs=12
while (($# > 0)); do
  case "$1" in
    -h | --help)
      sed -n '2,5p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    --mode) mode=${2:?--mode needs a value}; shift 2 ;;
    --epochs) epochs=${2:?--epochs needs a value}; shift 2 ;;
    -*) echo "screenshot-metrics.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) out=$1; shift ;;
  esac
done

bin="$root/${BUILD_DIR:-build}/bin"
[ -x "$bin/parasync-launch" ] || { echo "screenshot-metrics.sh: build first (tools/build.sh)" >&2; exit 2; }
command -v chromium >/dev/null 2>&1 || "$root/tools/install-deps.sh" chromium

work=$(mktemp -d)
launch_pid=""
prom_pid=""
cleanup() {
  [ -z "$launch_pid" ] || kill -INT "$launch_pid" 2>/dev/null || true
  [ -z "$prom_pid" ] || kill -TERM "$prom_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

run="$work/run"
job="fashion-mnist-$mode"
mkdir -p "$run"
# Prometheus first, so it sees the run from its first second.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$root/tools/watch-run.sh" "$run" --port "$port" --scrape-interval 1s >"$work/prometheus.out" 2>&1 &
prom_pid=$!
for _ in $(seq 300); do
  curl -fsS "http://127.0.0.1:$port/-/ready" >/dev/null 2>&1 && break
  kill -0 "$prom_pid" 2>/dev/null || { cat "$work/prometheus.out" >&2; exit 1; }
  sleep 0.1
done
launch_start=$(date +%s)
"$bin/parasync-launch" --ps 2 --workers 2 --mode "$mode" --epochs "$epochs" --log-dir "$run" \
  --job "$job" --metrics --worker-arg=--device=cpu >"$work/launch.out" 2>&1 &
launch_pid=$!

echo "screenshot-metrics.sh: training ($mode, $epochs epochs) with Prometheus on port $port"
for _ in $(seq 600); do
  grep -q "serving the final metrics" "$work/launch.out" && break
  kill -0 "$launch_pid" 2>/dev/null || { cat "$work/launch.out" >&2; exit 1; }
  sleep 0.5
done
grep "final test accuracy" "$work/launch.out" || true
sleep 3  # two more scrapes of the final values

enc() { python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1]))' "$1"; }
g0=$(enc "sum by (job) (rate(parasync_worker_examples_total{job=\"$job\"}[5s]))")
g1=$(enc "max by (job) (parasync_worker_eval_accuracy{job=\"$job\"})")
range=$(($(date +%s) - launch_start + 2))  # the whole run, start-up included
url="http://127.0.0.1:$port/graph?g0.expr=$g0&g0.tab=0&g0.range_input=${range}s&g1.expr=$g1&g1.tab=0&g1.range_input=${range}s"
mkdir -p "$(dirname "$out")"
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,1420 \
  --virtual-time-budget=15000 --screenshot="$out" "$url" >"$work/chromium.out" 2>&1 ||
  { cat "$work/chromium.out" >&2; exit 1; }
echo "screenshot-metrics.sh: wrote $out ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores)"
