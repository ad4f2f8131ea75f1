#!/usr/bin/env bash
# Compile-check every .cu / .cpp of the dgl_exact extension (cuda/) with nvcc and torch's headers.
# Nothing is linked or run, so no GPU is needed: this only makes sure a syntax or template error never
# lands. Exits non-zero if any file fails to compile.
#
# Environment (all optional):
#   PYTHON      interpreter whose torch provides the headers (default: $VIRTUAL_ENV/bin/python, else python)
#   NVCC        nvcc to use (default: nvcc on PATH, else $CUDA_HOME/bin/nvcc, else /usr/local/cuda/bin/nvcc)
#   CUDA_ARCH   SM architecture to compile for (default 90, the H200)
#   CXX_STD     C++ standard (default c++17, the oldest torch we support; torch >= 2.10 builds use c++20)
#   JOBS        parallel compiles (default: number of cores)
#   OPT         host optimisation flag (default -O0: errors are the same, the check is faster)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC_DIR="$ROOT/cuda"

if [[ -n "${PYTHON:-}" ]]; then
  PY="$PYTHON"
elif [[ -n "${VIRTUAL_ENV:-}" && -x "$VIRTUAL_ENV/bin/python" ]]; then
  PY="$VIRTUAL_ENV/bin/python"
else
  PY="python"
fi

if [[ -z "${NVCC:-}" ]]; then
  if command -v nvcc >/dev/null 2>&1; then
    NVCC="$(command -v nvcc)"
  elif [[ -n "${CUDA_HOME:-}" && -x "$CUDA_HOME/bin/nvcc" ]]; then
    NVCC="$CUDA_HOME/bin/nvcc"
  elif [[ -x /usr/local/cuda/bin/nvcc ]]; then
    NVCC=/usr/local/cuda/bin/nvcc
  else
    echo "compile_check_cuda: nvcc not found (set NVCC or CUDA_HOME)" >&2
    exit 2
  fi
fi
ARCH="${CUDA_ARCH:-90}"
STD="${CXX_STD:-c++17}"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 2)}"
OPT="${OPT:--O0}"

# torch (and Python) include directories, the C++ ABI flag, and whether torch ships the generated
# c10/cuda/impl/cuda_cmake_macros.h (CPU wheels do not: tell c10 to skip it).
PYINFO="$("$PY" - <<'PYEOF'
import os, sysconfig
import torch
base = os.path.join(os.path.dirname(torch.__file__), "include")
incs = [base, os.path.join(base, "torch", "csrc", "api", "include"), sysconfig.get_paths()["include"]]
for p in incs:
    print("-I" + p)
print("-D_GLIBCXX_USE_CXX11_ABI=%d" % int(torch._C._GLIBCXX_USE_CXX11_ABI))
if not os.path.exists(os.path.join(base, "c10", "cuda", "impl", "cuda_cmake_macros.h")):
    print("-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE")
try:  # the flags torch's extension builds add for .cu files (setup.py and JIT builds alike)
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS
except Exception:
    COMMON_NVCC_FLAGS = []
for f in COMMON_NVCC_FLAGS:
    print("#nvcc " + f)
print("#torch " + torch.__version__)
PYEOF
)" || { echo "compile_check_cuda: cannot import torch with $PY" >&2; exit 2; }
FLAGS=()
CU_FLAGS=()
while IFS= read -r line; do
  case "$line" in
    "#torch "*) TORCH_VERSION="${line#\#torch }" ;;
    "#nvcc "*) CU_FLAGS+=("${line#\#nvcc }") ;;
    ?*) FLAGS+=("$line") ;;
  esac
done <<< "$PYINFO"

shopt -s nullglob
SOURCES=("$SRC_DIR"/*.cu "$SRC_DIR"/*.cpp)
if [[ ${#SOURCES[@]} -eq 0 ]]; then
  echo "compile_check_cuda: no sources in $SRC_DIR" >&2
  exit 2
fi

TMP="$(mktemp -d "${TMPDIR:-/tmp}/dgl_exact_cc.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

echo "compile_check_cuda: $("$NVCC" --version | tail -n 2 | head -n 1); torch $TORCH_VERSION; sm_$ARCH; -std=$STD; ${#SOURCES[@]} files; $JOBS jobs"

compile_one() {
  local src="$1" name log
  name="$(basename "$src")"
  log="$TMP/$name.log"
  local start=$SECONDS
  local extra=()
  if [[ "$src" == *.cu ]]; then extra=("${CU_FLAGS[@]}"); fi
  if "$NVCC" -c "$src" -o "$TMP/$name.o" -std="$STD" "$OPT" -Xcompiler -fPIC -Xcompiler -Wno-c++20-extensions \
       -Xcompiler -ffp-contract=off -gencode "arch=compute_$ARCH,code=sm_$ARCH" -I"$SRC_DIR" "${FLAGS[@]}" "${extra[@]}" \
       >"$log" 2>&1; then
    echo "  ok    $name ($((SECONDS - start)) s)"
    # our own warnings (torch's headers are not our business)
    grep -E "^$SRC_DIR/[^ ]+(\(|:)[0-9]+.*warning" "$log" | sed 's/^/        /' || true
  else
    echo "  FAIL  $name ($((SECONDS - start)) s)"
    sed 's/^/        /' "$log" | grep -v "Wc++20-extensions" | head -n 60
    touch "$TMP/$name.failed"
  fi
}

running=0
for src in "${SOURCES[@]}"; do
  compile_one "$src" &
  running=$((running + 1))
  if [[ $running -ge $JOBS ]]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait || true

failed=("$TMP"/*.failed)
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "compile_check_cuda: ${#failed[@]} file(s) failed"
  exit 1
fi
echo "compile_check_cuda: all ${#SOURCES[@]} files compile"
