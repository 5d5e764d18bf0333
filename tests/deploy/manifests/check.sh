#!/usr/bin/env bash
# Checks the deployment files under deploy/ offline (no Docker daemon, no cluster):
#   k8s      every Kubernetes object of each kustomization's output (kubectl kustomize) against
#            the Kubernetes schemas, unknown fields, and consistency between the objects;
#            the entrypoint's dry run on the ConfigMap's settings
#   compose  compose files against the Compose Specification schema, references between
#            services, volumes and files; dclint's error rules; the compose Prometheus
#            layout (project config + targets file) with promtool
#   systemd  systemd-analyze verify (any message fails) and an exposure threshold of
#            systemd-analyze security, on copies of the units whose ExecStart and
#            EnvironmentFile point into this checkout
#   shell    shellcheck on every shell script under deploy/ (and this one)
#   docker   COPY/ADD sources, stages, the ignore file and drift against
#            tools/install-deps.sh; every apt package exists in Debian (apt-cache); with
#            BIN_DIR, the runtime stage installs the package of every library the binaries
#            load (readelf NEEDED -> dpkg -S) and nothing else
# Usage: tests/deploy/manifests/check.sh [SOURCE_DIR [BIN_DIR]]
#   SOURCE_DIR: the checkout to check (default: this one); BIN_DIR: built binaries
#   (e.g. build/bin) for the runtime-library check, skipped without it.
# Needs node and `npm ci --prefix tests/deploy/manifests` done once (the validators' npm
# packages). Exits 0 when every check passed, 1 otherwise; a check whose tool is missing
# says SKIP and why.
# The check functions below run through step(), which shellcheck cannot follow.
# shellcheck disable=SC2317
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
src_dir=$(cd "${1:-$here/../../..}" && pwd -P) || exit 1
bin_dir=${2:-}

if ! command -v node >/dev/null 2>&1; then
  echo "check.sh: node not found; install it with: sudo apt-get install nodejs npm" >&2
  exit 1
fi
if [[ ! -d $here/node_modules/kubernetes-models || ! -d $here/node_modules/dclint ]]; then
  echo "check.sh: $here/node_modules is missing; run: npm ci --prefix tests/deploy/manifests" >&2
  exit 1
fi

status=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
section() { echo "== $*"; }
skip() { echo "  SKIP $*"; }
# step DESCRIPTION COMMAND...: runs it, prints its output, records a failure.
step() {
  local what=$1
  shift
  echo "+ $what"
  if ! "$@"; then
    echo "check.sh: FAILED: $what" >&2
    status=1
  fi
}
rel() { echo "${1#"$src_dir"/}"; }
# names PATH...: the paths relative to the checkout, on one line.
names() {
  local out="" p
  for p in "$@"; do out+="${out:+ }$(rel "$p")"; done
  echo "$out"
}

# ---- Kubernetes -------------------------------------------------------------------------------
section "Kubernetes manifests"
k8s=$src_dir/deploy/k8s
if command -v kubectl >/dev/null 2>&1; then
  for kustomization in "$k8s"/*/kustomization.yaml; do
    dir=$(dirname "$kustomization")
    render() {
      kubectl kustomize "$1" >"$2" || return 1
      node "$here/validate-k8s.mjs" --consistency "$2"
    }
    step "kubectl kustomize $(rel "$dir") | validate-k8s.mjs --consistency" \
      render "$dir" "$tmp/$(basename "$dir").yaml"
  done
else
  skip "kubectl not found: overlays not rendered; checking the base's files one by one"
  mapfile -t base_files < <(find "$k8s/base" -name '*.yaml' ! -name kustomization.yaml | sort)
  step "validate-k8s.mjs --consistency deploy/k8s/base/*.yaml" \
    node "$here/validate-k8s.mjs" --consistency "${base_files[@]}"
fi

# The ConfigMap's settings through parasync-entrypoint, as a StatefulSet pod and an Indexed
# Job pod would run it: they must make a cluster spec and a command (a dry run).
entrypoint_dry_run() {
  local env_file=$tmp/configmap.env
  node "$here/helpers.mjs" configmap-env "$k8s/base/configmap.yaml" parasync-config \
    >"$env_file" || return 1
  local -a env=()
  mapfile -t env <"$env_file"
  (cd "$here" && env -i PATH="$PATH" PARASYNC_DRY_RUN=1 HOSTNAME=parasync-ps-1 "${env[@]}" \
    PARASYNC_DATA_DIR=/var/lib/parasync/data/shard \
    "$src_dir/deploy/docker/parasync-entrypoint.sh" ps) || return 1
  (cd "$here" && env -i PATH="$PATH" PARASYNC_DRY_RUN=1 HOSTNAME=parasync-worker-1 \
    JOB_COMPLETION_INDEX=1 "${env[@]}" "$src_dir/deploy/docker/parasync-entrypoint.sh" worker)
}
step "parasync-entrypoint dry run with the ConfigMap (ps 1, worker 1)" entrypoint_dry_run

# ---- docker compose -------------------------------------------------------------------------
section "docker compose"
docker_dir=$src_dir/deploy/docker
compose_files=("$docker_dir/compose.yaml")
[[ -f $docker_dir/compose.gpu.yaml ]] && compose_files+=("$docker_dir/compose.gpu.yaml")
step "validate-compose.mjs $(names "${compose_files[@]}")" \
  node "$here/validate-compose.mjs" "${compose_files[@]}"
# dclint's error-level rules only (--quiet); its warnings are style (key order and such).
step "dclint --quiet (error rules)" \
  "$here/node_modules/.bin/dclint" --quiet --color=false "${compose_files[@]}"
if command -v promtool >/dev/null 2>&1; then
  # compose.yaml mounts the project's prometheus.yml and alert rules unchanged, and its
  # targets file into targets/: check that arrangement (promtool reads the targets too).
  prometheus_layout() {
    mkdir -p "$tmp/prometheus/targets"
    cp "$src_dir/deploy/prometheus/prometheus.yml" "$src_dir/deploy/prometheus/parasync-alerts.yml" \
      "$tmp/prometheus/"
    cp "$docker_dir/prometheus-targets.json" "$tmp/prometheus/targets/compose.json"
    promtool check config "$tmp/prometheus/prometheus.yml" || return 1
    # Every target is a compose service on the metrics port.
    node "$here/helpers.mjs" compose-targets "$docker_dir/compose.yaml" \
      "$docker_dir/prometheus-targets.json" 9100
  }
  step "promtool check config (compose layout) and targets vs services" prometheus_layout
else
  skip "promtool not found (Debian package prometheus): compose Prometheus layout not checked"
fi

# ---- systemd ----------------------------------------------------------------------------------
section "systemd units"
units=("$src_dir"/deploy/systemd/*.service)
if ! command -v systemd-analyze >/dev/null 2>&1; then
  skip "systemd-analyze not found: units not verified"
elif [[ ! -e ${units[0]} ]]; then
  echo "  FAIL no unit files in deploy/systemd"
  status=1
else
  # Copies whose ExecStart is this checkout's entrypoint and whose environment file is the
  # example: verify checks that both exist. Templates are verified as instance 0.
  mkdir -p "$tmp/units"
  instances=()
  for unit in "${units[@]}"; do
    name=$(basename "$unit")
    sed -e "s#/opt/parasync/bin/parasync-entrypoint#$src_dir/deploy/docker/parasync-entrypoint.sh#g" \
      -e "s#^EnvironmentFile=-\\?/etc/parasync/parasync.env#EnvironmentFile=$src_dir/deploy/systemd/parasync.env.example#" \
      "$unit" >"$tmp/units/$name"
    if [[ $name == *@.service ]]; then
      ln -s "$name" "$tmp/units/${name%@.service}@0.service"
      instances+=("$tmp/units/${name%@.service}@0.service")
    else
      instances+=("$tmp/units/$name")
    fi
  done
  # verify exits 0 on warnings such as an unknown setting: any message is a failure here.
  verify() {
    local out
    out=$(cd "$tmp/units" && systemd-analyze verify --man=no "$@" 2>&1)
    local rc=$?
    [[ -n $out ]] && printf '  %s\n' "$out"
    [[ $rc -eq 0 && -z $out ]]
  }
  step "systemd-analyze verify $(cd "$tmp/units" && echo *@0.service)" \
    verify "${instances[@]}"
  # The hardening must keep the exposure level low: systemd prints it from 0.0 (locked
  # down) to 10.0 (none) and compares --threshold with ten times that; both units are at
  # about 2 ("OK"), the limit is 3.0.
  exposure() {
    local out rc
    out=$(cd "$tmp/units" && systemd-analyze security --offline=yes --threshold=30 "$1" 2>&1)
    rc=$?
    grep -E 'Overall exposure' <<<"$out" | sed 's/^/  /'
    return "$rc"
  }
  for instance in "${instances[@]}"; do
    step "systemd-analyze security --offline=yes --threshold=30 $(basename "$instance")" \
      exposure "$instance"
  done
fi

# ---- shell scripts -------------------------------------------------------------------------------
section "shell scripts"
if command -v shellcheck >/dev/null 2>&1; then
  scripts=()
  while IFS= read -r -d '' f; do
    if [[ $f == *.sh || $f == *.sbatch ]] || head -n1 "$f" | grep -qE '^#!.*\b(ba)?sh\b'; then
      scripts+=("$f")
    fi
  done < <(find "$src_dir/deploy" -type f -print0 | sort -z)
  scripts+=("$here/check.sh")
  step "shellcheck $(names "${scripts[@]}")" \
    shellcheck "${scripts[@]}"
else
  skip "shellcheck not found (Debian package shellcheck)"
fi

# ---- Dockerfile ---------------------------------------------------------------------------------
section "Dockerfile"
dockerfile=$src_dir/deploy/docker/Dockerfile
step "check-dockerfile.mjs deploy/docker/Dockerfile" \
  node "$here/check-dockerfile.mjs" "$dockerfile" "$src_dir" "$src_dir/tools/install-deps.sh" deps \
  >"$tmp/dockerfile.out"
grep -v '^packages ' "$tmp/dockerfile.out"
stage_packages() { awk -v s="$1" '$1 == "packages" && $2 == s { for (i = 3; i <= NF; i++) print $i }' "$tmp/dockerfile.out"; }

if ! command -v apt-cache >/dev/null 2>&1; then
  skip "apt-cache not found: package names not looked up"
elif ! apt-cache show libc6 >/dev/null 2>&1; then
  skip "apt-cache knows no packages (run apt-get update): package names not looked up"
else
  # CUDA packages come from NVIDIA's repository, which Debian's apt-cache does not know.
  lookup() {
    local missing=0 p
    while read -r p; do
      [[ $p == cuda-* || $p == libcublas* ]] && continue
      if ! apt-cache show --no-all-versions "$p" >/dev/null 2>&1; then
        echo "  FAIL no Debian package $p"
        missing=1
      fi
    done < <(awk '$1 == "packages" { for (i = 3; i <= NF; i++) print $i }' "$tmp/dockerfile.out" | sort -u)
    return "$missing"
  }
  step "apt-cache show: every Debian package the Dockerfile installs exists" lookup
fi

if [[ -z $bin_dir ]]; then
  skip "no BIN_DIR given: runtime packages not compared with the binaries' libraries"
elif ! command -v readelf >/dev/null 2>&1 || ! command -v dpkg >/dev/null 2>&1; then
  skip "readelf or dpkg not found: runtime packages not compared with the binaries' libraries"
else
  # The runtime stage must install the package of every library the binaries load (the
  # C runtime and libstdc++ are in every Debian image), and no library nobody loads.
  runtime_libraries() {
    local base="libc6 libgcc-s1 libstdc++6" data="dataset-fashion-mnist" bad=0 b lib path pkg
    local -A needed=()
    for b in parasync-ps parasync-worker parasync-export parasync-launch; do
      [[ -x $bin_dir/$b ]] || { echo "  FAIL $bin_dir/$b not found"; bad=1; continue; }
      for lib in $(readelf -d "$bin_dir/$b" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
        path=$(ldconfig -p | awk -v l="$lib" '$1 == l && /x86-64|x86_64/ { print $NF; exit }')
        [[ -n $path ]] || { echo "  FAIL $b needs $lib, which this machine does not have"; bad=1; continue; }
        pkg=$(dpkg -S "$(readlink -f "$path")" 2>/dev/null | head -n1 | cut -d: -f1)
        [[ -n $pkg ]] || pkg=$(dpkg -S "$path" 2>/dev/null | head -n1 | cut -d: -f1)
        [[ -n $pkg ]] || { echo "  FAIL no package owns $path ($lib)"; bad=1; continue; }
        needed[$pkg]+="$b:$lib "
      done
    done
    local -a runtime
    mapfile -t runtime < <(stage_packages runtime-base)
    for pkg in "${!needed[@]}"; do
      [[ " $base " == *" $pkg "* ]] && continue
      if [[ " ${runtime[*]} " != *" $pkg "* ]]; then
        echo "  FAIL runtime-base does not install $pkg (${needed[$pkg]% })"
        bad=1
      fi
    done
    for pkg in "${runtime[@]}"; do
      if [[ -z ${needed[$pkg]:-} && " $data " != *" $pkg "* ]]; then
        echo "  FAIL runtime-base installs $pkg, which no binary loads"
        bad=1
      fi
    done
    echo "  ${#needed[@]} package(s) provide the libraries of $(rel "$bin_dir")/parasync-{ps,worker,export,launch}"
    return "$bad"
  }
  step "runtime-base packages = packages of the binaries' NEEDED libraries" runtime_libraries
fi

if ((status == 0)); then
  echo "check.sh: all checks passed"
else
  echo "check.sh: some checks FAILED (above)"
fi
exit "$status"
