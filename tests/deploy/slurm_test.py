#!/usr/bin/env python3
"""deploy/slurm/parasync.sbatch, unchanged, on a real Slurm cluster: tools/slurm-lab's
controller and two slurmd nodes, each its own network namespace on a bridge (links shaped to
1 Gbit/s), with munge. Three jobs, each submitted with sbatch from the repository root:

  whole     `sbatch --wait`, 1 epoch: exit status 0 (the workers'); a server on each node and
            workers on both nodes (the tasks' Prometheus targets name them, and both nodes'
            links carried the training's bytes); the chief's eval.jsonl at the accuracy floor;
            every Prometheus target file in the run directory; CURVE on (each server says so,
            every task got its key flags); the servers stopped by SIGTERM with a final
            snapshot (their log lines and metrics-ps*.prom)
  kill      a worker killed (SIGKILL) mid-job: the job still ends, with the killed worker's
            failure as its status; the other workers finish every epoch; the servers are
            stopped with a final snapshot
  scancel   `scancel` of a running job: nothing of it runs on either node afterwards (only
            slurmd), and the queue is empty

Prints the nodes each task ran on, the accuracy and the seconds. Skips (77) with the reason
where the lab cannot be made (not root, no slurm-wlm/munge, no network namespaces).

  slurm_test.py BIN_DIR SOURCE_DIR
"""
import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

if len(sys.argv) != 3:
    print("usage: slurm_test.py BIN_DIR SOURCE_DIR", file=sys.stderr)
    sys.exit(2)
BIN_DIR, SOURCE_DIR = (os.path.abspath(p) for p in sys.argv[1:3])
SLURM_LAB = os.path.join(SOURCE_DIR, "tools", "slurm-lab")
NETLAB = os.path.join(SOURCE_DIR, "tools", "netlab")
SBATCH = os.path.join(SOURCE_DIR, "deploy", "slurm", "parasync.sbatch")
LAB = f"pslurm{os.getpid()}"  # a lab left by a run that was killed is found by its pid
ACCURACY_FLOOR = 0.78  # the MLP after one async epoch of 4 workers: 0.82-0.83 here
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_checks import SKIP, check, failures  # noqa: E402


def lab(*args, timeout=120):
    return subprocess.run([sys.executable, SLURM_LAB, *args], capture_output=True, text=True,
                          timeout=timeout)


def on_ctl(*command, timeout=60):
    """A Slurm client command on the lab's controller host, from the repository root."""
    return subprocess.run([sys.executable, SLURM_LAB, "exec", "--name", LAB, "--", *command],
                          capture_output=True, text=True, timeout=timeout, cwd=SOURCE_DIR,
                          env=job_env_base)


def job_env(run_dir, epochs):
    return dict(job_env_base, PARASYNC_BIN_DIR=BIN_DIR, PARASYNC_RUN_DIR=run_dir,
                PARASYNC_EPOCHS=str(epochs))


def submit(run_dir, epochs, wait):
    """sbatch of the batch script as it is, its output into the run directory."""
    os.makedirs(run_dir, exist_ok=True)
    command = [sys.executable, SLURM_LAB, "exec", "--name", LAB, "--", "sbatch",
               f"--output={run_dir}/job.out"] + (["--wait"] if wait else ["--parsable"]) + [SBATCH]
    return subprocess.Popen(command, cwd=SOURCE_DIR, env=job_env(run_dir, epochs),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def processes(node):
    """{pid: (comm, cmdline)} of every process on a lab node."""
    out = lab("pids", "--name", LAB, node).stdout
    result = {}
    for pid in out.split():
        comm, cmdline = read(f"/proc/{pid}/comm").strip(), read(f"/proc/{pid}/cmdline")
        if comm:
            result[int(pid)] = (comm, cmdline.replace("\0", " "))
    return result


def wait_for(condition, seconds, what):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    check(False, f"{what}: not within {seconds} s")
    return None


def link_bytes():
    out = subprocess.run([sys.executable, NETLAB, "counters", "--name", LAB, "--json"],
                         capture_output=True, text=True).stdout
    return {a: c["tx_bytes"] + c["rx_bytes"] for a, c in json.loads(out or "{}").items()}


def dump_on_failure(run_dir):
    print(f"--- {run_dir}/job.out (last 40 lines)")
    print("\n".join(read(f"{run_dir}/job.out").splitlines()[-40:]))
    print("--- slurmctld.log (last 15 lines)")
    print("\n".join(read(f"/run/parasync-slurmlab/{LAB}/log/slurmctld.log").splitlines()[-15:]))


def servers_stopped_with_snapshot(out, run_dir, case):
    for i in (0, 1):
        check(re.search(rf"\[ps{i}\] signal 15 received", out) and
              re.search(rf"\[ps{i}\] on disk: version \d+", out),
              f"{case}: server {i} was not stopped by SIGTERM with a final snapshot")
        check(os.path.exists(f"{run_dir}/metrics-ps{i}.prom"),
              f"{case}: no metrics-ps{i}.prom (written by a server's graceful stop)")


def case_whole(tmp):
    run_dir = f"{tmp}/whole"
    before = link_bytes()
    started = time.monotonic()
    job = submit(run_dir, epochs=1, wait=True)
    stdout, stderr = job.communicate(timeout=240)
    seconds = time.monotonic() - started
    after = link_bytes()
    out = read(f"{run_dir}/job.out")
    if not check(job.returncode == 0, f"whole: sbatch --wait exited with {job.returncode}: "
                 f"{stdout.strip()} {stderr.strip()}"):
        dump_on_failure(run_dir)
    # Where each task ran: the target file it wrote on its node names the node.
    placement = {}
    for path in sorted(glob.glob(f"{run_dir}/targets/*.json")):
        with open(path) as f:
            target = json.load(f)[0]
        host, port = target["targets"][0].rsplit(":", 1)
        check(port.isdigit() and not 9100 <= int(port) <= 9999, f"whole: {path}: port {port}")
        placement[os.path.basename(path)[:-5]] = host
    check(sorted(placement) == ["ps0", "ps1", "worker0", "worker1", "worker2", "worker3"],
          f"whole: Prometheus target files {sorted(placement)}, not the 2 servers' and 4 workers'")
    ps_nodes = {placement.get("ps0"), placement.get("ps1")}
    worker_nodes = {placement.get(f"worker{i}") for i in range(4)}
    check(ps_nodes == {"n1", "n2"}, f"whole: servers on {ps_nodes}, not one on each of n1, n2")
    check(worker_nodes == {"n1", "n2"}, f"whole: workers on {worker_nodes}, not on n1 and n2")
    traffic = {lab_node: (after.get(a, 0) - before.get(a, 0)) / 1e6
               for lab_node, a in nodes.items()}
    check(all(mb > 5 for mb in traffic.values()),
          f"whole: a node's link carried almost nothing ({traffic} MB): not a 2-host run")
    # Training: the chief's eval.jsonl.
    evals = [json.loads(line) for line in read(f"{run_dir}/eval.jsonl").splitlines() if line]
    accuracy = evals[-1]["test_accuracy"] if evals else 0.0
    check(evals and evals[-1]["epoch"] == 1 and accuracy >= ACCURACY_FLOOR,
          f"whole: final test accuracy {accuracy} (epoch {evals[-1]['epoch'] if evals else '-'}), "
          f"floor {ACCURACY_FLOOR}")
    # CURVE: both servers say so, every task was given its keys.
    for i in (0, 1):
        check(re.search(rf"\[ps{i}\] CURVE on: encrypted", out), f"whole: server {i}: CURVE not on")
    execs = re.findall(r"^parasync-entrypoint: exec \S+/parasync-(ps|worker) (.*)$", out, re.M)
    check(sorted(r for r, _ in execs) == ["ps"] * 2 + ["worker"] * 4,
          f"whole: started {sorted(r for r, _ in execs)}, not 2 servers and 4 workers")
    for role, flags in execs:
        need = ["--curve-key=", "--curve-allow="] if role == "ps" else \
            ["--curve-key=", "--curve-server-key="]
        check(all(n in flags for n in need), f"whole: a {role} started without {need}: {flags}")
    check(oct(os.stat(f"{run_dir}/keys").st_mode & 0o777) == "0o700", "whole: keys not 0700")
    servers_stopped_with_snapshot(out, run_dir, "whole")
    print(f"whole: job ran {seconds:.1f} s (sbatch --wait, status {job.returncode}); servers: "
          f"ps0 on {placement.get('ps0')}, ps1 on {placement.get('ps1')}; workers: "
          + ", ".join(f"rank {i} on {placement.get(f'worker{i}')}" for i in range(4))
          + f"; link MB n1 {traffic.get('n1', 0):.1f}, n2 {traffic.get('n2', 0):.1f}; final "
          f"test accuracy {accuracy:.4f} after {evals[-1]['epoch'] if evals else 0} epoch(s); "
          f"CURVE on; servers stopped with a final snapshot", flush=True)


def find_worker(rank):
    """(node, pid) of the parasync-worker of `rank` (its key file names it), or None."""
    for node in nodes:
        for pid, (comm, cmdline) in processes(node).items():
            if comm == "parasync-worker" and f"/worker{rank}.key" in cmdline:
                return node, pid
    return None


def case_kill(tmp):
    run_dir = f"{tmp}/kill"
    epochs = 3
    started = time.monotonic()
    job = submit(run_dir, epochs=epochs, wait=True)
    found = wait_for(lambda: find_worker(3), 60, "kill: worker rank 3 never started")
    # Mid-job: the chief has evaluated the initial model, so every worker is training.
    wait_for(lambda: os.path.exists(f"{run_dir}/eval.jsonl"), 60, "kill: no evaluation began")
    if found:
        node, pid = found
        # Still rank 3's worker (not a reused pid) at the moment of the kill.
        found = find_worker(3)
        if check(found == (node, pid), f"kill: rank 3's worker {pid} ended before the kill"):
            os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic() - started
    try:
        job.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        check(False, "kill: the job did not end within 240 s of a worker's death")
        job.kill()
        job.communicate()
        return
    seconds = time.monotonic() - started
    out = read(f"{run_dir}/job.out")
    check(job.returncode != 0, "kill: the job's status is 0 although a worker was killed")
    done = sorted(int(m.group(1))
                  for m in re.finditer(rf"\[worker(\d)\] training done: {epochs} epochs", out))
    check(done == [0, 1, 2], f"kill: workers {done} finished all {epochs} epochs, not 0, 1, 2")
    check(re.search(r"workers finished with status [1-9]", out),
          "kill: the batch script did not see the workers' failure")
    servers_stopped_with_snapshot(out, run_dir, "kill")
    if failures:
        dump_on_failure(run_dir)
    if found:
        print(f"kill: rank 3's worker (pid {pid} on {node}) killed {killed_at:.1f} s into the job; "
              f"job ended {seconds:.1f} s in with status {job.returncode}; ranks {done} finished "
              f"{epochs} epochs; servers stopped with a final snapshot", flush=True)


def case_scancel(tmp):
    run_dir = f"{tmp}/scancel"
    job = submit(run_dir, epochs=50, wait=False)
    stdout, stderr = job.communicate(timeout=60)
    job_id = stdout.strip().split(";")[0]
    if not check(job.returncode == 0 and job_id.isdigit(), f"scancel: sbatch: {stderr.strip()}"):
        return

    def running_workers():
        counts = {n: sum(c == "parasync-worker" for c, _ in processes(n).values()) for n in nodes}
        return counts if all(counts.values()) else None

    counts = wait_for(running_workers, 60, "scancel: workers did not start on both nodes")
    started = time.monotonic()
    cancel = on_ctl("scancel", job_id)
    check(cancel.returncode == 0, f"scancel: scancel {job_id}: {cancel.stderr.strip()}")

    def left():
        """What of the job is left: each node's processes but slurmd (a node whose slurmd is
        not seen is not listed: that counts as left), and the queue."""
        seen = {n: processes(n) for n in nodes}
        rest = {n: sorted(f"{c}[{p}]" for p, (c, _) in procs.items() if c != "slurmd")
                if any(c == "slurmd" for c, _ in procs.values()) else ["(no slurmd seen)"]
                for n, procs in seen.items()}
        queue = on_ctl("squeue", "--noheader", f"--jobs={job_id}")
        # squeue fails for a job id it no longer knows (MinJobAge passed): also empty.
        gone = queue.returncode == 0 and not queue.stdout.strip() or \
            "Invalid job id" in queue.stderr
        return rest, "" if gone else (queue.stdout + queue.stderr).strip()

    state = {}

    def cleaned_up():
        state["left"] = left()
        return not any(state["left"][0].values()) and not state["left"][1]

    cleaned = wait_for(cleaned_up, 60, "scancel: processes or queue entries left")
    if not cleaned:
        check(False, f"scancel: left at the end: {state.get('left')}")
    seconds = time.monotonic() - started
    if cleaned:
        print(f"scancel: job {job_id} with workers running ({counts}) cancelled; {seconds:.1f} s "
              "later nothing of it ran on n1 or n2 (only slurmd) and the queue was empty",
              flush=True)
    else:
        dump_on_failure(run_dir)


def remove_stale_labs():
    """Labs of earlier runs of this test that were killed (ctest's timeout) before their
    cleanup: their pid is gone."""
    root = "/run/parasync-slurmlab"
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        pid = name[len("pslurm"):]
        if name.startswith("pslurm") and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            print(f"removing lab {name} left by a killed run", flush=True)
            lab("down", "--name", name)


def main():
    def stop(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)  # before the lab exists: the finally below removes it
    remove_stale_labs()
    try:
        return run_cases()
    finally:
        lab("down", "--name", LAB)


def run_cases():
    global job_env_base, nodes
    up = lab("up", "--name", LAB, "--nodes", "2")
    if up.returncode == 3:
        print(f"SKIP: the Slurm lab cannot be made here: {up.stderr.strip()}")
        return SKIP
    if up.returncode != 0:
        print(f"FAILED: slurm-lab up: {up.stderr.strip()}")
        return 1
    settings = dict(line.split("=", 1) for line in up.stdout.split("\n") if "=" in line)
    settings = {k: v.strip("'") for k, v in settings.items()}
    nodes = {n: a for n, a in (pair.split("=") for pair in settings["SLURM_LAB_NODES"].split())}
    job_env_base = dict(os.environ, SLURM_CONF=settings["SLURM_CONF"])
    for key in ("SLURM_JOB_ID", "PARASYNC_INSECURE", "TF_CONFIG"):
        job_env_base.pop(key, None)
    print(f"slurm lab {LAB}: nodes {settings['SLURM_LAB_NODES']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="parasync-slurm-") as tmp:
        os.chmod(tmp, 0o755)
        for case in (case_whole, case_kill, case_scancel):
            case(tmp)
    lab("down", "--name", LAB)
    left = [p for p in (f"/run/parasync-slurmlab/{LAB}", f"/run/parasync-netlab/{LAB}.json")
            if os.path.exists(p)]
    check(not left, f"the lab left {left}")
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("slurm: every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
