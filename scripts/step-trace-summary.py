#!/usr/bin/env python3
"""step-trace-summary.py FILE [--min-seqs N] [--bucket P]: where a server's engine time went, from
an LM_STEP_TRACE file (engine/sched.h: one line per engine step; `LM_STEP_TRACE=FILE lumen serve`).

Prints the forward time of decode-only steps and of steps with prefill chunks, the admission and
planning time, the gaps between one forward's end and the next step's start (sampling, streaming,
bookkeeping), and the median decode-only step by its longest context (steps of at least
--min-seqs sequences, in buckets of --bucket positions). docs/perf-notes.md v18 and v19 read it."""
import argparse
import collections
import signal
import statistics
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", help="an LM_STEP_TRACE file")
    ap.add_argument("--min-seqs", type=int, default=57,
                    help="decode-only steps of at least this many sequences go in the table (default 57)")
    ap.add_argument("--bucket", type=int, default=256, help="longest-context bucket, positions (default 256)")
    a = ap.parse_args()
    steps = []
    with open(a.file) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            c = line.split()
            if len(c) != 10:
                sys.exit(f"{a.file}: a step line has {len(c)} columns, not 10: {line.strip()}")
            steps.append(dict(start=float(c[1]), fwd=float(c[2]), plan=float(c[3]), seqs=int(c[4]),
                              tokens=int(c[5]), chunks=int(c[7]), longest=int(c[9])))
    if not steps:
        sys.exit(f"{a.file}: no steps")
    dec = [s for s in steps if s["chunks"] == 0]
    mix = [s for s in steps if s["chunks"] > 0]
    # the next step's start minus this forward's end, less the next step's planning time
    gaps = [n["start"] - s["start"] - s["fwd"] - n["plan"] for s, n in zip(steps, steps[1:])]
    gaps = [g for g in gaps if g < 50]  # idle waits for requests are not step overhead
    print(f"steps {len(steps)}: forward {sum(s['fwd'] for s in steps) / 1e3:.2f} s")
    print(f"  decode-only {len(dec)}: {sum(s['fwd'] for s in dec) / 1e3:.2f} s")
    mixed = f"{sum(s['fwd'] for s in mix) / 1e3:.2f} s"
    if mix:
        mixed += (f" (mean {statistics.mean(s['fwd'] for s in mix):.2f} ms, "
                  f"{statistics.mean(s['tokens'] for s in mix):.0f} tokens)")
    print(f"  with prefill chunks {len(mix)}: {mixed}")
    print(f"  admission + planning: {sum(s['plan'] for s in steps) / 1e3:.3f} s")
    if gaps:
        print(f"  between steps: median {statistics.median(gaps):.3f} ms, sum {sum(gaps) / 1e3:.2f} s")
    by = collections.defaultdict(list)
    for s in dec:
        if s["seqs"] >= a.min_seqs:
            by[s["longest"] // a.bucket * a.bucket].append(s["fwd"])
    if by:
        print(f"decode-only steps of >= {a.min_seqs} sequences by longest context:")
        print("  longest context   steps   forward ms (median)")
        for k in sorted(by):
            print(f"  {k:5d}-{k + a.bucket - 1:<5d}     {len(by[k]):5d}   {statistics.median(by[k]):.2f}")


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet under `| head`
    main()
