#!/usr/bin/env python3
"""ncu-stalls.py CSV [--kernel SUBSTR] [--top N] [--cuts HEX,HEX,...]

Where warps stall, from Nsight Compute's source page: CSV is the output of
`ncu -i REPORT --page source --csv --print-source sass` for a report taken with the SourceCounters
section (PC sampling; `scripts/device-run.sh ncugraph` takes one of a whole decode graph). For each
kernel function: its sampled warps, in total and by stall reason (ncu's `stall_*` columns, e.g.
barrier, long_sb, no_inst; see the Profiling Guide's warp-state table). With --kernel, for the
functions whose name contains SUBSTR: the sums per code region (split at the first ACQBULK,
i.e. `griddepcontrol.wait`, at the first and last HGMMA, and at --cuts, offsets from the
function's start in hex; the wait instruction is a region of its own: warps resident early sit
there) and the --top instructions by samples. A sample is a warp seen at that
instruction, so a share of samples is a share of warp time, not of the critical path.
Used by scripts/device-run.sh's ncugraph step (perf-notes v31)."""
import argparse, csv, re, sys


def load(path):
    """{kernel name: (stall reason names, [(offset, sass text, samples, {reason: samples})])}"""
    kernels, name, reasons, cols, total_col = {}, None, [], [], None
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                name = row[1]
                kernels.setdefault(name, ([], []))
                if kernels[name][1]:  # the same function twice: keep its first table only
                    name = None
                continue
            if row[0] == "Address":
                if name is None and kernels:  # a repeated function's table: skipped
                    total_col = None
                    continue
                if name is None or "Warp Stall Sampling (All Samples)" not in row:
                    sys.exit(f"ncu-stalls: {path}: a source table without a kernel name or without the "
                             "'Warp Stall Sampling (All Samples)' column (take the report with --section SourceCounters)")
                # the all-samples columns only, not their "(Not Issued)" twins
                cols = [i for i, h in enumerate(row) if h.startswith("stall_") and "Not Issued" not in h]
                reasons = [row[i][len("stall_"):] for i in cols]
                kernels[name] = (reasons, kernels[name][1])
                total_col = row.index("Warp Stall Sampling (All Samples)")
                continue
            if total_col is None or not row[0].startswith("0x"):
                continue
            num = lambda s: int(s.replace(",", "")) if s.strip() not in ("", "-") else 0
            kernels[name][1].append((int(row[0], 16), row[1].strip(), num(row[total_col]),
                                     {r: num(row[i]) for r, i in zip(reasons, cols)}))
    for k, (reasons, ins) in kernels.items():
        if ins:
            base = ins[0][0]
            kernels[k] = (reasons, [(a - base, s, n, d) for a, s, n, d in ins])
    return kernels


def short(name):
    name = re.sub(r"\(anonymous namespace\)::|<unnamed>::|\(int\)|\(bool\)|void ", "", name)
    return re.sub(r">\(.*", ">", re.sub(r"^([^<(]*)\(.*", r"\1", name))[:70]


def by_reason(ins, reasons):
    return {r: sum(d[r] for _, _, _, d in ins) for r in reasons}


def fmt(tot, sums, total_all):
    """Samples, share, and the reasons; "other": samples the page gives no reason column for (at
    HGMMAs most of them: the raw metrics' gmma and warpgroup_arrive stalls have no column)."""
    top = sorted(((v, r) for r, v in sums.items() if v), reverse=True)
    other = tot - sum(sums.values())
    return (f"{tot:8d} {100 * tot / max(total_all, 1):5.1f}%  " + " ".join(f"{r} {v}" for v, r in top[:8]) +
            (f" other {other}" if other else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--kernel", help="detail the functions whose name contains this")
    ap.add_argument("--top", type=int, default=25, help="instructions listed per detailed function (default 25)")
    ap.add_argument("--cuts", default="", help="more region boundaries: offsets in hex, comma-separated")
    a = ap.parse_args()
    kernels = load(a.csv)
    if not kernels:
        sys.exit(f"ncu-stalls: no source rows in {a.csv} (was the report taken with --section SourceCounters?)")
    total_all = sum(n for _, ins in kernels.values() for _, _, n, _ in ins)
    print(f"{'kernel':70s} {'samples':>8s} {'share':>6s}  by reason")
    for k, (reasons, ins) in sorted(kernels.items(), key=lambda kv: -sum(n for _, _, n, _ in kv[1][1])):
        print(f"{short(k):70s} " + fmt(sum(n for _, _, n, _ in ins), by_reason(ins, reasons), total_all))
    if not a.kernel:
        return
    extra = [int(c, 16) for c in a.cuts.split(",") if c]
    for k, (reasons, ins) in kernels.items():
        if a.kernel not in k:
            continue
        print(f"\n{short(k)}")
        marks = {}
        for off, sass, _, _ in ins:
            if "ACQBULK" in sass and "the wait" not in marks.values():
                marks[off], marks[off + 16] = "the wait", "after the wait"
        hg = [off for off, sass, _, _ in ins if "HGMMA" in sass]
        if hg:
            marks.setdefault(hg[0], "first HGMMA")
            marks.setdefault(hg[-1] + 16, "after the last HGMMA")
        for c in extra:
            marks.setdefault(c, f"cut {c:x}")
        bounds = sorted(marks)
        kt = sum(n for _, _, n, _ in ins)
        start, label = 0, "start"
        for b in bounds + [None]:
            part = [x for x in ins if x[0] >= start and (b is None or x[0] < b)]
            if part:
                print(f"  from {start:6x} ({label:>20s}): " + fmt(sum(n for _, _, n, _ in part), by_reason(part, reasons), kt))
            if b is not None:
                start, label = b, marks[b]
        print(f"  top {a.top} instructions (offset, samples, sass, reasons):")
        for off, sass, n, d in sorted(ins, key=lambda x: -x[2])[: a.top]:
            why = " ".join(f"{r}:{v}" for r, v in sorted(d.items(), key=lambda kv: -kv[1]) if v)
            print(f"  {off:6x} {n:6d}  {sass[:56]:56s} {why}")


if __name__ == "__main__":
    main()
