"""Real parasync-ps processes for the Python tests: N shards on free loopback ports, each
stopped (by its PID) when the test is done. Test-only code."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time


def free_ports(count: int) -> list[int]:
    """`count` distinct ports that were free a moment ago, below the ephemeral range (32768 on),
    so no outgoing connection takes one before its server binds it."""
    ports: list[int] = []
    while len(ports) < count:
        port = random.randint(20000, 32000)
        if port in ports:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
    return ports


class Servers:
    """`shards` parasync-ps processes of a cluster of `workers` workers in `mode`, logging to
    <log_dir>/ps<i>.log; with `state_dir`, shard i keeps its store in <state_dir>/ps<i>."""

    def __init__(self, bin_dir: str, shards: int, workers: int, log_dir: str,
                 mode: str = "async", state_dir: str | None = None, args: tuple = ()):
        self.bin_dir, self.log_dir, self.state_dir = bin_dir, log_dir, state_dir
        ports = free_ports(shards)
        self.addresses = [f"127.0.0.1:{p}" for p in ports]
        self.workers = ",".join(f"127.0.0.1:{i + 1}" for i in range(workers))
        self.mode, self.args = mode, list(args)
        self.processes: list[subprocess.Popen | None] = [None] * shards
        for i in range(shards):
            self.start(i)

    def command(self, i: int) -> list[str]:
        cmd = [os.path.join(self.bin_dir, "parasync-ps"), "--ps-hosts", ",".join(self.addresses),
               "--worker-hosts", self.workers, "--task-index", str(i), "--mode", self.mode,
               "--log-dir", self.log_dir, "--worker-timeout", "5"]
        if self.state_dir:
            cmd += ["--state-dir", os.path.join(self.state_dir, f"ps{i}")]
        return cmd + self.args

    def start(self, i: int) -> None:
        log = open(os.path.join(self.log_dir, f"ps{i}.log"), "a")
        self.processes[i] = subprocess.Popen(self.command(i), stdout=log,
                                             stderr=subprocess.STDOUT)
        log.close()

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
