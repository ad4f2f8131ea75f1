#!/usr/bin/env bash
# One-shot GPU check: build the CUDA extension, benchmark kernels and training, run the CUDA tests.
# Every step is time-boxed and appends to $OUT (default gpu-results/), most important first, so a run that
# hits its limit still returns what it measured. Sized for the lent H200: about 5 minutes when the build is quick (the caps add up to more; correctness
# first, then the numbers by importance).
#
# That machine has torch 2.11 (CUDA 13), numba-cuda, PyG and nvcc, but no dgl/ogb and no network, and numpy
# 2.5 (which breaks numba-cuda; dgl_exact shims it, numpy 2.4.6 is carried anyway). Prepare here:
#     ../shared/tools/gpu-wheels .gpu-wheels        # dgl 2.1.0, numpy 2.4.6, ogb (+2 deps), cp312 wheels
# then run there from the repository root, carrying .gpu-wheels:   OUT=$OUT bash scripts/gpu_check.sh
set -u
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
T0=$(date +%s)
step() { echo; echo "=== [$(( $(date +%s) - T0 )) s] $*"; }

step "environment"
SITE="$PWD/.gpu-site"
ls .gpu-wheels/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --target "$SITE" .gpu-wheels/*.whl
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TORCH_EXTENSIONS_DIR="$PWD/.torch-ext" MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export DGL_EXACT_DATA="$PWD/.gpu-data"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

step "extension JIT build"
timeout ${BUILD_S:-300} python3 - <<'PY'
import time, dgl_exact
from dgl_exact.kernels import extension
t = time.time(); reason = extension.load(); print("extension.load():", reason or "available", f"{time.time() - t:.1f}s")
print(dgl_exact.backend("cuda"))
PY

step "CUDA-marked tests"
timeout 120 python3 -m pytest -q -x -m cuda -p no:cacheprovider tests 2>&1 | tail -15 | tee "$OUT/cuda_tests.txt"

step "raw kernel throughput (CUDA events; extension vs torch reference, bit-exact check)"
timeout 60 python3 cuda/bench.py --rows 2449029 --cols 256 2>&1 | tee "$OUT/kernels_raw.txt"

step "compress()/decompress() end to end per backend (GB/s of fp32 input)"
timeout 60 python3 -m dgl_exact bench kernels --device cuda --rows 2449029 --cols 256 --repeats 5 --out "$OUT" -q

step "arxiv-sized GCN (hidden 256, BN, dropout): epoch time vs own fp32 and PyG GCNConv(cached=True)"
timeout 90 python3 -m dgl_exact bench speed --device cuda --dataset synthetic-arxiv --models gcn --epochs 10 --warmup 3 \
  --settings "dgl_exact fp32,INT2,INT2 + RP(0.125),INT2 + RP(0.125) + blocks(64) + optimal,PyG fp32" \
  --out "$OUT/arxiv" -q

step "arxiv-sized step peak (CUDA max_memory_allocated over forward + backward + Adam, 2nd step) beside activations"
timeout 60 python3 -m dgl_exact bench memory --device cuda --dataset synthetic-arxiv --models gcn,sage \
  --settings "dgl_exact fp32,INT8,INT2,INT2 + RP(0.125),INT2 + RP(0.125) + blocks(64) + optimal,INT1,PyG fp32" \
  --out "$OUT/arxiv" -q
timeout 90 python3 -m dgl_exact bench memory --device cuda --dataset synthetic-arxiv --models gcn2 --layers 16 \
  --settings "dgl_exact fp32,INT2,INT2 + RP(0.125),INT2 + RP(0.125) + blocks(64) + optimal" \
  --out "$OUT/arxiv_gcn2_16" -q

step "arxiv-sized GCN step profile: wall vs GPU kernel time, launches, syncs, top ops (fp32 vs INT2)"
timeout 60 python3 -m dgl_exact bench profile --device cuda --dataset synthetic-arxiv --models gcn --steps 3 \
  --settings "dgl_exact fp32,INT2" --out "$OUT/arxiv_profile" -q

step "products-sized GCN: activation memory (peak minus static) and epoch time, fp32 vs INT2 + RP(0.125)"
timeout 150 python3 -m dgl_exact bench memory --device cuda --dataset synthetic-products --models gcn \
  --settings "dgl_exact fp32,INT2 + RP(0.125)" --out "$OUT/products" -q
timeout 120 python3 -m dgl_exact bench speed --device cuda --dataset synthetic-products --models gcn --epochs 3 \
  --warmup 1 --settings "dgl_exact fp32,INT2 + RP(0.125)" --out "$OUT/products" -q

step "products-sized GCN 3x256 totals (issue 31): planned static, step peak and total, then measured by the trainer"
timeout 120 python3 -m dgl_exact plan --device cuda --dataset synthetic-products --model gcn --hidden 256 --layers 3 \
  --settings "DGL fp32,dgl_exact fp32,INT2"
for BITS in "--act-fp" "--bits 2"; do
  echo "--- train --debug-mem $BITS (model, data = graph + cache + features, activations, step peak, total)"
  timeout 150 python3 -m dgl_exact train -q --device cuda --dataset synthetic-products --model gcn --layers 3 \
    --hidden 256 --epochs 1 --debug-mem $BITS
done

step "arxiv-sized GCN INT2 epoch time: eager vs torch.compile (default mode) vs CUDA graphs (reduce-overhead)"
for MODE in "" "--compile" "--compile=reduce-overhead"; do
  echo "--- train $MODE"
  timeout 120 python3 -m dgl_exact train -q --device cuda --dataset synthetic-arxiv --model gcn --layers 3 \
    --hidden 256 --bits 2 --test-speed 10 $MODE
done

step "plan vs measured (predicted step peak and activations against measured, every uniform setting)"
timeout 150 python3 -m dgl_exact bench plan --device cuda --dataset synthetic-arxiv --models gcn,sage \
  --out "$OUT/plan" -q

step "done"
