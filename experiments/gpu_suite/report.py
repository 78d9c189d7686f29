"""README.md of the suite's folder, and every table there rewritten from its
JSON, without a GPU (`python -m experiments.gpu_suite --report-only`; docs/gpu.md §5).

The tables come from the benchmarks' own markdown functions, so a committed
table is always what its JSON says; the targets of issue 56 come from
targets.py with their figures.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from latte.files import atomic_write
from latte.guard import check_folder, claim_folder

from .state import SUITE_WRITER, load_state
from .targets import junit_summary, targets, targets_markdown

# JSON name prefix -> (module, markdown function, plot function or None)
TABLES = (
    ("ops-cuda-", "latte.bench.cuda_report", "markdown_ops", "plot_ops"),
    ("check-", "latte.bench.cuda_check", "markdown", None),
    ("train-", "benchmarks.train_report", "markdown", "plot"),
    ("decode-", "latte.bench.decode", "markdown", "plot"),
    ("window-", "benchmarks.window", "markdown", "plot"),
)
TEST_RUNS = (
    ("tests-tf32.xml", "TF32 (default)"),
    ("tests-compile-tf32.xml", "the compile-heavy file, TF32 (--loan)"),
    ("tests-ieee.xml", "TRITON_F32_DEFAULT=ieee"),
)


def _machine_line(state: dict) -> str:
    invs = state.get("invocations") or []
    if not invs:
        return "Machine: no invocation recorded."
    m = invs[-1].get("machine", {})
    pk = m.get("packages", {})

    def ver(d):
        return (pk.get(d) or {}).get("version") or "missing"

    return (
        f"Machine (last invocation, {invs[-1]['started_utc']}): {m.get('gpu_name') or m.get('gpu')}, "
        f"driver {m.get('driver')}, {m.get('gpu_memory')}; Python {m.get('python')}, torch {ver('torch')} "
        f"(CUDA {m.get('torch_cuda')}), triton {ver('triton')}, fla-core {ver('fla-core')}, "
        f"{m.get('cpu_count')} CPU cores. Invocations: {len(invs)}, budgets "
        + ", ".join(f"{i['budget_s']:g} s" for i in invs)
        + "."
    )


def _stages_table(state: dict) -> list[str]:
    rows = state.get("stages") or {}
    if not rows:
        return ["No stage has run yet."]
    lines = ["| stage | status | wall s | limit s | GPU | when (UTC) | command |", "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        cmd = r.get("command") or r.get("reason", "")
        lines.append(
            f"| {name} | {r['status']} | {r.get('wall_s', '-')} | {r.get('limit_s', '-')} | {r.get('gpu') or '-'} | "
            f"{r.get('when_utc', '-')} | `{cmd}` |"
        )
    return lines


def _tests(folder: Path) -> list[str]:
    out = []
    for name, label in TEST_RUNS:
        j = junit_summary(folder / name)
        if j is None:
            out.append(f"- {label}: not run")
            continue
        out.append(f"- {label}: {j['passed']} passed, {j['failures'] + j['errors']} failed, {j['skipped']} skipped")
        out += [f"  - FAILED {f}" for f in j["failed"]]
    return out


def write_report(folder: Path, state: dict | None = None) -> Path:
    with claim_folder(folder, SUITE_WRITER) as folder:  # the one write rule, held while writing (latte/guard.py)
        return _write_report(folder, state)


def _write_report(folder: Path, state: dict | None) -> Path:
    if state is None:
        state = load_state(folder)
    tables = sorted(p.name for p in folder.glob("*.md") if p.name != "README.md")
    text = [
        "# latte on a GPU: the CUDA suite",
        "",
        "Written by `latte bench suite` from the files of this folder; `latte bench suite --report-only "
        f"--out {folder}` rewrites it and every table from the JSON, without a GPU (docs/gpu.md §5).",
        "",
        _machine_line(state),
        "",
        "## Targets (issue 56)",
        "",
        targets_markdown(targets(folder)),
        "",
        "## Stages",
        "",
        *_stages_table(state),
        "",
        "## tests/gpu",
        "",
        *_tests(folder),
        "",
        "## Tables",
        "",
        *([f"- [{t}]({t})" for t in tables] or ["None yet."]),
    ]
    notes = state.get("notes") or []
    text += ["", "## Notes", "", *[f"- {n}" for n in notes]] if notes else []
    out = folder / "README.md"
    atomic_write(out, "\n".join(text) + "\n")  # a kill leaves the old README or the new one
    return out


def regenerate(folder: Path) -> list[Path]:
    """Every table (and plot, with matplotlib) of folder from its JSON, then
    README.md; only in a suite's own folder (its marker and suite.json)."""
    folder, written = Path(folder), []
    if not (folder / "suite.json").is_file():
        raise ValueError(
            f"--out {folder}: "
            + ("no such folder" if not folder.exists() else "holds no suite.json")
            + "; --report-only rewrites the README and tables of a suite's folder (default benchmarks/cuda)"
        )
    check_folder(folder, SUITE_WRITER)
    load_state(folder)
    for path in sorted(folder.glob("*.json")):
        for prefix, module, md_name, plot_name in TABLES:
            if path.name.startswith(prefix):
                mod = importlib.import_module(module)
                res = json.loads(path.read_text())
                md = path.with_suffix(".md")
                md.write_text(getattr(mod, md_name)(res))
                written.append(md)
                if plot_name and getattr(mod, plot_name)(res, path.with_suffix(".png")):
                    written.append(path.with_suffix(".png"))
                break
    return [*written, write_report(folder)]
