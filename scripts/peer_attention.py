#!/usr/bin/env python3
"""The peer of `octet bench attention`: cuDNN's fused attention called through PyTorch, causal, BF16,
on the same (B, T, H, Dqk, Dv) shapes and with the same FLOP count (the causal half's useful work:
forward 2 * pairs * (Dqk + Dv), backward 2 * pairs * (3 Dqk + 2 Dv), pairs = B H T (T + 1) / 2).

Run on the GPU machine in the same call as `octet bench attention` so the two are measured on one card:
    python3 scripts/peer_attention.py [--deterministic]
Prints the cuDNN version PyTorch loaded and a table of forward / backward ms and TFLOPS (median of 20).
"""
import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [(8, 2048, 16, 96, 64), (8, 2048, 16, 192, 128), (1, 4096, 128, 192, 128)]


def median_ms(fn, warmup=3, runs=20):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    return sorted(times)[len(times) // 2]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="cudnn", choices=["cudnn", "flash"])
    parser.add_argument("--deterministic", action="store_true",
                        help="torch.use_deterministic_algorithms(True): cuDNN's deterministic backward, "
                             "as octet runs it")
    args = parser.parse_args()
    torch.use_deterministic_algorithms(args.deterministic)
    backend = SDPBackend.CUDNN_ATTENTION if args.backend == "cudnn" else SDPBackend.FLASH_ATTENTION
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}; "
          f"cuDNN {torch.backends.cudnn.version()}; backend {args.backend}; "
          f"deterministic {args.deterministic}")
    print(f"{'B x T x H (Dqk, Dv)':<26}{'fwd ms':>9}{'fwd TFLOPS':>12}{'bwd ms':>9}{'bwd TFLOPS':>12}")
    for b, t, h, dqk, dv in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(1)
        # (B, H, T, D) views of (B, T, H, D) storage: octet's layout.
        def make(d):
            x = torch.randn(b, t, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
            return x.transpose(1, 2).requires_grad_(True)
        q, k, v = make(dqk), make(dqk), make(dv)
        d_o = torch.randn(b, t, h, dv, device="cuda", dtype=torch.bfloat16, generator=gen).transpose(1, 2)
        with sdpa_kernel([backend]):
            fwd = median_ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            bwd = median_ms(lambda: torch.autograd.grad(o, (q, k, v), d_o, retain_graph=True))
        pairs = b * h * t * (t + 1) / 2
        f_fl, b_fl = 2 * pairs * (dqk + dv), 2 * pairs * (3 * dqk + 2 * dv)
        shape = f"{b}x{t}x{h} ({dqk}, {dv})"
        print(f"{shape:<26}{fwd:>9.3f}{f_fl / fwd / 1e9:>12.1f}{bwd:>9.3f}{b_fl / bwd / 1e9:>12.1f}")


if __name__ == "__main__":
    main()
