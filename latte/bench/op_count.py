"""`latte bench ops --count-ops`: ATen operations per forward+backward of
latte_causal (backend "torch") against T, counted by a dispatch mode
(issue 42: on a GPU each op is a kernel launch, so their number, not the
arithmetic, sets the time of a small or long call alike).

Every ATen call the dispatcher sees is counted, views included, in one
forward and one backward at each T (one untimed call before, so that
per-process caches are filled). Three shapes: a small one (one segment of
the chunked kernel at every T: the log-depth chunk scan alone), the
`bench ops` shape, and issue 42's GPU shape (its heads and widths, batch 1).
Two segment policies (latte/ops/latte/chunked.py): the CPU's, on CPU
tensors, whose segments of about 16 MB per temporary (docs/design.md §2)
split the `bench ops` shape's long inputs, so that its count grows with the
segments, by design; and a CUDA device's, 1/256 of its memory per
temporary (an H100's 80 GB), on `meta` tensors (the same ops, no
arithmetic) through `chunked.segment_elems`: the ops a GPU would launch,
counted without one.

Beside them, backend "fla" at issue 56's GPU shape (FLA_SHAPE, bfloat16):
the ops (views left out) and bytes read and written that each construction
of q, k, g adds to chunk_gla's own op, forward and backward, counted on
`meta` tensors through latte's custom ops (fla_construction_count;
docs/gpu.md §2.3).
"""

from __future__ import annotations

import collections
import contextlib
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from latte import reporting
from latte.ops import latte_causal
from latte.ops.backend import using_fla_construction
from latte.ops.latte import chunked, gla

from . import providers as P

SEQS, QUICK_SEQS = [1024, 2048, 4096, 8192, 16384], [256, 1024]
SHAPES = {
    "small (B1 H2 Lh8 Dv8)": (1, 2, 8, 8),
    "bench ops (B1 H8 Lh32 Dv64)": (1, P.HEADS, P.LATENTS // P.HEADS, P.DV),
    "issue 42 GPU (B1 H16 Lh128 Dv128)": (1, 16, 128, 128),
}
# segment policy -> (device the tensors live on, floats per segment temporary
# or None for the device's own choice)
CUDA_POLICY = "cuda (80 GB: H100)"
POLICIES = {"cpu": ("cpu", None), CUDA_POLICY: ("meta", chunked.cuda_segment_elems(chunked.H100_MEMORY))}
# the GPU shape only under the GPU's policy (on the CPU: 2 GB per segment temporary at 16K)
ROWS = [(s, "cpu") for s in list(SHAPES)[:2]] + [(s, CUDA_POLICY) for s in list(SHAPES)[1:]]


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


class ByteCounter(OpCounter):
    """OpCounter that leaves views out (they launch nothing) and adds up the
    bytes each op reads (its tensor arguments) and writes (its outputs):
    on `meta` tensors, shapes and dtypes only."""

    def __init__(self):
        super().__init__()
        self.bytes_by_op: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view or func.overloadpacket in (torch.ops.aten.detach, torch.ops.aten.alias):
            return out
        self.by_op[str(func.overloadpacket)] += 1
        flat = torch.utils._pytree.tree_leaves((args, kwargs or {}, out))
        self.bytes_by_op[str(func.overloadpacket)] += sum(
            t.numel() * t.element_size() for t in flat if isinstance(t, torch.Tensor)
        )
        return out


# issue 56's shape for the fla construction's count: B, T, H, L, D, bfloat16
FLA_SHAPE = (16, 4096, 16, 128, 128)
KERNEL_OPS = {"latte.chunk_gla", "latte.chunk_gla_bwd"}


def fla_construction_count(shape=FLA_SHAPE, dtype=torch.bfloat16, masked=False, construction="fused") -> dict:
    """Ops (views left out) and bytes read + written by one forward and one
    backward of backend "fla" (gla.gla_chunked: the construction and
    chunk_gla) on `meta` tensors, without and beside chunk_gla's own op:
    the custom ops of latte/ops/latte/gla_ops.py stand in for fla's kernels."""
    B, T, H, L, D = shape
    a, b = (torch.empty(B, T, H, L, device="meta", dtype=dtype, requires_grad=True) for _ in range(2))
    v = torch.empty(B, T, H, D, device="meta", dtype=dtype, requires_grad=True)
    mask = torch.ones(B, T, dtype=torch.bool, device="meta") if masked else None
    res = {}
    with using_fla_construction(construction):
        with ByteCounter() as fwd:
            y, S, z = gla.gla_chunked(a, b, v, mask=mask)
        dy = torch.empty_like(y)
        with ByteCounter() as bwd:
            torch.autograd.backward(y, dy)
    for name, c in (("forward", fwd), ("backward", bwd)):
        built = {op: n for op, n in c.by_op.items() if op not in KERNEL_OPS}
        res[name] = {
            "construction_ops": sum(built.values()),
            "construction_gib": sum(c.bytes_by_op[op] for op in built) / 2**30,
            "kernel_gib": sum(c.bytes_by_op[op] for op in c.by_op if op in KERNEL_OPS) / 2**30,
            "by_op": dict(c.by_op),
        }
    return res


def fla_construction_rows() -> list[dict]:
    """fla_construction_count for the fused construction without and with a
    mask, and the eager one, at FLA_SHAPE (without the per-op detail)."""
    rows = []
    for construction, masked in (("fused", False), ("fused", True), ("eager", False)):
        c = fla_construction_count(masked=masked, construction=construction)
        rows.append(
            {"construction": construction, "masked": masked}
            | {f"{k}_{m}": v for m in ("forward", "backward") for k, v in c[m].items() if k != "by_op"}
        )
        print(f"  fla construction {construction:5s} mask {masked!s:5s} {rows[-1]}", flush=True)
    return rows


def fwd_bwd(T: int, shape, device="cpu", chunk_size: int = P.CHUNK, seed: int = 0):
    """A zero-argument forward+backward of latte_causal at T (on `meta`, the
    inputs are shapes only)."""
    B, H, L, D = shape
    g = torch.Generator().manual_seed(seed)

    def draw(n):
        if device == "meta":
            return torch.empty(B, T, H, n, device="meta")
        return torch.randn(B, T, H, n, generator=g).to(device)

    a, b, v = (draw(n).requires_grad_(True) for n in (L, L, D))

    def call():
        y = latte_causal(a, b, v, chunk_size=chunk_size, backend="torch")[0]
        y.backward(torch.ones_like(y))

    return call


def count(call, elems: int | None = None) -> OpCounter:
    """The ops of one call, after an uncounted one (caches filled); elems:
    floats per segment temporary (chunked.segment_elems), None for the
    device's own policy."""
    with contextlib.nullcontext() if elems is None else chunked.segment_elems(elems):
        call()
        with OpCounter() as c:
            call()
    return c


def count_policy(T: int, shape, policy: str) -> OpCounter:
    """The ops of one forward+backward at T under a segment policy of POLICIES."""
    device, elems = POLICIES[policy]
    return count(fwd_bwd(T, shape, device), elems)


def run(seqs=None, quick: bool = False) -> dict:
    seqs = seqs or (QUICK_SEQS if quick else SEQS)
    rows, t0 = [], time.perf_counter()
    for name, policy in ROWS:
        for T in seqs:
            c = count_policy(T, SHAPES[name], policy)
            rows.append({"shape": name, "policy": policy, "T": T, "ops": c.total, "top": dict(c.by_op.most_common(5))})
            print(f"  {name:28s} {policy:18s} T={T:6d} {c.total:6d} ATen ops per forward+backward", flush=True)
    fla_rows = fla_construction_rows()
    return {
        "benchmark": "op-count",
        "fla_construction": fla_rows,
        "machine": reporting.machine_info(),
        "config": {
            "T": seqs,
            "shapes": SHAPES,
            "policies": {k: {"device": d, "segment_elems": e} for k, (d, e) in POLICIES.items()},
            "chunk_size": P.CHUNK,
            "what": __doc__.split("\n\n")[0],
        },
        "results": rows,
        "wall_s": time.perf_counter() - t0,
    }


def markdown(res: dict) -> str:
    seqs = res["config"]["T"]
    by = {(r["shape"], r["policy"], r["T"]): r["ops"] for r in res["results"]}
    rows = []
    for s, pol in dict.fromkeys((r["shape"], r["policy"]) for r in res["results"]):
        base = by[(s, pol, seqs[0])]
        rows.append([s, pol] + [f"{by[(s, pol, T)]} ({by[(s, pol, T)] / base:.2f}x)" for T in seqs])
    head = ["shape", "segment policy"] + [f"T={T:,}" for T in seqs]
    return (
        "# ATen ops per forward+backward of latte_causal (backend torch)\n\n"
        f"torch {res['machine']['torch']}, chunk {res['config']['chunk_size']}; "
        f"in brackets: the ratio to T={seqs[0]:,}. Segment policy cpu: about 16 MB per temporary, "
        f"on CPU tensors; {CUDA_POLICY}: 1/256 of the device's memory, on meta tensors "
        "(no GPU involved).\n\n"
        + reporting.md_table(head, rows)
        + "\n"
        + _fla_markdown(res.get("fla_construction", []))
    )


def _fla_markdown(rows: list[dict]) -> str:
    if not rows:
        return ""
    B, T, H, L, D = FLA_SHAPE
    body = [
        [r["construction"], "yes" if r["masked"] else "no"]
        + [f"{r[f'construction_ops_{m}']}" for m in ("forward", "backward")]
        + [f"{r[f'construction_gib_{m}']:.2f}" for m in ("forward", "backward")]
        for r in rows
    ]
    head = ["construction", "mask", "ops forward", "ops backward", "GiB forward", "GiB backward"]
    return (
        f"\n## backend fla: what the construction adds to chunk_gla\n\nB {B}, T {T:,}, H {H}, L {L}, "
        f"Dv {D}, bfloat16, on meta tensors through latte's custom ops; views left out, bytes read + "
        "written (docs/gpu.md §2.3).\n\n" + reporting.md_table(head, body) + "\n"
    )
