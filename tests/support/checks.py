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
