#!/usr/bin/env python3
"""Compares training runs' metrics.jsonl for scripts/two_gpu.sh (issue 18). Standard library only.

  losses --ref REF.jsonl --run NAME=RUN.jsonl [...] [--rel-tol 1e-3] [--from-step N]
      step by step against the reference: max abs and max relative loss difference, the step of
      the largest, skipped steps of each run; exit 1 when a run is beyond the tolerance, skipped a
      step, or shares no step with the reference.
  speed --ref NAME=REF.jsonl:WORLD --run NAME=RUN.jsonl:WORLD [...] [--skip N]
      mean tokens/s over the steps after the first N (default: min(10, half)), per GPU (the
      trainer's tokens/s counts every rank's tokens), and the ratio of the runs' total tokens/s to
      the reference's (the weak-scaling target on two GPUs: >= 1.85x).
"""
import argparse
import json
import math
import sys


def read(path):
    recs = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line (the trainer's readers accept it too)
            if "step" in r and "loss" in r:
                recs[int(r["step"])] = r
    if not recs:
        sys.exit(f"two_gpu_compare: {path}: no step records")
    return recs


def as_float(v):
    return float("nan") if v in ("nan", None) else float(v)


def losses(a):
    ref = read(a.ref)
    bad = False
    print(f"losses against {a.ref} (relative tolerance {a.rel_tol:g}, the in-process tests'):")
    for spec in a.run:
        name, path = spec.split("=", 1)
        run = read(path)
        steps = sorted(s for s in run if s in ref and s >= a.from_step)
        skipped = [s for s in sorted(run) if run[s].get("skipped") and s >= a.from_step]
        if not steps:
            print(f"  {name}: no step in common with the reference")
            bad = True
            continue
        max_abs, max_rel, at = 0.0, 0.0, steps[0]
        for s in steps:
            x, y = as_float(run[s]["loss"]), as_float(ref[s]["loss"])
            d = abs(x - y) if math.isfinite(x) and math.isfinite(y) else float("inf")
            rel = d / abs(y) if y else d
            if rel > max_rel or not math.isfinite(rel):
                at = s
            max_abs, max_rel = max(max_abs, d), max(max_rel, rel)
        ok = max_rel <= a.rel_tol and not skipped
        bad = bad or not ok
        print(f"  {name}: steps {steps[0]}-{steps[-1]} ({len(steps)}): max abs {max_abs:.3e}, "
              f"max rel {max_rel:.3e} (step {at}); skipped {len(skipped)}"
              f"{' ' + str(skipped) if skipped else ''}; {'PASS' if ok else 'FAIL'}")
    return 1 if bad else 0


def rate(path, skip):
    recs = read(path)
    steps = sorted(recs)
    n = skip if skip is not None else min(10, len(steps) // 2)
    vals = [as_float(recs[s].get("tokens_per_s")) for s in steps[n:]]
    vals = [v for v in vals if math.isfinite(v) and v > 0]
    if not vals:
        sys.exit(f"two_gpu_compare: {path}: no tokens/s after the first {n} steps")
    ms = [as_float(recs[s].get("step_ms")) for s in steps[n:]]
    return sum(vals) / len(vals), sum(ms) / len(ms), n


def speed(a):
    def parse(spec):
        name, rest = spec.split("=", 1)
        path, world = rest.rsplit(":", 1)
        return name, path, int(world)

    rname, rpath, rworld = parse(a.ref)
    ref_tps, ref_ms, n = rate(rpath, a.skip)
    ref_gpu = ref_tps / rworld
    print(f"tokens/s (mean after the first {n} steps; per GPU = total / GPUs):")
    print(f"  {rname}: {ref_tps / 1e3:.1f}k total, {ref_gpu / 1e3:.1f}k per GPU, step {ref_ms:.1f} ms")
    for spec in a.run:
        name, path, world = parse(spec)
        tps, ms, n = rate(path, a.skip)
        print(f"  {name}: {tps / 1e3:.1f}k total, {tps / world / 1e3:.1f}k per GPU, step {ms:.1f} ms; "
              f"{tps / ref_tps:.2f}x {rname} on {world} GPU{'s' if world > 1 else ''} ({tps / world / ref_gpu:.2f}x per GPU)")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    lo = sub.add_parser("losses")
    lo.add_argument("--ref", required=True)
    lo.add_argument("--run", action="append", required=True)
    lo.add_argument("--rel-tol", type=float, default=1e-3)
    lo.add_argument("--from-step", type=int, default=1)
    sp = sub.add_parser("speed")
    sp.add_argument("--ref", required=True)
    sp.add_argument("--run", action="append", default=[])
    sp.add_argument("--skip", type=int, default=None)
    a = p.parse_args()
    return losses(a) if a.cmd == "losses" else speed(a)


if __name__ == "__main__":
    sys.exit(main())
