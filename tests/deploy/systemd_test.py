#!/usr/bin/env python3
"""deploy/systemd's units under a real systemd (PID 1 of a Docker container).

tests/deploy/manifests/check.sh only runs `systemd-analyze verify` and `security` on the
units. This test boots systemd 252 (Debian 12) in a container made from
deploy/docker/systemd-test.Dockerfile, installs parasync as docs/deploying.md's systemd
section says (binaries and parasync-entrypoint in /opt/parasync/bin, the units in
/etc/systemd/system, /etc/parasync/parasync.env from parasync.env.example, CURVE keys made
with `parasync-entrypoint keys` in /etc/parasync/keys), and checks, on a 2-server, 2-worker
cluster on the container's loopback with 1 epoch of the default MLP:

  * parasync-ps@0 and @1 become active, run hardened (a dynamic user, no capabilities,
    no_new_privs, a seccomp filter), and their /healthz answers 200;
  * parasync-worker@0 and @1 train to completion (exit 0, no restart), and the chief's
    /var/lib/parasync/worker0/eval.jsonl has an epoch-1 test accuracy of at least 0.75;
  * `systemctl stop parasync-ps@0` makes the server write its final snapshot (journal:
    "signal 15 received", "on disk: version N" with N its version);
  * `systemctl kill -s KILL parasync-ps@1`: Restart=on-failure brings it back, active and
    healthy, restored from its StateDirectory ("restored from ... version N", N the version
    it had).

Usage: systemd_test.py BIN_DIR SOURCE_DIR [--units-dir DIR] [--keep]
  BIN_DIR     the build's bin directory (parasync-ps, parasync-worker, parasync-export,
              parasync-keygen; built on Debian 12)
  SOURCE_DIR  the checkout (deploy/systemd, deploy/docker)
  --units-dir DIR (or PARASYNC_SYSTEMD_UNITS_DIR): the units and parasync.env.example to
              test instead of SOURCE_DIR/deploy/systemd (e.g. a deliberately broken copy)
  --keep      leave the container running at the end (for a look inside; remove it with
              /usr/bin/docker rm -f NAME)

Exit status: 0 passed, 1 a check failed (one line saying which, after the journal that
explains it), 2 bad usage, 77 skipped: no usable Docker, no image, or systemd does not boot
in a container on this host (one line says why; with PARASYNC_ENGINES_REQUIRED=1 a skip is a
failure, 1). It uses /usr/bin/docker (Debian's docker.io; DOCKER overrides it). Every wait is
bounded; the container is removed whatever happens, SIGTERM and Ctrl-C included.
"""

import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import tempfile
import time

DOCKER = os.environ.get("DOCKER", "/usr/bin/docker")
IMAGE = "parasync-systemd-test"
# A skip, unless the engines stage requires the engines (PARASYNC_ENGINES_REQUIRED=1, as
# tools/run-tests.sh's `engines` stage sets it): then it is a failure.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_checks import SKIP  # noqa: E402
BINARIES = ("parasync-ps", "parasync-worker", "parasync-export", "parasync-keygen")
PS_PORTS = (5000, 5001)        # the servers' ZeroMQ ports on 127.0.0.1
PS_METRICS = (7100, 7101)      # PARASYNC_METRICS_PORT_BASE of parasync-ps@.service + shard
MIN_ACCURACY = 0.75            # 1 epoch of 784-256-128-10 with adam: about 0.84
# The test's own settings in parasync.env (the rest is the example's): the cluster on the
# loopback, one epoch, and a snapshot every second, so a server killed after training has
# its final version on disk.
ENV_SETTINGS = {
    "PARASYNC_PS_HOSTS": ",".join(f"127.0.0.1:{p}" for p in PS_PORTS),
    "PARASYNC_NUM_WORKERS": "2",
    "PARASYNC_EPOCHS": "1",
    "PARASYNC_CHECKPOINT_EVERY": "1",
}


class Skip(Exception):
    pass


class Failure(Exception):
    pass


def log(msg):
    print(f"systemd_test: {msg}", flush=True)


def run(args, timeout, check=True, input=None):
    """Runs a command (bounded); returns its CompletedProcess, stdout and stderr as text."""
    try:
        cp = subprocess.run(args, input=input, capture_output=True, timeout=timeout,
                            text=not isinstance(input, bytes))
    except subprocess.TimeoutExpired:
        raise Failure(f"timed out after {timeout} s: {' '.join(args)[:200]}")
    if isinstance(cp.stdout, bytes):
        cp.stdout = cp.stdout.decode(errors="replace")
        cp.stderr = cp.stderr.decode(errors="replace")
    if check and cp.returncode != 0:
        raise Failure(f"{' '.join(args)[:200]} exited with {cp.returncode}: "
                      f"{(cp.stderr or cp.stdout).strip()[-1500:]}")
    return cp


def wait_for(what, timeout, probe, interval=0.5):
    """Calls probe() until it returns something true; fails after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise Failure(f"{what}: not within {timeout} s")
        time.sleep(interval)


def cap_names():
    """Capability names by number (capability.h; 0..40)."""
    return ["CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID",
            "SETUID", "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST",
            "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO",
            "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
            "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE",
            "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM",
            "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE"]


def missing_caps():
    """Capabilities this machine's bounding set lacks (a VM sandbox may drop some): docker run
    --privileged then fails with "unable to apply caps", so the test asks for all but them."""
    try:
        with open("/proc/self/status") as f:
            bnd = int(re.search(r"^CapBnd:\s*([0-9a-f]+)", f.read(), re.M).group(1), 16)
    except (OSError, AttributeError):
        return []
    return [name for i, name in enumerate(cap_names()) if not bnd >> i & 1]


class Container:
    def __init__(self, name):
        self.name = name
        self.started = False

    def sh(self, script, timeout=30, check=True, input=None):
        args = [DOCKER, "exec"] + (["-i"] if input is not None else []) + \
            [self.name, "bash", "-c", script]
        return run(args, timeout, check=check, input=input)

    def out(self, script, timeout=30):
        return self.sh(script, timeout).stdout.strip()

    def show(self, unit, *props):
        text = self.out(f"systemctl show {unit} " + " ".join(f"-p {p}" for p in props))
        return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)

    def journal(self, unit, lines=40):
        return self.sh(f"journalctl --no-pager -o cat -u {unit} | tail -n {lines}",
                       check=False).stdout

    def remove(self):
        if self.started:
            run([DOCKER, "rm", "-f", "-v", self.name], 60, check=False)
            self.started = False


def healthz(c, port):
    return c.sh(f"curl -s -o /dev/null -m 3 -w '%{{http_code}}' http://127.0.0.1:{port}/healthz",
                check=False).stdout.strip() == "200"


def metric(c, port, name):
    text = c.sh(f"curl -s -m 3 http://127.0.0.1:{port}/metrics", check=False).stdout
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def fail_unit(c, unit, why):
    sys.stdout.write(f"--- systemctl status {unit} / journal:\n")
    sys.stdout.write(c.sh(f"systemctl status --no-pager -n 0 {unit}", check=False).stdout)
    sys.stdout.write(c.journal(unit))
    raise Failure(f"{unit}: {why}")


# ---- setup ------------------------------------------------------------------------------------

def check_docker():
    if not os.access(DOCKER, os.X_OK):
        raise Skip(f"{DOCKER} not found (Debian package docker.io)")
    try:
        cp = run([DOCKER, "info", "--format", "{{.CgroupVersion}}"], 30, check=False)
    except Failure as e:
        raise Skip(f"docker info: {e}")
    if cp.returncode != 0:
        raise Skip(f"no Docker daemon: {(cp.stderr or cp.stdout).strip()[:200]}")
    return cp.stdout.strip()


def build_image(source_dir):
    dockerfile = os.path.join(source_dir, "deploy/docker/systemd-test.Dockerfile")
    with open(dockerfile, "rb") as f:
        content = f.read()
    if run([DOCKER, "image", "inspect", "debian:bookworm"], 30, check=False).returncode != 0:
        # No registry needed: debootstrap's base image, kept between runs.
        base = run([os.path.join(source_dir, "tools/docker-base.sh")], 900, check=False)
        if base.returncode != 0:
            raise Skip(f"no image debian:bookworm, and tools/docker-base.sh failed: "
                       f"{(base.stderr or base.stdout).strip()[-300:]}")
    env = dict(os.environ, DOCKER_BUILDKIT="1")
    t0 = time.monotonic()
    try:
        cp = subprocess.run([DOCKER, "build", "-q", "-t", IMAGE, "-"], input=content,
                            capture_output=True, timeout=900, env=env)
    except subprocess.TimeoutExpired:
        raise Failure("docker build of the systemd image: not within 900 s")
    if cp.returncode != 0:
        err = (cp.stderr + cp.stdout).decode(errors="replace")
        if re.search(r"Temporary failure resolving|Could not resolve|Failed to fetch|"
                     r"Unable to locate package", err):
            raise Skip("cannot build the systemd image: no Debian mirror ("
                       + err.strip().splitlines()[-1][:200] + ")")
        raise Failure(f"docker build -f {dockerfile} failed:\n{err[-3000:]}")
    log(f"image {IMAGE} built in {time.monotonic() - t0:.1f} s")


def boot(c, cgroup_version):
    """Starts the container with the first set of flags under which systemd boots; returns the
    seconds systemd took to reach running (or degraded)."""
    common = ["--tmpfs", "/run", "--tmpfs", "/run/lock", "--tmpfs", "/tmp",
              "--memory", "3g", "--label", "parasync-systemd-test=1"]
    caps = ["--cap-add", "ALL"]
    for cap in missing_caps():
        caps += ["--cap-drop", cap]
    unconfined = ["--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined"]
    host_cgroups = ["--cgroupns=host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw"]
    candidates = [
        ("all capabilities this host has, host cgroup namespace, /sys/fs/cgroup rw",
         caps + unconfined + host_cgroups),
        ("--privileged, host cgroup namespace, /sys/fs/cgroup rw",
         ["--privileged"] + host_cgroups),
        ("--privileged, private cgroup namespace", ["--privileged", "--cgroupns=private"]),
    ]
    if cgroup_version == "2":
        candidates = [candidates[2], candidates[0], candidates[1]]
    reasons = []
    for what, flags in candidates:
        t0 = time.monotonic()
        cp = run([DOCKER, "run", "-d", "--name", c.name] + common + flags + [IMAGE], 60,
                 check=False)
        c.started = True
        if cp.returncode != 0:
            reasons.append(f"{what}: {cp.stderr.strip().splitlines()[-1][:160]}")
            c.remove()
            continue
        state, deadline = "", time.monotonic() + 60
        while time.monotonic() < deadline:
            state = run([DOCKER, "exec", c.name, "systemctl", "is-system-running"], 15,
                        check=False).stdout.strip()
            if state in ("running", "degraded"):
                break
            if run([DOCKER, "inspect", "-f", "{{.State.Running}}", c.name], 15,
                   check=False).stdout.strip() != "true":
                state = "container exited"
                break
            time.sleep(0.5)
        if state in ("running", "degraded"):
            seconds = time.monotonic() - t0
            log(f"systemd booted ({state}) in {seconds:.1f} s with {what}")
            if state == "degraded":
                log("failed units: " + c.out("systemctl --failed --no-legend --plain | "
                                             "awk '{print $1}' | xargs"))
            return seconds
        logs = run([DOCKER, "logs", "--tail", "5", c.name], 15, check=False)
        tail = (logs.stderr + logs.stdout).strip()[-200:]
        reasons.append(f"{what}: {state or 'no answer'} {tail}")
        c.remove()
    raise Skip("systemd does not boot in a container here: " + "; ".join(reasons))


def env_file(example):
    """parasync.env.example with the test's settings in place of its values."""
    text = example
    for key, value in ENV_SETTINGS.items():
        text, n = re.subn(rf"^{key}=.*$", f"{key}={value}", text, flags=re.M)
        if n != 1:
            raise Failure(f"parasync.env.example has {n} lines {key}=..., not 1")
    return text


def install(c, bin_dir, source_dir, units_dir):
    """docs/deploying.md's systemd installation, as one tar stream (owner root, install's
    modes)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add(data, path, mode):
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.uid, info.gid = len(data), mode, 0, 0
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(data))

        for d in ("opt", "opt/parasync", "opt/parasync/bin", "etc/parasync"):
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
            tar.addfile(info)
        for b in BINARIES:
            with open(os.path.join(bin_dir, b), "rb") as f:
                add(f.read(), f"opt/parasync/bin/{b}", 0o755)
        with open(os.path.join(source_dir, "deploy/docker/parasync-entrypoint.sh"), "rb") as f:
            add(f.read(), "opt/parasync/bin/parasync-entrypoint", 0o755)
        for unit in ("parasync-ps@.service", "parasync-worker@.service"):
            with open(os.path.join(units_dir, unit), "rb") as f:
                add(f.read(), f"etc/systemd/system/{unit}", 0o644)
        with open(os.path.join(units_dir, "parasync.env.example")) as f:
            add(env_file(f.read()).encode(), "etc/parasync/parasync.env", 0o644)
    run([DOCKER, "cp", "-", f"{c.name}:/"], 120, input=buf.getvalue())
    missing = c.out("ldd /opt/parasync/bin/parasync-* 2>/dev/null | grep 'not found' || true")
    if missing:
        raise Failure(f"shared libraries missing in the image (built on Debian 12?): {missing}")
    # The keys, as the docs make them (ps, worker0, worker1, export; allowed).
    c.sh("install -d -m 0700 /etc/parasync/keys && PARASYNC_KEYS_DIR=/etc/parasync/keys "
         "PARASYNC_NUM_WORKERS=2 PARASYNC_BIN_DIR=/opt/parasync/bin "
         "/opt/parasync/bin/parasync-entrypoint keys")
    keys = c.out("ls /etc/parasync/keys | xargs")
    for k in ("ps.key", "ps.pub", "allowed", "worker0.key", "worker1.key"):
        if k not in keys.split():
            raise Failure(f"parasync-entrypoint keys made no {k} (made: {keys})")
    # LoadCredential= needs shared mount propagation (see systemd-test.Dockerfile's CMD).
    prop = c.out("findmnt -no PROPAGATION /run")
    if "shared" not in prop:
        raise Failure(f"/run's mount propagation is '{prop}', not shared: LoadCredential= "
                      "cannot work (the image's CMD should have run mount --make-rshared /)")
    c.sh("systemctl daemon-reload")


# ---- checks -----------------------------------------------------------------------------------

def check_hardened(c, unit):
    """The unit's process runs as a dynamic user, with no capabilities, no_new_privs and a
    seccomp filter: the hardening is in force, not ignored."""
    pid = c.show(unit, "MainPID")["MainPID"]
    status = c.out(f"cat /proc/{pid}/status")
    fields = dict(re.findall(r"^(\w+):\s*(.*)$", status, re.M))
    uid = int(fields["Uid"].split()[0])
    problems = []
    if not 61184 <= uid <= 65519:
        problems.append(f"uid {uid} is not a dynamic user's (61184..65519)")
    if int(fields["CapEff"], 16) or int(fields["CapBnd"], 16):
        problems.append(f"capabilities CapEff={fields['CapEff']} CapBnd={fields['CapBnd']}")
    if fields.get("NoNewPrivs") != "1":
        problems.append("no_new_privs is not set")
    if fields.get("Seccomp") != "2":
        problems.append(f"Seccomp={fields.get('Seccomp')}, not 2 (a filter)")
    if problems:
        fail_unit(c, unit, "hardening not in force: " + "; ".join(problems))
    return uid


def start_servers(c):
    t0 = time.monotonic()
    c.sh("systemctl start parasync-ps@0 parasync-ps@1", timeout=60, check=False)
    for shard, port in enumerate(PS_METRICS):
        unit = f"parasync-ps@{shard}"
        try:
            def up():
                state = c.show(unit, "ActiveState")["ActiveState"]
                if state == "failed":
                    raise Failure("failed to start")
                return state == "active" and healthz(c, port)
            wait_for(f"{unit} active with /healthz 200", 30, up)
        except Failure as e:
            fail_unit(c, unit, str(e))
        uid = check_hardened(c, unit)
        log(f"{unit}: active, /healthz on 127.0.0.1:{port} answers 200, dynamic user {uid}")
    log(f"servers up in {time.monotonic() - t0:.1f} s")


def train(c):
    t0 = time.monotonic()
    units = ["parasync-worker@0", "parasync-worker@1"]
    c.sh("systemctl start " + " ".join(units), timeout=60, check=False)
    props = ("ActiveState", "Result", "ExecMainStatus", "NRestarts")

    def done():
        states = {u: c.show(u, *props) for u in units}
        for u, s in states.items():
            if s["NRestarts"] != "0":
                fail_unit(c, u, f"did not train to completion: it failed and Restart=on-failure "
                          f"restarted it {s['NRestarts']} time(s) (journal above)")
            if s["ActiveState"] == "failed":
                fail_unit(c, u, f"did not train to completion: {s}")
        return states if all(s["ActiveState"] == "inactive" for s in states.values()) else None

    states = wait_for("both workers finished", 240, done, interval=1)
    for u, s in states.items():
        if s["Result"] != "success" or s["ExecMainStatus"] != "0":
            fail_unit(c, u, f"ended with {s}")
    seconds = time.monotonic() - t0
    lines = c.out("cat /var/lib/parasync/worker0/eval.jsonl").splitlines()
    try:
        last = json.loads(lines[-1])
    except (IndexError, ValueError):
        fail_unit(c, units[0], f"no eval.jsonl record in /var/lib/parasync/worker0: {lines}")
    if last.get("epoch") != 1 or last.get("test_accuracy", 0) < MIN_ACCURACY:
        fail_unit(c, units[0], f"eval.jsonl's last record: epoch {last.get('epoch')}, test "
                  f"accuracy {last.get('test_accuracy')} (wanted epoch 1, >= {MIN_ACCURACY})")
    log(f"workers trained 1 epoch in {seconds:.1f} s: test accuracy {last['test_accuracy']:.4f}, "
        f"global step {last.get('step')} (worker0/eval.jsonl)")
    return last["test_accuracy"]


def stop_server(c):
    unit, port = "parasync-ps@0", PS_METRICS[0]
    version = metric(c, port, "parasync_ps_version")
    t0 = time.monotonic()
    c.sh(f"systemctl stop {unit}", timeout=150)
    s = c.show(unit, "ActiveState", "Result", "ExecMainStatus")
    journal = c.journal(unit, 200)
    if s["ActiveState"] != "inactive" or s["Result"] != "success" or s["ExecMainStatus"] != "0":
        fail_unit(c, unit, f"systemctl stop: {s}")
    if "signal 15 received" not in journal:
        fail_unit(c, unit, "systemctl stop: no 'signal 15 received' in its journal")
    m = re.findall(r"on disk: version (\d+)", journal)
    if not m or version is None or int(m[-1]) != int(version):
        fail_unit(c, unit, f"systemctl stop: final snapshot 'on disk: version N' {m} is not "
                  f"its version {version}")
    log(f"{unit} stopped in {time.monotonic() - t0:.1f} s: 'signal 15 received', "
        f"final snapshot 'on disk: version {m[-1]}'")
    return int(m[-1])


def kill_server(c, trained_at):
    unit, port = "parasync-ps@1", PS_METRICS[1]
    version = metric(c, port, "parasync_ps_version")
    # With PARASYNC_CHECKPOINT_EVERY=1 the server snapshots its last version within about a
    # second of the last update (and skips unchanged versions): 2.5 s after training the
    # store holds the final version, and it must have snapshotted at least once.
    time.sleep(max(0.0, trained_at + 2.5 - time.monotonic()))
    if not metric(c, port, "parasync_ps_last_checkpoint_timestamp_seconds"):
        fail_unit(c, unit, "no snapshot (parasync_ps_last_checkpoint_timestamp_seconds is 0) "
                  "after training with PARASYNC_CHECKPOINT_EVERY=1")
    before = c.show(unit, "MainPID", "NRestarts")
    t0 = time.monotonic()
    c.sh(f"systemctl kill -s KILL {unit}")
    try:
        wait_for(f"{unit} restarted (Restart=on-failure, RestartSec=5s), active, /healthz 200",
                 30, lambda: (lambda s: s["NRestarts"] == str(int(before["NRestarts"]) + 1)
                              and s["ActiveState"] == "active"
                              and s["MainPID"] not in ("0", before["MainPID"]))(
                     c.show(unit, "MainPID", "NRestarts", "ActiveState"))
                 and healthz(c, port))
    except Failure as e:
        fail_unit(c, unit, str(e))
    journal = c.journal(unit, 200)
    m = re.findall(r"restored from /var/lib/parasync/ps1: version (\d+)", journal)
    if not m or version is None or int(m[-1]) != int(version):
        fail_unit(c, unit, f"after SIGKILL: 'restored from /var/lib/parasync/ps1: version N' "
                  f"{m} is not the version it had, {version}")
    log(f"{unit} killed with SIGKILL: restarted by systemd and healthy in "
        f"{time.monotonic() - t0:.1f} s, 'restored from /var/lib/parasync/ps1: version {m[-1]}'")
    return int(m[-1])


# ---- main -------------------------------------------------------------------------------------

def main(argv):
    args, keep, units_dir = [], False, os.environ.get("PARASYNC_SYSTEMD_UNITS_DIR")
    it = iter(argv)
    for a in it:
        if a == "--keep":
            keep = True
        elif a == "--units-dir":
            units_dir = next(it, None)
        elif a.startswith("--units-dir="):
            units_dir = a.split("=", 1)[1]
        else:
            args.append(a)
    if len(args) != 2 or (units_dir is not None and not units_dir):
        print("usage: systemd_test.py BIN_DIR SOURCE_DIR [--units-dir DIR] [--keep]",
              file=sys.stderr)
        return 2
    bin_dir, source_dir = (os.path.abspath(a) for a in args)
    units_dir = os.path.abspath(units_dir or os.path.join(source_dir, "deploy/systemd"))
    for b in BINARIES:
        if not os.access(os.path.join(bin_dir, b), os.X_OK):
            print(f"systemd_test: FAIL {bin_dir}/{b} is missing", file=sys.stderr)
            return 1
    if units_dir != os.path.join(source_dir, "deploy/systemd"):
        log(f"units and parasync.env.example from {units_dir}")

    t_start = time.monotonic()
    c = Container(f"parasync-systemd-test-{os.getpid()}")

    def on_term(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_term)
    # A Docker daemon: the running one, or one started for this test and stopped after, with
    # the host's iptables, sysctls and links put back.
    sys.path.insert(0, os.path.join(source_dir, "tools"))
    from dockerd_session import DockerdSession, DockerUnavailable
    session = DockerdSession(log=log)
    try:
        session.__enter__()
    except DockerUnavailable as e:
        print(f"systemd_test: SKIP {e}", flush=True)
        return SKIP
    try:
        status = run_checks(c, bin_dir, source_dir, units_dir, keep, t_start)
    finally:
        session.__exit__(None, None, None)
    if session.problems:
        print(f"systemd_test: FAIL the host was not left as found: {session.problems}", flush=True)
        return 1
    return status


def remove_stale_containers():
    """Containers of earlier runs of this test that were killed (ctest's timeout) before
    their cleanup: the pid in their name is gone."""
    out = run([DOCKER, "ps", "-a", "--format", "{{.Names}}"], 30, check=False).stdout
    for name in out.split():
        pid = name[len("parasync-systemd-test-"):]
        if name.startswith("parasync-systemd-test-") and pid.isdigit() and \
                not os.path.exists(f"/proc/{pid}"):
            log(f"removing container {name} left by a killed run")
            run([DOCKER, "rm", "-f", name], 60, check=False)


def run_checks(c, bin_dir, source_dir, units_dir, keep, t_start):
    remove_stale_containers()
    try:
        cgroup_version = check_docker()
        build_image(source_dir)
        boot_s = boot(c, cgroup_version)
        install(c, bin_dir, source_dir, units_dir)
        start_servers(c)
        accuracy = train(c)
        trained_at = time.monotonic()
        v0 = stop_server(c)
        v1 = kill_server(c, trained_at)
        log(f"PASS in {time.monotonic() - t_start:.0f} s: boot {boot_s:.1f} s, accuracy "
            f"{accuracy:.4f}, ps@0 final snapshot version {v0}, ps@1 restored version {v1}")
        return 0
    except Skip as e:
        print(f"systemd_test: SKIP {e}", flush=True)
        return SKIP
    except Failure as e:
        print(f"systemd_test: FAIL {e}", flush=True)
        return 1
    finally:
        if keep and c.started:
            log(f"--keep: container {c.name} left running (until dockerd stops: this test stops a "
                "dockerd it started)")
        else:
            c.remove()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
