#!/usr/bin/env bash
# parasync-entrypoint: starts parasync-ps or parasync-worker in a container (docker compose,
# Kubernetes) or under systemd. It builds the cluster description (TF_CONFIG) from the
# environment, turns PARASYNC_* variables into flags, prints what it runs, and execs the
# binary (which becomes PID 1 and handles SIGTERM itself: a PS saves a final snapshot).
#
# Usage:
#   parasync-entrypoint ps     [FLAG...]   start a parameter server; FLAGs go to parasync-ps
#   parasync-entrypoint worker [FLAG...]   start a worker; FLAGs go to parasync-worker
#   parasync-entrypoint export [FLAG...]   run parasync-export on the cluster's servers (--ps-hosts
#                                          and the CURVE client flags from the settings below)
#   parasync-entrypoint keys               make the CURVE keys PARASYNC_KEYS_DIR lacks (see CURVE)
#   parasync-entrypoint healthcheck [PORT] exit 0 if http://127.0.0.1:PORT/healthz answers 200
#                                          (the process's main loop turned lately)
#   parasync-entrypoint COMMAND [ARG...]   run anything else (parasync-keygen, bash, ...)
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
#   PARASYNC_TASK_INDEX        this task's index (a --task-index argument wins); else
#                              JOB_COMPLETION_INDEX (a worker in a Kubernetes Indexed Job);
#                              else the number that ends the host name (StatefulSet pod
#                              parasync-ps-1 -> 1).
#
# Flags from the environment (each only when the variable is non-empty and the flag is not
# already among the arguments, so arguments win, as flags win over TF_CONFIG):
#   both:    PARASYNC_MODE --mode, PARASYNC_LOG_LEVEL --log-level, PARASYNC_LOG_DIR --log-dir,
#            PARASYNC_METRICS_BIND --metrics-bind (default 0.0.0.0: scraped from outside),
#            PARASYNC_METRICS_PORT --metrics-port (default 7100; or PARASYNC_METRICS_PORT_BASE
#            plus the task index, for several tasks on one host). The port also serves
#            /healthz and /readyz. 7100, not 9100: 9100-9999 is Prometheus' exporter port
#            range (9100 is node exporter's), which a host may already use.
#   ps:      PARASYNC_BIND --bind (default 0.0.0.0:<port of this shard's address>),
#            PARASYNC_DATA_DIR --data-dir, PARASYNC_DURABILITY, PARASYNC_CHECKPOINT_EVERY,
#            PARASYNC_CHECKPOINT_EVERY_VERSIONS, PARASYNC_REPLICAS_TO_AGGREGATE,
#            PARASYNC_WORKER_TIMEOUT, PARASYNC_BARRIER_TIMEOUT, PARASYNC_MAX_MODEL_BYTES
#            (default: 80% of the container's memory limit when it has one)
#   worker:  PARASYNC_DATA --data, PARASYNC_EPOCHS, PARASYNC_BATCH_SIZE, PARASYNC_MAX_STEPS,
#            PARASYNC_MAX_SECONDS, PARASYNC_MODEL, PARASYNC_OPTIMIZER, PARASYNC_LR,
#            PARASYNC_MOMENTUM, PARASYNC_SEED, PARASYNC_LR_SCALING, PARASYNC_DEVICE,
#            PARASYNC_COMPUTE_THREADS, PARASYNC_TRAIN_EXAMPLES, PARASYNC_CONNECT_TIMEOUT,
#            PARASYNC_REQUEST_TIMEOUT, PARASYNC_HEARTBEAT_INTERVAL, PARASYNC_WIRE_DTYPE
#            (float32, bfloat16 or float16), and the switches
#            PARASYNC_CHECKPOINT_EACH_EPOCH, PARASYNC_STALENESS_LR, PARASYNC_NO_SHUFFLE (=1)
#   any other flag: PARASYNC_PS_ARGS / PARASYNC_WORKER_ARGS / PARASYNC_EXPORT_ARGS (split at
#            blanks). export takes only the cluster and the CURVE settings below.
#
# CURVE (CurveZMQ: every connection authenticated and encrypted) is on: a ps, worker or
# export whose keys are not set, or not readable, stops here with exit status 2 and one line,
# unless PARASYNC_INSECURE=1 says explicitly to run without authentication and encryption.
#   PARASYNC_KEYS_DIR          a directory as `parasync-entrypoint keys` fills it:
#                                ps.key      the servers' key pair (one for every shard)
#                                ps.pub      its public key: the clients' --curve-server-key
#                                allowed     the clients' public keys (a file of keys, or a
#                                            directory of .pub files): the servers' --curve-allow
#                                worker<i>.key  worker i's key pair; else worker.key, one pair
#                                            that every worker shares
#                                export.key  parasync-export's key pair
#   PARASYNC_CURVE_KEY         this process's key pair file, instead of the directory's
#   PARASYNC_CURVE_ALLOW       ps: the allowed keys, instead of <dir>/allowed
#   PARASYNC_CURVE_SERVER_KEY  worker, export: the servers' public key(s), instead of <dir>/ps.pub
#   PARASYNC_INSECURE=1        CURVE off: for a test on one machine's loopback only; no
#                              deploy/ manifest sets it
# `keys` makes, in PARASYNC_KEYS_DIR (mode 0700), the key pairs of ps, worker0 .. worker<N-1>
# (N: the number of workers, as above) and export that are not there yet (PARASYNC_KEY_NAMES
# names others, e.g. "ps worker export" for one shared worker key), then writes `allowed`
# with the public keys of all of them but ps. Existing pairs are kept: running it again
# changes nothing. It needs parasync-keygen.
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

# This task's index (see the header), or nothing when nothing names it.
known_index() {
  local role=$1 index=${PARASYNC_TASK_INDEX:-}
  if [[ -z $index && $role == worker ]]; then index=${JOB_COMPLETION_INDEX:-}; fi
  if [[ -z $index ]]; then index=$(hostname_ordinal); fi
  if [[ $index =~ ^[0-9]+$ ]]; then echo "$((10#$index))"; fi
}

# This task's index; dies when nothing names it.
task_index() {
  local index
  index=$(known_index "$1")
  [[ -n $index ]] ||
    die "no task index: set PARASYNC_TASK_INDEX (or run as a StatefulSet pod / Indexed Job)"
  echo "$index"
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
# the task index, else 7100.
metrics_port() {
  local role=$1
  if [[ -n ${PARASYNC_METRICS_PORT:-} ]]; then
    echo "$PARASYNC_METRICS_PORT"
  elif [[ -n ${PARASYNC_METRICS_PORT_BASE:-} ]]; then
    local index
    index=$(task_index "$role")
    echo "$((PARASYNC_METRICS_PORT_BASE + index))"
  else
    echo 7100
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

# healthcheck PORT: one HTTP GET of /healthz with bash's /dev/tcp (no curl in the image). Not
# /metrics: that is served by threads of its own and answers while the main loop is wedged.
healthcheck() {
  local port=$1 status=""
  if ! { exec 3<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null; then
    echo "$prog: nothing listens on 127.0.0.1:$port" >&2
    exit 1
  fi
  printf 'GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  IFS= read -r -t 5 status <&3 || true
  exec 3<&-
  if [[ $status == "HTTP/1."?" 200"* ]]; then exit 0; fi
  echo "$prog: http://127.0.0.1:$port/healthz answered '${status%$'\r'}'" >&2
  exit 1
}

# make_keys KEYGEN: `parasync-entrypoint keys` (see the header).
make_keys() {
  local keygen=$1 dir=${PARASYNC_KEYS_DIR:-} name i content="" old=""
  local -a names=() missing=() clients=() workers=()
  [[ -n $dir ]] || die "keys: set PARASYNC_KEYS_DIR to the directory the keys go to"
  dir=${dir%/}
  if [[ -n ${PARASYNC_KEY_NAMES:-} ]]; then
    read -r -a names <<<"$PARASYNC_KEY_NAMES"
  else
    local worker_hosts
    worker_hosts=$(host_list "${PARASYNC_WORKER_HOSTS:-}" "${PARASYNC_NUM_WORKERS:-}" \
      "${PARASYNC_WORKER_HOST_PATTERN:-$default_worker_pattern}" worker)
    IFS=, read -r -a workers <<<"${worker_hosts//[[:space:]]/}"
    names=(ps)
    for ((i = 0; i < ${#workers[@]}; i++)); do names+=("worker$i"); done
    names+=(export)
  fi
  ((${#names[@]} > 0)) || die "keys: PARASYNC_KEY_NAMES names no key"
  for name in "${names[@]}"; do
    [[ $name =~ ^[A-Za-z0-9_][A-Za-z0-9._-]*$ ]] || die "keys: '$name' is not a key name"
    [[ $name == ps ]] || clients+=("$name")
    if [[ -e $dir/$name.key && -e $dir/$name.pub ]]; then continue; fi
    if [[ -e $dir/$name.key || -e $dir/$name.pub ]]; then
      die "keys: $dir/$name.key and $dir/$name.pub must both exist or neither: remove the one there"
    fi
    missing+=("$name")
  done
  if ((${#missing[@]} == 0)); then
    echo "$prog: keys: all ${#names[@]} key pair(s) present in $dir; none made" >&2
  elif [[ ${PARASYNC_DRY_RUN:-0} == 1 ]]; then
    echo "$prog: keys: would run $keygen --dir $dir ${missing[*]}" >&2
  else
    # Keys only for this user: the directory 0700 (parasync-keygen makes the .key files 0600).
    (umask 077 && mkdir -p "$dir") || die "keys: cannot create $dir"
    echo "$prog: keys: $keygen --dir $dir ${missing[*]}" >&2
    (umask 077 && exec "$keygen" --dir "$dir" "${missing[@]}") ||
      die "keys: $keygen failed (above)"
  fi
  # The servers' allow-list: the public keys of every client named (a worker no longer
  # named, e.g. after PARASYNC_NUM_WORKERS went down, is no longer admitted).
  ((${#clients[@]} > 0)) || return 0
  if [[ -d $dir/allowed ]]; then
    echo "$prog: keys: $dir/allowed is a directory: left as it is" >&2
    return 0
  fi
  [[ ${PARASYNC_DRY_RUN:-0} == 1 ]] && return 0
  content="# parasync-entrypoint keys: the public keys the servers admit (${clients[*]})"
  for name in "${clients[@]}"; do content+=$'\n'$(<"$dir/$name.pub"); done
  [[ -r $dir/allowed ]] && old=$(<"$dir/allowed")
  if [[ $content == "$old" ]]; then
    echo "$prog: keys: $dir/allowed is up to date (${#clients[@]} client key(s))" >&2
  else
    if ! (umask 077 && printf '%s\n' "$content" >"$dir/.allowed.$$" &&
      mv -f "$dir/.allowed.$$" "$dir/allowed"); then
      die "keys: cannot write $dir/allowed"
    fi
    echo "$prog: keys: wrote $dir/allowed (${#clients[@]} client key(s): ${clients[*]})" >&2
  fi
}

# ---- dispatch -----------------------------------------------------------------------------

default_worker_pattern='worker-{i}:6000'
[[ $# -gt 0 ]] ||
  die "usage: $prog ps|worker|export [FLAG...] | keys | healthcheck [PORT] | COMMAND [ARG...]"
role=$1
shift
case $role in
  ps | worker | export | keys) ;;
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

tool=$role
[[ $role != keys ]] || tool=keygen
here=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)
bin_dir=${PARASYNC_BIN_DIR:-}
if [[ -z $bin_dir && -x $here/parasync-$tool ]]; then bin_dir=$here; fi
binary=${bin_dir:+$bin_dir/}parasync-$tool

if [[ $role == keys ]]; then
  [[ $# -eq 0 ]] || die "usage: $prog keys (no arguments: PARASYNC_KEYS_DIR, PARASYNC_NUM_WORKERS or PARASYNC_KEY_NAMES)"
  make_keys "$binary"
  exit 0
fi

# Extra flags from PARASYNC_PS_ARGS / PARASYNC_WORKER_ARGS / PARASYNC_EXPORT_ARGS, split at
# blanks on purpose.
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

# flag_value FLAG: the value of FLAG among the arguments (--flag=V or --flag V), or nothing.
flag_value() {
  local flag=$1 value="" i
  for ((i = 0; i < ${#user_args[@]}; i++)); do
    case ${user_args[i]} in
      "$flag="*) value=${user_args[i]#*=} ;;
      "$flag") value=${user_args[i + 1]:-} ;;
    esac
  done
  echo "$value"
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
if [[ -z ${TF_CONFIG:-} ]] && ! has_flag --ps-hosts; then
  ps_hosts=$(host_list "${PARASYNC_PS_HOSTS:-}" "${PARASYNC_NUM_PS:-}" \
    "${PARASYNC_PS_HOST_PATTERN:-}" ps)
  ps_json=$(json_list "$ps_hosts")
  if [[ $role == export ]]; then
    # The exporter is no task of the cluster: the servers' addresses are all it needs.
    flags+=("--ps-hosts=${ps_hosts//[[:space:]]/}")
  else
    worker_hosts=$(host_list "${PARASYNC_WORKER_HOSTS:-}" "${PARASYNC_NUM_WORKERS:-}" \
      "${PARASYNC_WORKER_HOST_PATTERN:-$default_worker_pattern}" worker)
    index=$(flag_value --task-index)
    if [[ ! $index =~ ^[0-9]+$ ]]; then index=$(task_index "$role"); fi
    # Assigned one by one: a failure inside $(...) must stop the script (set -e).
    worker_json=$(json_list "$worker_hosts")
    TF_CONFIG=$(printf '{"cluster":{"ps":%s,"worker":%s},"task":{"type":"%s","index":%d}}' \
      "$ps_json" "$worker_json" "$role" "$index")
    export TF_CONFIG
  fi
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

if [[ $role != export ]]; then
  add_flag --mode "${PARASYNC_MODE:-}"
  add_flag --log-level "${PARASYNC_LOG_LEVEL:-}"
  add_flag --log-dir "${PARASYNC_LOG_DIR:-}"
  add_flag --metrics-bind "${PARASYNC_METRICS_BIND:-0.0.0.0}"
  if ! has_flag --metrics-port; then
    port=$(metrics_port "$role")
    add_flag --metrics-port "$port"
  fi
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
elif [[ $role == worker ]]; then
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
  add_flag --wire-dtype "${PARASYNC_WIRE_DTYPE:-}"
  add_switch --checkpoint-each-epoch "${PARASYNC_CHECKPOINT_EACH_EPOCH:-}"
  add_switch --staleness-lr "${PARASYNC_STALENESS_LR:-}"
  add_switch --no-shuffle "${PARASYNC_NO_SHUFFLE:-}"
fi

# ---- CURVE ------------------------------------------------------------------------------------

# The worker's index for its key file: --task-index among the arguments, else the index in
# TF_CONFIG (given, or made above), else the environment's; nothing when none says.
worker_index() {
  local value
  value=$(flag_value --task-index)
  if [[ -z $value && ${TF_CONFIG:-} =~ \"index\"[[:space:]]*:[[:space:]]*([0-9]+) ]]; then
    value=${BASH_REMATCH[1]}
  fi
  [[ -n $value ]] || value=$(known_index worker)
  if [[ $value =~ ^[0-9]+$ ]]; then echo "$((10#$value))"; fi
}

# curve_flag FLAG PATH WHAT SETTING [NOTE]: FLAG=PATH, unless FLAG is among the arguments;
# dies with one line when PATH is unset (neither PARASYNC_KEYS_DIR nor SETTING) or unreadable.
curve_flag() {
  local flag=$1 path=$2 what=$3 setting=$4 note=${5:-}
  local off="or set PARASYNC_INSECURE=1 to run without authentication and encryption"
  if has_flag "$flag"; then return 0; fi
  [[ -n $path ]] ||
    die "CURVE is on but this $role has no $what: set PARASYNC_KEYS_DIR (see '$prog keys') or $setting, $off"
  [[ -r $path ]] ||
    die "CURVE $what $path${note:+ ($note)} is missing or unreadable: make the keys with parasync-keygen ('$prog keys'), $off"
  flags+=("$flag=$path")
}

case ${PARASYNC_INSECURE:-} in
  1 | [Tt]rue | [Yy]es)
    echo "$prog: PARASYNC_INSECURE=${PARASYNC_INSECURE}: CURVE off, connections are neither authenticated nor encrypted" >&2
    ;;
  "" | 0 | [Ff]alse | [Nn]o)
    keys_dir=${PARASYNC_KEYS_DIR:-}
    keys_dir=${keys_dir%/}
    if [[ $role == ps ]]; then
      curve_flag --curve-key "${PARASYNC_CURVE_KEY:-${keys_dir:+$keys_dir/ps.key}}" \
        "key pair" PARASYNC_CURVE_KEY
      curve_flag --curve-allow "${PARASYNC_CURVE_ALLOW:-${keys_dir:+$keys_dir/allowed}}" \
        "list of allowed client keys" PARASYNC_CURVE_ALLOW
    else
      own=${PARASYNC_CURVE_KEY:-}
      note=""
      if [[ -z $own && -n $keys_dir && $role == export ]]; then
        own=$keys_dir/export.key
      elif [[ -z $own && -n $keys_dir ]]; then
        # worker<i>.key, else worker.key (one pair all workers share).
        worker_idx=$(worker_index)
        own=$keys_dir/worker.key
        if [[ -n $worker_idx && -e $keys_dir/worker$worker_idx.key ]]; then
          own=$keys_dir/worker$worker_idx.key
        else
          note="shared by all workers; nor is there a worker${worker_idx:-<index>}.key"
        fi
      fi
      curve_flag --curve-key "$own" "key pair" PARASYNC_CURVE_KEY "$note"
      curve_flag --curve-server-key \
        "${PARASYNC_CURVE_SERVER_KEY:-${keys_dir:+$keys_dir/ps.pub}}" \
        "server public key" PARASYNC_CURVE_SERVER_KEY
    fi
    ;;
  *) die "PARASYNC_INSECURE: '$PARASYNC_INSECURE' is not 1/true/yes or 0/false/no" ;;
esac

command=("$binary" "${flags[@]}" "${user_args[@]}")
echo "$prog: TF_CONFIG=${TF_CONFIG:-}" >&2
echo "$prog: exec ${command[*]}" >&2
if [[ ${PARASYNC_DRY_RUN:-0} == 1 ]]; then exit 0; fi
exec "${command[@]}"
