"""Build script. The CUDA extension is built when CUDA is available (or forced); otherwise the package
installs pure-Python and compiles the extension just in time on first use, if it can.

Environment variables:
    DGL_EXACT_BUILD_CUDA=1   build the extension even if torch sees no GPU (nvcc must exist)
    DGL_EXACT_BUILD_CUDA=0   never build it at install time

The C++/CUDA sources in ``cuda/`` are also copied into the package (``dgl_exact/_cuda_src``) so that an
installed wheel can compile them just in time (see dgl_exact/kernels/extension.py).
"""
import glob
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
CUDA_DIR = os.path.join(HERE, "cuda")
SOURCE_PATTERNS = ("*.cpp", "*.cu", "*.h", "*.cuh")


#: one line run by Python's ``site`` at interpreter start (see _dgl_exact_import_hook.py): it only appends a
#: finder that acts on the first ``import dgl``
IMPORT_HOOK_PTH = ("dgl_exact-import-hook.pth", "import _dgl_exact_import_hook; _dgl_exact_import_hook.install()\n")


class BuildPyWithSources(build_py):
    """build_py that also ships the extension sources as package data (dgl_exact/_cuda_src) and puts the
    import hook's ``.pth`` file at the top of the wheel (site-packages)."""

    def run(self):
        super().run()
        if not self.dry_run:
            name, line = IMPORT_HOOK_PTH
            os.makedirs(self.build_lib, exist_ok=True)
            with open(os.path.join(self.build_lib, name), "w") as f:
                f.write(line)
        if self.dry_run or not os.path.isdir(CUDA_DIR):
            return
        target = os.path.join(self.build_lib, "dgl_exact", "_cuda_src")
        os.makedirs(target, exist_ok=True)
        for pattern in SOURCE_PATTERNS:
            for path in glob.glob(os.path.join(CUDA_DIR, pattern)):
                shutil.copy2(path, os.path.join(target, os.path.basename(path)))


def _extensions():
    flag = os.environ.get("DGL_EXACT_BUILD_CUDA")
    if flag == "0":
        return [], {}
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension
    except Exception:
        return [], {}
    if flag != "1" and not (torch.cuda.is_available() and CUDA_HOME):
        return [], {}
    if not os.path.isdir(CUDA_DIR):
        return [], {}
    sources = sorted(os.path.join("cuda", f) for f in os.listdir(CUDA_DIR) if f.endswith((".cpp", ".cu")))
    if not sources:
        return [], {}
    ext = CUDAExtension(
        name="dgl_exact._C",
        sources=sources,
        include_dirs=[CUDA_DIR],
        # No --use_fast_math / -ffast-math: the kernels must reproduce the reference's IEEE rounding bit for bit.
        extra_compile_args={"cxx": ["-O3", "-ffp-contract=off"], "nvcc": ["-O3", "-lineinfo"]},
    )
    return [ext], {"build_ext": BuildExtension}


ext_modules, cmdclass = _extensions()
cmdclass["build_py"] = BuildPyWithSources
setup(ext_modules=ext_modules, cmdclass=cmdclass)
