#!/usr/bin/env bash
# One-shot GPU check (issue 4): build the CUDA extension, run the CUDA-marked tests and the GPU benchmarks,
# and leave every result under $OUT (default gpu-results/). Sized for the lent H200 machine (15 minutes of
# device time per session: run it once, with a timeout that leaves room for a rerun).
#
# That machine has torch 2.11 (CUDA 13), numba-cuda, PyG and nvcc, but no dgl/ogb, no network, and numpy 2.5
# (which breaks numba-cuda; dgl_exact shims it, and numpy 2.4.6 is carried anyway). Prepare here:
#     ../shared/tools/gpu-wheels .gpu-wheels        # dgl 2.1.0, numpy 2.4.6, ogb (+2 deps), cp312 wheels
# then run there from the repository root, carrying .gpu-wheels:
#     OUT=$OUT bash scripts/gpu_check.sh
set -u
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
step() { echo; echo "=== $* ($(date +%T))"; }

step "environment"
SITE="$PWD/.gpu-site"
if ls .gpu-wheels/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target "$SITE" .gpu-wheels/*.whl
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TORCH_EXTENSIONS_DIR="$PWD/.torch-ext" MAX_JOBS=${MAX_JOBS:-16} DGL_EXACT_DATA="$PWD/.gpu-data"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
python3 -m dgl_exact info

step "extension build (JIT) and backend selection"
start=$(date +%s)
python3 - <<'PY'
import time, torch, dgl_exact
from dgl_exact.kernels import extension
t = time.time(); reason = extension.load(); print("extension.load():", reason or "available", f"{time.time() - t:.1f}s")
print(dgl_exact.backend("cuda"))
PY
echo "build+load wall: $(( $(date +%s) - start )) s"

step "CUDA-marked tests"
timeout 240 python3 -m pytest -q -m cuda -p no:cacheprovider tests 2>&1 | tail -25 | tee "$OUT/cuda_tests.txt"

step "kernel throughput (GB/s of fp32 input; copy ceiling 4.26 TB/s)"
timeout 120 python3 -m dgl_exact bench kernels --device cuda --rows 2449029 --cols 256 --repeats 10 --out "$OUT" -q

step "arxiv-sized GCN (hidden 256, BN, dropout): memory and epoch time, PyG as second baseline"
timeout 240 python3 -m dgl_exact bench memory --device cuda --dataset synthetic-arxiv --models gcn,sage --out "$OUT" -q
timeout 240 python3 -m dgl_exact bench speed --device cuda --dataset synthetic-arxiv --models gcn --epochs 20 --warmup 5 \
  --settings "dgl_exact fp32,INT8,INT2,INT2 + RP(0.125),INT2 + RP(0.125) + blocks(64) + optimal,PyG fp32" --out "$OUT/arxiv-speed" -q

step "products-sized GCN: activation memory fp32 vs INT2 + RP(0.125), epoch time"
timeout 300 python3 -m dgl_exact bench memory --device cuda --dataset synthetic-products --models gcn \
  --settings "dgl_exact fp32,INT2,INT2 + RP(0.125),INT2 + RP(0.125) + blocks(64) + optimal" --out "$OUT/products" -q
timeout 300 python3 -m dgl_exact bench speed --device cuda --dataset synthetic-products --models gcn --epochs 5 --warmup 2 \
  --settings "dgl_exact fp32,INT2,INT2 + RP(0.125)" --out "$OUT/products-speed" -q

step "done"
ls -R "$OUT"
