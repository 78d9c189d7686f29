"""`python -m latte.ops`: a first sanity check of speed, not a benchmark.

Times latte_causal forward+backward beside torch's causal
scaled_dot_product_attention on the same shapes (B=1, H=8, Lh=32, Dv=64,
float32) and prints a table. The real benchmarks are `latte bench ...`.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch
import torch.nn.functional as F

from . import latte_causal


def _time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e3


def main(argv=None) -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m latte.ops", description=__doc__)
    p.add_argument("--lengths", default="1024,4096,16384")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    H, L, D = 8, 32, 64
    print(
        f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"{args.threads} threads, fp32, B=1 H={H} Lh={L} Dv={D}, median of {args.repeats}, fwd+bwd"
    )
    print("| T | latte_causal ms | sdpa causal ms | sdpa / latte |")
    print("|---|---|---|---|")
    for T in (int(t) for t in args.lengths.split(",")):
        a, b = (torch.randn(1, T, H, L, requires_grad=True) for _ in range(2))
        v = torch.randn(1, T, H, D, requires_grad=True)
        q, k, vv = (torch.randn(1, H, T, D, requires_grad=True) for _ in range(3))
        t_latte = _time(lambda a=a, b=b, v=v: latte_causal(a, b, v)[0].sum().backward(), args.repeats)
        t_sdpa = _time(
            lambda q=q, k=k, vv=vv: F.scaled_dot_product_attention(q, k, vv, is_causal=True).sum().backward(),
            args.repeats,
        )
        print(f"| {T} | {t_latte:.1f} | {t_sdpa:.1f} | {t_sdpa / t_latte:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
