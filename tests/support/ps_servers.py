"""Real parasync-ps processes for the Python tests: N shards, each on a free loopback port it
binds itself (port 0) and reports in its ready file, so that tests run side by side; each
stopped (by its PID) when the test is done. Test-only code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

# A loopback address where no server listens: port 1 is privileged, and no test binds it.
NO_SERVER = "127.0.0.1:1"


class NotServing(RuntimeError):
    """A server exited, or did not say it serves, within the bound."""


class Servers:
    """`shards` parasync-ps processes of a cluster of `workers` workers in `mode`, logging to
    <log_dir>/ps<i>.log; with `state_dir`, shard i keeps its store in <state_dir>/ps<i>.
    Returns once every shard serves; `addresses` are theirs ("127.0.0.1:port")."""

    def __init__(self, bin_dir: str, shards: int, workers: int, log_dir: str,
                 mode: str = "async", state_dir: str | None = None, args: tuple = ()):
        self.bin_dir, self.log_dir, self.state_dir = bin_dir, log_dir, state_dir
        # Port 0 at first; a restarted shard binds the port it had.
        self.addresses = ["127.0.0.1:0"] * shards
        self.workers = ",".join(f"127.0.0.1:{i + 1}" for i in range(workers))
        self.mode, self.args = mode, list(args)
        self.processes: list[subprocess.Popen | None] = [None] * shards
        try:
            for i in range(shards):
                self._spawn(i)
            for i in range(shards):
                self._await_serving(i)
        except BaseException:
            self.stop()
            raise

    def command(self, i: int) -> list[str]:
        cmd = [os.path.join(self.bin_dir, "parasync-ps"), "--ps-hosts", ",".join(self.addresses),
               "--worker-hosts", self.workers, "--task-index", str(i), "--mode", self.mode,
               "--log-dir", self.log_dir, "--worker-timeout", "5",
               "--ready-file", self._ready_file(i)]
        if self.state_dir:
            cmd += ["--state-dir", os.path.join(self.state_dir, f"ps{i}")]
        return cmd + self.args

    def start(self, i: int) -> None:
        """(Re)starts shard i on its address and waits until it serves."""
        self._spawn(i)
        self._await_serving(i)

    def _ready_file(self, i: int) -> str:
        return os.path.join(self.log_dir, f"ps{i}.ready")

    def _spawn(self, i: int) -> None:
        log = open(os.path.join(self.log_dir, f"ps{i}.log"), "a")
        self.processes[i] = subprocess.Popen(self.command(i), stdout=log,
                                             stderr=subprocess.STDOUT)
        log.close()

    def _await_serving(self, i: int, timeout: float = 60.0) -> None:
        """Reads shard i's address from its ready file (written once it serves, by this
        process: the pid tells an old file apart); NotServing if it exits first or the time
        runs out."""
        p = self.processes[i]
        deadline = time.monotonic() + timeout
        while True:
            try:
                with open(self._ready_file(i)) as f:
                    ready = json.load(f)
                if ready.get("pid") == p.pid:
                    self.addresses[i] = ready["address"]
                    return
            except (OSError, ValueError):
                pass  # not written yet (it is written whole, by a rename)
            if p.poll() is not None:
                raise NotServing(f"ps{i} exited with status {p.returncode} before serving:\n"
                                 + self.log(i))
            if time.monotonic() > deadline:
                raise NotServing(f"ps{i} did not serve within {timeout:.0f} s:\n" + self.log(i))
            time.sleep(0.02)

    def kill(self, i: int) -> None:
        """SIGKILL shard i and reap it."""
        p = self.processes[i]
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)

    def stop(self) -> None:
        for p in self.processes:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for p in self.processes:
            if p is None:
                continue
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def log(self, i: int) -> str:
        with open(os.path.join(self.log_dir, f"ps{i}.log")) as f:
            return f.read()

    def __enter__(self) -> "Servers":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
