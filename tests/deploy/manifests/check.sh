#!/usr/bin/env bash
# Checks the deployment files under deploy/ offline (no Docker daemon, no cluster):
#   k8s      every Kubernetes object of each kustomization's output (kubectl kustomize) against
#            the Kubernetes schemas, unknown fields, and consistency between the objects
#            (CURVE keys from a read-only Secret mount holding the right files, for every
#            server and worker); the entrypoint's dry run with each server's and worker's
#            environment and Secret files
#   compose  compose files against the Compose Specification schema, references between
#            services, volumes and files, CURVE keys (read-only from the volume the keys
#            service fills, waited for); dclint's error rules; the compose Prometheus
#            layout (project config + targets file) with promtool; the keys service's
#            `parasync-entrypoint keys` run twice (the second run changes nothing) and every
#            server's and worker's entrypoint dry run on what it made
#   systemd  systemd-analyze verify (any message fails) and an exposure threshold of
#            systemd-analyze security, on copies of the units whose ExecStart and
#            EnvironmentFile point into this checkout; the entrypoint's dry run with each
#            unit's Environment=, the example environment file and its LoadCredential= files
#   slurm    deploy/slurm/parasync.sbatch run as a whole with stand-ins for srun, squeue, scancel,
#            scontrol and the binaries (stubs/): a fresh key directory (0700), every task's
#            command, and the servers stopped through scancel of their named step
#   shell    shellcheck on every shell script under deploy/ (and this one, and stubs/)
# Every entrypoint run above must start each server with --curve-key and --curve-allow and
# each worker with --curve-key and --curve-server-key (CURVE on by default everywhere), and
# with a --metrics-port outside Prometheus' exporter range 9100-9999 (9100: node exporter).
# The Kubernetes objects' ports, annotations and Services must be outside it too, parasync
# pods' liveness probes GET /healthz, and a PodMonitor carry a release label (validate-k8s.mjs).
# Every file a kustomization.yaml names (resources, patches, or "x.yml beside this file" in
# a comment) must exist. The export commands of docs/deploying.md's Kubernetes and docker compose
# sections run in a server pod's / service's environment (dry run) and must carry the export
# key pair and the servers' public key (--curve-key, --curve-server-key).
#   docker   COPY/ADD sources, stages, the ignore file and drift against
#            tools/install-deps.sh; every apt package exists in Debian (apt-cache); with
#            BIN_DIR, the runtime stage installs the package of every library the binaries
#            load (readelf NEEDED -> dpkg -S) and nothing else
#   grafana  every dashboards/*.json type-checked by the TypeScript compiler (strict) against
#            @grafana/schema's Dashboard type as an object literal: unknown fields at any
#            depth, wrong types, values outside the enums, required fields missing
#            (check-dashboards.mjs; grafana-dashboard.ts: which type, and its two departures)
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
for package in kubernetes-models dclint @grafana/schema typescript; do
  if [[ ! -d $here/node_modules/$package ]]; then
    echo "check.sh: $here/node_modules/$package is missing; run: npm ci --prefix tests/deploy/manifests" >&2
    exit 1
  fi
done

status=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
entrypoint=$src_dir/deploy/docker/parasync-entrypoint.sh
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
# Every *.yaml / *.yml a kustomization.yaml names, in its fields or its comments, exists
# beside it (a comment once sent readers to a file that was never written).
named_files_exist() {
  local kustomization dir name bad=0
  for kustomization in "$k8s"/*/kustomization.yaml; do
    dir=$(dirname "$kustomization")
    while read -r name; do
      [[ $name == kustomization.yaml || $name == */* ]] && continue
      if [[ ! -e $dir/$name ]]; then
        echo "  FAIL $(rel "$kustomization") names $name, which is not in $(rel "$dir")"
        bad=1
      fi
    done < <(grep -oE '(\.\./)?[A-Za-z0-9_./-]+\.ya?ml' "$kustomization" | sort -u)
  done
  return "$bad"
}
step "every file each deploy/k8s/*/kustomization.yaml names exists" named_files_exist
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

# Stand-in binaries for the entrypoint runs below: parasync-ps, -worker and -export print
# their arguments; parasync-keygen is the real one when BIN_DIR has it.
fake_bin=$tmp/fake-bin
mkdir -p "$fake_bin"
for b in parasync-ps parasync-worker parasync-export parasync-keygen; do
  ln -s "$here/stubs/fake-parasync" "$fake_bin/$b"
done
if [[ -n $bin_dir && -x $bin_dir/parasync-keygen ]]; then
  ln -sf "$(cd "$bin_dir" && pwd -P)/parasync-keygen" "$fake_bin/parasync-keygen"
fi

# curve_ok ROLE FILE: FILE holds parasync-entrypoint's output for ROLE (ps or worker); its
# command must carry ROLE's CURVE flags, and CURVE must not have been turned off.
curve_ok() {
  local role=$1 out=$2 line flag bad=0
  local -a want=(--curve-key --curve-allow)
  [[ $role == ps ]] || want=(--curve-key --curve-server-key)
  line=$(grep -E "^parasync-entrypoint: exec [^ ]*parasync-$role( |$)" "$out" | tail -n1)
  if [[ -z $line ]]; then
    echo "  FAIL no parasync-$role command in the entrypoint's output"
    return 1
  fi
  if grep -q 'CURVE off' "$out"; then
    echo "  FAIL parasync-$role runs with CURVE off"
    bad=1
  fi
  for flag in "${want[@]}"; do
    if [[ " $line " != *" $flag="* && " $line " != *" $flag "* ]]; then
      echo "  FAIL parasync-$role without $flag: ${line#parasync-entrypoint: exec }"
      bad=1
    fi
  done
  [[ $role == export ]] || metrics_port_ok "$role" "$line" || bad=1
  return "$bad"
}

# metrics_port_ok ROLE LINE: LINE (an exec line) has a --metrics-port outside Prometheus'
# exporter range 9100-9999, where node exporter and the other exporters listen.
metrics_port_ok() {
  local role=$1 line=" $2 " port
  if [[ $line =~ \ --metrics-port[=\ ]([0-9]+)\  ]]; then
    port=${BASH_REMATCH[1]}
  else
    echo "  FAIL parasync-$role without --metrics-port: ${2#parasync-entrypoint: exec }"
    return 1
  fi
  if ((port >= 9100 && port <= 9999)); then
    echo "  FAIL parasync-$role metrics port $port is in Prometheus' exporter range 9100-9999"
    return 1
  fi
}

# joined_lines FILE: FILE with each line ending in a backslash joined to the next.
joined_lines() {
  awk '{ if (sub(/\\$/, "")) { buf = buf $0; next } print buf $0; buf = "" }' "$1"
}

# export_dry_run WHAT ENV_FILE ROOT COMMAND...: runs an export command as documented
# (parasync-entrypoint export ... or parasync-export ...) with the environment in ENV_FILE,
# whose key files lie under ROOT; it must carry the export key and the servers' public key.
export_dry_run() {
  local what=$1 env_file=$2 root=$3 flag path bad=0
  shift 3
  local -a env=() words=("$@")
  mapfile -t env <"$env_file"
  echo "  [$what] ${words[*]}"
  case ${words[0]} in
    parasync-entrypoint)
      if [[ ${words[1]:-} != export ]]; then
        echo "  FAIL $what: parasync-entrypoint ${words[1]:-}, not parasync-entrypoint export"
        return 1
      fi
      (cd "$tmp" && env -i PATH="$PATH" PARASYNC_DRY_RUN=1 "${env[@]}" "$entrypoint" export \
        "${words[@]:2}") >"$tmp/export.out" 2>&1
      local rc=$?
      sed 's/^/  /' "$tmp/export.out"
      ((rc == 0)) || return 1
      curve_ok export "$tmp/export.out"
      ;;
    parasync-export)
      # Given as flags: each must name a key file the pod or service has.
      for flag in --curve-key --curve-server-key; do
        path=""
        for ((i = 1; i < ${#words[@]}; i++)); do
          [[ ${words[i]} == "$flag" ]] && path=${words[i + 1]:-}
          [[ ${words[i]} == "$flag="* ]] && path=${words[i]#*=}
        done
        if [[ -z $path ]]; then
          echo "  FAIL $what: parasync-export without $flag"
          bad=1
        elif [[ ! -e $root$path ]]; then
          echo "  FAIL $what: $flag $path is not a key file there (no Secret item / volume file)"
          bad=1
        fi
      done
      return "$bad"
      ;;
    *)
      echo "  FAIL $what: runs ${words[0]}, neither parasync-entrypoint export nor parasync-export"
      return 1
      ;;
  esac
}

# entrypoint_run ROLE OUT ENV...: runs the entrypoint's dry run for ROLE with only ENV (and
# PATH), its output in OUT and printed; then curve_ok.
entrypoint_run() {
  local role=$1 out=$2
  shift 2
  (cd "$tmp" && env -i PATH="$PATH" PARASYNC_DRY_RUN=1 "$@" "$entrypoint" "$role") >"$out" 2>&1
  local rc=$?
  sed 's/^/  /' "$out"
  ((rc == 0)) || return 1
  curve_ok "$role" "$out"
}

# Each server and worker pod as Kubernetes would start it: the ConfigMap and env of its
# container, its Secret volumes' items as (empty) files; the entrypoint must find its keys.
pod_dry_run() {
  local docs=("$@") root env_file
  local -a env=()
  root=$tmp/pod-ps
  env_file=$tmp/pod-ps.env
  node "$here/helpers.mjs" pod-env "$root" StatefulSet/parasync-ps ps "${docs[@]}" >"$env_file" ||
    return 1
  mapfile -t env <"$env_file"
  entrypoint_run ps "$tmp/pod-ps.out" HOSTNAME=parasync-ps-1 "${env[@]}" || return 1
  root=$tmp/pod-worker
  env_file=$tmp/pod-worker.env
  node "$here/helpers.mjs" pod-env "$root" Job/parasync-worker worker "${docs[@]}" >"$env_file" ||
    return 1
  mapfile -t env <"$env_file"
  entrypoint_run worker "$tmp/pod-worker.out" HOSTNAME=parasync-worker-1-x7k2p \
    JOB_COMPLETION_INDEX=1 "${env[@]}"
}
if command -v kubectl >/dev/null 2>&1; then
  # The Secret made as deploy/k8s/base/kustomization.yaml says (kubectl's client-side dry
  # run), checked with the base: every key the pods' Secret volumes name must be in it.
  secret_check() {
    local dir=$tmp/secret
    mkdir -p "$dir"
    (
      cd "$dir" || exit 1
      "$fake_bin/parasync-keygen" --dir keys ps worker export >/dev/null &&
        cat keys/worker.pub keys/export.pub >keys/allowed &&
        kubectl -n parasync create secret generic parasync-curve --from-file=keys/ps.key \
          --from-file=keys/ps.pub --from-file=keys/allowed --from-file=keys/worker.key \
          --from-file=keys/export.key --dry-run=client -o yaml >secret.yaml
    ) || return 1
    node "$here/validate-k8s.mjs" --consistency "$tmp/base.yaml" "$dir/secret.yaml"
  }
  step "the Secret parasync-curve as kustomization.yaml makes it, with deploy/k8s/base" secret_check
  for rendered in "$tmp"/base.yaml "$tmp"/gpu.yaml; do
    [[ -s $rendered ]] || continue
    rm -rf "$tmp/pod-ps" "$tmp/pod-worker"
    step "parasync-entrypoint dry run of ps 1 and worker 1 as $(basename "$rendered" .yaml) starts them" \
      pod_dry_run "$rendered"
  done
  # The export commands of docs/deploying.md's Kubernetes section, as a server pod of the base runs
  # them (kubectl exec gives the command the container's environment and mounts).
  readme_k8s_export() {
    local root=$tmp/pod-export line n=0 bad=0
    local -a words
    node "$here/helpers.mjs" pod-env "$root" StatefulSet/parasync-ps ps "$tmp/base.yaml" \
      >"$tmp/pod-export.env" || return 1
    while IFS= read -r line; do
      read -r -a words <<<"${line#* -- }"
      n=$((n + 1))
      export_dry_run "docs/deploying.md: kubectl exec" "$tmp/pod-export.env" "$root" "${words[@]}" || bad=1
    done < <(joined_lines "$src_dir/docs/deploying.md" |
      grep -E '^kubectl .*exec .*parasync-ps-[0-9]+ -- .*export')
    if ((n == 0)); then
      echo "  FAIL docs/deploying.md has no 'kubectl ... exec parasync-ps-<i> -- ... export' command"
      return 1
    fi
    return "$bad"
  }
  step "docs/deploying.md's Kubernetes export command carries the CURVE keys (dry run in a server pod)" \
    readme_k8s_export
else
  step "parasync-entrypoint dry run of ps 1 and worker 1 as deploy/k8s/base starts them" \
    pod_dry_run "${base_files[@]}"
fi

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
# The services as compose starts them, named volumes as directories under $tmp/compose:
# the keys service twice (the second run must change nothing), then every server and worker.
compose_dry_run() {
  local root=$tmp/compose name role bad=0 env_file
  local -a env=() services=()
  mapfile -t services < <(node "$here/helpers.mjs" compose-services "${compose_files[@]}")
  for role in keys ps worker; do
    for name in "${services[@]}"; do
      [[ ${name#* } == "$role" ]] || continue
      name=${name%% *}
      env_file=$tmp/compose-$name.env
      node "$here/helpers.mjs" compose-env "$root" "$name" "${compose_files[@]}" >"$env_file" || return 1
      mapfile -t env <"$env_file"
      echo "  [$name]"
      if [[ $role == keys ]]; then
        local run
        for run in 1 2; do
          (cd "$tmp" && env -i PATH="$PATH" PARASYNC_BIN_DIR="$fake_bin" "${env[@]}" \
            "$entrypoint" keys) >"$tmp/compose-$name.$run" 2>&1 || { cat "$tmp/compose-$name.$run"; return 1; }
          sed 's/^/  /' "$tmp/compose-$name.$run"
        done
        if ! grep -q 'none made' "$tmp/compose-$name.2" || ! grep -q 'up to date' "$tmp/compose-$name.2"; then
          echo "  FAIL service $name: its second run changed the keys"
          bad=1
        fi
      else
        entrypoint_run "$role" "$tmp/compose-$name.out" HOSTNAME="$name" "${env[@]}" || bad=1
      fi
    done
  done
  return "$bad"
}
step "keys service twice, then parasync-entrypoint dry run of every server and worker service" \
  compose_dry_run
# The export commands of docs/deploying.md's and deploy/docker/README.md's compose sections, in the
# environment of the service they exec into, with the keys the keys service made above.
readme_compose_export() {
  local file line service n=0 bad=0
  local -a words
  for file in "$src_dir/docs/deploying.md" "$docker_dir/README.md"; do
    while IFS= read -r line; do
      line=${line#*docker compose exec }
      service=${line%% *}
      read -r -a words <<<"${line#* }"
      n=$((n + 1))
      if [[ ! -s $tmp/compose-$service.env ]]; then
        echo "  FAIL $(rel "$file"): docker compose exec $service: no such server service"
        bad=1
        continue
      fi
      export_dry_run "$(rel "$file"): docker compose exec $service" "$tmp/compose-$service.env" \
        "$tmp/compose" "${words[@]}" || bad=1
    done < <(joined_lines "$file" | grep -oE "docker compose exec [A-Za-z0-9_-]+ [^\`]*export[^\`]*")
  done
  ((n > 0)) || { echo "  FAIL no 'docker compose exec SERVICE ... export' command in docs/deploying.md or deploy/docker/README.md"; return 1; }
  return "$bad"
}
step "the docs' docker compose export commands carry the CURVE keys (dry run in the service)" \
  readme_compose_export
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
      "$docker_dir/prometheus-targets.json" 7100
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
  # Each unit's entrypoint as instance 0 under systemd: its Environment= (%i, %S, %L and %d,
  # the credentials directory, resolved), then the example environment file (which wins),
  # and one (empty) file per LoadCredential= in the credentials directory.
  unit_dry_run() {
    local unit=$1 name role creds line key
    local -a env=()
    name=$(basename "$unit" .service)
    role=$(sed -n 's/^ExecStart=.*parasync-entrypoint \([a-z]*\).*/\1/p' "$unit")
    [[ -n $role ]] || { echo "  FAIL $name: ExecStart runs no parasync-entrypoint ROLE"; return 1; }
    creds=$tmp/credentials/$name
    mkdir -p "$creds"
    while IFS= read -r line; do
      case $line in
        LoadCredential=*)
          key=${line#LoadCredential=}
          : >"$creds/${key%%:*}"
          ;;
        Environment=*)
          line=${line#Environment=}
          line=${line//%i/0}
          line=${line//%S//var/lib}
          line=${line//%L//var/log}
          env+=("${line//%d/$creds}")
          ;;
      esac
    done <"$unit"
    while IFS= read -r line; do
      [[ $line =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] && env+=("$line")
    done <"$src_dir/deploy/systemd/parasync.env.example"
    entrypoint_run "$role" "$tmp/$name.out" "${env[@]}"
  }
  for unit in "${units[@]}"; do
    name=$(basename "$unit" .service)
    step "parasync-entrypoint dry run of ${name%@}@0 with its credentials" \
      unit_dry_run "$unit"
  done
fi

# ---- Slurm ------------------------------------------------------------------------------------
section "Slurm"
sbatch_script=$src_dir/deploy/slurm/parasync.sbatch
# The whole batch script on 2 nodes with 3 tasks, srun, squeue and scontrol from stubs/, the binaries
# from $fake_bin: the keys must be made fresh in a 0700 directory of the run directory before
# the servers start, and every task must get its own key.
slurm_run() {
  local run_dir=$tmp/slurm-run out=$tmp/slurm.out bad=0 i mode
  mkdir -p "$run_dir/keys" && : >"$run_dir/keys/stale.key"
  (cd "$tmp" && env -i PATH="$here/stubs:$PATH" HOME="$tmp" SLURM_JOB_ID=7 \
    SLURM_JOB_NODELIST=node-a,node-b SLURM_NTASKS=3 SLURM_SUBMIT_DIR="$tmp" FAKE_PS_SERVES=1 \
    PARASYNC_BIN_DIR="$fake_bin" PARASYNC_ENTRYPOINT="$entrypoint" PARASYNC_RUN_DIR="$run_dir" \
    bash "$sbatch_script") >"$out" 2>&1
  local rc=$?
  sed 's/^/  /' "$out"
  ((rc == 0)) || { echo "  FAIL parasync.sbatch exited with $rc"; return 1; }
  mode=$(stat -c %a "$run_dir/keys")
  [[ $mode == 700 ]] || { echo "  FAIL $run_dir/keys has mode $mode, not 700"; bad=1; }
  [[ ! -e $run_dir/keys/stale.key ]] || { echo "  FAIL the keys of an earlier run were kept"; bad=1; }
  # A server per node (2), a worker per task (3), each with its flags.
  local -a lines
  mapfile -t lines < <(grep -E '^parasync-entrypoint: exec ' "$out")
  for role in ps worker; do
    local count=0 line
    for line in "${lines[@]}"; do
      [[ $line == *"/parasync-$role "* ]] || continue
      count=$((count + 1))
      printf '%s\n' "$line" >"$tmp/slurm-line"
      curve_ok "$role" "$tmp/slurm-line" || bad=1
    done
    local expected=2
    [[ $role == ps ]] || expected=3
    ((count == expected)) || { echo "  FAIL $count parasync-$role command(s), not $expected"; bad=1; }
  done
  for i in 0 1 2; do
    grep -q -- "--curve-key=$run_dir/keys/worker$i.key" "$out" ||
      { echo "  FAIL worker $i was not given its own key worker$i.key"; bad=1; }
  done
  # The servers are stopped by SIGTERM to their step, found by name (not through srun).
  grep -q -- "scancel (stand-in): --signal=TERM 7.0" "$out" ||
    { echo "  FAIL the servers' step was not signalled with scancel --signal=TERM 7.0"; bad=1; }
  count=$(grep -c "^parasync-ps: SIGTERM, stopping" "$out")
  ((count == 2)) || { echo "  FAIL $count of 2 servers stopped by SIGTERM"; bad=1; }
  return "$bad"
}
step "parasync.sbatch with stand-ins for srun, squeue, scancel, scontrol and the binaries" slurm_run

# ---- shell scripts -------------------------------------------------------------------------------
section "shell scripts"
if command -v shellcheck >/dev/null 2>&1; then
  scripts=()
  while IFS= read -r -d '' f; do
    if [[ $f == *.sh || $f == *.sbatch ]] || head -n1 "$f" | grep -qE '^#!.*\b(ba)?sh\b'; then
      scripts+=("$f")
    fi
  done < <(find "$src_dir/deploy" -type f -print0 | sort -z)
  scripts+=("$here/check.sh" "$here"/stubs/*)
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
      [[ $p == cuda-* || $p == libcublas* || $p == libcudnn* ]] && continue
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
    for b in parasync-ps parasync-worker parasync-export parasync-launch parasync-keygen; do
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
    echo "  ${#needed[@]} package(s) provide the libraries of $(rel "$bin_dir")/parasync-{ps,worker,export,launch,keygen}"
    return "$bad"
  }
  step "runtime-base packages = packages of the binaries' NEEDED libraries" runtime_libraries
fi

# ---- Grafana dashboards ---------------------------------------------------------------------------
section "Grafana dashboards"
dashboards=("$src_dir"/dashboards/*.json)
if [[ ! -e ${dashboards[0]} ]]; then
  echo "  FAIL no dashboards/*.json"
  status=1
else
  step "grafana: check-dashboards.mjs $(names "${dashboards[@]}") (tsc against @grafana/schema's Dashboard)" \
    env TMPDIR="$tmp" node "$here/check-dashboards.mjs" "${dashboards[@]}"
fi

if ((status == 0)); then
  echo "check.sh: all checks passed"
else
  echo "check.sh: some checks FAILED (above)"
fi
exit "$status"
