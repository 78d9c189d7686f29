"""The targets of issue 56 met or missed, from the GPU suite's JSON and JUnit
files (docs/gpu.md §5.3). Nothing here asserts: a target is "met",
"missed" or "not measured", always with its figure; report.py puts the
table in README.md of the suite's folder. The ops targets read the default
construction's provider (latte-fla) and quote the fused one (latte-fla-fused)
beside it.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from latte import reporting

LATTE, FUSED, GLA, FLASH = "latte-fla", "latte-fla-fused", "fla-gla", "sdpa"
OVER_GLA = {4096: 1.15, 16384: 1.15, 65536: 1.25}  # latte (fla) / chunk_gla, at most
OVER_LATTE = {16384: 2.7, 65536: 8.5}  # FlashAttention / latte (fla), at least
PEAK_OVER_GLA = 1.2  # peak extra memory, forward+backward, over chunk_gla's
DECODE_MS, DECODE_FLAT = 1.0, 1.1  # captured step: ms/token at most; longest / shortest context at most
DECODE_MIXERS = ("latte", "macchiato")
TRAIN_EAGER = {"latte[fla]": 0.93, "macchiato[fla]": 0.80}  # tokens/s over softmax's at T = 4K, at least
TRAIN_T = 4096
TESTS_COLD_S, TESTS_WARM_S = 150.0, 45.0
TEST_FILES = ("tests-tf32.xml", "tests-compile-tf32.xml")  # the loan's two tests/gpu stages


def _target(name: str, figure: str, met: bool | None) -> dict:
    return {"target": name, "figure": figure, "status": "not measured" if met is None else "met" if met else "missed"}


def _cells(ops: dict | None) -> dict:
    """{(provider, T, mode): row} of the measured rows."""
    return {(r["provider"], r["T"], r["mode"]): r for r in (ops or {}).get("results", []) if not r.get("skipped")}


def _ratio(cells: dict, num: str, den: str, T: int, mode: str, key: str = "median_ms") -> float | None:
    a, b = cells.get((num, T, mode)), cells.get((den, T, mode))
    return None if a is None or b is None or not b.get(key) else a[key] / b[key]


def _partial(got: dict, ok) -> tuple[str, bool | None]:
    """(figure, met) of a target bounded at several T from the T measured:
    missed as soon as one measured T misses (the rest cannot mend it), met
    only when every T is measured and within, else not measured."""
    seen = {T: v for T, v in got.items() if v is not None}
    if not seen:
        return "-", None
    fig = ", ".join(f"{v:.2f} at {T // 1024}K" for T, v in seen.items())
    fig += "" if len(seen) == len(got) else " (" + ", ".join(f"{T // 1024}K" for T in got if T not in seen) + ": -)"
    if not all(ok(T, v) for T, v in seen.items()):
        return fig, False
    return fig, True if len(seen) == len(got) else None


def _gla_targets(ops: dict | None) -> list[dict]:
    cells, out = _cells(ops), []
    for mode, label in (("fwdbwd", "forward+backward"), ("fwd", "forward")):
        bounds = ", ".join(f"<= {v:g} at {T // 1024}K" for T, v in OVER_GLA.items())
        name = f"latte (fla) / chunk_gla, {label}, bfloat16: {bounds}"
        fig, met = _partial({T: _ratio(cells, LATTE, GLA, T, mode) for T in OVER_GLA}, lambda T, v: v <= OVER_GLA[T])
        fused, _ = _partial({T: _ratio(cells, FUSED, GLA, T, mode) for T in OVER_GLA}, lambda T, v: True)
        out.append(_target(name, fig + ("" if fused == "-" else f" (fused: {fused})"), met))
    name = "FlashAttention / latte (fla), forward+backward: " + ", ".join(
        f">= {v:g} at {T // 1024}K" for T, v in OVER_LATTE.items()
    )
    got = {T: _ratio(cells, FLASH, LATTE, T, "fwdbwd") for T in OVER_LATTE}
    out.append(_target(name, *_partial(got, lambda T, v: v >= OVER_LATTE[T])))
    return out


def _memory_target(ops: dict | None) -> dict:
    name = f"peak extra memory, forward+backward: latte (fla) / chunk_gla <= {PEAK_OVER_GLA:g} at every T"
    cells = _cells(ops)
    got = {T: _ratio(cells, LATTE, GLA, T, "fwdbwd", "peak_mb") for (p, T, m) in cells if (p, m) == (LATTE, "fwdbwd")}
    got = {T: v for T, v in sorted(got.items()) if v is not None}
    if not got:
        return _target(name, "-", None)
    fig = ", ".join(f"{v:.2f} at T={T:,}" for T, v in got.items())
    fused = {T: _ratio(cells, FUSED, GLA, T, "fwdbwd", "peak_mb") for T in got}
    fused = {T: v for T, v in fused.items() if v is not None}
    fig += "" if not fused else " (fused: " + ", ".join(f"{v:.2f} at T={T:,}" for T, v in fused.items()) + ")"
    return _target(name, fig, max(got.values()) <= PEAK_OVER_GLA)


def _decode_targets(dec: dict | None) -> list[dict]:
    """The captured step (static_median_ms) of latte and Macchiato: at most
    DECODE_MS at every context and flat within DECODE_FLAT; softmax's beside."""
    rows = [r for r in (dec or {}).get("results", []) if not r.get("skipped") and "static_median_ms" in r]
    out = []
    for mixer in DECODE_MIXERS:
        name = (
            f"decode, {mixer}, captured step, Table 6 model, batch 1: <= {DECODE_MS:g} ms/token, "
            f"longest / shortest context <= {DECODE_FLAT:g}"
        )
        mine = [r for r in rows if r["mixer"].split("[")[0] == mixer and r.get("static_captured")]
        if not mine:
            out.append(_target(name, "-", None))
            continue
        best = {}
        for r in mine:  # per context, the faster backend
            best[r["context"]] = min(best.get(r["context"], float("inf")), r["static_median_ms"])
        lo, hi = min(best), max(best)
        flat, worst = best[hi] / best[lo], max(best.values())
        fig = f"{best[lo]:.2f} ms at {lo:,}, {best[hi]:.2f} ms at {hi:,} ({flat:.2f}x)" + _softmax_beside(rows)
        out.append(_target(name, fig, worst <= DECODE_MS and flat <= DECODE_FLAT and hi >= 131072 and lo <= 1024))
    return out


def _softmax_beside(rows: list[dict]) -> str:
    soft = {r["context"]: r["static_median_ms"] for r in rows if r["mixer"] == "softmax"}
    return (
        ""
        if not soft
        else "; softmax's static KV cache: " + ", ".join(f"{v:.2f} ms at {c:,}" for c, v in sorted(soft.items()))
    )


def _train_target(train: dict | None) -> list[dict]:
    over = ((train or {}).get("ratios") or {}).get("over_softmax", {}).get(str(TRAIN_T), {})
    out = []
    for mixer, bound in TRAIN_EAGER.items():
        name = f"training tokens/s over softmax's, {mixer}, Table 6 model, T = {TRAIN_T}, eager: >= {bound:g}"
        r = over.get(mixer)  # time over softmax's time
        out.append(_target(name, "-" if not r else f"{1 / r:.2f}", None if not r else 1 / r >= bound))
    return out


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


def _tests_time_targets(folder: Path) -> list[dict]:
    """tests/gpu (both loan stages) all passing within TESTS_COLD_S from a
    cold kernel cache and TESTS_WARM_S from one carried in (suite.json's
    stage records say which)."""
    runs = [junit_summary(Path(folder) / name) for name in TEST_FILES]
    path = Path(folder) / "suite.json"
    recs = json.loads(path.read_text()).get("stages", {}) if path.exists() else {}
    stages = [recs.get(n) for n in ("loan-tests", "loan-tests-compile")]
    out = []
    for kind, bound in (("cold", TESTS_COLD_S), ("carried in", TESTS_WARM_S)):
        name = f"tests/gpu all pass, kernel cache {'cold' if kind == 'cold' else 'warm'}: <= {bound:g} s"
        if None in runs or any(s is None or s.get("kernels") != kind for s in stages):
            out.append(_target(name, "-", None))
            continue
        wall = sum(s["wall_s"] for s in stages)
        failed = sum(j["failures"] + j["errors"] for j in runs)
        fig = f"{wall:.0f} s, {sum(j['passed'] for j in runs)} passed, {failed} failed"
        out.append(_target(name, fig, failed == 0 and wall <= bound))
    return out


def targets(folder: Path) -> list[dict]:
    def load(name):
        p = Path(folder) / name
        return json.loads(p.read_text()) if p.exists() else None

    # the loan's ops run (its constructions side by side, docs/gpu.md §5.3) when one was kept apart
    ops = load("ops-cuda-bfloat16-loan.json") or load("ops-cuda-bfloat16.json")
    return [
        *_tests_time_targets(folder),
        _tests_target("tests/gpu pass (TRITON_F32_DEFAULT=ieee)", junit_summary(Path(folder) / "tests-ieee.xml")),
        *_check_target(load("check-cuda.json")),
        *_gla_targets(ops),
        _memory_target(ops),
        *_decode_targets(load("decode-cuda.json")),
        *_train_target(load("train-cuda.json")),
    ]


def targets_markdown(rows: list[dict]) -> str:
    return reporting.md_table(["target", "figure", "status"], [[r["target"], r["figure"], r["status"]] for r in rows])
