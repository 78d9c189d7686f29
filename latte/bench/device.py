"""Device handling shared by the benchmarks' `--device` option.

CUDA runs asynchronously: a timed call is followed by torch.cuda.synchronize()
so the wall clock covers the kernels, not just their launch. Peak memory on
CUDA is torch.cuda.max_memory_allocated() during one call minus the memory
allocated before it (the CPU benchmarks measure resident memory in a worker
process instead, latte.bench.common).
"""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version

import torch

from latte.ops.backend import fla_missing

DEVICES = ("cpu", "cuda")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def add_device_args(p) -> None:
    p.add_argument("--device", choices=DEVICES, default="cpu", help="where to run (default cpu)")
    p.add_argument(
        "--dtype",
        choices=tuple(DTYPES),
        default=None,
        help="inputs (ops) or autocast (train) dtype: float32 on CPU (the only choice there), "
        "bfloat16 by default on CUDA (what SDPA's flash kernel takes)",
    )


def resolve_device_args(p, args, *, cpu_dtypes=("float32",)) -> None:
    """Fill the dtype default for the device and reject what the CPU path does not run."""
    if args.dtype is None:
        args.dtype = "float32" if args.device == "cpu" else "bfloat16"
    if args.device == "cpu" and args.dtype not in cpu_dtypes:
        p.error(f"--dtype {args.dtype}: the CPU run takes {'/'.join(cpu_dtypes)}")


def check_device(device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        why = "a CPU build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda} but sees no GPU"
        raise SystemExit(
            f"--device cuda: torch.cuda.is_available() is False on this machine (torch {torch.__version__}: "
            f"{why}); run with --device cpu"
        )


def synced(fn, device: str):
    """fn, followed by a CUDA synchronize on CUDA (so that timing covers the work)."""
    if device != "cuda":
        return fn

    def call():
        out = fn()
        torch.cuda.synchronize()
        return out

    return call


def cuda_peak_mb(fn) -> float:
    """Peak CUDA memory one call adds on top of what was allocated before it (MiB)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def device_info(device: str) -> dict:
    """What the machine_info of a CPU run lacks on a GPU: the device and the libraries."""
    if device != "cuda":
        return {"device": "cpu"}

    props = torch.cuda.get_device_properties(0)
    info = {
        "device": "cuda",
        "gpu": props.name,
        "gpu_memory_gb": round(props.total_memory / 2**30, 1),
        "cuda": torch.version.cuda,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "fla": fla_missing() or "ok",
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    try:
        info["fla_core"] = version("fla-core")
    except PackageNotFoundError:
        info["fla_core"] = None
    info["TRITON_F32_DEFAULT"] = os.environ.get("TRITON_F32_DEFAULT")  # "ieee": exact float32 dots
    return info
