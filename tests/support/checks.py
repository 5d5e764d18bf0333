"""What the Python tests under tests/ share: checks that record a failure and go on, and the
closing line and exit status (0 only if every check held)."""

failures = []


def check(condition, message):
    """Records `message` as a failure (and prints it) unless `condition` holds; returns it."""
    if not condition:
        failures.append(message)
        print("FAIL: " + message, flush=True)
    return condition


def report():
    """Prints how the checks went; the exit status for main(): 1 if any failed, else 0."""
    if failures:
        print(f"{len(failures)} check(s) failed", flush=True)
        return 1
    print("all checks passed", flush=True)
    return 0


def require_torch():
    """Returns the torch module for a test that needs /usr/bin/python3's PyTorch; without it
    the test fails (exit 1), or skips (exit 77) where PARASYNC_ALLOW_NO_TORCH=1, for a machine
    where PyTorch cannot be installed (never set in CI)."""
    import os
    import sys
    try:
        import torch
    except ImportError as e:
        if os.environ.get("PARASYNC_ALLOW_NO_TORCH") == "1":
            print(f"SKIP: {sys.executable} cannot import {e.name} and PARASYNC_ALLOW_NO_TORCH=1")
            sys.exit(77)
        print(f"FAIL: {sys.executable} cannot import {e.name}: tools/install-deps.sh --tests "
              "installs python3-torch (PARASYNC_ALLOW_NO_TORCH=1 skips this test instead)")
        sys.exit(1)
    return torch
