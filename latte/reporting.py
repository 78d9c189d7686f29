"""What every report of the package shares: where the numbers come from
(`machine_info`), markdown tables (`md_table`, `fmt`), figures (`pyplot` on
the Agg backend, `save_figure`) and the generated sections of a README
(`update_readme`). Benchmarks, experiments, training and evaluation all
import it; it imports nothing above the base of the package (allocator)."""

from __future__ import annotations

import os
import platform
import re
import sys
import time
from pathlib import Path

import torch

from latte import allocator
from latte.files import atomic_write


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
        m = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
        if m:
            return m.group(1).strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict:
    """Where the numbers come from; the load average says how busy it was."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    mem = None
    try:
        m = re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text())
        mem = round(int(m.group(1)) / 2**20, 1) if m else None
    except OSError:
        pass
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "usable_cores": usable,
        "mem_total_gb": mem,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "allocator": allocator.tune() or "default",
        "loadavg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def fmt(x, digits: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    return f"{x:,.{digits}f}" if abs(x) < 1e5 else f"{x:,.0f}"


def md_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(c) if not isinstance(c, str) else c for c in r) + " |" for r in rows]
    return "\n".join(lines)


NO_MATPLOTLIB = "note: matplotlib is not installed (pip install 'latte[plot]'); no plot written"


def pyplot(*, note: str | None = NO_MATPLOTLIB):
    """matplotlib.pyplot on the Agg backend (files only, no display), or None
    when the optional extra "plot" is not installed, after `note` on stderr
    (None: silently)."""
    try:
        import matplotlib  # optional dependency (extra "plot")

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        if note is not None:
            print(note, file=sys.stderr)
        return None
    return plt


def save_figure(plt, fig, path, *, dpi: int = 120) -> Path:
    """Lay out, write (creating the folder) and close a figure."""
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return Path(path)


def update_readme(path: Path, name: str, markdown: str, image: str | None = None, *, kind: str = "bench") -> None:
    """Replace the text between `<!-- KIND:NAME:start -->` and
    `<!-- KIND:NAME:end -->` in `path` with `markdown` (+ an image link), so
    the README's numbers always come from a benchmark or experiment run
    (kind "bench" or "results"), never by hand."""
    path = Path(path)
    text = path.read_text()
    start, end = f"<!-- {kind}:{name}:start -->", f"<!-- {kind}:{name}:end -->"
    if start not in text or end not in text:
        raise ValueError(f"{path}: no {start} ... {end} markers to replace")
    # the benchmark's own headings sit three levels below the README's section
    body = "\n".join("###" + line if line.startswith("#") else line for line in markdown.strip().splitlines())
    if image:
        body += f"\n\n![{name}]({image})"
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    # a README holds every other section too: a kill leaves it whole, old or new
    atomic_write(path, f"{head}{start}\n{body}\n{end}{tail}")
