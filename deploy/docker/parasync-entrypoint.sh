#!/usr/bin/env bash
# parasync-entrypoint: starts parasync-ps or parasync-worker in a container (docker compose,
# Kubernetes) or under systemd. It builds the cluster description (TF_CONFIG) from the
# environment, turns PARASYNC_* variables into flags, prints what it runs, and execs the
# binary (which becomes PID 1 and handles SIGTERM itself: a PS saves a final snapshot).
#
# Usage:
#   parasync-entrypoint ps     [FLAG...]   start a parameter server; FLAGs go to parasync-ps
#   parasync-entrypoint worker [FLAG...]   start a worker; FLAGs go to parasync-worker
#   parasync-entrypoint healthcheck [PORT] exit 0 if http://127.0.0.1:PORT/metrics answers 200
#   parasync-entrypoint COMMAND [ARG...]   run anything else (parasync-export, bash, ...)
#
# The cluster (only when TF_CONFIG is unset; a given TF_CONFIG is passed on untouched):
#   PARASYNC_PS_HOSTS          host:port of every PS, comma-separated; or
#   PARASYNC_NUM_PS and PARASYNC_PS_HOST_PATTERN
#                              N addresses made from the pattern, {i} = 0..N-1, e.g.
#                              "parasync-ps-{i}.parasync-ps:5000" (Kubernetes StatefulSet)
#   PARASYNC_WORKER_HOSTS      host:port of every worker; or
#   PARASYNC_NUM_WORKERS and PARASYNC_WORKER_HOST_PATTERN (default "worker-{i}:6000").
#                              Worker addresses are only counted (the world size), never
#                              contacted: no Service or open port is needed for them.
#   PARASYNC_TASK_INDEX        this task's index; else JOB_COMPLETION_INDEX (a worker in a
#                              Kubernetes Indexed Job); else the number that ends the host
#                              name (StatefulSet pod parasync-ps-1 -> 1).
#
# Flags from the environment (each only when the variable is non-empty and the flag is not
# already among the arguments, so arguments win, as flags win over TF_CONFIG):
#   both:    PARASYNC_MODE --mode, PARASYNC_LOG_LEVEL --log-level, PARASYNC_LOG_DIR --log-dir,
#            PARASYNC_METRICS_BIND --metrics-bind (default 0.0.0.0: scraped from outside),
#            PARASYNC_METRICS_PORT --metrics-port (default 9100; or PARASYNC_METRICS_PORT_BASE
#            plus the task index, for several tasks on one host)
#   ps:      PARASYNC_BIND --bind (default 0.0.0.0:<port of this shard's address>),
#            PARASYNC_DATA_DIR --data-dir, PARASYNC_DURABILITY, PARASYNC_CHECKPOINT_EVERY,
#            PARASYNC_CHECKPOINT_EVERY_VERSIONS, PARASYNC_REPLICAS_TO_AGGREGATE,
#            PARASYNC_WORKER_TIMEOUT, PARASYNC_BARRIER_TIMEOUT, PARASYNC_MAX_MODEL_BYTES
#            (default: 80% of the container's memory limit when it has one)
#   worker:  PARASYNC_DATA --data, PARASYNC_EPOCHS, PARASYNC_BATCH_SIZE, PARASYNC_MAX_STEPS,
#            PARASYNC_MAX_SECONDS, PARASYNC_MODEL, PARASYNC_OPTIMIZER, PARASYNC_LR,
#            PARASYNC_MOMENTUM, PARASYNC_SEED, PARASYNC_LR_SCALING, PARASYNC_DEVICE,
#            PARASYNC_COMPUTE_THREADS, PARASYNC_TRAIN_EXAMPLES, PARASYNC_CONNECT_TIMEOUT,
#            PARASYNC_REQUEST_TIMEOUT, PARASYNC_HEARTBEAT_INTERVAL, and the switches
#            PARASYNC_CHECKPOINT_EACH_EPOCH, PARASYNC_STALENESS_LR, PARASYNC_NO_SHUFFLE (=1)
#   any other flag: PARASYNC_PS_ARGS / PARASYNC_WORKER_ARGS (split at blanks).
# PARASYNC_BIN_DIR: where the binaries are (default: this script's directory if it holds
# them, else PATH). PARASYNC_DRY_RUN=1: print TF_CONFIG and the command instead of running.
set -euo pipefail
shopt -s inherit_errexit  # a failure inside $(...) stops the script too

prog=parasync-entrypoint
die() {
  echo "$prog: $*" >&2
  exit 2
}

# ---- helpers ------------------------------------------------------------------------------

# Prints the number that ends this host's name (parasync-ps-1 -> 1), or nothing.
hostname_ordinal() {
  local host=${HOSTNAME:-}
  [[ -n $host ]] || host=$(hostname 2>/dev/null || true)
  host=${host%%.*}
  if [[ $host =~ -([0-9]+)$ ]]; then
    echo "$((10#${BASH_REMATCH[1]}))"
  fi
}

# This task's index (see the header); dies when nothing names it.
task_index() {
  local role=$1 index=${PARASYNC_TASK_INDEX:-}
  if [[ -z $index && $role == worker ]]; then index=${JOB_COMPLETION_INDEX:-}; fi
  if [[ -z $index ]]; then index=$(hostname_ordinal); fi
  [[ $index =~ ^[0-9]+$ ]] ||
    die "no task index: set PARASYNC_TASK_INDEX (or run as a StatefulSet pod / Indexed Job)"
  echo "$((10#$index))"
}

# host_list LIST COUNT PATTERN WHAT: prints the comma-separated addresses, from LIST when set,
# else COUNT addresses made from PATTERN ({i} replaced by 0..COUNT-1).
host_list() {
  local list=$1 count=$2 pattern=$3 what=$4 out="" i
  if [[ -n $list ]]; then
    echo "$list"
    return
  fi
  [[ $count =~ ^[0-9]+$ && $count -gt 0 ]] ||
    die "no $what addresses: set PARASYNC_${what^^}_HOSTS, or PARASYNC_NUM_${what^^} with a pattern"
  [[ -n $pattern ]] || die "PARASYNC_NUM_${what^^} needs PARASYNC_${what^^}_HOST_PATTERN"
  [[ $pattern == *"{i}"* ]] || die "the $what host pattern '$pattern' has no {i}"
  for ((i = 0; i < count; i++)); do
    out+="${out:+,}${pattern//\{i\}/$i}"
  done
  echo "$out"
}

# json_list A,B,C: prints ["A","B","C"]; dies on characters that need JSON escaping (no
# host name or address has them).
json_list() {
  local out="" item
  local -a items
  IFS=, read -r -a items <<<"$1"
  for item in "${items[@]}"; do
    item=${item//[[:space:]]/}
    [[ -n $item ]] || continue
    [[ $item =~ ^[][A-Za-z0-9._:-]+$ ]] || die "'$item' is not a host:port address"
    out+="${out:+,}\"$item\""
  done
  echo "[$out]"
}

# The metrics port of this task: PARASYNC_METRICS_PORT, else PARASYNC_METRICS_PORT_BASE plus
# the task index, else 9100.
metrics_port() {
  local role=$1
  if [[ -n ${PARASYNC_METRICS_PORT:-} ]]; then
    echo "$PARASYNC_METRICS_PORT"
  elif [[ -n ${PARASYNC_METRICS_PORT_BASE:-} ]]; then
    local index
    index=$(task_index "$role")
    echo "$((PARASYNC_METRICS_PORT_BASE + index))"
  else
    echo 9100
  fi
}

# The memory limit of this container's cgroup in bytes (v2, then v1), or nothing when it
# has none. parasync-ps bounds a model by the machine's memory, which a container does not get.
cgroup_memory_limit() {
  local limit=""
  if [[ -r /sys/fs/cgroup/memory.max ]]; then
    limit=$(</sys/fs/cgroup/memory.max)
  elif [[ -r /sys/fs/cgroup/memory/memory.limit_in_bytes ]]; then
    limit=$(</sys/fs/cgroup/memory/memory.limit_in_bytes)
  fi
  # cgroup v1 says "no limit" with a huge number; anything above 1 PiB counts as none.
  if [[ $limit =~ ^[0-9]+$ ]] && ((${#limit} < 16)); then echo "$limit"; fi
}

# healthcheck PORT: one HTTP GET of /metrics with bash's /dev/tcp (no curl in the image).
healthcheck() {
  local port=$1 status=""
  if ! { exec 3<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null; then
    echo "$prog: nothing listens on 127.0.0.1:$port" >&2
    exit 1
  fi
  printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  IFS= read -r -t 5 status <&3 || true
  exec 3<&-
  if [[ $status == "HTTP/1."?" 200"* ]]; then exit 0; fi
  echo "$prog: http://127.0.0.1:$port/metrics answered '${status%$'\r'}'" >&2
  exit 1
}

# ---- dispatch -----------------------------------------------------------------------------

[[ $# -gt 0 ]] || die "usage: $prog ps|worker [FLAG...] | healthcheck [PORT] | COMMAND [ARG...]"
role=$1
shift
case $role in
  ps | worker) ;;
  healthcheck)
    [[ $# -le 1 ]] || die "usage: $prog healthcheck [PORT]"
    port=${1:-}
    if [[ -z $port ]]; then
      # The role matters only with PARASYNC_METRICS_PORT_BASE (a worker may take its index
      # from JOB_COMPLETION_INDEX).
      port=$(metrics_port "${PARASYNC_ROLE:-ps}")
    fi
    healthcheck "$port"
    ;;
  *) exec "$role" "$@" ;;
esac

here=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)
bin_dir=${PARASYNC_BIN_DIR:-}
if [[ -z $bin_dir && -x $here/parasync-$role ]]; then bin_dir=$here; fi
binary=${bin_dir:+$bin_dir/}parasync-$role

# Extra flags from PARASYNC_PS_ARGS / PARASYNC_WORKER_ARGS, split at blanks on purpose.
extra_var=PARASYNC_${role^^}_ARGS
read -r -a extra <<<"${!extra_var:-}"
user_args=("${extra[@]}" "$@")

has_flag() {
  local flag=$1 arg
  for arg in "${user_args[@]}"; do
    if [[ $arg == "$flag" || $arg == "$flag="* ]]; then return 0; fi
  done
  return 1
}

flags=()
add_flag() {  # add_flag --flag VALUE: only when VALUE is set and the user did not give --flag
  if [[ -n $2 ]] && ! has_flag "$1"; then flags+=("$1=$2"); fi
}
add_switch() {  # add_switch --flag VALUE: the bare flag when VALUE is 1/true/yes
  case ${2,,} in
    1 | true | yes) has_flag "$1" || flags+=("$1") ;;
    "" | 0 | false | no) ;;
    *) die "$1: '$2' is not 1/true/yes or 0/false/no" ;;
  esac
}

# ---- the cluster ----------------------------------------------------------------------------

computed_bind=""
default_worker_pattern='worker-{i}:6000'
if [[ -z ${TF_CONFIG:-} ]] && ! has_flag --ps-hosts; then
  ps_hosts=$(host_list "${PARASYNC_PS_HOSTS:-}" "${PARASYNC_NUM_PS:-}" \
    "${PARASYNC_PS_HOST_PATTERN:-}" ps)
  worker_hosts=$(host_list "${PARASYNC_WORKER_HOSTS:-}" "${PARASYNC_NUM_WORKERS:-}" \
    "${PARASYNC_WORKER_HOST_PATTERN:-$default_worker_pattern}" worker)
  index=$(task_index "$role")
  # Assigned one by one: a failure inside $(...) must stop the script (set -e).
  ps_json=$(json_list "$ps_hosts")
  worker_json=$(json_list "$worker_hosts")
  TF_CONFIG=$(printf '{"cluster":{"ps":%s,"worker":%s},"task":{"type":"%s","index":%d}}' \
    "$ps_json" "$worker_json" "$role" "$index")
  export TF_CONFIG
  if [[ $role == ps ]]; then
    IFS=, read -r -a ps_list <<<"$ps_hosts"
    ((index < ${#ps_list[@]})) || die "task index $index, but only ${#ps_list[@]} PS addresses"
    own=${ps_list[index]//[[:space:]]/}
    # Listen on every interface at this shard's port: its cluster address is a name other
    # processes resolve (a Service, a compose service), which need not be a local address.
    computed_bind=0.0.0.0:${own##*:}
  fi
fi

# ---- flags ------------------------------------------------------------------------------------

add_flag --mode "${PARASYNC_MODE:-}"
add_flag --log-level "${PARASYNC_LOG_LEVEL:-}"
add_flag --log-dir "${PARASYNC_LOG_DIR:-}"
add_flag --metrics-bind "${PARASYNC_METRICS_BIND:-0.0.0.0}"
if ! has_flag --metrics-port; then
  port=$(metrics_port "$role")
  add_flag --metrics-port "$port"
fi

if [[ $role == ps ]]; then
  add_flag --bind "${PARASYNC_BIND:-$computed_bind}"
  add_flag --data-dir "${PARASYNC_DATA_DIR:-}"
  add_flag --durability "${PARASYNC_DURABILITY:-}"
  add_flag --checkpoint-every "${PARASYNC_CHECKPOINT_EVERY:-}"
  add_flag --checkpoint-every-versions "${PARASYNC_CHECKPOINT_EVERY_VERSIONS:-}"
  add_flag --replicas-to-aggregate "${PARASYNC_REPLICAS_TO_AGGREGATE:-}"
  add_flag --worker-timeout "${PARASYNC_WORKER_TIMEOUT:-}"
  add_flag --barrier-timeout "${PARASYNC_BARRIER_TIMEOUT:-}"
  max_model_bytes=${PARASYNC_MAX_MODEL_BYTES:-}
  if [[ -z $max_model_bytes ]]; then
    limit=$(cgroup_memory_limit)
    if [[ -n $limit ]]; then max_model_bytes=$((limit * 8 / 10)); fi
  fi
  add_flag --max-model-bytes "$max_model_bytes"
else
  add_flag --data "${PARASYNC_DATA:-}"
  add_flag --epochs "${PARASYNC_EPOCHS:-}"
  add_flag --batch-size "${PARASYNC_BATCH_SIZE:-}"
  add_flag --max-steps "${PARASYNC_MAX_STEPS:-}"
  add_flag --max-seconds "${PARASYNC_MAX_SECONDS:-}"
  add_flag --model "${PARASYNC_MODEL:-}"
  add_flag --optimizer "${PARASYNC_OPTIMIZER:-}"
  add_flag --lr "${PARASYNC_LR:-}"
  add_flag --momentum "${PARASYNC_MOMENTUM:-}"
  add_flag --seed "${PARASYNC_SEED:-}"
  add_flag --lr-scaling "${PARASYNC_LR_SCALING:-}"
  add_flag --device "${PARASYNC_DEVICE:-}"
  add_flag --compute-threads "${PARASYNC_COMPUTE_THREADS:-}"
  add_flag --train-examples "${PARASYNC_TRAIN_EXAMPLES:-}"
  add_flag --connect-timeout "${PARASYNC_CONNECT_TIMEOUT:-}"
  add_flag --request-timeout "${PARASYNC_REQUEST_TIMEOUT:-}"
  add_flag --heartbeat-interval "${PARASYNC_HEARTBEAT_INTERVAL:-}"
  add_switch --checkpoint-each-epoch "${PARASYNC_CHECKPOINT_EACH_EPOCH:-}"
  add_switch --staleness-lr "${PARASYNC_STALENESS_LR:-}"
  add_switch --no-shuffle "${PARASYNC_NO_SHUFFLE:-}"
fi

command=("$binary" "${flags[@]}" "${user_args[@]}")
echo "$prog: TF_CONFIG=${TF_CONFIG:-}" >&2
echo "$prog: exec ${command[*]}" >&2
if [[ ${PARASYNC_DRY_RUN:-0} == 1 ]]; then exit 0; fi
exec "${command[@]}"
