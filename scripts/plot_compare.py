#!/usr/bin/env python3
"""Plots training runs against each other from their metrics.jsonl (written by octet's trainer).

Three panels, steps on every x axis:
  1. loss: train (raw, faint; smoothed, solid) and validation points;
  2. relative loss error against the first run, (L - L0) / L0 in %: the validation loss at every
     evaluation (points joined by lines) and the smoothed train loss (thin), with DeepSeek-V3's
     0.25% bound (FP8 vs BF16 on ~1T tokens, reference/fp8-facts.md) as lines at +-0.25%, the
     seed band (a second seed of the reference recipe, --seed-band) shaded, and the warm-up
     (--after) greyed out;
  3. tokens/s per step.

`octet compare RUN_DIR... [--seed-band DIR] --out FILE.png` runs this script; it also runs on its
own:
    python scripts/plot_compare.py --out cmp.png runs/bf16 runs/fp8 --seed-band runs/bf16-seed2

Failures print one line on stderr and exit non-zero (3 when matplotlib is missing), which
`octet compare` reports as its error line.
"""

import argparse
import json
import math
import os
import re
import sys
import tempfile

# DeepSeek-V3 report: FP8 training stays within 0.25% relative loss error of BF16.
DEEPSEEK_V3_BOUND_PERCENT = 0.25
# Moving-average windows, as fractions of a run's steps.
LOSS_WINDOW = 0.02
ERROR_WINDOW = 0.05


def fail(msg, code=1):
    print(f"plot_compare.py: {msg}", file=sys.stderr)
    sys.exit(code)


def to_float(v):
    """Numbers as src/train/metrics.h writes them: non-finite values are "nan"/"inf"/"-inf"/null."""
    if v is None:
        return math.nan
    if isinstance(v, bool):
        raise ValueError(f"expected a number, got {v!r}")
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        return float(v)  # accepts "nan", "inf", "-inf", "infinity"
    raise ValueError(f"expected a number, got {v!r}")


def read_metrics(path):
    """Records of one metrics.jsonl; a bad last line is a write cut short by a crash and is dropped."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    records = []
    for i, (n, line) in enumerate(lines):
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict) or "step" not in rec or "loss" not in rec:
                raise ValueError("expected an object with 'step' and 'loss'")
            records.append(rec)
        except ValueError as e:
            if i + 1 < len(lines):
                fail(f"{path}:{n}: {e}")
    if not records:
        fail(f"{path}: no metrics records")
    return records


def read_recipe(run_dir):
    """The top-level `recipe = "..."` of the resolved config the trainer saves, if any."""
    try:
        with open(os.path.join(run_dir, "config.toml"), encoding="utf-8") as f:
            for line in f:
                if line.lstrip().startswith("["):
                    break
                m = re.match(r"""\s*"?recipe"?\s*=\s*["']([^"']*)["']""", line)
                if m:
                    return m.group(1)
    except OSError:
        pass
    return None


class Run:
    def __init__(self, run_dir):
        path = os.path.join(run_dir, "metrics.jsonl")
        if not os.path.isdir(run_dir):
            fail(f"{run_dir}: no such run directory")
        if not os.path.isfile(path):
            fail(f"{path}: no such file")
        recs = read_metrics(path)
        name = os.path.basename(os.path.normpath(run_dir))
        recipe = read_recipe(run_dir)
        self.label = f"{name} ({recipe})" if recipe and recipe != name else name
        try:
            self.steps = [int(r["step"]) for r in recs]
            self.loss = [to_float(r["loss"]) for r in recs]
            self.tok_s = [to_float(r.get("tokens_per_s")) for r in recs]
            self.skipped = [bool(r.get("skipped", False)) for r in recs]
            self.val = [(int(r["step"]), to_float(r["val_loss"])) for r in recs if "val_loss" in r]
        except (TypeError, ValueError) as e:
            fail(f"{path}: {e}")
        # Skipped steps did not update the weights; their loss is often the non-finite value
        # that made the trainer skip, and would break the smoothing.
        self.train = [(s, l) for s, l, k in zip(self.steps, self.loss, self.skipped)
                      if not k and math.isfinite(l)]
        self.val = [(s, v) for s, v in self.val if math.isfinite(v)]
        steps, losses = [s for s, _ in self.train], [l for _, l in self.train]
        self.smooth = dict(zip(steps, smooth(losses, LOSS_WINDOW)))
        # The relative error is a difference of two noisy curves: it needs a wider window.
        self.smooth_wide = dict(zip(steps, smooth(losses, ERROR_WINDOW)))


def smooth(values, fraction):
    """Trailing moving average over `fraction` of the run: per-step losses are too noisy to compare."""
    w = max(1, int(len(values) * fraction))
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= w:
            acc -= values[i - w]
        out.append(acc / min(i + 1, w))
    return out


def rel_error(a, b):
    """(a - b) / |b| in % at the steps both dicts have (negative: a is lower)."""
    steps = sorted(s for s in a.keys() & b.keys() if b[s] != 0)
    return steps, [100.0 * (a[s] - b[s]) / abs(b[s]) for s in steps]


def upper_limit(values, floor):
    """A y limit that leaves out the first 10% (large early-training errors would flatten the rest)."""
    tail = values[len(values) // 10:]
    finite = [v for v in tail if math.isfinite(v)]
    return max([floor] + [1.1 * v for v in finite])


def after(steps, values, first):
    """The (step, value) pairs past the warm-up."""
    return [v for s, v in zip(steps, values) if s > first]


def plot(runs, out, band=None, warmup=0):
    try:
        import matplotlib
        matplotlib.use("Agg")  # no display: the PNG is the product
        import matplotlib.pyplot as plt
    except ImportError:
        fail(f"matplotlib is not installed for {sys.executable} (scripts/setup.sh installs it)", 3)

    fig, (ax_loss, ax_err, ax_tok) = plt.subplots(3, 1, figsize=(10, 12), sharex=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    loss_top = []
    for i, run in enumerate(runs):
        c = colors[i % len(colors)]
        steps = [s for s, _ in run.train]
        ax_loss.plot(steps, [l for _, l in run.train], color=c, alpha=0.2, linewidth=0.8)
        smoothed = [run.smooth[s] for s in steps]
        skipped = sum(run.skipped)
        label = run.label + (f", {skipped} skipped" if skipped else "")
        ax_loss.plot(steps, smoothed, color=c, linewidth=1.6, label=f"{label} train")
        if run.val:
            ax_loss.plot([s for s, _ in run.val], [v for _, v in run.val], "o", color=c,
                         markersize=5, markeredgecolor="black", markeredgewidth=0.5, zorder=3,
                         label=f"{run.label} val")
        loss_top.append(upper_limit(smoothed + [v for _, v in run.val], 0.0))
    ax_loss.set_ylabel("loss")
    ax_loss.set_title(f"loss (train: raw faint, moving average over {LOSS_WINDOW:.0%} of the steps; "
                      "val as points)")
    if loss_top and max(loss_top) > 0:
        ax_loss.set_ylim(top=max(loss_top))
    ax_loss.legend(fontsize=8)

    ref = runs[0]
    bound = DEEPSEEK_V3_BOUND_PERCENT
    err_top = [2 * bound]
    if band is not None:
        bsteps, berr = rel_error(dict(band.val), dict(ref.val))
        if bsteps:
            width = [abs(e) for e in berr]
            ax_err.fill_between(bsteps, [-w for w in width], width, color="gray", alpha=0.25,
                                linewidth=0, label=f"seed band: |{band.label} - reference|")
            err_top.append(upper_limit(after(bsteps, width, warmup), 0.0))
        else:
            tsteps, terr = rel_error(band.smooth_wide, ref.smooth_wide)
            width = [abs(e) for e in terr]
            ax_err.fill_between(tsteps, [-w for w in width], width, color="gray", alpha=0.25,
                                linewidth=0, label=f"seed band (train): |{band.label} - reference|")
    for i, run in enumerate(runs[1:], 1):
        c = colors[i % len(colors)]
        steps, err = rel_error(run.smooth_wide, ref.smooth_wide)
        ax_err.plot(steps, err, color=c, linewidth=0.8, alpha=0.6, label=f"{run.label} train")
        err_top.append(upper_limit([abs(e) for e in after(steps, err, warmup)], 0.0))
        vsteps, verr = rel_error(dict(run.val), dict(ref.val))
        if vsteps:
            ax_err.plot(vsteps, verr, "o-", color=c, markersize=4, linewidth=1.6,
                        markeredgecolor="black", markeredgewidth=0.5, zorder=3,
                        label=f"{run.label} val")
            err_top.append(max([0.0] + [1.1 * abs(e) for e in after(vsteps, verr, warmup)]))
    for sign in (1, -1):
        ax_err.axhline(sign * bound, color="red", linestyle="--", linewidth=1.2,
                       label=f"DeepSeek-V3 bound (\u00b1{bound}%)" if sign > 0 else None)
    ax_err.axhline(0, color="black", linewidth=0.6)
    if warmup > 0:
        ax_err.axvspan(0, warmup, color="black", alpha=0.06, linewidth=0,
                       label=f"warm-up (steps 1-{warmup}), left out of the y range")
    if len(runs) == 1:
        ax_err.text(0.5, 0.7, "one run: nothing to compare against", transform=ax_err.transAxes,
                    ha="center", va="center", color="gray")
    top = max(err_top)
    ax_err.set_ylim(-top, top)
    ax_err.set_ylabel("relative loss error (%)")
    ax_err.set_title(f"relative loss error (L - L0) / L0 against {ref.label} (val: every "
                     f"evaluation; train: moving average over {ERROR_WINDOW:.0%} of the steps)")
    ax_err.legend(fontsize=8)

    for i, run in enumerate(runs):
        c = colors[i % len(colors)]
        pts = [(s, t) for s, t in zip(run.steps, run.tok_s) if math.isfinite(t)]
        ax_tok.plot([s for s, _ in pts], [t for _, t in pts], color=c, linewidth=1.0,
                    label=run.label)
    ax_tok.set_ylim(bottom=0)
    ax_tok.set_ylabel("tokens/s")
    ax_tok.set_xlabel("step")
    ax_tok.set_title("throughput")
    ax_tok.legend(fontsize=8)
    for ax in (ax_loss, ax_err, ax_tok):
        ax.grid(True, alpha=0.3)

    fig.tight_layout()
    # Written to a new file next to the target (mkstemp: a fresh name, created exclusively, so
    # never through a planted link) and renamed, so a failure never leaves a half-written PNG.
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(out) + ".tmp.",
                                   dir=os.path.dirname(os.path.abspath(out)))
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes it 0600; the PNG gets what open() gives
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png", dpi=110)
        os.replace(tmp, out)
    except OSError as e:
        if tmp is not None and os.path.lexists(tmp):
            os.remove(tmp)
        fail(f"{out}: {e.strerror}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="PNG file to write")
    p.add_argument("--seed-band", help="a second seed of the reference recipe: its error is the band")
    p.add_argument("--after", type=int, default=0,
                   help="warm-up steps, left out of the error axis' range (default 0)")
    p.add_argument("runs", nargs="+", help="run directories holding metrics.jsonl; first = reference")
    args = p.parse_args()
    band = Run(args.seed_band) if args.seed_band else None
    plot([Run(d) for d in args.runs], args.out, band, max(0, args.after))


if __name__ == "__main__":
    main()
