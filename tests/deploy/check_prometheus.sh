#!/usr/bin/env bash
# Checks deploy/prometheus with promtool: the config (with a sample targets file in the
# launcher's format), the alert rules, and the rules' unit tests.
# Usage: tests/deploy/check_prometheus.sh [SOURCE_DIR]  (default: the repository root)
set -euo pipefail

src_dir=${1:-${PARASYNC_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)}}
prom_dir="$src_dir/deploy/prometheus"

if ! command -v promtool >/dev/null 2>&1; then
  echo "check_prometheus.sh: promtool not found; install it with:" \
    "sudo apt-get install prometheus" >&2
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$prom_dir/prometheus.yml" "$prom_dir/parasync-alerts.yml" "$tmp/"
mkdir "$tmp/targets"
cat >"$tmp/targets/sample.json" <<'JSON'
[{"targets":["127.0.0.1:40001"],"labels":{"job":"check","role":"ps","shard":"0"}},
 {"targets":["127.0.0.1:40003"],"labels":{"job":"check","role":"worker","rank":"0"}}]
JSON

status=0
step() {
  echo "+ $*"
  if ! "$@"; then
    echo "check_prometheus.sh: FAILED: $*" >&2
    status=1
  fi
}
step promtool check config "$tmp/prometheus.yml"
step promtool check rules "$prom_dir/parasync-alerts.yml"
step promtool test rules "$prom_dir/parasync-alerts.test.yml"
exit "$status"
