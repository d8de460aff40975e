"""Builds cgx_torch: cgx's compressed allreduce for PyTorch (a DDP communication hook
and ``cgx_torch.allreduce_``), a C++ extension built with torch.utils.cpp_extension
against the installed torch.

    pip install --break-system-packages --no-build-isolation ./python   # Debian 12, as root
    python3 setup.py build --build-lib DIR                               # no install: PYTHONPATH=DIR

Needs: torch (>= 1.13), mpi4py, a C++20 compiler (g++ >= 11), cgx's headers
(../include, or CGX_INCLUDE_DIR) and the MPI that mpi4py was built with (found through
mpi4py's mpicc, or MPICC). A CUDAExtension with the device plans is built when torch
has CUDA and nvcc is found (CUDA >= 12 for C++20); CGX_TORCH_CUDA=0 forces CPU only.
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


def mpi_flags():
    """Compile and link flags of the MPI that mpi4py uses: ask its mpicc wrapper."""
    mpicc = os.environ.get("MPICC")
    if not mpicc:
        try:
            import mpi4py

            mpicc = mpi4py.get_config().get("mpicc")
        except ImportError:
            sys.exit("cgx_torch: mpi4py is needed (Debian: apt-get install python3-mpi4py)")
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


inc, mpi_cflags, libdirs, libs, lflags = mpi_flags()
cuda = want_cuda()
csrc = os.path.join("csrc")
sources = [os.path.join(csrc, f) for f in ("bindings.cpp", "plans.cpp", "host_plan_f32_stochastic.cpp",
                                          "host_plan_f32_nearest.cpp", "host_plan_f64_stochastic.cpp",
                                          "host_plan_f64_nearest.cpp")]
# torch 1.13's headers are C++14 code and warn under C++20 (std::iterator, is_pod). No
# debug information (Python's CFLAGS add -g): it triples the build time of the kernels.
cxx = ["-std=c++20", "-O2", "-g0", "-Wno-deprecated-declarations"] + mpi_cflags
define_macros = [("OMPI_SKIP_MPICXX", "1"), ("MPICH_SKIP_MPICXX", "1")]  # MPI's C API only
extra = {"cxx": cxx}
if cuda:
    sources.append(os.path.join(csrc, "device_plans.cu"))
    define_macros.append(("CGX_TORCH_WITH_CUDA", "1"))
    # torch's CUDAExtension defines __CUDA_NO_HALF_OPERATORS__ and friends; cgx's kernels use
    # the half operators (our .cu includes no torch header, so this changes nothing of torch's).
    no_half = ["__CUDA_NO_HALF_OPERATORS__", "__CUDA_NO_HALF_CONVERSIONS__", "__CUDA_NO_BFLOAT16_CONVERSIONS__",
               "__CUDA_NO_HALF2_OPERATORS__"]
    extra["nvcc"] = (["-std=c++20", "-O2", "--expt-relaxed-constexpr"] + [f"-U{m}" for m in no_half] +
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
    packages=["cgx_torch"],
    ext_modules=[ext],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
    python_requires=">=3.8",
    zip_safe=False,
)
