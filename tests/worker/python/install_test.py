#!/usr/bin/env python3
"""cmake --install gives a working Python worker: the installed parasync-launch runs a
--worker-command that imports the installed package (found on its own, beside the
binaries) with the installed library, trains a step against the installed servers, and the
run's summary sees it.

Usage: install_test.py BUILD_DIR CMAKE SOURCE_DIR
"""

import json
import os
import subprocess
import sys
import tempfile

BUILD_DIR, CMAKE, SOURCE_DIR = sys.argv[1:4]
sys.path[:0] = [os.path.join(SOURCE_DIR, "tests", "support")]
from checks import check, report  # noqa: E402

WORKER = """
import sys
import numpy as np
import parasync
prefix = sys.argv[1]
assert parasync.__file__.startswith(prefix), parasync.__file__
assert parasync._capi._library_path().startswith(prefix), parasync._capi._library_path()
client = parasync.Client()
client.register([parasync.Variable("w", (4,))], optimizer="sgd", lr=0.5,
                initial_values=[np.ones(4, np.float32)] if client.is_chief else None)
w = np.zeros(4, np.float32)
client.pull([w])
client.push([np.ones(4, np.float32)], examples=10)
client.record_step(10, 0.5, 0.0, 0.0, 0.0)
if client.is_chief:
    client.wait_for_workers(60)
    client.log_eval(1, 0.5, 1.0)
client.finish()
print("installed worker", client.rank, "ok", flush=True)
"""


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        prefix = os.path.join(d, "prefix")
        done = subprocess.run([CMAKE, "--install", BUILD_DIR, "--prefix", prefix],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        check(done.returncode == 0, f"cmake --install failed: {done.stdout[-2000:]}")
        script = os.path.join(d, "worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",
                                                                 "PARASYNC_CLIENT_LIBRARY")}
        log_dir = os.path.join(d, "run")
        run = subprocess.run(
            [os.path.join(prefix, "bin", "parasync-launch"), "--ps", "2", "--workers", "2",
             "--epochs", "1", "--log-dir", log_dir,
             "--worker-command", f"/usr/bin/python3 {script} {prefix}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=300)
        print(run.stdout[-3000:], flush=True)
        check(run.returncode == 0, f"the installed launcher exited {run.returncode}")
        check(run.stdout.count("installed worker") == 2, "not both workers ran to the end")
        with open(os.path.join(log_dir, "summary.json")) as f:
            summary = json.load(f)
        check(summary.get("examples") == 20, f"the summary counted {summary.get('examples')} "
                                             "examples, not 20")
    return report()


if __name__ == "__main__":
    sys.exit(main())
