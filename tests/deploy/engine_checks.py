"""What the engine tests (slurm_test.py, docker_test.py, systemd_test.py) share: the skip
status and the failed-checks list."""
import os

# Where the engine cannot run: 77 (ctest's skip), or a failure where it must run (the stage
# `engines` of tools/run-tests.sh sets PARASYNC_ENGINES_REQUIRED=1).
SKIP = 1 if os.environ.get("PARASYNC_ENGINES_REQUIRED") == "1" else 77

failures = []


def check(ok, message):
    """Records and prints a failed check; returns ok."""
    if not ok:
        failures.append(message)
        print(f"FAILED: {message}", flush=True)
    return ok
