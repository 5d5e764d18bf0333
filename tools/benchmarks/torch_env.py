#!/usr/bin/env python3
"""What a PyTorch process computes with on the CPU, and whether its CPU figures may stand
beside parasync's: the one place the PyTorch baselines (tools/bench-worker, torch_model.py,
torch_train.py, torch_ddp_cnn.py, bench_torch_workers.py's and bench_netlab.py's DDP, the
examples' harness) decide it: the BLAS and the memory allocator.

The allocator is set before the process starts: each baseline calls start_with_allocator
first thing, before it imports torch, and where the environment it started with lacks the
allocator's variables (ALLOCATORS[ALLOCATOR]; PARASYNC_TORCH_ALLOCATOR names another, for
an A/B run) the same interpreter runs the same arguments again with them (os.execve: the
same pid), so that the process and every process it starts (DDP's ranks) has them from its
start. check() refuses a CPU baseline that lacks them, and the ran-with line names the
allocator as found in the process (/proc/self/environ, the libraries it mapped).

Debian's python3-torch (BLAS_INFO=generic) does its matrix products in whatever BLAS
libblas.so.3 resolves to. With only libblas3 installed that is the reference BLAS (netlib's
plain loops), on which a dense model runs many times slower: tools/bench-worker printed
parasync 47x faster than PyTorch there, 5.9x with OpenBLAS. A comparison against it says
nothing about parasync, so it is refused.

The BLAS is found in the running process, after a matrix product: the file that defines
libblas.so.3's sgemm_ (dladdr; it must be mapped, /proc/self/maps), identified by the
functions its dependency tree exports (openblas_get_config, bli_info_get_version_str,
MKL_Get_Version_String); without any, it is taken for the reference BLAS. A PyTorch built
with its BLAS inside (a pip wheel: MKL, BLAS_INFO=mkl or open) maps no libblas.so.3.

  torch_env.py [--threads N] [--install]
  torch_env.py --allocator-env

Prints one line: what PyTorch runs with (its version, the BLAS with its library and
threads, oneDNN, ATen's threads, the CPU capability), and exits 0 when the BLAS is an
optimized one. On the reference BLAS, or one it cannot identify, it prints one line on
stderr naming the library and the fix instead, and exits 2 (also when PyTorch is missing).
--threads N: as torch.set_num_threads(N), the BLAS's own pool included (OpenBLAS and BLIS
keep theirs otherwise). --install: when that check fails, installs python3-torch and
libopenblas0-pthread (tools/install-deps.sh; PARASYNC_NO_INSTALL=1 makes it install
nothing) and checks again in a fresh process (a process cannot change the BLAS it mapped).
Either way the check runs in a process started with the allocator. --allocator-env prints
the allocator's variables, NAME=VALUE a line (for env(1): tools/bench-worker --reference).
"""
import argparse
import ctypes
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# What tools/install-deps.sh installs for a fair baseline: OpenBLAS beside Debian's PyTorch,
# which its package registers as libblas.so.3 above the reference BLAS.
PACKAGES = ["python3-torch", "libopenblas0-pthread"]
# Debian's optimized BLASes, each a libblas.so.3 the alternative can point at.
OPTIMIZED = [f"/usr/lib/x86_64-linux-gnu/{d}/libblas.so.3"
             for d in ("openblas-pthread", "openblas-openmp", "openblas-serial",
                       "blis-pthread", "blis-openmp", "blis-serial")]


# The allocator every PyTorch baseline runs with, set in its environment before the process
# starts (start_with_allocator): name -> (the variables it sets, the Debian package of a
# preloaded library or None). PyTorch allocates every activation and gradient afresh each
# step, and on this VM (a Firecracker guest) a page touched for the first time costs several
# microseconds, so an allocator that hands freed memory back to the kernel makes PyTorch pay
# for it again every step (BASELINES.md, "Memory"). glibc reads MALLOC_*_ when the process
# starts, before anything is allocated; a preloaded allocator replaces malloc from the
# start. Setting them before the process starts is what a user tuning PyTorch from outside
# does, and what this module did not (it called mallopt() after start). "glibc" (its
# defaults) is there for A/B runs only.
_LIB = "/usr/lib/x86_64-linux-gnu"
MMAP_THRESHOLD = 32 << 20  # glibc's largest
ALLOCATORS = {
    "glibc-keep": ({"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
                    "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1)}, None),
    "tcmalloc": ({"LD_PRELOAD": f"{_LIB}/libtcmalloc_minimal.so.4"}, "libtcmalloc-minimal4"),
    "jemalloc": ({"LD_PRELOAD": f"{_LIB}/libjemalloc.so.2"}, "libjemalloc2"),
    "glibc": ({}, None),
}
# The best of them for the CNN step here (torch_reference.py --compare, BASELINES.md).
ALLOCATOR = "glibc-keep"
# Names another of ALLOCATORS for a run (an A/B measurement); also marks a process this
# module started again, so that it never does so twice.
ALLOCATOR_VARIABLE = "PARASYNC_TORCH_ALLOCATOR"
_REEXECUTED = "PARASYNC_TORCH_ALLOCATOR_REEXECUTED"
# glibc's mallopt parameters (keep_freed_memory).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_mallopt_called = False


def allocator_env(name):
    """The variables to add to a child's environment so that it starts with allocator `name`
    (LD_PRELOAD keeps what the current environment preloads, after the allocator)."""
    env = dict(ALLOCATORS[name][0])
    if "LD_PRELOAD" in env and os.environ.get("LD_PRELOAD"):
        env["LD_PRELOAD"] += " " + os.environ["LD_PRELOAD"]
    return env


def environment_for(name, base=None):
    """A copy of `base` (default: this process's environment) in which allocator `name` is
    the only one of ALLOCATORS: every other one's variables removed and its library taken out
    of LD_PRELOAD (an A/B run's children must not inherit the parent's allocator), then
    `name`'s added (allocator_env: its library first in LD_PRELOAD)."""
    env = dict(os.environ if base is None else base)
    libraries = {os.path.realpath(v["LD_PRELOAD"]) for v, _ in ALLOCATORS.values()
                 if "LD_PRELOAD" in v}
    for variables, _ in ALLOCATORS.values():
        for k in variables:
            if k != "LD_PRELOAD":
                env.pop(k, None)
    rest = [p for p in env.pop("LD_PRELOAD", "").split() if os.path.realpath(p) not in libraries]
    if rest:
        env["LD_PRELOAD"] = " ".join(rest)
    added = dict(ALLOCATORS[name][0])
    if "LD_PRELOAD" in added and rest:
        added["LD_PRELOAD"] += " " + env["LD_PRELOAD"]
    env.update(added)
    return env


def missing_library(name):
    """None when allocator `name` can be used here; else the line saying what to install."""
    variables, package = ALLOCATORS[name]
    library = variables.get("LD_PRELOAD")
    if library and not os.path.exists(library):
        return (f"the allocator {name} needs {library}: install it (tools/install-deps.sh "
                f"{package}) and run again")
    return None


def chosen():
    """The allocator this process must run with: $PARASYNC_TORCH_ALLOCATOR, else ALLOCATOR;
    None when the variable names none of ALLOCATORS."""
    name = os.environ.get(ALLOCATOR_VARIABLE) or ALLOCATOR
    return name if name in ALLOCATORS else None


def _initial_environment():
    """The environment this process was started with (/proc/self/environ: what execve gave
    it, whatever os.environ became since)."""
    with open("/proc/self/environ", "rb") as f:
        return dict(e.decode(errors="replace").partition("=")[::2]
                    for e in f.read().split(b"\0") if e)


def _preloaded():
    """The real paths of the ALLOCATORS' preloaded libraries this process has mapped."""
    libraries = {os.path.realpath(v[0]["LD_PRELOAD"]) for v in ALLOCATORS.values()
                 if "LD_PRELOAD" in v[0]}
    return sorted(libraries & _mapped())


def in_force(name):
    """True when this process started with allocator `name`: its variables in the
    environment it was started with, and its library (if any) mapped; "glibc" when no
    allocator library is mapped and none of glibc-keep's variables was set."""
    start = _initial_environment()
    variables, _ = ALLOCATORS[name]
    if name == "glibc":
        return not _preloaded() and not any(k in start for k in ALLOCATORS["glibc-keep"][0])
    if "LD_PRELOAD" not in variables and _preloaded():
        return False  # glibc's variables, but another allocator replaced glibc's malloc
    for k, v in variables.items():
        if k == "LD_PRELOAD":
            if os.path.realpath(v) not in _mapped():
                return False
        elif start.get(k) != v:
            return False
    return True


def start_with_allocator(program):
    """Called first thing by every PyTorch baseline, before it imports torch: unless the
    process already started with the chosen allocator (chosen()), runs the same interpreter
    on the same arguments again (os.execve) with the allocator's variables added to its
    environment, so that it, and every process it starts (DDP's ranks), runs with them from
    its start. Returns the allocator's name when it is in force; None when torch was
    imported already (too late to start again: check() then refuses a CPU baseline). Exits
    2 with one line when the allocator is unknown, its library is missing, or the process
    started again still lacks it."""
    name = chosen()
    if name is None:
        print(f"{program}: {ALLOCATOR_VARIABLE}={os.environ[ALLOCATOR_VARIABLE]} is none of "
              f"{', '.join(ALLOCATORS)}", file=sys.stderr)
        sys.exit(2)
    if in_force(name):
        return name
    if "torch" in sys.modules:
        return None
    missing = missing_library(name)
    if not missing and os.environ.get(_REEXECUTED) == name:
        missing = f"started again with the allocator {name}, and it is still not in force"
    if missing:
        print(f"{program}: {missing}", file=sys.stderr)
        sys.exit(2)
    env = environment_for(name)
    env[_REEXECUTED] = name
    sys.stdout.flush()
    sys.stderr.flush()
    # sys.orig_argv (Python 3.10+) keeps the interpreter's own options (-c, -m, -u);
    # before 3.10 the script's path and arguments are what there is.
    argv = getattr(sys, "orig_argv", None) or [sys.executable] + sys.argv
    os.execve(sys.executable, [sys.executable] + argv[1:], env)


def keep_freed_memory():
    """For a process that imported torch before it could start with the allocator (parasync's
    own Python worker, worker/python/examples/train.py, whose parasync.torch imports it):
    glibc's M_MMAP_THRESHOLD to 32 MiB and no trimming, set now with mallopt, as before.
    Weaker than the same settings from the start (see ALLOCATORS), and named so by
    allocator_setting()."""
    global _mallopt_called
    libc = ctypes.CDLL("libc.so.6")
    _mallopt_called = bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and
                           libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))


def allocator_setting():
    """One phrase: the allocator this process runs with, as found in it (the environment it
    started with, the libraries it mapped, a mallopt call)."""
    start = _initial_environment()
    mapped = _preloaded()
    glibc = [f"{k}={start[k]}" for k in ALLOCATORS["glibc-keep"][0] if k in start]
    if mapped:
        names = [n for n, (v, _) in ALLOCATORS.items()
                 if "LD_PRELOAD" in v and os.path.realpath(v["LD_PRELOAD"]) in mapped]
        text = f"allocator {'+'.join(names)} (preloaded from the start: {', '.join(mapped)})"
    elif glibc:
        text = f"allocator glibc-keep (glibc malloc, {' '.join(glibc)} from the start)"
    elif not _mallopt_called:
        text = "allocator glibc (malloc's defaults)"
    else:
        text = "allocator glibc"
    if _mallopt_called:
        text += f", mallopt after start (M_MMAP_THRESHOLD {MMAP_THRESHOLD >> 20} MiB, no trim)"
    return text


class _DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]


def _file_of(function):
    """The real path of the shared object that defines `function` (a ctypes function)."""
    dladdr = ctypes.CDLL(None).dladdr
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    info = _DlInfo()
    if not dladdr(ctypes.cast(function, ctypes.c_void_p), ctypes.byref(info)) or not info.fname:
        return None
    return os.path.realpath(info.fname.decode())


def _mapped():
    """The real paths of every file this process has mapped."""
    with open("/proc/self/maps") as f:
        return {l.split(None, 5)[5].strip() for l in f if len(l.split(None, 5)) == 6}


def _implementation(lib):
    """(name, threads, set_threads) of the BLAS behind the loaded `lib` (a CDLL whose
    dependency tree dlsym searches), or None when it exports none of an optimized one's."""
    def fn(name, restype=ctypes.c_int):
        try:
            f = getattr(lib, name)
        except AttributeError:
            return None
        f.restype = restype
        return f

    config = fn("openblas_get_config", ctypes.c_char_p)
    if config:
        parallel = {0: "sequential", 1: "pthreads", 2: "OpenMP"}.get(
            fn("openblas_get_parallel")(), "?")
        core = fn("openblas_get_corename", ctypes.c_char_p)()
        name = " ".join(config().decode().split()[:2])  # "OpenBLAS 0.3.21"
        return (f"{name} ({core.decode()} kernels, {parallel})",
                fn("openblas_get_num_threads"), fn("openblas_set_num_threads", None))
    version = fn("bli_info_get_version_str", ctypes.c_char_p)
    if version:
        return (f"BLIS {version().decode()}",
                fn("bli_thread_get_num_threads"), fn("bli_thread_set_num_threads", None))
    mkl = fn("MKL_Get_Version_String", None)
    if mkl:
        buf = ctypes.create_string_buffer(200)
        mkl(buf, len(buf))
        return (buf.value.decode().strip(),
                fn("mkl_get_max_threads"), None)  # MKL follows torch.set_num_threads
    return None


def blas(torch):
    """What PyTorch's matrix products run on in this process: a dict with "name", "library"
    (the libblas.so.3 file mapped, or None when the BLAS is inside PyTorch), "threads"
    (the BLAS's own pool, or None when it follows PyTorch's), "optimized" (False for the
    reference BLAS or one not identified) and "set_threads" (a function of N, or None)."""
    a = torch.ones(8, 8)
    (a @ a).sum().item()  # a matrix product first, as the benchmarks make
    config = torch.__config__.show()
    info = re.search(r"BLAS_INFO=(\w+)", config)
    blas_info = info.group(1) if info else "?"
    try:
        lib = ctypes.CDLL("libblas.so.3", mode=os.RTLD_NOLOAD)
    except OSError:
        lib = None
    if lib is None or not hasattr(lib, "sgemm_"):
        inside = {"mkl": "MKL", "open": "OpenBLAS"}.get(blas_info)
        if inside or torch.backends.mkl.is_available():
            return {"name": f"{inside or 'MKL'} inside PyTorch (BLAS_INFO={blas_info})",
                    "library": None, "threads": None, "optimized": True, "set_threads": None}
        return {"name": f"none identified (BLAS_INFO={blas_info}, no libblas.so.3 mapped)",
                "library": None, "threads": None, "optimized": False, "set_threads": None}
    library = _file_of(lib.sgemm_)
    if library not in _mapped():
        library = f"{library} (not found in /proc/self/maps)"
    found = _implementation(lib)
    if found is None:
        return {"name": "the reference BLAS", "library": library, "threads": 1,
                "optimized": False, "set_threads": None}  # netlib's: single-threaded
    name, threads, set_threads = found
    return {"name": name, "library": library, "threads": threads() if threads else None,
            "optimized": True, "set_threads": set_threads}


def describe(torch, b, gpu=False):
    """One line: PyTorch's version, its BLAS (library, threads), oneDNN, ATen's threads and
    the CPU capability it dispatches to; with `gpu`, its CUDA and cuDNN too."""
    config = torch.__config__.show()
    parallel = torch.__config__.parallel_info()

    def find(pattern, text, default="?"):
        m = re.search(pattern, text)
        return m.group(1) if m else default

    threads = (f"{b['threads']} thread(s)" if b["threads"] is not None
               else "PyTorch's threads")
    onednn = find(r"MKL-DNN (v[0-9.]+)", config)
    aten = find(r"ATen parallel backend: (\w+)", parallel)
    capability = find(r"CPU capability usage: (\w+)", config)
    library = f" via {b['library']}" if b["library"] else ""
    env = [f"{k}={os.environ[k]}" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                           "MKL_NUM_THREADS") if k in os.environ]
    return (f"PyTorch {torch.__version__}; BLAS: {b['name']}{library}, {threads}; "
            f"oneDNN {onednn}; ATen {aten}, {torch.get_num_threads()} intra-op thread(s); "
            f"CPU capability {capability}"
            + (f"; {' '.join(env)}" if env else "")
            + (f"; CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}"
               if gpu else "")
            + f"; {allocator_setting()}")


def refusal(b):
    """The line that refuses a comparison against `b` (not optimized): the library and the
    fix."""
    where = b["library"] or "no libblas.so.3"
    if b["library"]:
        where += ": no OpenBLAS, BLIS or MKL functions in it"
    present = [p for p in OPTIMIZED if os.path.exists(p)]
    if present:
        fix = (f"an optimized one is installed but libblas.so.3 does not resolve to it: "
               f"sudo update-alternatives --set libblas.so.3-x86_64-linux-gnu {present[0]}, "
               f"or LD_LIBRARY_PATH={os.path.dirname(present[0])}, and run again")
    else:
        fix = f"install one (tools/install-deps.sh {PACKAGES[1]}) and run again"
    return (f"PyTorch runs on {b['name']} ({where}), many times slower than an optimized "
            f"BLAS: not a fair baseline, so nothing is timed; {fix}")


def sized_to_torch(torch):
    """blas(torch), after sizing the BLAS's own pool (where it keeps one) as PyTorch's
    threads: Debian's PyTorch does not, and OpenBLAS keeps a thread per core otherwise."""
    b = blas(torch)
    if b["set_threads"]:
        b["set_threads"](torch.get_num_threads())
        b = blas(torch)
    return b


def check(torch, program, cpu=True, out=sys.stderr, allocator=True):
    """Prints "PROGRAM: ran with: <describe>" on `out`. For a CPU run (`cpu`), sizes the
    BLAS's own pool as PyTorch's threads, and returns False after printing "PROGRAM:
    <refusal>" on stderr when the BLAS is not an optimized one or (with `allocator`) when
    the process did not start with the chosen allocator (start_with_allocator); True
    otherwise."""
    b = sized_to_torch(torch) if cpu else blas(torch)
    print(f"{program}: ran with: {describe(torch, b, gpu=not cpu)}", file=out, flush=True)
    if cpu and not b["optimized"]:
        print(f"{program}: {refusal(b)}", file=sys.stderr, flush=True)
        return False
    name = chosen()
    if cpu and allocator and not in_force(name):
        print(f"{program}: PyTorch did not start with the allocator {name} "
              f"({' '.join(f'{k}={v}' for k, v in allocator_env(name).items()) or 'defaults'}; "
              f"it runs with {allocator_setting()}): not a fair baseline, so nothing is timed; "
              f"call torch_env.start_with_allocator before importing torch",
              file=sys.stderr, flush=True)
        return False
    return True


def ensure(program, threads):
    """Before PROGRAM imports torch: torch_env.py --install in a child process. True when
    PyTorch is there on an optimized BLAS (installed now if need be); False after the
    child's refusal line."""
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--install",
                           "--threads", str(threads)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or ["torch_env.py failed"]
        print(f"{program}: {lines[-1].removeprefix('torch_env.py: ')}", file=sys.stderr)
    return proc.returncode == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch.set_num_threads(N) first, the BLAS's pool included")
    parser.add_argument("--install", action="store_true",
                        help="install python3-torch and libopenblas0-pthread when the check "
                             "fails (tools/install-deps.sh), then check again")
    parser.add_argument("--allocator-env", action="store_true",
                        help="print the chosen allocator's variables (NAME=VALUE lines) and "
                             "exit; 2 with one line when its library is missing")
    args = parser.parse_args()
    if args.allocator_env:
        name = chosen()
        missing = (f"{ALLOCATOR_VARIABLE}={os.environ[ALLOCATOR_VARIABLE]} is none of "
                   f"{', '.join(ALLOCATORS)}" if name is None else missing_library(name))
        if missing:
            print(f"torch_env.py: {missing}", file=sys.stderr)
            return 2
        for k, v in allocator_env(name).items():
            print(f"{k}={v}")
        return 0
    if args.install:
        again = [sys.executable, os.path.abspath(__file__)]
        if args.threads is not None:
            again += ["--threads", str(args.threads)]
        first = subprocess.run(again, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if first.returncode == 0:
            sys.stdout.write(first.stdout)
            sys.stderr.write(first.stderr)
            return 0
        install = [os.path.join(HERE, "..", "install-deps.sh"), *PACKAGES]
        subprocess.run(install, stdout=sys.stderr, check=False)  # its own lines say why
        return subprocess.run(again).returncode
    start_with_allocator("torch_env.py")
    try:
        import torch
    except ImportError:
        print(f"torch_env.py: PyTorch is not installed for {sys.executable}; install it "
              f"(tools/install-deps.sh {' '.join(PACKAGES)}) and run again", file=sys.stderr)
        return 2
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if not check(torch, "torch_env.py", out=sys.stdout):
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
