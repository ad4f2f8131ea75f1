#!/bin/bash
# Epoch time of GCNII 16x256 (arxiv-sized synthetic graph), old vs new side by side, alternating, one thread.
# usage: bash speed_old_vs_new.sh OLD_COMMIT OUT_DIR [REPS] [EPOCHS]   (run from the repository root, venv active)
set -e
old=$1; out=$2; reps=${3:-2}; epochs=${4:-2}
mkdir -p "$out"
git worktree add -f "$out/old-tree" "$old" >/dev/null 2>&1 || true
for i in $(seq "$reps"); do
  for t in old new; do
    tree=$PWD; [ "$t" = old ] && tree="$out/old-tree"
    PYTHONPATH=$tree OMP_NUM_THREADS=1 python -m dgl_exact bench speed --models gcn2 --layers 16 \
      --settings "INT2,INT2 + RP(0.125) + blocks(64) + optimal" --epochs "$epochs" -q --out "$out/${t}_$i" \
      2>/dev/null | grep "^| gcn2" | sed "s/^/$t $i /"
  done
done
git worktree remove --force "$out/old-tree" >/dev/null 2>&1 || true
