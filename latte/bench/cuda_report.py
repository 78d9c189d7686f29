"""Tables of the CUDA benchmarks, regenerable without a GPU from their JSON
(docs/evaluation.md §1.2), and the targets of issue 26 met or missed.

    latte bench suite --report-only --out benchmarks/cuda   # rewrite every .md there from its .json

`markdown_ops`/`plot_ops`/`ops_ratios` serve `latte bench ops --device cuda`;
`write_report` writes README.md of the suite's folder: the device, each
stage's status and wall time, the tests' outcome (JUnit XML), the targets
table, and links to every table. Nothing here asserts: a target is "met",
"missed" or "not measured", always with its figure.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from latte import reporting

from . import common

MODE_NAME = {"fwd": "forward", "fwdbwd": "forward+backward"}
RATIOS = (  # name -> (numerator, denominator): > 1 means the denominator is faster
    ("sdpa/latte-fla", "sdpa", "latte-fla"),
    ("latte-fla/fla-gla", "latte-fla", "fla-gla"),
    ("latte/latte-fla", "latte", "latte-fla"),
    ("sdpa/macchiato-fla", "sdpa", "macchiato-fla"),
    ("macchiato-fla/latte-fla", "macchiato-fla", "latte-fla"),
)
TARGET_T, MAX_T, MIN_T = 16384, 131072, 1024


# ---- latte bench ops --device cuda ------------------------------------------------


def _ok(res: dict) -> dict:
    return {(r["provider"], r["T"], r["mode"]): r for r in res["results"] if not r.get("skipped")}


def ops_ratios(res: dict) -> dict:
    """{mode: {T: {ratio name: value}}} for the pairs measured at the same (T, mode)."""
    ok, out = _ok(res), {}
    for (p, T, mode), r in ok.items():
        for name, num, den in RATIOS:
            if p == num and (den, T, mode) in ok:
                out.setdefault(mode, {}).setdefault(str(T), {})[name] = r["median_ms"] / ok[(den, T, mode)]["median_ms"]
    return out


def _device_line(m: dict) -> str:
    return (
        f"{m.get('gpu') or m.get('cpu_model')}, CUDA {m.get('cuda')}, torch {m.get('torch')}, "
        f"fla-core {m.get('fla_core')}, triton {m.get('triton')}, TRITON_F32_DEFAULT={m.get('TRITON_F32_DEFAULT')}"
    )


def markdown_ops(res: dict) -> str:
    m, cfg = res["machine"], res["config"]
    cell = {(r["provider"], r["T"], r["mode"]): r for r in res["results"]}
    provs, s = cfg["providers"], cfg["shapes"]
    batch = {r["T"]: r.get("B") for r in res["results"]}

    def val(p, T, mode, key):
        r = cell.get((p, T, mode))
        return "-" if r is None else r["reason"].split(":")[0] if r.get("skipped") else r[key]

    out = [
        f"# latte bench ops --device cuda ({cfg['dtype']}{', quick' if cfg['quick'] else ''})",
        "",
        f"{_device_line(m)}. Batch x T = {cfg['tokens']:,} tokens at every T, H={s['H']} Lh={s['Lh']} "
        f"Dv={s['Dv']} W={s['window_size']} chunk {s['chunk_size']}; SDPA: {cfg['sdpa']}. Median of "
        f"{cfg['repeats']} synchronised calls, providers interleaved. Ratios > 1: the second is faster.",
    ]
    ratios = res.get("ratios") or ops_ratios(res)
    for mode in ("fwd", "fwdbwd"):
        names = [n for n, *_ in RATIOS if any(n in row for row in ratios.get(mode, {}).values())]
        rows = [
            [str(T), str(batch.get(T, "-"))]
            + [val(p, T, mode, "median_ms") for p in provs]
            + [ratios.get(mode, {}).get(str(T), {}).get(n, "-") for n in names]
            for T in cfg["T"]
        ]
        out += ["", f"## {MODE_NAME[mode]}: median ms", "", reporting.md_table(["T", "B", *provs, *names], rows)]
        rows = [[str(T), str(batch.get(T, "-"))] + [val(p, T, mode, "peak_mb") for p in provs] for T in cfg["T"]]
        out += ["", f"## {MODE_NAME[mode]}: peak extra MiB", "", reporting.md_table(["T", "B", *provs], rows)]
    first = {}
    for r in res["results"]:
        if r.get("skipped"):
            first.setdefault((r["provider"], r["mode"], r["reason"]), r["T"])
    if first:
        out += ["", "Skipped (from the first T named; every later one alike):"]
        out += [f"- {p} {mode} from T={T}: {reason}" for (p, mode, reason), T in first.items()]
    return "\n".join(out) + "\n"


def plot_ops(res: dict, path) -> bool:
    ok = [r for r in res["results"] if not r.get("skipped")]
    panels = {}
    for mode in ("fwd", "fwdbwd"):
        panels[MODE_NAME[mode] + ": ms"] = {
            p: ([r["T"] for r in ok if (r["provider"], r["mode"]) == (p, mode)],
                [r["median_ms"] for r in ok if (r["provider"], r["mode"]) == (p, mode)])
            for p in res["config"]["providers"]
        }  # fmt: skip
    panels["forward+backward: peak MiB"] = {
        p: ([r["T"] for r in ok if (r["provider"], r["mode"]) == (p, "fwdbwd") and r.get("peak_mb")],
            [r["peak_mb"] for r in ok if (r["provider"], r["mode"]) == (p, "fwdbwd") and r.get("peak_mb")])
        for p in res["config"]["providers"]
    }  # fmt: skip
    cfg = res["config"]
    return common.plot_loglog(
        path,
        panels,
        xlabel=f"T (batch x T = {cfg['tokens']:,})",
        ylabel="median ms / peak MiB",
        title=f"latte bench ops --device cuda ({cfg['dtype']}): {res['machine'].get('gpu')}",
    )


# ---- targets ------------------------------------------------------------------------


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
        out.append(_target(name, fig, fwd <= fwd_tol and grad <= grad_tol and all(r["finite"] for r in rows)))
    return out


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
