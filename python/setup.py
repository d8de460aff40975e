"""Builds cgx_torch: cgx's compressed allreduce for PyTorch (a DDP communication hook
and ``cgx_torch.allreduce_``), a C++ extension built with torch.utils.cpp_extension
against the installed torch.

    pip install --break-system-packages --no-build-isolation ./python   # Debian 12, as root
    python3 setup.py build --build-lib DIR                               # no install: PYTHONPATH=DIR

Needs: torch (>= 1.13), a C++20 compiler (g++ >= 11) and cgx's headers (../include, or
CGX_INCLUDE_DIR). Where mpi4py is importable (or CGX_TORCH_MPI=1) the plans over mpi4py
communicators are built too, against the MPI that mpi4py was built with (found through
mpi4py's mpicc, or MPICC); without it (CGX_TORCH_MPI=0, or no mpi4py) cgx_torch runs over
torch.distributed process groups only (torchrun; no MPI anywhere). A CUDAExtension with the device plans is built when torch
has CUDA and nvcc is found (CUDA >= 12 for C++20); CGX_TORCH_CUDA=0 forces CPU only.
Its GPU architectures: TORCH_CUDA_ARCH_LIST (e.g. "9.0"), else the visible GPUs', else,
on a machine without one (a login or build node), those this torch was built for that
nvcc can compile, the newest also as PTX.
"""
import os
import shlex
import subprocess
import sys

from setuptools import setup

import torch
from torch.utils import cpp_extension

HERE = os.path.dirname(os.path.abspath(__file__))
os.chdir(HERE)  # setuptools wants sources relative to setup.py


def cgx_include():
    """cgx's include directory: CGX_INCLUDE_DIR or ../include (exits when cgx.hpp is not there)."""
    d = os.environ.get("CGX_INCLUDE_DIR") or os.path.join(HERE, "..", "include")
    d = os.path.abspath(d)
    if not os.path.isfile(os.path.join(d, "cgx", "cgx.hpp")):
        sys.exit(f"cgx_torch: cgx's headers not found in {d} (set CGX_INCLUDE_DIR)")
    return d


def want_mpi():
    """Whether to build the MPI half (plans over mpi4py communicators): CGX_TORCH_MPI
    ("0" or "1"), else whether mpi4py is importable. Without it the plans run over
    torch.distributed process groups only (torchrun, no MPI needed)."""
    env = os.environ.get("CGX_TORCH_MPI")
    if env is not None:
        return env not in ("0", "", "off", "OFF")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


def mpi_flags():
    """Compile and link flags of the MPI that mpi4py uses: ask its mpicc wrapper."""
    mpicc = os.environ.get("MPICC")
    if not mpicc:
        try:
            import mpi4py

            mpicc = mpi4py.get_config().get("mpicc")
        except ImportError:
            sys.exit("cgx_torch: CGX_TORCH_MPI=1 needs mpi4py (Debian: apt-get install python3-mpi4py; "
                     "or pip install mpi4py), or MPICC naming MPI's compiler wrapper")
    mpicc = mpicc or "mpicc"

    def ask(*args):
        """The wrapper's answer to args, or None when it does not understand them."""
        try:
            return subprocess.run([mpicc, *args], check=True, capture_output=True, text=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    comp, link = ask("--showme:compile"), ask("--showme:link")  # Open MPI
    if comp is None or link is None:  # MPICH: "-show" prints the whole command line
        show = ask("-show")
        if show is None:
            sys.exit(f"cgx_torch: cannot ask {mpicc} for MPI's flags (set MPICC to mpi4py's mpicc wrapper)")
        words = shlex.split(show)[1:]
        comp = " ".join(w for w in words if w.startswith(("-I", "-D")))
        link = " ".join(w for w in words if w.startswith(("-L", "-l", "-Wl")))
    inc, cflags = [], []
    for w in shlex.split(comp):
        (inc.append(w[2:]) if w.startswith("-I") else cflags.append(w))
    libdirs, libs, lflags = [], [], []
    for w in shlex.split(link):
        if w.startswith("-L"):
            libdirs.append(w[2:])
        elif w.startswith("-l"):
            libs.append(w[2:])
        else:
            lflags.append(w)
    # MPI's deprecated C++ bindings are not used (OMPI_SKIP_MPICXX below).
    libs = [l for l in libs if l not in ("mpi_cxx", "mpicxx")]
    return inc, cflags, libdirs, libs, lflags


def want_cuda():
    """Whether to build the CUDA extension: CGX_TORCH_CUDA, else torch has CUDA and nvcc is found."""
    env = os.environ.get("CGX_TORCH_CUDA")
    if env is not None:
        return env not in ("0", "", "off", "OFF")
    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


def default_cuda_archs():
    """TORCH_CUDA_ARCH_LIST for a machine without a visible GPU, where torch's own choice
    (the visible GPUs' architectures) fails: the architectures this torch was built for
    (torch.cuda.get_arch_list()) that nvcc can compile, the newest also as PTX (for GPUs
    newer still). None when a GPU is visible or TORCH_CUDA_ARCH_LIST is set."""
    if os.environ.get("TORCH_CUDA_ARCH_LIST") or torch.cuda.device_count() > 0:
        return None
    wanted = []
    for a in torch.cuda.get_arch_list():  # "sm_90", "sm_100a", "compute_120", ...
        kind, _, num = a.partition("_")
        num = num.rstrip("af")
        if kind == "sm" and num.isdigit() and num not in wanted:
            wanted.append(num)
    nvcc = os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc")
    try:
        listed = subprocess.run([nvcc, "--list-gpu-arch"], check=True, capture_output=True, text=True).stdout.split()
        can = {w.split("_", 1)[1] for w in listed if w.startswith("compute_")}
        wanted = [a for a in wanted if a in can]
    except (OSError, subprocess.CalledProcessError):
        pass  # an older nvcc without --list-gpu-arch: torch's list as it is
    if not wanted:
        sys.exit("cgx_torch: no GPU is visible and none of torch's architectures "
                 f"({', '.join(torch.cuda.get_arch_list()) or 'none'}) can be compiled by {nvcc}: "
                 "set TORCH_CUDA_ARCH_LIST (e.g. \"9.0\") or CGX_TORCH_CUDA=0")
    wanted.sort(key=int)
    archs = [f"{a[:-1]}.{a[-1]}" for a in wanted]
    return ";".join(archs[:-1] + [archs[-1] + "+PTX"])


mpi = want_mpi()
inc, mpi_cflags, libdirs, libs, lflags = mpi_flags() if mpi else ([], [], [], [], [])
print(f"cgx_torch: building {'with' if mpi else 'without'} MPI (mpi4py communicators); "
      "torch.distributed process groups always", file=sys.stderr)
cuda = want_cuda()
if cuda:
    archs = default_cuda_archs()
    if archs is not None:
        print(f"cgx_torch: no GPU visible; building the device plans for TORCH_CUDA_ARCH_LIST=\"{archs}\" "
              "(this torch's architectures; set TORCH_CUDA_ARCH_LIST to build fewer)", file=sys.stderr)
        os.environ["TORCH_CUDA_ARCH_LIST"] = archs
csrc = os.path.join("csrc")
plan_tus = [f"{kind}_{t}_{r}.cpp" for kind in (("host_plan", "pg_plan") if mpi else ("pg_plan",))
            for t in ("f32", "f64") for r in ("stochastic", "nearest")]
sources = [os.path.join(csrc, f) for f in ["bindings.cpp", "plans.cpp", "pg_plans.cpp", "store_bootstrap.cpp"] + plan_tus]
# torch 1.13's headers are C++14 code and warn under C++20 (std::iterator, is_pod). No
# debug information (Python's CFLAGS add -g): it triples the build time of the kernels.
# CGX_TORCH_OPT: the optimization of the host code (default -O2); a build that is only
# compiled, never run (CI's GPU rehearsal), uses -O0.
opt = os.environ.get("CGX_TORCH_OPT", "-O2")
cxx = ["-std=c++20", opt, "-g0", "-Wno-deprecated-declarations"] + mpi_cflags
define_macros = [("OMPI_SKIP_MPICXX", "1"), ("MPICH_SKIP_MPICXX", "1")]  # MPI's C API only
if mpi:
    define_macros.append(("CGX_TORCH_WITH_MPI", "1"))
extra = {"cxx": cxx}
# The device plans run over comm::mpi (mpi_device; builds with MPI) and over comm::cuda_ipc
# set up through a torch.distributed group's Store (every CUDA build, with or without MPI).
if cuda:
    sources.append(os.path.join(csrc, "device_plans.cu"))
    define_macros.append(("CGX_TORCH_WITH_CUDA", "1"))
    # torch's CUDAExtension defines __CUDA_NO_HALF_OPERATORS__ and friends; cgx's kernels use
    # the half operators (our .cu includes no torch header, so this changes nothing of torch's).
    no_half = ["__CUDA_NO_HALF_OPERATORS__", "__CUDA_NO_HALF_CONVERSIONS__", "__CUDA_NO_BFLOAT16_CONVERSIONS__",
               "__CUDA_NO_HALF2_OPERATORS__"]
    extra["nvcc"] = (["-std=c++20", opt, "--expt-relaxed-constexpr"] + [f"-U{m}" for m in no_half] +
                     [f"-I{d}" for d in inc] + [f"-D{k}={v}" for k, v in define_macros])
    Ext = cpp_extension.CUDAExtension
else:
    sources.append(os.path.join(csrc, "device_stub.cpp"))
    Ext = cpp_extension.CppExtension

ext = Ext(
    name="cgx_torch._C",
    sources=sources,
    include_dirs=[cgx_include(), os.path.join(HERE, "csrc")] + inc,
    library_dirs=libdirs,
    libraries=libs,
    runtime_library_dirs=libdirs,
    define_macros=define_macros,
    extra_compile_args=extra,
    extra_link_args=lflags,
)

setup(
    name="cgx_torch",
    version="0.1.0",
    description="cgx's compressed allreduce for PyTorch: a DDP communication hook and allreduce_",
    # torch_cgx and cgx_utils: the original system's module names, for its users' scripts
    packages=["cgx_torch", "torch_cgx", "cgx_utils"],
    # The `cgx` backend without an import: torch >= 2.5 calls `torch.backends` entry points
    # at `import torch`, newer torch also `torch.distributed.backends` ones when a group asks
    # for a backend it does not know. Both go to a module that imports nothing of cgx_torch
    # (cgx_torch_autoload.py): the extension is loaded when the first `cgx` group is made.
    py_modules=["cgx_torch_autoload"],
    entry_points={
        "torch.backends": ["cgx = cgx_torch_autoload:autoload"],
        "torch.distributed.backends": ["cgx = cgx_torch_autoload:register"],
    },
    ext_modules=[ext],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
    python_requires=">=3.8",
    zip_safe=False,
)
