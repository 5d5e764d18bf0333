#!/usr/bin/env bash
# Watches a local run made by parasync-launch with its own Prometheus: scrapes every process
# of RUN_DIR (from RUN_DIR/prometheus-targets.json) and evaluates the parasync alerts.
# Everything it writes goes under RUN_DIR/prometheus/. Run `tools/watch-run.sh --help`.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: tools/watch-run.sh RUN_DIR [--port PORT] [--scrape-interval DURATION]

Starts Prometheus for a run made by parasync-launch (RUN_DIR is its --log-dir and holds
prometheus-targets.json, or will: start this first to see a run from its first second). Prepares RUN_DIR/prometheus/ with a copy of
deploy/prometheus/prometheus.yml and parasync-alerts.yml, links the run's targets file into
RUN_DIR/prometheus/targets/, keeps the time series in RUN_DIR/prometheus/data and serves on
127.0.0.1:PORT until interrupted (Ctrl-C).

Options:
  --port PORT                  Port of the Prometheus web UI and API (default 9090)
  --scrape-interval DURATION   How often to scrape, e.g. 1s, 5s, 1m (default 5s, as in
                               deploy/prometheus/prometheus.yml)
  -h, --help                   Print this help and exit

Then open the printed URL, or Grafana with dashboards/ (see dashboards/README.md), whose
data source expects Prometheus at http://localhost:9090.

Example:
  build/bin/parasync-launch --ps 2 --workers 2 --mode sync --log-dir runs/sync1 &
  tools/watch-run.sh runs/sync1
USAGE
}

die() {
  echo "watch-run.sh: $*" >&2
  exit 2
}

run_dir=""
port=9090
scrape_interval=""
while (($# > 0)); do
  case "$1" in
    -h | --help)
      usage
      exit 0
      ;;
    --port)
      (($# >= 2)) || die "--port needs a value"
      port=$2
      shift 2
      ;;
    --port=*)
      port=${1#--port=}
      shift
      ;;
    --scrape-interval)
      (($# >= 2)) || die "--scrape-interval needs a value"
      scrape_interval=$2
      shift 2
      ;;
    --scrape-interval=*)
      scrape_interval=${1#--scrape-interval=}
      shift
      ;;
    -*)
      die "unknown option $1 (see --help)"
      ;;
    *)
      [[ -z "$run_dir" ]] || die "one RUN_DIR only, got '$run_dir' and '$1' (see --help)"
      run_dir=$1
      shift
      ;;
  esac
done

[[ -n "$run_dir" ]] || {
  usage >&2
  exit 2
}
if [[ ! "$port" =~ ^[0-9]{1,5}$ ]] || ((10#$port < 1 || 10#$port > 65535)); then
  die "--port must be a number from 1 to 65535, got '$port'"
fi
port=$((10#$port))
if [[ -n "$scrape_interval" && ! "$scrape_interval" =~ ^[0-9]+(ms|s|m|h)$ ]]; then
  die "--scrape-interval must be a duration such as 500ms, 5s or 1m, got '$scrape_interval'"
fi
# Started before the run, the directory may not exist yet; parasync-launch accepts it.
mkdir -p "$run_dir" || die "cannot create $run_dir"
run_dir=$(cd "$run_dir" && pwd -P)
targets_file="$run_dir/prometheus-targets.json"
if [[ ! -f "$targets_file" ]]; then
  echo "watch-run.sh: $targets_file does not exist yet; it is picked up as soon as" \
    "parasync-launch --log-dir $run_dir writes it" >&2
fi

repo_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
config_src="$repo_dir/deploy/prometheus/prometheus.yml"
rules_src="$repo_dir/deploy/prometheus/parasync-alerts.yml"
[[ -f "$config_src" && -f "$rules_src" ]] || die "missing $config_src or $rules_src"

prometheus_bin=$(command -v prometheus || true)
if [[ -z "$prometheus_bin" ]]; then
  # The quick start does not install it (the test suite does): Debian's package.
  "$repo_dir/tools/install-deps.sh" prometheus ||
    die "no prometheus binary on PATH, and installing Debian's prometheus failed"
  prometheus_bin=$(command -v prometheus || true)
  [[ -n "$prometheus_bin" ]] || die "no prometheus binary on PATH after installing it"
fi

out_dir="$run_dir/prometheus"
mkdir -p "$out_dir/targets" "$out_dir/data"
if [[ -n "$scrape_interval" ]]; then
  # Only the global scrape_interval line (two-space indent under global:).
  # The targets file is re-read as often, so a run that starts later is seen at once.
  sed -e "s/^  scrape_interval: .*/  scrape_interval: $scrape_interval/" \
    -e "s/^        refresh_interval: .*/        refresh_interval: $scrape_interval/" \
    "$config_src" >"$out_dir/prometheus.yml"
  grep -q "^  scrape_interval: $scrape_interval\$" "$out_dir/prometheus.yml" ||
    die "could not set scrape_interval in $out_dir/prometheus.yml"
else
  cp "$config_src" "$out_dir/prometheus.yml"
fi
cp "$rules_src" "$out_dir/parasync-alerts.yml"
ln -sfn "$targets_file" "$out_dir/targets/parasync.json"

url="http://127.0.0.1:$port"
echo "Prometheus for $run_dir: $url (targets: $url/targets, alerts: $url/alerts)"
echo "Data in $out_dir/data; Ctrl-C to stop."
exec "$prometheus_bin" \
  --config.file="$out_dir/prometheus.yml" \
  --storage.tsdb.path="$out_dir/data" \
  --web.listen-address="127.0.0.1:$port"
