#!/usr/bin/python3
"""The PyTorch examples (worker/python/examples/) and the DDP baseline
(tools/benchmarks/torch_ddp_cnn.py) train, on CI-sized subsets, to figures a broken model
cannot reach; they take parasync's models; they refuse bad input and the reference BLAS.

  1. KerasCnn and CtrModel's MLP are parasync's `cnn` and `ctr`: models.CNN_SPEC and
     models.CTR_MLP_SPEC equal what parasync-bench-compute --describe prints (the layers
     tools/benchmarks/torch_model.py builds, which torch_parity_test.py checks against
     parasync's CPU backend).
  2. Each local example, 1 epoch on a subset, reaches its floor (FLOORS: measured on the
     2-core development VM, then given a margin); every figure is deterministic from the
     seed, so a floor missed means the model or its data changed:
       cnn_local.py      6,000 Fashion-MNIST examples: test accuracy (an untrained model: 0.1)
       seq2seq_local.py  6,000 dates, 3 epochs: exact-sequence and character accuracy on 500
                         test dates (a model that ignores its source: ~0 and 0.507, the best
                         fixed string's)
       ctr_local.py      parasync-gen-ctr --train 50000 --test 5000 --vocab 1000 --fields 4,
                         3 epochs: test AUC within CTR_MARGIN of the planted model's (a model
                         that ignores its inputs: 0.5)
     and each prints one progress line per epoch and a final JSON line naming its BLAS and
     the allocator it started with (tools/benchmarks/torch_env.py's ALLOCATOR, "from the
     start": the script started itself again with it; no mallopt after start).
  3. torch_ddp_cnn.py, 2 processes on 4,000 examples for 1 epoch: its epoch line and JSON,
     and its accuracy floor; the JSON's "torch" is rank 0's, a process mp.spawn started, so
     its allocator "from the start" is the one it inherited.
  4. Bad flags or data: exit status 2 and one line on stderr, nothing trained. On the
     reference BLAS (forced by LD_LIBRARY_PATH, where libblas3 is installed) every script
     refuses: exit status 2, the refusal its one stderr line.

PyTorch is /usr/bin/python3's. Without it the test FAILS; PARASYNC_ALLOW_NO_TORCH=1 makes it
skip instead (exit 77).

Usage: torch_examples_test.py BIN_DIR SOURCE_DIR
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from checks import check, report  # noqa: E402

PYTHON = "/usr/bin/python3"
REFERENCE = "/usr/lib/x86_64-linux-gnu/blas"
# Measured (seed 1, 1 thread): cnn 0.8136; seq2seq exact 0.196, characters 0.868; ctr 0.0139
# below the planted AUC (0.7797 against 0.7936); ddp 0.7752 (2 x 2,000 examples).
FLOORS = {"cnn": 0.70, "seq2seq": 0.05, "seq2seq_characters": 0.75, "ddp": 0.60}
CTR_MARGIN = 0.04
REFUSAL = re.compile(r"PyTorch runs on the reference BLAS .*not a fair baseline")
ALLOCATOR = None  # the one tools/benchmarks/torch_env.py chooses, read in main()


def run(argv, **env):
    """Runs argv (installing nothing; `env` added to the environment), prints its output and
    time, and returns the finished process."""
    print("$ " + " ".join(argv), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=dict(os.environ, PARASYNC_NO_INSTALL="1", **env), timeout=240)
    print(proc.stdout + proc.stderr + f"({time.perf_counter() - t0:.1f} s)", flush=True)
    return proc


def result(proc, what, epochs):
    """The final JSON line of a run that must have succeeded with `epochs` epoch lines; {}
    after recording why not."""
    if not check(proc.returncode == 0, f"{what}: exit status {proc.returncode}"):
        return {}
    lines = proc.stdout.strip().splitlines()
    check(sum(l.startswith("epoch ") for l in lines) == epochs,
          f"{what}: want {epochs} epoch line(s)")
    try:
        record = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        check(False, f"{what}: the last line is not JSON")
        return {}
    check("BLAS: OpenBLAS" in record.get("torch", ""),
          f"{what}: its JSON does not name OpenBLAS: {record.get('torch')!r}")
    named = re.escape(ALLOCATOR) if ALLOCATOR else r"\S+"
    started = re.search(r"; allocator " + named + r" \(.*from the start[:)]",
                        record.get("torch", ""))
    check(started and "mallopt" not in record.get("torch", ""),
          f"{what}: its JSON does not name the allocator {ALLOCATOR or '(any)'} from the start: "
          f"{record.get('torch')!r}")
    return record


def one_line_refusal(proc, what, pattern):
    """`proc` exited 2 with one stderr line matching `pattern` and trained nothing."""
    err = proc.stderr.strip().splitlines()
    check(proc.returncode == 2, f"{what}: exit status {proc.returncode}, want 2")
    check(len(err) == 1 and re.search(pattern, err[0]),
          f"{what}: stderr {err!r} is not one line matching {pattern!r}")
    check("epoch" not in proc.stdout, f"{what}: trained anyway")


def same_models(bin_dir, models):
    """1. The examples' specs are parasync's built-ins."""
    def describe(model):
        out = subprocess.run([os.path.join(bin_dir, "parasync-bench-compute"), "--model",
                              model, "--describe"], stdout=subprocess.PIPE, text=True,
                             check=True).stdout
        return json.loads(out)
    cnn = describe("cnn")
    check(cnn == models.CNN_SPEC, f"models.CNN_SPEC {models.CNN_SPEC} is not parasync's cnn {cnn}")
    ctr = describe("ctr")
    check(ctr["layers"][1:] == models.CTR_MLP_SPEC["layers"],
          f"models.CTR_MLP_SPEC's layers are not parasync's ctr's after its embedding: "
          f"{ctr['layers'][1:]}")
    check(ctr["layers"][0]["dim"] == models.CTR_DIM,
          f"ctr's embedding dim is {ctr['layers'][0]['dim']}, models.CTR_DIM {models.CTR_DIM}")


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    bin_dir, source = sys.argv[1], sys.argv[2]
    if subprocess.run([PYTHON, "-c", "import torch"], stderr=subprocess.DEVNULL).returncode:
        if os.environ.get("PARASYNC_ALLOW_NO_TORCH") == "1":
            print(f"SKIP: {PYTHON} has no PyTorch and PARASYNC_ALLOW_NO_TORCH=1")
            return 77
        print(f"FAIL: {PYTHON} has no PyTorch: tools/install-deps.sh --tests installs "
              "python3-torch (PARASYNC_ALLOW_NO_TORCH=1 skips this test instead)")
        return 1
    examples = os.path.join(source, "worker", "python", "examples")
    sys.path.insert(0, os.path.join(source, "tools", "benchmarks"))
    import torch_env
    global ALLOCATOR
    # ALLOCATOR, or PARASYNC_TORCH_ALLOCATOR's (None: torch_env.py chooses none).
    ALLOCATOR = torch_env.chosen() if hasattr(torch_env, "chosen") else None
    sys.path.insert(0, examples)
    import models
    same_models(bin_dir, models)
    cnn = os.path.join(examples, "cnn_local.py")
    seq2seq = os.path.join(examples, "seq2seq_local.py")
    ctr = os.path.join(examples, "ctr_local.py")
    ddp = os.path.join(source, "tools", "benchmarks", "torch_ddp_cnn.py")

    # 2. Each example on a subset.
    r = result(run([PYTHON, cnn, "--epochs", "1", "--train-examples", "6000", "--threads",
                    "1"]), "cnn_local.py", 1)
    check(r.get("value", 0) >= FLOORS["cnn"],
          f"cnn_local.py: test accuracy {r.get('value')} below {FLOORS['cnn']}")
    r = result(run([PYTHON, seq2seq, "--epochs", "3", "--train-examples", "6000",
                    "--test-examples", "500", "--threads", "1"]), "seq2seq_local.py", 3)
    check(r.get("value", 0) >= FLOORS["seq2seq"],
          f"seq2seq_local.py: exact-sequence accuracy {r.get('value')} below "
          f"{FLOORS['seq2seq']}")
    check(r.get("character_accuracy", 0) >= FLOORS["seq2seq_characters"],
          f"seq2seq_local.py: character accuracy {r.get('character_accuracy')} below "
          f"{FLOORS['seq2seq_characters']}")
    with tempfile.TemporaryDirectory(prefix="torch_examples.") as work:
        gen = subprocess.run([os.path.join(bin_dir, "parasync-gen-ctr"), "--out", work,
                              "--train", "50000", "--test", "5000", "--vocab", "1000",
                              "--fields", "4"], stdout=subprocess.PIPE, text=True, check=True)
        print(gen.stdout, flush=True)
        planted = float(re.search(r"planted model on test: .* AUC ([0-9.]+)", gen.stdout)[1])
        r = result(run([PYTHON, ctr, "--data", work, "--epochs", "3", "--threads", "1"]),
                   "ctr_local.py", 3)
        check(r.get("value", 0) >= planted - CTR_MARGIN,
              f"ctr_local.py: test AUC {r.get('value')} more than {CTR_MARGIN} below the "
              f"planted model's {planted}")

    # 3. DDP, 2 processes.
    proc = run([PYTHON, ddp, "--processes", "2", "--epochs", "1", "--train-examples", "4000"])
    r = result(proc, "torch_ddp_cnn.py", 1)
    check(re.search(r"^epoch 1: test accuracy [0-9.]+, wall [0-9.]+ s, train [0-9.]+ s, "
                    r"[0-9]+ examples/s \(all processes\)$", proc.stdout, re.M),
          "torch_ddp_cnn.py: no epoch line in its format")
    check(r.get("processes") == 2 and r.get("train_examples") == 4000,
          f"torch_ddp_cnn.py: its JSON says {r.get('processes')} processes and "
          f"{r.get('train_examples')} examples, want 2 and 4000")
    accuracy = (r.get("test_accuracy") or [0])[-1]
    check(accuracy >= FLOORS["ddp"],
          f"torch_ddp_cnn.py: test accuracy {accuracy} below {FLOORS['ddp']}")

    # 4. Bad input, and the reference BLAS.
    for script in (cnn, seq2seq, ctr, ddp):
        name = os.path.basename(script)
        data = ["--data", "/nonexistent"] if script == ctr else []  # ctr_local.py needs one
        one_line_refusal(run([PYTHON, script, "--epochs", "0", *data]), f"{name} --epochs 0",
                         rf"^{name}: --epochs must be at least 1, not 0$")
        one_line_refusal(run([PYTHON, script, "--lr", "nan", *data]), f"{name} --lr nan",
                         rf"^{name}: --lr must be a positive number")
    for script in (cnn, ddp):
        name = os.path.basename(script)
        one_line_refusal(run([PYTHON, script, "--data", "/nonexistent"]),
                         f"{name} --data /nonexistent",
                         rf"^{name}: .*/nonexistent/train-images-idx3-ubyte\.gz")
    one_line_refusal(run([PYTHON, ctr, "--data", "/nonexistent"]), "ctr_local.py --data",
                     r"^ctr_local.py: no /nonexistent/train_ids.npy")
    if not os.path.exists(f"{REFERENCE}/libblas.so.3"):
        print(f"SKIP (the reference BLAS): none in {REFERENCE} (libblas3)")
    else:
        for script in (cnn, seq2seq, ddp):
            one_line_refusal(run([PYTHON, script, "--epochs", "1", "--train-examples", "64"],
                                 LD_LIBRARY_PATH=REFERENCE),
                             f"{os.path.basename(script)} on the reference BLAS", REFUSAL)
    return report()


if __name__ == "__main__":
    sys.exit(main())
