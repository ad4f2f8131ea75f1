"""Build script. The CUDA extension is built when CUDA is available (or forced); otherwise the package
installs pure-Python and compiles the extension just in time on first use, if it can.

Environment variables:
    DGL_EXACT_BUILD_CUDA=1   build the extension even if torch sees no GPU (nvcc must exist)
    DGL_EXACT_BUILD_CUDA=0   never build it at install time
"""
import os

from setuptools import setup


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
    here = os.path.dirname(os.path.abspath(__file__))
    cuda_dir = os.path.join(here, "cuda")
    sources = sorted(os.path.join("cuda", f) for f in os.listdir(cuda_dir) if f.endswith((".cpp", ".cu")))
    if not sources:
        return [], {}
    ext = CUDAExtension(
        name="dgl_exact._C",
        sources=sources,
        include_dirs=[cuda_dir],
        extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3", "--use_fast_math", "-lineinfo"]},
    )
    return [ext], {"build_ext": BuildExtension}


ext_modules, cmdclass = _extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
