"""`latte bench ops --count-ops`: ATen operations per forward+backward of
latte_causal (backend "torch") against T, counted by a dispatch mode
(issue 42: on a GPU each op is a kernel launch, so their number, not the
arithmetic, sets the time of a small or long call alike).

Every ATen call the dispatcher sees is counted, views included, in one
forward and one backward at each T (one untimed call before, so that
per-process caches are filled). Two shapes: a small one (one segment of
the chunked kernel at every T: the log-depth chunk scan alone) and the
`bench ops` shape, whose chunks the CPU runs in segments of about 16 MB
(docs/design.md §2): there the count grows with the segments, by design on
the CPU; a GPU sizes its segments by its memory (latte/ops/chunked.py).
"""

from __future__ import annotations

import collections
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from latte import reporting
from latte.ops import latte_causal

from . import providers as P

SEQS, QUICK_SEQS = [1024, 2048, 4096, 8192, 16384], [256, 1024]
SHAPES = {
    "small (B1 H2 Lh8 Dv8)": (1, 2, 8, 8),
    "bench ops (B1 H8 Lh32 Dv64)": (1, P.HEADS, P.LATENTS // P.HEADS, P.DV),
}


class OpCounter(TorchDispatchMode):
    """Counts every ATen op dispatched while active, by name."""

    def __init__(self):
        super().__init__()
        self.by_op: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.by_op[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.by_op.values())


def fwd_bwd(T: int, shape, device="cpu", chunk_size: int = P.CHUNK, seed: int = 0):
    """A zero-argument forward+backward of latte_causal at T."""
    B, H, L, D = shape
    g = torch.Generator().manual_seed(seed)
    a, b, v = (torch.randn(B, T, H, n, generator=g).to(device).requires_grad_(True) for n in (L, L, D))

    def call():
        y = latte_causal(a, b, v, chunk_size=chunk_size, backend="torch")[0]
        y.backward(torch.ones_like(y))

    return call


def count(call) -> OpCounter:
    """The ops of one call, after an uncounted one (caches filled)."""
    call()
    with OpCounter() as c:
        call()
    return c


def run(seqs=None, quick: bool = False) -> dict:
    seqs = seqs or (QUICK_SEQS if quick else SEQS)
    rows, t0 = [], time.perf_counter()
    for name, shape in SHAPES.items():
        for T in seqs:
            c = count(fwd_bwd(T, shape))
            rows.append({"shape": name, "T": T, "ops": c.total, "top": dict(c.by_op.most_common(5))})
            print(f"  {name:28s} T={T:6d} {c.total:6d} ATen ops per forward+backward", flush=True)
    return {
        "benchmark": "op-count",
        "machine": reporting.machine_info(),
        "config": {"T": seqs, "shapes": SHAPES, "chunk_size": P.CHUNK, "what": __doc__.split("\n\n")[0]},
        "results": rows,
        "wall_s": time.perf_counter() - t0,
    }


def markdown(res: dict) -> str:
    seqs = res["config"]["T"]
    by = {(r["shape"], r["T"]): r["ops"] for r in res["results"]}
    shapes = list(res["config"]["shapes"])
    rows = []
    for s in shapes:
        base = by[(s, seqs[0])]
        rows.append([s] + [f"{by[(s, T)]} ({by[(s, T)] / base:.2f}x)" for T in seqs])
    head = ["shape"] + [f"T={T:,}" for T in seqs]
    return (
        "# ATen ops per forward+backward of latte_causal (backend torch)\n\n"
        f"torch {res['machine']['torch']}, chunk {res['config']['chunk_size']}; "
        f"in brackets: the ratio to T={seqs[0]:,}.\n\n" + reporting.md_table(head, rows) + "\n"
    )
