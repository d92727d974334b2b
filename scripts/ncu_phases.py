"""Splits a Nsight Compute per-launch report of `octet bench train-step --runs 1` into its phases.

Usage: python3 scripts/ncu_phases.py REPORT.csv [--top N]
The bench runs, in order: prepare, 3 x forward+backward (2 warm-ups), prepare x 2, AdamW x 2, then the
blocks. Each forward + backward starts with embedding_forward_kernel and ends with the embedding
backward's last kernel, so the launches between the first kernel of the third forward and the first
kernel after it that is neither of the step are the steady step. Prints the device time of that step
(kernels only; copies and memsets are not in the report) and its kernels by total time.
"""
import argparse
import collections
import re
import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
from ncu_summary import rows  # noqa: E402


def short(kernel):
    s = re.sub(r"\(.*", "", kernel).replace("void ", "").replace("<unnamed>", "(anon)")
    return re.sub(r"<.*", "", s)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("report")
    p.add_argument("--top", type=int, default=40)
    a = p.parse_args()
    launches = [(short(k), ns) for k, ns in rows(a.report)]
    starts = [i for i, (k, _) in enumerate(launches) if "embedding_forward" in k]
    ends = [i for i, (k, _) in enumerate(launches) if "embedding_backward_runs" in k]
    print(f"{len(launches)} launches; embedding_forward at {starts[:8]}; backward ends at {ends[:8]}")
    if len(starts) < 3 or len(ends) < 3:
        print("fewer than three steps in the report")
        return
    for n in range(3):
        s, e = starts[n], ends[n]
        seg = launches[s:e + 1]
        print(f"step {n}: {len(seg)} kernels, {sum(ns for _, ns in seg) / 1e6:.2f} ms of kernel time")
    seg = launches[starts[2]:ends[2] + 1]
    tot, cnt = collections.Counter(), collections.Counter()
    for k, ns in seg:
        tot[k] += ns
        cnt[k] += 1
    for k, ns in tot.most_common(a.top):
        print(f"{ns / 1e6:9.3f} ms {cnt[k]:6d}  {k[:110]}")
    # What precedes the first step: the prepare; what follows the third: prepare x 2 and AdamW x 2.
    pre = launches[:starts[0]]
    print(f"before the first step (one prepare and set-up): {len(pre)} kernels, "
          f"{sum(ns for _, ns in pre) / 1e6:.2f} ms")


if __name__ == "__main__":
    main()
