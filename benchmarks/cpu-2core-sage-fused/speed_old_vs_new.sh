#!/bin/bash
# side by side: old (HEAD b50aa30, before the fused SAGE op) and new (working tree), alternating
. /root/venv/bin/activate
cd /work/speedcmp
for i in 1 2 3; do
  for t in old new; do
    tree=/work/run20k/tree; [ $t = new ] && tree=/work/speedcmp/new
    PYTHONPATH=$tree OMP_NUM_THREADS=1 python -m dgl_exact bench speed --models sage --settings "INT2,INT2 + RP(0.125) + blocks(64) + optimal" --epochs 5 -q --out /work/speedcmp/out_${t}_$i 2>/dev/null | grep "^| sage" | sed "s/^/$t $i /"
  done
done
