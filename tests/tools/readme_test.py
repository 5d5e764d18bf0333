#!/usr/bin/python3
"""The README's commands, run as a new user would right after command 1, so that they cannot
rot; and every link of the README and docs/ reaches its file and heading.

  1. Every command of every ```sh block of README.md (lines joined at a trailing backslash,
     comment lines dropped) is classified by the first rule of RULES whose pattern matches
     it: run it, run it and stop it with Ctrl-C once its run is over, or skip it with a
     reason. A command no rule matches fails the test: a new command is classified on
     purpose, not skipped by accident.
  2. A command that runs runs with bash in a scratch directory made to look like a checkout
     after command 1: every top-level entry of the source tree linked in, `build` linked to
     the build tree under test, nothing else (what the runs write, runs/ and keys, stays
     there). Two changes, and only these, shorten it:
       - PARASYNC_SKIP_BUILD=1: tools/run-local-cluster.sh installs and builds nothing and
         runs the built binaries. Under CTest the build tree is the test build, and the
         script's tools/build.sh --quick would reconfigure it without its tests;
       - a training command (tools/run-local-cluster.sh, parasync-launch) gets `--epochs 1`
         (in place of the value it gives) and `--max-steps 30`.
     It must exit with status 0 and print the launcher's "run succeeded" and "final test
     accuracy" lines, and its "exit status:" line must name as many workers as the command
     asks for (2 when it does not say).
  3. The test can fail: README texts with a misspelt launcher flag, a command of no rule and
     a command that exits 1 each give a failure through the same path (SELF_CHECKS).
     `shorten` changes exactly the two flags (checked on examples), and
     PARASYNC_SKIP_BUILD=1 with a build tree that lacks the binaries exits 2 with one line.
  4. What the skipped build command makes is in the tree under test: tools/build.sh
     --python's package, build/python/parasync with libparasync_client.so.
  5. Every relative link in README.md and docs/**/*.md names a file that exists and, with a
     #fragment, a heading of that file (GitHub's anchors).

The PyTorch command needs /usr/bin/python3's PyTorch: without it the test FAILS;
PARASYNC_ALLOW_NO_TORCH=1 skips that command instead (the rest still runs).

Usage: readme_test.py SOURCE_DIR BIN_DIR
"""
import glob
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from checks import check, report  # noqa: E402

PYTHON = "/usr/bin/python3"
MAX_STEPS = "30"
TIMEOUT_S = 180

# (pattern on the whole command, action, why). Actions: "run"; "ctrl-c": run, and once the
# launcher says the run is over send SIGINT, as the user is told to; "skip".
RULES = [
    (r"bash tools/run-tests\.sh", "skip",
     "the whole test suite, this test among it (.ci/run runs it)"),
    (r"tools/build\.sh --python", "skip",
     "builds, and would rebuild the test build without its tests; what it makes is checked "
     "to be in the tree instead"),
    (r"PARASYNC_CUDA=\S+ bash tools/run-local-cluster\.sh .*--device=cuda.*", "skip",
     "needs a GPU, nvcc and cuDNN (ctest -L gpu and tools/gpu-checks.sh run the GPU worker)"),
    (r"tools/watch-run\.sh .*", "skip",
     "serves Prometheus on port 9090 until Ctrl-C (PrometheusTest runs tools/watch-run.sh "
     "against a live cluster on a port of its own)"),
    (r"tools/install-deps\.sh --engines && \(cd build && ctest -L engines.*", "skip",
     "installs the engines and runs the engine tests: the test command's stage `engines`"),
    (r"tools/slurm-lab run -- sbatch .*", "skip",
     "a Slurm job on a lab cluster: ctest slurm_engine submits the same script to it"),
    (r"build/bin/parasync-launch .*--metrics( .*)?", "ctrl-c", ""),
    (r"bash tools/run-local-cluster\.sh( .*)?", "run", ""),
    (r"build/bin/parasync-launch .*", "run", ""),
]

# README texts that must fail, and a word each failure must contain.
SELF_CHECKS = [
    ("```sh\nbuild/bin/parasync-launch --ps 2 --worker 2\n```\n", "exit status 2"),
    ("```sh\nmake install\n```\n", "no rule"),
    ("```sh\nbash tools/run-local-cluster.sh --worker-command false\n```\n", "exit status 1"),
]


def commands(markdown):
    """The commands of the ```sh blocks of `markdown`, continuation lines joined, comment
    and blank lines dropped, in order."""
    found, block, pending = [], None, ""
    for line in markdown.splitlines():
        if block is None:
            block = [] if line.strip() == "```sh" else None
            continue
        if line.startswith("```"):
            block = None
            continue
        text = pending + line.strip()
        if text.endswith("\\"):
            pending = text[:-1].rstrip() + " "
            continue
        pending = ""
        if text and not text.startswith("#"):
            found.append(text)
    return found


def classify(command):
    """(action, why) of the first rule matching `command`, or None."""
    for pattern, action, why in RULES:
        if re.fullmatch(pattern, command):
            return action, why
    return None


def shorten(words):
    """`words` of a training command with --epochs 1 (replacing its value) and --max-steps
    30 (unless it gives one); nothing else changed."""
    out, i, epochs = [], 0, False
    while i < len(words):
        if words[i] == "--epochs" and i + 1 < len(words):
            out += ["--epochs", "1"]
            i, epochs = i + 2, True
            continue
        if words[i].startswith("--epochs="):
            out.append("--epochs=1")
            i, epochs = i + 1, True
            continue
        out.append(words[i])
        i += 1
    if not epochs:
        out += ["--epochs", "1"]
    if not any(w == "--max-steps" or w.startswith("--max-steps=") for w in out):
        out += ["--max-steps", MAX_STEPS]
    return out


def wanted_workers(words):
    for i, w in enumerate(words):
        if w == "--workers" and i + 1 < len(words):
            return int(words[i + 1])
        if w.startswith("--workers="):
            return int(w.split("=", 1)[1])
    return 2


def scratch_checkout(source_dir, build_dir, where):
    """A directory under `where` with the source tree's entries linked in and `build` linked
    to `build_dir`: a checkout right after command 1, without its runs/."""
    root = os.path.join(where, "checkout")
    os.makedirs(root)
    for name in os.listdir(source_dir):
        if name in ("build", "runs", "data", ".git") or name.startswith("build-"):
            continue
        os.symlink(os.path.join(source_dir, name), os.path.join(root, name))
    os.symlink(build_dir, os.path.join(root, "build"))
    return root


def run_command(command, action, root, build_dir):
    """Runs one command in `root`, shortened; returns what is wrong with it ([] if nothing)."""
    words = shorten(shlex.split(command, comments=True))
    argv = ["bash", "-c", shlex.join(words)]
    print("$ " + shlex.join(words), flush=True)
    env = dict(os.environ, PARASYNC_SKIP_BUILD="1", BUILD_DIR=build_dir)
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    killed = []
    timer = threading.Timer(TIMEOUT_S, lambda: (killed.append(1), os.killpg(proc.pid, signal.SIGKILL)))
    timer.start()
    lines, interrupted = [], False
    for line in proc.stdout:
        print(line, end="", flush=True)
        lines.append(line)
        if action == "ctrl-c" and not interrupted and "] final test accuracy" in line:
            os.killpg(proc.pid, signal.SIGINT)
            interrupted = True
    proc.wait()
    timer.cancel()
    print(f"({time.monotonic() - t0:.1f} s)", flush=True)
    output = "".join(lines)
    problems = []
    if killed:
        problems.append(f"{command}: still running after {TIMEOUT_S} s, killed")
    if proc.returncode != 0:
        tail = " | ".join(l.strip() for l in lines[-3:])
        problems.append(f"{command}: exit status {proc.returncode}: {tail}")
        return problems
    for want in ("run succeeded", "final test accuracy"):
        if want not in output:
            problems.append(f"{command}: no '{want}' line")
    status = re.search(r"\] exit status: (.*)", output)
    workers = len(re.findall(r"\bworker\d+ exit", status.group(1))) if status else 0
    if workers != wanted_workers(words):
        problems.append(f"{command}: {workers} workers in the exit status line, "
                        f"{wanted_workers(words)} asked for")
    return problems


def run_markdown(markdown, root, build_dir, skip_torch):
    """Classifies and runs every command of `markdown`; returns the problems found."""
    problems = []
    for command in commands(markdown):
        rule = classify(command)
        if rule is None:
            problems.append(f"{command}: no rule of RULES classifies it (run it or skip it, "
                            "with the reason, in tests/tools/readme_test.py)")
            continue
        action, why = rule
        if action == "skip":
            print(f"skipped: {command}\n  ({why})", flush=True)
            continue
        if skip_torch and "--worker-command" in command and "python3" in command:
            print(f"skipped: {command}\n  (no PyTorch and PARASYNC_ALLOW_NO_TORCH=1)", flush=True)
            continue
        problems += run_command(command, action, root, build_dir)
    return problems


def github_anchors(path):
    """The #fragments GitHub gives the headings of the markdown file at `path`."""
    anchors, seen, fence = set(), {}, False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            fence = not fence
        m = None if fence else re.match(r"#{1,6} (.*)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def check_links(source_dir):
    files = [os.path.join(source_dir, "README.md")]
    files += sorted(glob.glob(os.path.join(source_dir, "docs", "**", "*.md"), recursive=True))
    links = 0
    for path in files:
        text = re.sub(r"```.*?```", "", open(path, encoding="utf-8").read(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            links += 1
            name, _, fragment = target.partition("#")
            where = os.path.normpath(os.path.join(os.path.dirname(path), name)) if name else path
            what = f"{os.path.relpath(path, source_dir)}: link {target}"
            if check(os.path.exists(where), f"{what}: no such file") and fragment and \
                    where.endswith(".md"):
                check(fragment in github_anchors(where), f"{what}: no such heading")
    print(f"{links} relative links in {len(files)} files checked", flush=True)


def check_skip_build(source_dir):
    with tempfile.TemporaryDirectory() as empty:
        proc = subprocess.run(["bash", os.path.join(source_dir, "tools", "run-local-cluster.sh")],
                              env=dict(os.environ, PARASYNC_SKIP_BUILD="1", BUILD_DIR=empty),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=60)
    check(proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and
          "PARASYNC_SKIP_BUILD" in proc.stderr and not proc.stdout,
          f"PARASYNC_SKIP_BUILD=1 without binaries: exit status {proc.returncode}, "
          f"stderr {proc.stderr!r}, stdout {proc.stdout[-300:]!r}")


def check_shorten():
    cases = {
        "bash tools/run-local-cluster.sh": "bash tools/run-local-cluster.sh --epochs 1 --max-steps 30",
        "bash tools/run-local-cluster.sh --model cnn --epochs 10 --mode sync":
            "bash tools/run-local-cluster.sh --model cnn --epochs 1 --mode sync --max-steps 30",
        "build/bin/parasync-launch --epochs=7 --max-steps 5 --worker-command 'a b'":
            "build/bin/parasync-launch --epochs=1 --max-steps 5 --worker-command 'a b'",
    }
    for command, want in cases.items():
        got = shlex.join(shorten(shlex.split(command)))
        check(got == want, f"shorten({command!r}) = {got!r}, want {want!r}")


def main():
    source_dir, bin_dir = (os.path.abspath(a) for a in sys.argv[1:3])
    build_dir = os.path.dirname(bin_dir)
    skip_torch = subprocess.run([PYTHON, "-c", "import torch"], capture_output=True).returncode != 0
    if skip_torch and os.environ.get("PARASYNC_ALLOW_NO_TORCH") != "1":
        print(f"FAIL: {PYTHON} has no PyTorch, which the README's PyTorch command needs: "
              "tools/install-deps.sh --tests installs python3-torch (PARASYNC_ALLOW_NO_TORCH=1 "
              "skips that command instead)", flush=True)
        return 1
    check_links(source_dir)
    check_shorten()
    check_skip_build(source_dir)
    package = os.path.join(build_dir, "python", "parasync")
    check(os.path.isfile(os.path.join(package, "libparasync_client.so")) and
          os.path.isfile(os.path.join(package, "torch.py")),
          f"{package}: not there with libparasync_client.so (what tools/build.sh --python makes)")
    with tempfile.TemporaryDirectory(prefix="readme-test-") as tmp:
        self_checks = scratch_checkout(source_dir, build_dir, os.path.join(tmp, "self"))
        root = scratch_checkout(source_dir, build_dir, os.path.join(tmp, "readme"))
        for text, word in SELF_CHECKS:
            found = run_markdown(text, self_checks, build_dir, skip_torch)
            check(any(word in p for p in found),
                  f"the self-check README {text!r} gave {found}, want a failure with '{word}'")
        readme = open(os.path.join(source_dir, "README.md"), encoding="utf-8").read()
        check(len(commands(readme)) > 0, "README.md has no ```sh command")
        for problem in run_markdown(readme, root, build_dir, skip_torch):
            check(False, problem)
    return report()


if __name__ == "__main__":
    sys.exit(main())
