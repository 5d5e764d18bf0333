#!/usr/bin/env python3
"""tools/dockerd_session.py: a Docker daemon for the length of a command, leaving the host as
it found it. Where a daemon already answers (`docker info`), it is used and left running.
Otherwise dockerd (Debian's docker.io) is started with its defaults (overlay2, the docker0
bridge, /var/lib/docker, so images and build cache stay for the next session) and, after the
command, stopped; then what dockerd changes on the host is put back: the iptables and
ip6tables rules (dockerd adds its chains, NAT and a FORWARD policy of DROP), the
net.ipv4.ip_forward and net.bridge.bridge-nf-call-* sysctls, and the network links it made
(docker0). A change that cannot be put back is printed, and the exit status is 1 if the
command itself succeeded.

  dockerd_session.py run -- COMMAND ...   COMMAND with a daemon; exits with its status
  dockerd_session.py status               says whether a daemon answers, and which

Also a Python module: `with DockerdSession() as d:` (d.started: whether this session
started the daemon; d.docker: the client to use, Debian's /usr/bin/docker where it exists,
as a /usr/local/bin/docker of another version may come first on PATH). Raises
DockerUnavailable (exit 3 from the command line) where no daemon answers and none can be
started here (no dockerd, not root, or it does not come up): tests skip on it.
"""
import os
import shutil
import signal
import subprocess
import sys
import time

PROGRAM = "dockerd_session"
PID_FILE = "/run/parasync-dockerd.pid"
LOG_FILE = "/run/parasync-dockerd.log"
SYSCTLS = ["/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/bridge/bridge-nf-call-iptables",
           "/proc/sys/net/bridge/bridge-nf-call-ip6tables",
           "/proc/sys/net/bridge/bridge-nf-call-arptables"]


class DockerUnavailable(Exception):
    """No daemon answers and none can be started here."""


def docker_client():
    """Debian's client where it exists (it matches Debian's dockerd), else the one on PATH."""
    return "/usr/bin/docker" if os.access("/usr/bin/docker", os.X_OK) else shutil.which("docker")


def daemon_answers(client, timeout=10):
    if client is None:
        return False
    try:
        return subprocess.run([client, "info", "--format", "{{.ServerVersion}}"],
                              capture_output=True, timeout=timeout).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def rules(tool):
    """The tool's tables ({name: text}), without comment lines and counters, and without
    tables that hold nothing (built-in chains only, policy ACCEPT, no rule): the same as no
    table at all. None without the tool."""
    if shutil.which(tool) is None:
        return None
    out = subprocess.run([tool], capture_output=True, text=True).stdout
    tables, name, lines = {}, None, []
    for line in out.splitlines():
        if line.startswith("#"):
            continue
        if line.startswith("*"):
            name, lines = line[1:], []
        elif line == "COMMIT" and name is not None:
            chains = [c for c in lines if c.startswith(":")]
            empty = len(chains) == len(lines) and all(c.split()[1] == "ACCEPT" for c in chains)
            if not empty:
                tables[name] = "\n".join(lines)
            name = None
        elif name is not None:
            lines.append(line.split(" [")[0] if line.startswith(":") else line)
    return tables


# The built-in chains of each table, for writing a table back empty.
BUILTIN_CHAINS = {"filter": ["INPUT", "FORWARD", "OUTPUT"],
                  "nat": ["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"],
                  "mangle": ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"],
                  "raw": ["PREROUTING", "OUTPUT"], "security": ["INPUT", "FORWARD", "OUTPUT"]}


def restore_tables(tool, before):
    """Writes back every table that differs from `before`: its old rules, or nothing (its
    chains emptied, policies ACCEPT, dockerd's chains deleted) where it held nothing."""
    now = rules(tool + "-save") or {}
    text = ""
    for table in sorted(set(now) | set(before)):
        if now.get(table) == before.get(table):
            continue
        body = before.get(table)
        if body is None:
            body = "\n".join(f":{c} ACCEPT" for c in BUILTIN_CHAINS.get(table, []))
        text += f"*{table}\n{body}\nCOMMIT\n"
    if text:
        subprocess.run([tool + "-restore"], input=text, text=True, capture_output=True)


def links():
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line}


def nft_tables():
    if shutil.which("nft") is None:
        return None
    out = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    return {line.strip() for line in out.splitlines() if line.startswith("table ")}


class HostState:
    """What dockerd changes on the host, taken before it starts, and put back after."""

    def __init__(self):
        self.sysctls = {p: read(p) for p in SYSCTLS}
        self.iptables = {t: rules(t + "-save") for t in ("iptables", "ip6tables")}
        self.tables = nft_tables()
        self.links = links()

    def restore(self):
        """Puts back what differs; returns the differences it could not put back."""
        problems = []
        now = nft_tables()
        if self.tables is not None and now is not None:
            # Tables dockerd made (through iptables-nft) are deleted whole where nft is here
            # (else they stay, empty) ...
            for table in sorted(now - self.tables):
                subprocess.run(["nft", "delete", *table.split()], capture_output=True)
        for tool, before in self.iptables.items():
            # ... and every table (without nft: all of them) gets its rules back.
            if before is not None:
                restore_tables(tool, before)
        for link in sorted(links() - self.links):
            subprocess.run(["ip", "link", "delete", link], capture_output=True)
        # A bridge-nf-call-* file that was not there: dockerd loaded br_netfilter, which
        # cannot be unloaded here (no modprobe in a VM without modules); 0 makes bridges
        # bypass iptables, as without the module.
        wanted = {p: "0" if v is None and read(p) is not None and "/bridge/" in p else v
                  for p, v in self.sysctls.items()}
        for path, value in wanted.items():
            if value is not None and read(path) != value:
                try:
                    with open(path, "w") as f:
                        f.write(value + "\n")
                except OSError as e:
                    problems.append(f"{path}: {e}")
        for tool, before in self.iptables.items():
            if (before or {}) != (rules(tool + "-save") or {}):
                problems.append(f"{tool} rules differ from before the daemon started")
        for path, value in wanted.items():
            if read(path) != value:
                problems.append(f"{path} is {read(path)}, was {value}")
        extra = links() - self.links
        if extra:
            problems.append(f"links left: {', '.join(sorted(extra))}")
        return problems


class DockerdSession:
    def __init__(self, log=print):
        self.docker = docker_client()
        self.started = False
        self.process = None
        self.state = None
        self.problems = []
        self.log = log

    def __enter__(self):
        if daemon_answers(self.docker):
            self.log(f"{PROGRAM}: using the Docker daemon that is running (left running)")
            return self
        dockerd = shutil.which("dockerd") or ("/usr/sbin/dockerd"
                                              if os.path.exists("/usr/sbin/dockerd") else None)
        if dockerd is None or self.docker is None:
            raise DockerUnavailable("no Docker daemon answers, and dockerd or the docker client "
                                    "is not installed (apt-get install docker.io)")
        if os.geteuid() != 0:
            raise DockerUnavailable("no Docker daemon answers, and starting one needs root")
        self.state = HostState()
        log = open(LOG_FILE, "ab")
        self.process = subprocess.Popen([dockerd, "--pidfile", PID_FILE], stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.started = True
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    break
                if daemon_answers(self.docker, timeout=5):
                    self.log(f"{PROGRAM}: started dockerd (pid {self.process.pid}; log "
                             f"{LOG_FILE})")
                    return self
                time.sleep(0.2)
        except BaseException:
            # Interrupted while it comes up (SIGTERM): `with` would not call __exit__.
            self.__exit__(None, None, None)
            raise
        self.__exit__(None, None, None)
        raise DockerUnavailable(f"dockerd did not come up within 60 s (see {LOG_FILE})")

    def __exit__(self, *exc):
        if not self.started:
            return False
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.started = False
        self.problems = self.state.restore()
        for p in self.problems:
            self.log(f"{PROGRAM}: NOT RESTORED: {p}")
        if not self.problems:
            self.log(f"{PROGRAM}: dockerd stopped; iptables, sysctls and links as before")
        return False


def main():
    args = sys.argv[1:]
    if args[:1] == ["status"]:
        client = docker_client()
        print(f"{PROGRAM}: a daemon answers ({client})" if daemon_answers(client)
              else f"{PROGRAM}: no daemon answers")
        return 0
    if args[:1] != ["run"] or len(args) < 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    command = args[2:] if args[1] == "--" else args[1:]
    if not command:
        print(f"{PROGRAM}: run needs a command", file=sys.stderr)
        return 2

    def stop(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    try:
        session = DockerdSession(log=lambda m: print(m, file=sys.stderr, flush=True))
        with session:
            status = subprocess.run(command).returncode
    except DockerUnavailable as e:
        print(f"{PROGRAM}: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        status = 130
    return 1 if status == 0 and session.problems else status


if __name__ == "__main__":
    sys.exit(main())
