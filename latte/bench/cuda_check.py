"""`latte bench check`: causal Latte on the device against float64, at
benchmark sizes, on the key logits training produces (docs/evaluation.md §1.2).

For each T and key-logit distribution (std 1, std 40, +80 spikes; latte.ops.distributions)
and each path (torch kernels float32, fla float32, fla bfloat16, and the
bfloat16 floor: the reference's float64 arithmetic on the inputs rounded to
bfloat16, the error every bfloat16 path starts from): the forward
output and the gradients of a, b, v under one random cotangent, as relative
errors max|x - ref| / max|ref| against float64 on the same device: the exact
reference (latte/ops/reference.py, O(T^2) memory) up to `--exact-max-t`, the
torch kernels in float64 beyond (themselves checked against the exact one in
the suite). Decode == forward: the last `--steps` tokens decoded one step at a
time from the state of the prefix, against the same path's forward. A record,
not a test: the thresholds live in tests/gpu and in the targets table
(latte.bench.cuda_report). On CPU the fla rows say why they cannot run.

    latte bench check --device cuda --out benchmarks/cuda
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from latte import reporting
from latte.arguments import int_at_least
from latte.ops import distributions as dists
from latte.ops import latte_causal, latte_causal_step
from latte.ops import reference as R

from . import common
from .device import DEVICES, check_device, device_info

FULL_T, QUICK_T = [256, 4096], [32]
DISTS = ("std1", "std40", "spike80")
PATHS = (("torch", "float32"), ("fla", "float32"), ("fla", "bfloat16"), ("rounding", "bfloat16"))
FULL_SHAPE, QUICK_SHAPE = (2, 8, 64, 64), (1, 2, 8, 8)  # B, H, Lh, Dv
f64 = torch.float64


def parse_args(argv=None):
    p = argparse.ArgumentParser(allow_abbrev=False, prog="latte bench check", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=DEVICES, default="cuda", help="where to run (default cuda)")
    p.add_argument("--out", type=Path, default=Path(common.DEFAULT_OUT), help="output folder")
    p.add_argument("--quick", action="store_true", help="tiny sizes for CI and tests")
    p.add_argument("--seqs", default=None, help="comma-separated T (default 256,4096)")
    p.add_argument(
        "--exact-max-t", type=int_at_least(1), default=256, help="longest T checked against the exact reference"
    )
    p.add_argument("--steps", type=int_at_least(1), default=16, help="decoding steps compared with the forward")
    p.add_argument("--threads", type=int_at_least(1), default=common.DEFAULT_THREADS, help="torch threads (CPU)")
    args = p.parse_args(argv)
    try:
        args.seqs = [int(t) for t in args.seqs.split(",")] if args.seqs else (QUICK_T if args.quick else FULL_T)
    except ValueError:
        p.error(f"--seqs: expected comma-separated integers, got {args.seqs!r}")
    if min(args.seqs) < 2 or args.steps < 1 or args.steps >= min(args.seqs):
        p.error(f"--seqs {args.seqs} / --steps {args.steps}: expected every T >= 2 and 1 <= steps < T")
    return args


def _rel(x, ref) -> float:
    ref = ref.detach().double()
    return ((x.detach().double() - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item()


def _inputs(T: int, dist: str, shape, device, seed: int):
    B, H, L, D = shape
    g = torch.Generator().manual_seed(seed)
    a, b, v = (torch.randn(B, T, H, n, generator=g, dtype=f64) for n in (L, L, D))
    cot = torch.randn(B, T, H, D, generator=g, dtype=f64)
    return [x.to(device) for x in (a, dists.logits(b, dist), v, cot)]


def _run(fn, a, b, v, cot, dtype):
    """fn's output (float64) and the gradients of <output, cot> w.r.t. a, b, v."""
    xs = [x.detach().to(dtype).requires_grad_(True) for x in (a, b, v)]
    y = fn(*xs)
    (y.double() * cot).sum().backward()
    return y.detach().double(), [x.grad.double() for x in xs]


def _reference(a, b, v, cot, exact: bool):
    fn = (lambda *x: R.latte_causal(*x)[0]) if exact else (lambda *x: latte_causal(*x, backend="torch")[0])
    return _run(fn, a, b, v, cot, f64)


def _decode_err(a, b, v, backend: str, dtype, steps: int) -> float:
    """Prefix forward + `steps` decoding steps against the forward of the whole sequence."""

    a, b, v = (x.to(dtype) for x in (a, b, v))
    with torch.no_grad():
        full = latte_causal(a, b, v, backend=backend)[0]
        P = a.shape[1] - steps
        y, state = latte_causal(a[:, :P], b[:, :P], v[:, :P], output_final_state=True, backend=backend)
        ys = [y]
        for t in range(P, a.shape[1]):
            y_t, state = latte_causal_step(a[:, t], b[:, t], v[:, t], state, backend=backend)
            ys.append(y_t.unsqueeze(1))
    return _rel(torch.cat(ys, 1), full)


def _failed(e: BaseException, what: str = "unavailable") -> dict:
    """A path that raised, as a row: fla on CPU, fla-core missing, out of
    memory, a kernel that fails to compile, a device mix-up."""
    return common.skipped(f"{what}: {type(e).__name__}: {str(e)[:200]}")


def _errors(y, g, ref) -> dict:
    """A path's output y and gradients g against the reference's: relative errors, and whether all are finite."""
    y_ref, g_ref = ref
    row = dict(forward=_rel(y, y_ref), **{f"grad_{n}": _rel(x, r) for n, x, r in zip("abv", g, g_ref)})
    row["finite"] = bool(torch.isfinite(y).all()) and all(bool(torch.isfinite(x).all()) for x in g)
    return row


def _check_path(backend: str, dtype: str, a, b, v, cot, ref, args) -> dict:
    fn = lambda *x: latte_causal(*x, backend=backend)[0]  # noqa: E731
    row = _errors(*_run(fn, a, b, v, cot, common_dtype(dtype)), ref)
    if dtype == "float32":
        row["decode_vs_forward"] = _decode_err(a, b, v, backend, torch.float32, args.steps)
    return row


def _rounding_floor(a, b, v, cot, ref, exact: bool) -> dict:
    """The reference's float64 arithmetic on a, b, v rounded to bfloat16: what
    rounding the inputs alone costs (bfloat16's spacing between 32 and 64 is
    0.25: a key logit near 40 moves by up to 0.125, its softmax weight by up
    to about 13%)."""
    return _errors(*_reference(*(x.to(torch.bfloat16).to(f64) for x in (a, b, v)), cot, exact), ref)


def check_case(T: int, dist: str, args, seed: int = 0) -> list[dict]:
    """One row per path; a path (or the reference) that raises is a row
    saying why, never a missing row."""
    shape = QUICK_SHAPE if args.quick else FULL_SHAPE
    a, b, v, cot = _inputs(T, dist, shape, args.device, seed)
    exact = T <= args.exact_max_t
    try:
        ref, ref_error = _reference(a, b, v, cot, exact), None
    except Exception as e:  # noqa: BLE001  (recorded in every row of this shape)
        ref, ref_error = None, _failed(e, "reference failed")
    rows = []
    for backend, dtype in PATHS:
        row = {"T": T, "dist": dist, "path": backend, "dtype": dtype, "reference": "exact" if exact else "torch f64"}
        try:
            if ref_error is not None:
                row.update(ref_error)
            elif backend == "rounding":
                row.update(_rounding_floor(a, b, v, cot, ref, exact))
            else:
                row.update(_check_path(backend, dtype, a, b, v, cot, ref, args))
        except Exception as e:  # noqa: BLE001  (a failed path is a row, not a lost run)
            row.update(_failed(e))
        rows.append(row)
        print(f"  T={T:6d} {dist:8s} {backend:5s} {dtype:8s} " + _fmt_row(row), flush=True)
    return rows


def common_dtype(name: str):
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def _fmt_row(r: dict) -> str:
    if r.get("skipped"):
        return "skipped: " + r["reason"]
    return f"forward {r['forward']:.1e} grads {r['grad_a']:.1e} {r['grad_b']:.1e} {r['grad_v']:.1e}"


def run(args, save=None) -> dict:
    """All shapes; save(result so far) after each one (a run cut short keeps them)."""
    check_device(args.device)
    common.set_threads(args.threads)
    info = {**reporting.machine_info(), **device_info(args.device)}
    t0, rows = time.perf_counter(), []
    res = _result(args, info, rows)
    for T in args.seqs:
        for i, dist in enumerate(DISTS):
            rows += check_case(T, dist, args, seed=i)
            info["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
            res["wall_s"] = time.perf_counter() - t0
            if save is not None:
                save(res)
    return res


def _result(args, info: dict, rows: list) -> dict:
    B, H, L, D = QUICK_SHAPE if args.quick else FULL_SHAPE
    return {
        "benchmark": "check",
        "machine": info,
        "config": {
            "device": args.device,
            "quick": args.quick,
            "T": args.seqs,
            "dists": list(DISTS),
            "paths": [f"{b} {d}" for b, d in PATHS],
            "shape": {"B": B, "H": H, "Lh": L, "Dv": D},
            "exact_max_t": args.exact_max_t,
            "decode_steps": args.steps,
            "error": "max |x - ref| / max |ref| against float64 on the same device",
        },
        "results": rows,
        "wall_s": 0.0,
    }


def markdown(res: dict) -> str:
    m, cfg = res["machine"], res["config"]
    s = cfg["shape"]

    def cell(r, key):
        return "-" if r.get("skipped") or key not in r else f"{r[key]:.1e}"

    hdr = ["T", "logits", "path", "reference", "forward", "grad a", "grad b", "grad v", "finite", "decode vs forward"]
    rows = [
        [str(r["T"]), r["dist"], f"{r['path']} {r['dtype']}", r["reference"]]
        + [cell(r, k) for k in ("forward", "grad_a", "grad_b", "grad_v")]
        + ["skipped" if r.get("skipped") else str(r["finite"]), cell(r, "decode_vs_forward")]
        for r in res["results"]
    ]
    where = m.get("gpu") or m.get("cpu_model")
    out = [
        f"# latte bench check ({cfg['device']}{', quick' if cfg['quick'] else ''})",
        "",
        f"{where}, torch {m['torch']}, fla-core {m.get('fla_core')}, TRITON_F32_DEFAULT="
        f"{m.get('TRITON_F32_DEFAULT')}; B={s['B']} H={s['H']} Lh={s['Lh']} Dv={s['Dv']}. Relative error "
        f"max|x - ref| / max|ref| against float64 on the device (exact reference up to T={cfg['exact_max_t']}, "
        f"the torch kernels in float64 beyond); decode: the last {cfg['decode_steps']} tokens stepped from the "
        "prefix's state against the same path's forward. Path `rounding bfloat16`: the reference's float64 "
        "arithmetic on the inputs rounded to bfloat16, the floor of every bfloat16 path.",
        "",
        reporting.md_table(hdr, rows),
    ]
    skips = sorted({r["reason"] for r in res["results"] if r.get("skipped")})
    return "\n".join(out + ([""] + [f"- {x}" for x in skips] if skips else [])) + "\n"


def main(argv=None) -> dict:
    args = parse_args(argv)
    name = f"check-{args.device}"
    # before any work (latte/guard.py); no README section
    common.claim_outputs(args, "check", name, suffixes=(".json", ".md"), sections=[])

    def save(res):
        common.claim_outputs(args, "check", name, suffixes=(".json", ".md"), create=True)
        common.write_json(args.out / f"{name}.json", res)
        (args.out / f"{name}.md").write_text(markdown(res))

    res = run(args, save)
    print(markdown(res))
    return res


if __name__ == "__main__":
    main()
