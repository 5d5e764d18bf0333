#!/usr/bin/env python3
"""deploy/docker for real: the image built from deploy/docker/Dockerfile by Debian's Docker
20.10 (BuildKit, no frontend image), and the compose cluster of deploy/docker/compose.yaml
(the keys service, 2 servers, 2 workers, Prometheus from prometheus.Dockerfile) brought up
with docker-compose 1.29. Checks:

  build     the base images (tools/docker-base.sh: debootstrap, kept between runs), the
            image from source (target runtime, the default) and from this build's binaries
            (target runtime-prebuilt), Prometheus' image; the seconds of each
  train     the chief's eval.jsonl at the accuracy floor after the epochs; both workers exit 0
  health    every server's and worker's container is `healthy` (its HEALTHCHECK, GET
            /healthz) during the run, and /healthz answers 200 from outside the container
  metrics   Prometheus (the project's config, file_sd targets of the compose file) returns
            examples/sec of every worker: rate(parasync_worker_examples_total) > 0 by rank
  crash     a server's process killed (SIGKILL) mid-run: the restart policy brings it back,
            it restores its store, the workers go on; after the run every server's version
            (updates applied) equals the pushes the workers were acknowledged (their steps)
  down      `docker-compose down -v` leaves no container, network or volume of the project

The cluster runs the from-source image; PARASYNC_DOCKER_IMAGE=prebuilt runs the prebuilt one
instead (and skips the from-source build), e.g. on a machine where the build does not fit.
Which ran is printed. Uses a Docker daemon that is running, or starts one for the test and
stops it after, with the host's iptables, sysctls and links as before
(tools/dockerd_session.py). Skips (77), saying why, without docker.io, docker-compose or
debootstrap, or where dockerd cannot start.

Why SIGKILL to the process and not `docker kill`: Docker counts `docker kill` as a manual
stop, which no restart policy undoes (checked here with Docker 20.10: always, unless-stopped
and on-failure all left the container exited); a restart policy is for a process that dies.

  docker_test.py BIN_DIR SOURCE_DIR
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

if len(sys.argv) != 3:
    print("usage: docker_test.py BIN_DIR SOURCE_DIR", file=sys.stderr)
    sys.exit(2)
BIN_DIR, SOURCE_DIR = (os.path.abspath(p) for p in sys.argv[1:3])
sys.path.insert(0, os.path.join(SOURCE_DIR, "tools"))
from dockerd_session import DockerdSession, DockerUnavailable  # noqa: E402

COMPOSE_DIR = os.path.join(SOURCE_DIR, "deploy", "docker")
PROJECT = f"parasynctest{os.getpid()}"  # a project left by a killed run is found by its pid
IMAGE_SOURCE, IMAGE_PREBUILT = "parasync:test-source", "parasync:test-prebuilt"
EPOCHS = 3
BATCH = 64  # compose.yaml's PARASYNC_BATCH_SIZE default
ACCURACY_FLOOR = 0.80  # the MLP after 3 async epochs of 2 workers: 0.86-0.87 here
RUN_SECONDS = 300
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_checks import SKIP, check, failures  # noqa: E402


def say(message):
    print(message, flush=True)


class Docker:
    def __init__(self, client):
        self.client = client
        self.env = dict(os.environ, DOCKER_BUILDKIT="1", PARASYNC_EPOCHS=str(EPOCHS),
                        COMPOSE_DOCKER_CLI_BUILD="1")
        for key in ("PARASYNC_INSECURE", "TF_CONFIG", "COMPOSE_FILE", "COMPOSE_PROJECT_NAME"):
            self.env.pop(key, None)
        if os.path.dirname(client) != "/usr/local/bin":
            # docker-compose shells out to `docker` for builds: the same client.
            self.env["PATH"] = os.path.dirname(client) + os.pathsep + self.env["PATH"]

    def run(self, *args, timeout=120, check_rc=True, cwd=None):
        done = subprocess.run([self.client, *args], capture_output=True, text=True,
                              timeout=timeout, env=self.env, cwd=cwd)
        if check_rc and done.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args[:3])}: {done.stderr.strip()[-800:]}")
        return done.stdout.strip()

    def compose(self, *args, timeout=300, check_rc=True):
        done = subprocess.run(["docker-compose", "-f", os.path.join(COMPOSE_DIR, "compose.yaml"),
                               "-p", PROJECT, *args], capture_output=True, text=True,
                              timeout=timeout, env=self.env, cwd=COMPOSE_DIR)
        if check_rc and done.returncode != 0:
            raise RuntimeError(f"docker-compose {' '.join(args)}: {done.stderr.strip()[-800:]}")
        return done

    def inspect(self, container, template):
        return self.run("inspect", "--format", template, container, check_rc=False)

    def build(self, what, args, timeout=900):
        started = time.monotonic()
        done = subprocess.run([self.client, "build", *args], capture_output=True, text=True,
                              timeout=timeout, env=self.env, cwd=SOURCE_DIR)
        seconds = time.monotonic() - started
        if not check(done.returncode == 0, f"build {what}: exit {done.returncode}\n"
                     + "\n".join((done.stdout + done.stderr).splitlines()[-30:])):
            return None
        cached = len(re.findall(r"^#\d+ CACHED", done.stdout + done.stderr, re.M))
        say(f"build: {what} in {seconds:.1f} s ({cached} step(s) from the layer cache)")
        return seconds


def container(service):
    return f"{PROJECT}_{service}_1"


def get(url, timeout=5):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except Exception as e:  # connection refused, timeout, HTTP error: not healthy now
        return None, str(e)


def prometheus_rates(address):
    query = "sum by (rank) (rate(parasync_worker_examples_total[15s]))"
    status, body = get(f"http://{address}:9090/api/v1/query?"
                       + urllib.parse.urlencode({"query": query}))
    if status != 200:
        return {}
    return {r["metric"].get("rank"): float(r["value"][1]) for r in json.loads(body)["data"]["result"]}


def metric(text, name):
    """The value of an unlabelled-by-us metric line `name{...} value` in a .prom file."""
    m = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def builds(docker):
    started = time.monotonic()
    base = subprocess.run([os.path.join(SOURCE_DIR, "tools", "docker-base.sh")],
                          capture_output=True, text=True, timeout=600, env=docker.env)
    if not check(base.returncode == 0, f"tools/docker-base.sh: {base.stderr.strip()}"):
        return None
    say(f"build: base images in {time.monotonic() - started:.1f} s: "
        + base.stdout.strip().splitlines()[-1])
    dockerfile = "deploy/docker/Dockerfile"
    which = os.environ.get("PARASYNC_DOCKER_IMAGE", "source")
    if which not in ("source", "prebuilt"):
        check(False, f"PARASYNC_DOCKER_IMAGE={which}: expected source or prebuilt")
        return None
    if which == "source":
        if docker.build("the image from source (target runtime)",
                        ["-f", dockerfile, "-t", IMAGE_SOURCE, "."]) is None:
            return None
    else:
        say("build: the image from source NOT built (PARASYNC_DOCKER_IMAGE=prebuilt)")
    if os.path.realpath(BIN_DIR) == os.path.realpath(os.path.join(SOURCE_DIR, "build", "bin")):
        if docker.build("the image from this build's binaries (target runtime-prebuilt)",
                        ["-f", dockerfile, "--target", "runtime-prebuilt", "-t", IMAGE_PREBUILT,
                         "."], timeout=300) is None:
            return None
    else:
        check(which == "source", f"runtime-prebuilt copies build/bin; the binaries are in {BIN_DIR}")
        say(f"build: runtime-prebuilt NOT built: it copies build/bin, this build is {BIN_DIR}")
    if docker.build("Prometheus (prometheus.Dockerfile, Debian's package)",
                    ["-f", "deploy/docker/prometheus.Dockerfile", "-t",
                     "parasync-prometheus:2.42", "deploy/docker"], timeout=300) is None:
        return None
    return IMAGE_SOURCE if which == "source" else IMAGE_PREBUILT


def watch_run(docker, started, logs_dir):
    """Until both workers exit: health, /healthz, Prometheus, and the crash of ps-1."""
    parasync = ["ps-0", "ps-1", "worker-0", "worker-1"]
    healthy, healthz, rates = set(), set(), {}
    crash = {}
    prometheus = docker.inspect(container("prometheus"),
                                "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}")
    deadline = time.monotonic() + RUN_SECONDS
    while time.monotonic() < deadline:
        states = {}
        for s in parasync + ["prometheus"]:
            out = docker.inspect(container(s), "{{.State.Status}} {{if .State.Health}}"
                                 "{{.State.Health.Status}}{{end}} {{.RestartCount}} "
                                 "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}")
            status, health, restarts, address = (out.split() + ["", "", "", ""])[:4]
            states[s] = status
            if health == "healthy":
                healthy.add(s)
            if s in parasync and status == "running" and address and s not in healthz:
                if get(f"http://{address}:7100/healthz")[0] == 200:
                    healthz.add(s)
            if s == "ps-1" and crash and restarts.isdigit() and int(restarts) >= 1 and \
                    status == "running" and "back" not in crash:
                crash["back"] = time.monotonic() - crash["at"]
        for rank, value in prometheus_rates(prometheus).items():
            rates[rank] = max(rates.get(rank, 0.0), value)
        # The chief's first evaluation is written: every worker is training.
        if not crash and os.path.exists(os.path.join(logs_dir, "eval.jsonl")):
            time.sleep(1.5)  # a little training first
            # The pid read just before the kill: a process that ended meanwhile reads 0.
            pid = docker.inspect(container("ps-1"), "{{.State.Pid}}")
            if pid.isdigit() and int(pid) > 0:
                os.kill(int(pid), signal.SIGKILL)
                crash = {"at": time.monotonic(), "pid": int(pid),
                         "into": time.monotonic() - started}
        if states["worker-0"] == "exited" and states["worker-1"] == "exited":
            return healthy, healthz, rates, crash
        time.sleep(0.5)
    check(False, f"the workers did not finish within {RUN_SECONDS} s")
    return healthy, healthz, rates, crash


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster(docker, image):
    docker.env["PARASYNC_IMAGE"] = image
    # The compose file publishes Prometheus on the host; a free port, not a taken 9090.
    docker.env["PARASYNC_PROMETHEUS_PORT"] = str(free_port())
    started = time.monotonic()
    up = docker.compose("up", "-d", "--no-build", check_rc=False)
    if not check(up.returncode == 0, f"docker-compose up: {up.stderr.strip()[-1500:]}"):
        return
    say(f"compose: up -d returned after {time.monotonic() - started:.1f} s (image {image}; "
        f"{EPOCHS} epochs)")
    logs_dir = docker.run("volume", "inspect", "--format", "{{.Mountpoint}}", f"{PROJECT}_logs")
    healthy, healthz, rates, crash = watch_run(docker, started, logs_dir)
    seconds = time.monotonic() - started
    for w in ("worker-0", "worker-1"):
        code = docker.inspect(container(w), "{{.State.ExitCode}}")
        check(code == "0", f"{w} exited with {code}")
    parasync = {"ps-0", "ps-1", "worker-0", "worker-1"}
    everything = parasync | {"prometheus"}
    check(everything <= healthy, f"containers never seen healthy: {sorted(everything - healthy)}")
    check(parasync <= healthz, f"/healthz never answered 200: {sorted(parasync - healthz)}")
    check(set(rates) == {"0", "1"} and all(v > 0 for v in rates.values()),
          f"Prometheus' examples/sec by rank: {rates}, not both workers above 0")
    check(crash and "back" in crash, f"ps-1 was not killed and restarted by its policy: {crash}")
    ps1_log = docker.compose("logs", "--no-color", "ps-1", check_rc=False).stdout
    restored = re.search(r"\[ps1\] restored from \S+: version (\d+)", ps1_log)
    check(restored, "ps-1 did not restore its store after the crash")
    # Graceful stops: final snapshots and metrics-ps*.prom in the logs volume.
    docker.compose("stop", "ps-0", "ps-1", timeout=180, check_rc=False)

    def read(name):
        try:
            with open(os.path.join(logs_dir, name)) as f:
                return f.read()
        except OSError:
            return ""

    evals = [json.loads(line) for line in read("eval.jsonl").splitlines() if line.strip()]
    accuracy = evals[-1]["test_accuracy"] if evals else 0.0
    check(evals and evals[-1]["epoch"] == EPOCHS and accuracy >= ACCURACY_FLOOR,
          f"final test accuracy {accuracy} after epoch {evals[-1]['epoch'] if evals else '-'}, "
          f"floor {ACCURACY_FLOOR} after {EPOCHS}")
    # Pushes acknowledged: every step of each worker (its steps_total); a worker restarted by
    # its policy (restarts > 0) counted only its last life's steps, and resumed where the
    # servers recorded it: its share is then the whole training's (epochs x its shard's
    # steps), which its earlier lives' acknowledged steps and the last life's add up to.
    steps = [metric(read(f"metrics-worker{r}.prom"), "parasync_worker_steps_total") for r in (0, 1)]
    versions = [metric(read(f"metrics-ps{i}.prom"), "parasync_ps_version") for i in (0, 1)]
    restarts, shares = [], []
    for r, w in enumerate(("worker-0", "worker-1")):
        count = docker.inspect(container(w), "{{.RestartCount}}")
        restarts.append(int(count) if count.isdigit() else 0)
        log = docker.compose("logs", "--no-color", w, check_rc=False).stdout
        shard = re.search(r"(\d+) training examples in this shard", log)
        share = EPOCHS * -(-int(shard.group(1)) // BATCH) if shard else None
        shares.append(share if restarts[-1] else steps[r])
        if restarts[-1]:
            say(f"{w} was restarted {restarts[-1]} time(s) by its policy; its log's errors: "
                + " | ".join(line.split("|", 1)[-1].strip() for line in log.splitlines()
                             if re.search(r"error|critical|resuming", line))[-1500:])
            check(share is not None and steps[r] is not None and steps[r] < share,
                  f"{w}: restarted, yet its last life counted {steps[r]} of {share} steps")
    acknowledged = sum(shares) if None not in shares else None
    if not check(None not in versions and acknowledged is not None and
                 all(v == acknowledged for v in versions),
                 f"updates applied {versions} (ps-0, ps-1) vs pushes acknowledged "
                 f"{acknowledged} ({shares}; steps_total {steps}, restarts {restarts})"):
        for w in ("worker-0", "worker-1"):
            lines = [line for line in docker.compose("logs", "--no-color", w, check_rc=False)
                     .stdout.splitlines() if re.search(r"error|warn|resum|training done", line)]
            say(f"--- {w}:\n" + "\n".join(lines[-12:]))
    say(f"train: final test accuracy {accuracy:.4f} after {EPOCHS} epochs; compose up to the "
        f"workers' end {seconds:.1f} s")
    say(f"health: healthy seen for {', '.join(sorted(healthy))}; /healthz 200 from "
        f"{', '.join(sorted(healthz))}")
    say("metrics: Prometheus' sum by (rank) (rate(parasync_worker_examples_total[15s])) at "
        "most " + ", ".join(f"rank {r} {v:,.0f}" for r, v in sorted(rates.items()))
        + " examples/sec")
    if crash:
        say(f"crash: ps-1's server (pid {crash['pid']}) killed {crash['into']:.1f} s after up; "
            f"running again {crash.get('back', float('nan')):.1f} s later, restored version "
            f"{restored.group(1) if restored else '?'}; at the end updates applied ps-0 "
            f"{versions[0]:.0f}, ps-1 {versions[1]:.0f}, pushes acknowledged "
            f"{acknowledged:.0f} ({' + '.join(f'{s:.0f}' for s in shares if s is not None)}; "
            f"worker restarts {restarts})")


def down(docker):
    done = docker.compose("down", "-v", "--remove-orphans", timeout=180, check_rc=False)
    label = f"label=com.docker.compose.project={PROJECT}"
    left = {kind: docker.run(kind, "ls", "-q", "--filter", label, check_rc=False) for kind in
            ("container", "network", "volume")}
    left["container"] = docker.run("ps", "-aq", "--filter", label, check_rc=False)
    return done.returncode, {k: v.split() for k, v in left.items() if v}


def remove_stale_projects(docker):
    """Compose projects of earlier runs of this test that were killed (ctest's timeout)
    before their cleanup: their pid is gone."""
    out = docker.run("ps", "-a", "--format", '{{.Label "com.docker.compose.project"}}',
                     check_rc=False)
    for project in sorted(set(out.split())):
        pid = project[len("parasynctest"):]
        if project.startswith("parasynctest") and pid.isdigit() and \
                not os.path.exists(f"/proc/{pid}"):
            say(f"removing compose project {project} left by a killed run")
            subprocess.run(["docker-compose", "-f", os.path.join(COMPOSE_DIR, "compose.yaml"),
                            "-p", project, "down", "-v"], capture_output=True, timeout=300,
                           env=docker.env, cwd=COMPOSE_DIR)


def main():
    for tool in ("docker-compose", "debootstrap"):
        if shutil.which(tool) is None:
            say(f"SKIP: {tool} is not installed (tools/install-deps.sh --engines)")
            return SKIP

    def stop(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    try:
        session = DockerdSession(log=say)
        with session:
            docker = Docker(session.docker)
            remove_stale_projects(docker)
            try:
                image = builds(docker)
                if image:
                    cluster(docker, image)
            finally:
                rc, left = down(docker)
                if check(rc == 0 and not left, f"down -v: exit {rc}, left {left}"):
                    say("down: docker-compose down -v left no container, network or volume")
    except DockerUnavailable as e:
        say(f"SKIP: {e}")
        return SKIP
    check(not session.problems, f"the host was not left as found: {session.problems}")
    if failures:
        say(f"{len(failures)} check(s) failed")
        return 1
    say("docker: every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
