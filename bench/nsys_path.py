#!/usr/bin/env python3
"""Reads bench/h200_nsys.sh's CSV (nsys stats -r cuda_gpu_trace) and prints, per decode step, the
critical path each kernel adds (its end less the latest end before it, never below 0), summed by kernel
name over the last STEPS steps (a step ends at the copy of the logits to the host), plus the time
between steps in which the GPU ran nothing. Usage: nsys_path.py CSV [STEPS] [LAYERS]"""
import csv
import re
import sys
from collections import defaultdict


def short(name):
    name = re.sub(r"\(.*", "", name)  # drop the argument list
    name = re.sub(r"^(void )?(xpert::)?(cuda::)?((anonymous namespace)::)?", "", name)
    return name[:60]


def main():
    rows = list(csv.DictReader(open(sys.argv[1])))
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    layers = int(sys.argv[3]) if len(sys.argv) > 3 else 48
    ev = []
    for r in rows:
        start, dur = int(r["Start (ns)"]), int(r["Duration (ns)"])
        name = r["Name"]
        ev.append((start, start + dur, name))
    ev.sort()
    ends = [i for i, e in enumerate(ev) if "Device-to-Host" in e[2]]
    if len(ends) < steps + 1:
        sys.exit(f"only {len(ends)} device-to-host copies in {sys.argv[1]}")
    path = defaultdict(float)
    count = defaultdict(int)
    idle = total = 0.0
    for a, b in zip(ends[-steps - 1:-1], ends[-steps:]):
        prev_end = ev[a][1]
        t0 = prev_end
        for start, end, name in ev[a + 1:b + 1]:
            k = short(name)
            if start > prev_end:
                idle += start - prev_end
            path[k] += max(0, end - max(start, prev_end)) if start > prev_end else max(0, end - prev_end)
            count[k] += 1
            prev_end = max(prev_end, end)
        total += prev_end - t0
    print(f"{steps} steps: {total / steps / 1e3:.1f} us from one logits copy's end to the next's, "
          f"{idle / steps / 1e3:.1f} us of it with nothing running")
    print(f"{'kernel':60} {'calls':>6} {'us/step':>9} {'us/layer':>9}")
    for k, v in sorted(path.items(), key=lambda kv: -kv[1]):
        print(f"{k:60} {count[k] / steps:6.0f} {v / steps / 1e3:9.2f} {v / steps / 1e3 / layers:9.3f}")


if __name__ == "__main__":
    main()
