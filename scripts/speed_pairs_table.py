"""The per-pair table of `scripts/speed_old_vs_new.sh` outputs: for each model and setting, the old and new
epoch times of every alternating pair, new / old per pair, and the median and mean ratio.

    python scripts/speed_pairs_table.py OUT_A.txt OUT_B.txt ...
"""
import collections
import re
import statistics
import sys

rows = collections.defaultdict(dict)
for f in sys.argv[1:]:
    for line in open(f):
        m = re.match(r"(old|new) (\d+) \| (\w+) \| (.+?) \| ([\d.]+) \|", line)
        if m:
            t, i, model, setting, ms = m.groups()
            rows[(model, setting, f)].setdefault(int(i), {})[t] = float(ms)
agg = collections.defaultdict(list)
for (model, setting, f), pairs in rows.items():
    for i, d in sorted(pairs.items()):
        if "old" in d and "new" in d:
            agg[(model, setting)].append((d["old"], d["new"]))
print("| model | setting | pairs | old ms (median) | new ms (median) | new/old per pair | median ratio | mean ratio |")
print("|---|---|---|---|---|---|---|---|")
for (model, setting), ps in agg.items():
    r = [n / o for o, n in ps]
    print(f"| {model} | {setting} | {len(ps)} | {statistics.median(o for o, _ in ps):.0f} | "
          f"{statistics.median(n for _, n in ps):.0f} | "
          f"{' '.join(f'{x:.2f}' for x in r)} | {statistics.median(r):.3f} | {statistics.mean(r):.3f} |")
