#!/bin/bash
# Epoch time, an older commit against the current checkout, side by side, alternating, one thread
# (benchmarks/cpu-2core/gcn2-fused/speed/ and sage-fused/speed/ were measured this way).
# usage: bash scripts/speed_old_vs_new.sh OLD_COMMIT OUT_DIR [REPS] [EPOCHS]
#   (from the repository root, venv active; MODEL=gcn2 LAYERS=16 by default, e.g. MODEL=sage LAYERS=3;
#   SETTINGS="INT2,INT2 + RP(0.125) + blocks(64) + optimal" by default; WARMUP=2 untimed epochs by default;
#   CPU=N pins every run to core N with taskset, so two campaigns can run side by side on separate cores)
# The old commit runs from a temporary git worktree; `dgl-exact bench` refuses a checkout with uncommitted
# changes to the measured code, so commit first (or set DGL_EXACT_ALLOW_DIRTY=1: the results then say so).
set -e
old=$1; out=$2; reps=${3:-2}; epochs=${4:-2}
model=${MODEL:-gcn2}; layers=${LAYERS:-16}; warmup=${WARMUP:-2}
pin=""; [ -n "$CPU" ] && pin="taskset -c $CPU"; settings=${SETTINGS:-"INT2,INT2 + RP(0.125) + blocks(64) + optimal"}
if [ -z "$old" ] || [ -z "$out" ]; then
  echo "usage: bash scripts/speed_old_vs_new.sh OLD_COMMIT OUT_DIR [REPS] [EPOCHS]" >&2; exit 2
fi
mkdir -p "$out"; out=$(cd "$out" && pwd)
git worktree add -f "$out/old-tree" "$old" >/dev/null 2>&1 || true
# Each tree runs from its own root: `python -m` puts the current folder first on sys.path, ahead of PYTHONPATH,
# so running the old tree from this checkout's root would import this checkout's dgl_exact (both sides "new").
for t in old new; do
  tree=$PWD; [ "$t" = old ] && tree="$out/old-tree"
  got=$(cd "$tree" && PYTHONPATH=$tree python -c "import os, dgl_exact; print(os.path.dirname(os.path.dirname(dgl_exact.__file__)))" 2>/dev/null)
  if [ "$got" != "$tree" ]; then echo "the $t tree imports dgl_exact from $got, not $tree" >&2; exit 1; fi
done
here=$PWD
for i in $(seq "$reps"); do
  for t in old new; do
    tree=$here; [ "$t" = old ] && tree="$out/old-tree"
    cd "$tree"
    PYTHONPATH=$tree OMP_NUM_THREADS=1 $pin python -m dgl_exact bench speed --models "$model" --layers "$layers" \
      --settings "$settings" --epochs "$epochs" --warmup "$warmup" -q --out "$out/${t}_$i" \
      2>/dev/null | grep "^| $model" | sed "s/^/$t $i /"
    cd "$here"
  done
done
git worktree remove --force "$out/old-tree" >/dev/null 2>&1 || true
