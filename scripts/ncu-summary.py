#!/usr/bin/env python3
"""ncu-summary.py CSV: per-kernel totals from `ncu --csv --metrics gpu__time_duration.sum` output
(one row per launch): kernel (short name, grid), launches, mean and total microseconds, sorted by
total. Used by scripts/device-run.sh's ncu step."""
import csv, re, sys
from collections import defaultdict

rows = defaultdict(lambda: [0, 0.0])
with open(sys.argv[1], newline="") as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = r["Kernel Name"]
    name = re.sub(r"\(anonymous namespace\)::", "", name)
    name = re.sub(r"\(.*", "", name)[:60]
    v = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "ns")
    us = {"nsecond": v / 1000, "ns": v / 1000, "usecond": v, "us": v, "msecond": v * 1000, "ms": v * 1000, "second": v * 1e6}.get(unit, v / 1000)
    key = (name, r.get("Grid Size", ""))
    rows[key][0] += 1
    rows[key][1] += us
total = sum(v[1] for v in rows.values())
print(f"{'kernel':60s} {'grid':>16s} {'n':>6s} {'mean us':>9s} {'total us':>10s} {'share':>6s}")
for (name, grid), (n, t) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:40]:
    print(f"{name:60s} {grid:>16s} {n:6d} {t / n:9.2f} {t:10.1f} {100 * t / total:5.1f}%")
