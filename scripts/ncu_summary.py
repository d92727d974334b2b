"""Sums Nsight Compute's per-launch gpu__time_duration (a --csv --page raw report) per kernel.

Usage: python3 scripts/ncu_summary.py REPORT.csv[.gz] [--top N]
Prints, largest first: total ms, launches and the kernel name without its arguments.
"""
import argparse
import collections
import csv
import gzip
import re


def rows(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        lines = [line for line in f if line.startswith('"')]
    reader = csv.reader(lines)
    header = next(reader)
    next(reader)  # the units row
    name = header.index("Kernel Name")
    time = header.index("gpu__time_duration.sum")
    for row in reader:
        try:
            yield row[name], float(row[time].replace(",", ""))
        except (ValueError, IndexError):
            continue


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("report")
    p.add_argument("--top", type=int, default=30)
    a = p.parse_args()
    total, count = collections.Counter(), collections.Counter()
    for kernel, ns in rows(a.report):
        short = re.sub(r"\(.*", "", kernel).replace("void ", "").replace("<unnamed>", "(anon)")
        short = re.sub(r"<.*", "", short)
        total[short] += ns
        count[short] += 1
    print(f"{sum(count.values())} launches, {sum(total.values()) / 1e6:.1f} ms")
    for kernel, ns in total.most_common(a.top):
        print(f"{ns / 1e6:9.2f} ms {count[kernel]:6d}  {kernel[:100]}")


if __name__ == "__main__":
    main()
