#!/usr/bin/env python3
"""tools/netlab at a small scale: bad arguments are one line and exit 2; two hosts on links
shaped to 1 Gbit/s carry a real training run (parasync-launch over netlab's exec, a PS on one
host, a worker on the other, the MLP, one epoch) whose tensor bytes the PS counted are on the
links' counters, within TCP/IP's overhead; the same epoch with --wire-dtype int8 crosses in
at most 0.27 of float32's bytes pushed and pulled (int8 delta pulls of parameters); two workers
of one host with --local-aggregation cross in at most 0.55 of them; a Horovod script with
hvd.Compression.topk crosses in at most a quarter of float32's bytes each way; the shaper
holds a probe to the rate; and an
interrupted lab is removed with the processes it ran. Without iproute2 on PATH (no `ip`; or
`ip` but no `tc` for a shaped rate) every verb says so in one line and exits 3 with nothing of
the lab made; where `ip` cannot make a namespace (a stand-in `ip` that refuses, as in a
container without CAP_NET_ADMIN), `up` exits 3 leaving nothing behind. Those checks run
everywhere; the rest skips (77), saying why, where network namespaces cannot be made (not
root, no iproute2).

  netlab_test.py BIN_DIR SOURCE_DIR
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

BIN_DIR, SOURCE_DIR = sys.argv[1:3]
NETLAB = os.path.join(SOURCE_DIR, "tools", "netlab")
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
STATE_DIR = "/run/parasync-netlab"  # where tools/netlab records a lab (NAME.json)
failures = []


def check(ok, message):
    if not ok:
        failures.append(message)
        print(f"FAILED: {message}", flush=True)


def netlab(*args, timeout=120, path=None):
    """tools/netlab ARGS; with `path`, that is the only PATH it has."""
    env = dict(os.environ, PATH=path) if path is not None else None
    return subprocess.run([sys.executable, NETLAB, *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def namespaces(prefix):
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix + "-")]


def lab_left(name):
    """What of lab `name` is on this host: its state file, its namespaces (when this host
    has iproute2 to list them)."""
    left = [p for p in [os.path.join(STATE_DIR, name + ".json")] if os.path.exists(p)]
    return left + (namespaces(name) if shutil.which("ip") else [])


def refused_leaving_nothing(done, what, says, name):
    """`done` exited 3 with one line on stderr containing `says`, and no part of lab `name`
    exists (else it is removed, with the host's own PATH)."""
    lines = done.stderr.strip().splitlines()
    check(done.returncode == 3, f"{what}: exit {done.returncode}, not 3: {done.stderr[-800:]!r}")
    check(len(lines) == 1 and says in lines[0],
          f"{what}: stderr is not one line saying {says!r}: {done.stderr[-800:]!r}")
    left = lab_left(name)
    check(not left, f"{what}: the lab was made anyway, or left behind: {left}")
    if left:
        netlab("down", "--name", name)


def without_iproute2(name):
    """No `ip` on PATH: every verb refuses before it changes anything. An `ip` found some
    other way (an absolute path) would make the lab: lab_left sees it."""
    with tempfile.TemporaryDirectory() as empty:
        for verb, *args in (["up", "--hosts", "1", "--rate", "0"], ["up", "--hosts", "2"],
                            ["run", "--hosts", "1", "--rate", "0", "--", "true"],
                            ["exec", "h0", "true"], ["counters"], ["probe"], ["down"]):
            done = netlab(verb, "--name", name, *args, path=empty)
            refused_leaving_nothing(done, f"netlab {verb} without iproute2",
                                    "iproute2 is not installed: no 'ip'", name)
        ip = shutil.which("ip")
        if ip is None:
            return
        # `ip` but no `tc`: a shaped lab is refused before its first namespace.
        os.symlink(ip, os.path.join(empty, "ip"))
        for verb in (["up"], ["run", "--", "true"]):
            done = netlab(verb[0], "--hosts", "1", "--rate", "1gbit", "--name", name, *verb[1:],
                          path=empty)
            refused_leaving_nothing(done, f"netlab {verb[0]} without tc",
                                    "iproute2 is not installed: no 'tc'", name)


STAND_IN_IP = """#!/bin/sh
# iproute2's ip where namespaces cannot be made: it runs, `netns add` is refused.
case "$1 $2" in
  "-V ") echo "ip utility, iproute2-stand-in"; exit 0 ;;
  "netns add") echo "mount --make-shared /run/netns failed: Operation not permitted" >&2 ;;
esac
exit 1
"""


def namespace_refused(name):
    """`ip` that cannot make a namespace: `up` exits 3 in one line and removes what it
    recorded, so the same name can be tried again (not "already up")."""
    with tempfile.TemporaryDirectory() as bin_dir:
        with open(os.path.join(bin_dir, "ip"), "w") as f:
            f.write(STAND_IN_IP)
        os.chmod(os.path.join(bin_dir, "ip"), 0o755)
        says = "network namespaces need root" if os.geteuid() != 0 else "Operation not permitted"
        for attempt in ("first", "second"):
            done = netlab("up", "--hosts", "2", "--rate", "0", "--name", name, path=bin_dir)
            refused_leaving_nothing(done, f"netlab up where namespaces are refused ({attempt})",
                                    says, name)


def wait_for(condition, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def bad_arguments():
    for args, says in ((["up", "--hosts", "0"], "--hosts must be at least 1"),
                       (["up", "--hosts", "2", "--rate", "fast"], "--rate fast"),
                       (["up", "--hosts", "2", "--name", "a b"], "--name a b"),
                       (["run", "--hosts", "2"], "needs a command")):
        done = netlab(*args)
        check(done.returncode == 2, f"netlab {' '.join(args)}: exit {done.returncode}, not 2")
        check(says in done.stderr, f"netlab {' '.join(args)}: '{says}' not in {done.stderr!r}")


def prom_value(path, name, labels):
    with open(path) as f:
        for line in f:
            if line.startswith(name + "{") and all(l in line for l in labels):
                return float(line.rsplit(" ", 1)[1])
    return None


def lab_training(tmp, name, wire="float32", grouped=False):
    """One epoch of the MLP across a fresh lab of two hosts (a PS on one, a worker on the
    other) with --wire-dtype `wire`; `grouped`: two workers on the worker host, sync, with
    --local-aggregation. Its log dir and the PS host's link counters, or None (the failure
    recorded)."""
    tag = wire + ("-grouped" if grouped else "")
    log_dir = os.path.join(tmp, f"run-{tag}")
    counts = os.path.join(tmp, f"links-{tag}.json")
    workers = '"$2:2" --mode sync --local-aggregation' if grouped else '"$2:1"'
    launch = (f'set -- $NETLAB_HOSTS; exec {BIN_DIR}/parasync-launch --ps "$1:1" -H {workers} '
              f'--ssh-command "$NETLAB_EXEC" --model mlp --epochs 1 --log-dir {log_dir} '
              f'--dataset {FASHION_MNIST} --wire-dtype {wire}')
    if wire != "float32":
        # The codec's bytes alone: the probe (which may choose float32 on a fast link) is
        # checked in tests/ps/server_int8_test.cc.
        launch += " --topk-probe off"
    done = netlab("run", "--hosts", "2", "--rate", "1gbit", "--name", name, "--json", counts,
                  "--", "sh", "-c", launch, timeout=240)
    print(done.stdout[-3000:], flush=True)
    check(done.returncode == 0, f"{tag}: the run across the lab exited {done.returncode}: "
                                f"{done.stderr[-2000:]}")
    check(not namespaces(name), f"the lab's namespaces outlived the run: {namespaces(name)}")
    if done.returncode != 0:
        return None
    with open(os.path.join(log_dir, "summary.json")) as f:
        summary = json.load(f)
    accuracy = (summary.get("final") or {}).get("test_accuracy")
    check(accuracy is not None and accuracy >= 0.75,
          f"{tag}: final accuracy {accuracy} below 0.75")
    with open(counts) as f:
        links = {h["address"]: h for h in json.load(f)["hosts"]}
    with open(os.path.join(log_dir, "cluster.json")) as f:
        hosts = [p["host"] for p in json.load(f)["processes"]]
    check(sorted(set(hosts)) == sorted(links), f"processes ran on {hosts}, the lab's hosts "
                                               f"are {sorted(links)}")
    return log_dir, links[hosts[0]]


def training_crosses_the_links(tmp, name):
    ran = lab_training(tmp, name)
    if ran is None:
        return None
    log_dir, link = ran
    metrics = os.path.join(log_dir, "metrics-ps0.prom")
    pushed = prom_value(metrics, "parasync_ps_bytes_total", ['direction="in"', 'type="push"'])
    pulled = prom_value(metrics, "parasync_ps_bytes_total", ['direction="out"', 'type="pull"'])
    check(pushed and pulled and pushed > 100e6,
          f"the PS counted {pushed} bytes pushed, {pulled} pulled: no training crossed")
    if not (pushed and pulled):
        return None
    # Every tensor byte crossed the PS host's link; TCP/IP adds a few per cent, not more.
    for what, on_link, payload in (("received", link["rx_bytes"], pushed),
                                   ("sent", link["tx_bytes"], pulled)):
        check(payload <= on_link <= 1.10 * payload + 5e6,
              f"the PS host's link {what} {on_link:,} bytes for {payload:,.0f} of tensors")
        print(f"PS host {what} {on_link / 1e6:,.1f} MB on its link for {payload / 1e6:,.1f} MB "
              f"of tensors", flush=True)
    return link


def int8_crosses_in_a_quarter(tmp, name, float32_link):
    """--wire-dtype int8, the same epoch: the pushes cross the PS host's link in at most a
    quarter of float32's bytes (a byte per element, one per 128-element chunk, the same
    headers and TCP/IP), and so do the pulls of parameters (int8 changes to the worker's copy:
    delta pulls)."""
    ran = lab_training(tmp, name, wire="int8")
    if ran is None or float32_link is None:
        return
    _, link = ran
    for what, limit in (("rx_bytes", 0.27), ("tx_bytes", 0.27)):
        ratio = link[what] / float32_link[what]
        print(f"int8: the PS host's link {what} {link[what] / 1e6:,.1f} MB, "
              f"{ratio:.3f} of float32's", flush=True)
        check(ratio <= limit, f"int8: the PS host's {what} were {ratio:.3f} of float32's "
                              f"(at most {limit})")


def local_aggregation_halves_the_link(tmp, name, float32_link):
    """Two workers on one host, sync, --local-aggregation, the same epoch: the host's workers
    exchange each step through one of them, so the PS host's link carries one push and one
    pull per step for both — at most 0.55 of what one worker alone moved over the epoch
    (each worker of a flat pair moves that one's bytes over its half of the epoch, so a flat
    pair moves as much as one worker alone)."""
    ran = lab_training(tmp, name, grouped=True)
    if ran is None or float32_link is None:
        return
    log_dir, link = ran
    for what in ("rx_bytes", "tx_bytes"):
        ratio = link[what] / float32_link[what]
        print(f"local aggregation: the PS host's link {what} {link[what] / 1e6:,.1f} MB, "
              f"{ratio:.3f} of flat's", flush=True)
        check(ratio <= 0.55, f"local aggregation: the PS host's {what} were {ratio:.3f} of "
                             "flat's (at most 0.55)")
    # One rank pushed for both, and the servers applied the whole epoch: both ranks' examples.
    metrics = os.path.join(log_dir, "metrics-ps0.prom")
    pushed = [prom_value(metrics, "parasync_ps_worker_gradients_total", [f'rank="{r}"'])
              for r in (0, 1)]
    examples = prom_value(metrics, "parasync_ps_examples_total", [])
    check(pushed[0] and pushed[1] == 0,
          f"local aggregation: pushes by rank {pushed} (rank 0's should carry rank 1's)")
    check(examples == 60000, f"local aggregation: the servers applied {examples} examples, "
                             "not both workers' 60,000")
    print(f"local aggregation: pushes by rank {pushed}, {examples:,.0f} examples applied",
          flush=True)


def topk_both_ways_under_a_quarter(tmp, name):
    """A Horovod script (its own optimizer: the servers average) with hvd.Compression.topk,
    100 steps across the lab, evaluating every 40 (rows within the epoch): the PS host's link carries at most a quarter, each way, of
    what the same steps would move in float32 (steps x the model's elements x 4 bytes; the
    script's float32 broadcast of the model and its evaluation's collectives count on the
    top-k side only)."""
    log_dir = os.path.join(tmp, "run-hvd-topk")
    counts = os.path.join(tmp, "links-hvd-topk.json")
    script = os.path.join(SOURCE_DIR, "worker", "python", "examples", "horovod_mnist.py")
    launch = (f'set -- $NETLAB_HOSTS; exec {BIN_DIR}/parasync-launch --ps "$1:1" -H "$2:1" '
              f'--ssh-command "$NETLAB_EXEC" --mode sync --epochs 1 --max-steps 100 '
              f'--topk-probe off --log-dir {log_dir} --worker-command "/usr/bin/python3 {script} '
              f'--compression topk --test-examples 500 --eval-every 40 '
              f'--data {FASHION_MNIST}"')
    done = netlab("run", "--hosts", "2", "--rate", "1gbit", "--name", name, "--json", counts,
                  "--", "sh", "-c", launch, timeout=240)
    print(done.stdout[-2000:], flush=True)
    check(done.returncode == 0, f"hvd topk: the run across the lab exited {done.returncode}: "
                                f"{done.stderr[-2000:]}")
    if done.returncode != 0:
        return
    # The script's --eval-every 40: rows within the epoch at steps 40 and 80 of its 938.
    with open(os.path.join(log_dir, "eval.jsonl")) as f:
        epochs = [round(json.loads(line)["epoch"], 4) for line in f if line.strip()]
    check(epochs == [round(40 / 938, 4), round(80 / 938, 4), 1],
          f"hvd topk --eval-every 40: eval.jsonl's epochs {epochs}")
    metrics = os.path.join(log_dir, "metrics-ps0.prom")
    steps = prom_value(metrics, "parasync_ps_worker_gradients_total", ['rank="0"'])
    elements = prom_value(metrics, "parasync_ps_elements", [])
    check(steps == 100 and elements, f"hvd topk: {steps} pushes of {elements} elements")
    if not (steps and elements):
        return
    with open(counts) as f:
        links = {h["address"]: h for h in json.load(f)["hosts"]}
    with open(os.path.join(log_dir, "cluster.json")) as f:
        ps_host = [p["host"] for p in json.load(f)["processes"] if p["role"] == "ps"][0]
    float32 = steps * elements * 4
    for what in ("rx_bytes", "tx_bytes"):
        ratio = links[ps_host][what] / float32
        print(f"hvd topk: the PS host's link {what} {links[ps_host][what] / 1e6:,.2f} MB, "
              f"{ratio:.3f} of float32's {float32 / 1e6:,.2f} MB", flush=True)
        check(ratio <= 0.25, f"hvd topk: the PS host's {what} were {ratio:.3f} of float32's "
                             "(at most 0.25)")


def shaped(name):
    done = netlab("up", "--hosts", "2", "--rate", "200mbit", "--name", name)
    check(done.returncode == 0, f"netlab up: {done.stderr}")
    try:
        probe = netlab("probe", "--name", name, "--megabytes", "10")
        print(probe.stdout, end="", flush=True)
        check(probe.returncode == 0, f"netlab probe exited {probe.returncode}: {probe.stderr}")
        rates = [float(r.replace(",", "")) for r in re.findall(r"([\d,.]+) MB/s", probe.stdout)]
        # 200 Mbit/s is 25 MB/s: a probe can be slower on a busy machine, never faster.
        check(len(rates) == 2 and all(0 < r <= 25 * 1.15 for r in rates),
              f"probe rates {rates} MB/s on links shaped to 25 MB/s")
    finally:
        down = netlab("down", "--name", name)
        check(down.returncode == 0, f"netlab down: {down.stderr}")
    check(not namespaces(name), f"namespaces left after down: {namespaces(name)}")


def interrupted(name):
    """SIGTERM to `netlab run` while a process runs on a lab host: both go, and the lab."""
    run = subprocess.Popen([sys.executable, NETLAB, "run", "--hosts", "2", "--rate", "0",
                            "--name", name, "--", "sh", "-c", '$NETLAB_EXEC h1 "sleep 300"'],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def sleeper():
            out = subprocess.run(["ip", "netns", "pids", f"{name}-h1"], capture_output=True,
                                 text=True).stdout.split()
            return [int(p) for p in out]
        check(wait_for(lambda: sleeper(), 30), "no process appeared on host h1 within 30 s")
        pids = sleeper()
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=30)
        check(run.returncode != 0, "netlab run exited 0 after SIGTERM")
        check(not namespaces(name), f"namespaces left after SIGTERM: {namespaces(name)}")
        check(all(not os.path.exists(f"/proc/{p}") for p in pids),
              f"processes of the lab outlived it: {pids}")
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        netlab("down", "--name", name)


def main():
    bad_arguments()
    name = f"nlt{os.getpid() % 100000}"
    without_iproute2(name + "n")
    namespace_refused(name + "r")
    probe = netlab("up", "--hosts", "1", "--rate", "0", "--name", name)
    if probe.returncode == 3:
        print(f"SKIP: no network namespaces here: {probe.stderr.strip()}", flush=True)
        return 77 if not failures else 1
    check(probe.returncode == 0, f"netlab up --hosts 1: {probe.stderr}")
    netlab("down", "--name", name)
    with tempfile.TemporaryDirectory() as tmp:
        shaped(name + "s")
        float32_link = training_crosses_the_links(tmp, name + "t")
        int8_crosses_in_a_quarter(tmp, name + "q", float32_link)
        local_aggregation_halves_the_link(tmp, name + "g", float32_link)
        topk_both_ways_under_a_quarter(tmp, name + "k")
        interrupted(name + "i")
    if failures:
        print(f"{len(failures)} check(s) failed", flush=True)
        return 1
    print("all checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
