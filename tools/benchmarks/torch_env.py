#!/usr/bin/env python3
"""What a PyTorch process computes with on the CPU, and whether its CPU figures may stand
beside parasync's: the one place the PyTorch baselines (tools/bench-worker,
torch_model.py, torch_train.py) decide it.

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

Prints one line: what PyTorch runs with (its version, the BLAS with its library and
threads, oneDNN, ATen's threads, the CPU capability), and exits 0 when the BLAS is an
optimized one. On the reference BLAS, or one it cannot identify, it prints one line on
stderr naming the library and the fix instead, and exits 2 (also when PyTorch is missing).
--threads N: as torch.set_num_threads(N), the BLAS's own pool included (OpenBLAS and BLIS
keep theirs otherwise). --install: when that check fails, installs python3-torch and
libopenblas0-pthread (tools/install-deps.sh; PARASYNC_NO_INSTALL=1 makes it install
nothing) and checks again in a fresh process (a process cannot change the BLAS it mapped).
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


# glibc's mallopt parameters.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest
malloc_setting = "malloc's defaults"


def keep_freed_memory():
    """Makes glibc's malloc keep the memory PyTorch frees for its next tensors, up to
    tensors of 32 MiB (MMAP_THRESHOLD), instead of unmapping it (the default above its
    adaptive threshold) or trimming the heap. PyTorch allocates every activation and
    gradient afresh each step, and on this VM (a Firecracker guest) a page touched for the
    first time costs several microseconds, so handing memory back to the kernel made
    PyTorch pay for it again every step: worker/python/examples/cnn_local.py on 12,000
    examples, 1 thread, trained at 634-698 examples/s with glibc's defaults and 2,558-2,651
    with this, torch_model.py's cnn (batch 64, 1 thread) at 610-632 against 3,146-3,712
    (worker/python/examples/BASELINES.md, "Memory"). parasync's processes keep theirs
    likewise (common/process.h, KeepFreedMessageBuffers). check() calls it for every CPU
    baseline, and describe() says what is in force. Returns that phrase."""
    global malloc_setting
    libc = ctypes.CDLL("libc.so.6")
    ok = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and libc.mallopt(_M_TRIM_THRESHOLD,
                                                                          2**31 - 1)
    malloc_setting = ("malloc keeps freed memory (M_MMAP_THRESHOLD 32 MiB, no trim)" if ok
                      else "malloc's defaults (mallopt refused)")
    return malloc_setting


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
            + f"; {malloc_setting}")


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


def check(torch, program, cpu=True, out=sys.stderr):
    """Prints "PROGRAM: ran with: <describe>" on `out`. For a CPU run (`cpu`), first keeps
    freed memory (keep_freed_memory) and sizes the BLAS's own pool as PyTorch's threads, and returns False after printing
    "PROGRAM: <refusal>" on stderr when the BLAS is not an optimized one; True otherwise."""
    if cpu:
        keep_freed_memory()
    b = blas(torch)
    if cpu and b["set_threads"]:
        b["set_threads"](torch.get_num_threads())
        b = blas(torch)
    print(f"{program}: ran with: {describe(torch, b, gpu=not cpu)}", file=out, flush=True)
    if cpu and not b["optimized"]:
        print(f"{program}: {refusal(b)}", file=sys.stderr, flush=True)
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
    args = parser.parse_args()
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
