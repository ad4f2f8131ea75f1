#!/bin/bash
# Epoch time of full-graph training on the graph each commit's trainer trains on, an older commit against the
# current checkout: one graph per process (scripts/graph_idtype_speed.py), processes alternating.
# usage: bash scripts/graph_speed_old_vs_new.sh OLD_COMMIT OLD_VARIANT NEW_VARIANT [REPS]
#   e.g. bash scripts/graph_speed_old_vs_new.sh 97aa943 "int32 csc+csr" "int32 csc" 3
#   (from the repository root, venv active; DATASET=synthetic-arxiv MODEL=gcn SETTINGS="dgl_exact fp32,INT2" by
#   default). The old commit runs from a temporary git worktree with its own copy of the script, restricted to
#   OLD_VARIANT (older copies of the script have no --variants option).
set -e
old=$1; old_variant=$2; new_variant=$3; reps=${4:-3}
dataset=${DATASET:-synthetic-arxiv}; model=${MODEL:-gcn}; settings=${SETTINGS:-"dgl_exact fp32,INT2"}
if [ -z "$old" ] || [ -z "$old_variant" ] || [ -z "$new_variant" ]; then
  echo "usage: bash scripts/graph_speed_old_vs_new.sh OLD_COMMIT OLD_VARIANT NEW_VARIANT [REPS]" >&2; exit 2
fi
here=$PWD; tree=$(mktemp -d)/old-tree
git worktree add -f "$tree" "$old" >/dev/null 2>&1
trap 'git -C "$here" worktree remove --force "$tree" >/dev/null 2>&1 || true' EXIT
for i in $(seq "$reps"); do
  (cd "$tree/scripts" && PYTHONPATH=$tree python -c "
import sys; sys.argv = ['graph_idtype_speed.py', '--dataset', '$dataset', '--model', '$model', '--settings', '$settings',
                        '--repeats', '5', '--warmup', '2']
import graph_idtype_speed as m
every = m.variants
m.variants = lambda g: {'$old_variant': every(g)['$old_variant']}
m.main()" 2>/dev/null | sed "s/^/old $i /")
  (cd "$here" && PYTHONPATH=$here python scripts/graph_idtype_speed.py --dataset "$dataset" --model "$model" \
     --settings "$settings" --repeats 5 --warmup 2 --variants "$new_variant" 2>/dev/null | sed "s/^/new $i /")
done
