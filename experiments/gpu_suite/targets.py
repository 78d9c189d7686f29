"""The targets of issue 26 met or missed, from the GPU suite's JSON and JUnit
files (docs/gpu.md §5); moved here from latte/bench/cuda_report.py. Nothing
here asserts: a target is "met", "missed" or "not measured", always with its
figure; report.py puts the table in README.md of the suite's folder.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from latte import reporting
from latte.bench.cuda_report import ops_ratios

TARGET_T, MAX_T, MIN_T = 16384, 131072, 1024


def _target(name: str, figure: str, met: bool | None) -> dict:
    return {"target": name, "figure": figure, "status": "not measured" if met is None else "met" if met else "missed"}


def _speed_targets(ops: dict | None) -> list[dict]:
    names = (
        f"latte-fla >= 3x faster than FlashAttention (sdpa) at T={TARGET_T:,}, forward+backward, bfloat16",
        "latte-fla within 1.3x of fla's chunk_gla at every T, forward+backward, bfloat16",
        "latte-fla within 1.3x of fla's chunk_gla at every T, forward, bfloat16",
    )
    if ops is None:
        return [_target(n, "no ops-cuda-bfloat16.json", None) for n in names]
    ratios = ops.get("ratios") or ops_ratios(ops)
    r = ratios.get("fwdbwd", {}).get(str(TARGET_T), {}).get("sdpa/latte-fla")
    out = [_target(names[0], "-" if r is None else f"sdpa / latte-fla = {r:.2f}x", None if r is None else r >= 3)]
    for name, mode in zip(names[1:], ("fwdbwd", "fwd")):
        got = {T: v["latte-fla/fla-gla"] for T, v in ratios.get(mode, {}).items() if "latte-fla/fla-gla" in v}
        if not got:
            out.append(_target(name, "-", None))
            continue
        worst = max(got, key=got.get)
        fig = f"worst {got[worst]:.2f}x at T={worst}; {got.get(str(TARGET_T), float('nan')):.2f}x at T={TARGET_T}"
        out.append(_target(name, fig, got[worst] <= 1.3))
    return out


def _memory_target(ops: dict | None) -> dict:
    name = f"latte-fla memory linear to T={MAX_T:,}: peak(T) / peak(T={MIN_T}) <= 1.25 at batch x T constant"
    rows = {r["T"]: r.get("peak_mb") for r in (ops or {}).get("results", [])
            if (r["provider"], r["mode"]) == ("latte-fla", "fwdbwd") and not r.get("skipped")}  # fmt: skip
    if MIN_T not in rows or not rows[MIN_T]:
        return _target(name, "-", None)
    top = max(rows)
    ratio = rows[top] / rows[MIN_T]
    fig = f"{rows[top]:,.0f} / {rows[MIN_T]:,.0f} MiB = {ratio:.2f} at T={top:,}"
    return _target(name, fig + ("" if top >= MAX_T else f" (longest T run: {top:,})"), top >= MAX_T and ratio <= 1.25)


def _decode_target(dec: dict | None) -> dict:
    name = f"decode ms/token flat for latte[fla]: longest / shortest context <= 1.25, up to {MAX_T:,}"
    flat = (dec or {}).get("ratios", {}).get("longest/shortest median_ms", {})
    if "latte[fla]" not in flat:
        return _target(name, "-", None)
    ctxs = [r["context"] for r in dec["results"] if r["mixer"] == "latte[fla]" and not r.get("skipped")]
    soft = flat.get("softmax")
    fig = f"{flat['latte[fla]']:.2f}x from {min(ctxs):,} to {max(ctxs):,}" + (
        f" (softmax's KV cache: {soft:.2f}x)" if soft else ""
    )
    return _target(name, fig, flat["latte[fla]"] <= 1.25 and max(ctxs) >= MAX_T)


def _check_target(chk: dict | None) -> list[dict]:
    out = []
    for dtype, fwd_tol, grad_tol in (("float32", 5e-3, 2e-2), ("bfloat16", 5e-2, 1e-1)):
        name = f"fla backend vs float64, {dtype}: forward <= {fwd_tol:g}, gradients <= {grad_tol:g}"
        rows = [r for r in (chk or {}).get("results", []) if r["path"] == "fla" and r["dtype"] == dtype]
        rows = [r for r in rows if not r.get("skipped")]
        if not rows:
            out.append(_target(name, "-", None))
            continue
        fwd = max(r["forward"] for r in rows)
        grad = max(max(r["grad_a"], r["grad_b"], r["grad_v"]) for r in rows)
        fig = f"worst forward {fwd:.1e}, gradient {grad:.1e} over {len(rows)} cases"
        if dtype == "bfloat16":
            fig += _floor_figure(chk, rows)
        out.append(_target(name, fig, fwd <= fwd_tol and grad <= grad_tol and all(r["finite"] for r in rows)))
    return out


def _floor_figure(chk: dict, rows: list[dict]) -> str:
    """The bfloat16 rows beside the rounding floor of the same cases (the
    reference on the inputs rounded to bfloat16, latte.bench.cuda_check):
    the floor's worst errors and the largest ratio of path to floor."""
    keys = ("forward", "grad_a", "grad_b", "grad_v")
    floor = {(r["T"], r["dist"]): r for r in chk.get("results", []) if r["path"] == "rounding" and not r.get("skipped")}
    pairs = [(r, floor[(r["T"], r["dist"])]) for r in rows if (r["T"], r["dist"]) in floor]
    if not pairs:
        return " (no rounding floor recorded)"
    f_fwd = max(f["forward"] for _, f in pairs)
    f_grad = max(max(f[k] for k in keys[1:]) for _, f in pairs)
    worst = max(r[k] / max(f[k], 1e-12) for r, f in pairs for k in keys)
    return (
        f"; bfloat16 rounding of the inputs alone: forward {f_fwd:.1e}, gradient {f_grad:.1e}; "
        f"at most {worst:.1f}x the floor of its case"
    )


def junit_summary(path: Path) -> dict | None:
    """Counts and failed test names of a pytest --junitxml file."""
    if not Path(path).exists():
        return None
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    count = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    failed = []
    for case in root.iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            failed.append(f"{case.get('classname', '')}.{case.get('name')}: {bad.get('message', '')[:160]}")
    return {
        **count,
        "passed": count["tests"] - count["failures"] - count["errors"] - count["skipped"],
        "failed": failed,
    }


def _tests_target(name: str, junit: dict | None) -> dict:
    if junit is None:
        return _target(name, "-", None)
    fig = f"{junit['passed']} passed, {junit['failures'] + junit['errors']} failed, {junit['skipped']} skipped"
    return _target(name, fig, junit["failures"] + junit["errors"] == 0 and junit["passed"] > 0)


def targets(folder: Path) -> list[dict]:
    def load(name):
        p = Path(folder) / name
        return json.loads(p.read_text()) if p.exists() else None

    return [
        _tests_target("tests/gpu pass (TF32, the default)", junit_summary(Path(folder) / "tests-tf32.xml")),
        _tests_target("tests/gpu pass (TRITON_F32_DEFAULT=ieee)", junit_summary(Path(folder) / "tests-ieee.xml")),
        *_check_target(load("check-cuda.json")),
        *_speed_targets(load("ops-cuda-bfloat16.json")),
        _memory_target(load("ops-cuda-bfloat16.json")),
        _decode_target(load("decode-cuda.json")),
    ]


def targets_markdown(rows: list[dict]) -> str:
    return reporting.md_table(["target", "figure", "status"], [[r["target"], r["figure"], r["status"]] for r in rows])
