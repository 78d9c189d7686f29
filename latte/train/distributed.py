"""Process groups, model wrapping and collective helpers for `latte train`.

One command on one machine or many (docs/reliability.md, "Distributed"):

    torchrun --standalone --nproc_per_node=2 -m latte train ...

Without torchrun (no WORLD_SIZE in the environment, or WORLD_SIZE=1) nothing
here touches torch.distributed and every helper is a no-op, so the trainer has
one code path. Backend by device type: gloo on CPU, nccl on CUDA.

Wrapping: DDP by default; `distributed: fsdp2` shards with `fully_shard` per
block, then the root, over an explicit 1-D device mesh (under gloo an implicit
mesh may pick CUDA when a GPU is visible and crash).

Checkpoints stay world-size independent. The "full" format gathers model and
optimizer state as unsharded state dicts keyed by parameter name
(`torch.distributed.checkpoint.state_dict`, cpu_offload: only rank 0 holds
them) and rank 0 writes one safetensors file: one full copy of the weights
and moments in rank 0's CPU memory. The "sharded" format (train/sharded.py,
the default under FSDP2) writes each rank's shards with DCP instead.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from latte.models.weights import tied_aliases


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r}: expected an integer") from None


def init_distributed(timeout_minutes: float = 30.0) -> DistEnv:
    """Reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, ...) and
    initialises the default process group when WORLD_SIZE > 1."""
    world_size = _env_int("WORLD_SIZE", 1)
    rank, local_rank = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    local_world_size = _env_int("LOCAL_WORLD_SIZE", world_size)
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend=backend,
            timeout=datetime.timedelta(minutes=timeout_minutes),
            **({"device_id": device} if device.type == "cuda" else {}),
        )
    return DistEnv(rank, world_size, local_rank, local_world_size, device)


def shutdown(env: DistEnv, *, synchronize: bool = False) -> None:
    """Destroys the process group. synchronize (on a clean exit): a barrier
    first, so that no rank tears down while a collective's last work object
    is still being released by gloo's worker thread (that release needs the
    GIL, which the process-group destructor holds while joining the thread:
    a deadlock at exit). The barrier's own work object is held here until
    the group is gone, so its last reference is dropped by this thread, never
    by the worker: a rank whose worker had not yet dropped it when the
    interpreter began to exit hung for good (the DDP reducer still held the
    group, destroyed by the exit's garbage collection)."""
    if env.is_distributed and dist.is_initialized():
        work = dist.barrier(async_op=True) if synchronize else None
        if work is not None:
            work.wait()
        dist.destroy_process_group()
        del work  # released with the GIL, by this thread


def barrier(env: DistEnv) -> None:
    if env.is_distributed:
        dist.barrier()


def all_reduce(tensor: torch.Tensor, env: DistEnv, op: str = "sum") -> torch.Tensor:
    """In-place SUM / MIN / MAX over ranks (identity on one process). The
    tensor must live on env.device (nccl reduces CUDA tensors only)."""
    if env.is_distributed:
        reduce_op = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op]
        dist.all_reduce(tensor, op=reduce_op)
    return tensor


def on_rank0(fn, env: DistEnv, *, share: bool = True):
    """`fn()` run by rank 0 alone. Every rank raises the same ValueError /
    OSError (message included) when it failed, so no rank is left waiting on
    a collective that rank 0 never reaches; otherwise every rank returns the
    result (share=False: rank 0 only, the others get None)."""
    result, error = None, None
    if env.is_main:
        try:
            result = fn()
        except (ValueError, OSError) as e:
            if not env.is_distributed:
                raise
            error = (type(e).__name__, str(e))
    shared, error = broadcast_object((result if share else None, error), env)
    if error is not None:
        raise (OSError if error[0] == "OSError" else ValueError)(error[1])
    return result if env.is_main else shared


def broadcast_object(obj, env: DistEnv):
    """`obj` from rank 0 on every rank (small picklable values only)."""
    if not env.is_distributed:
        return obj
    box = [obj if env.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# --------------------------------------------------------------------------- wrapping


def wrap_model(model: nn.Module, mode: str, env: DistEnv, *, units: list[nn.Module] | None = None) -> nn.Module:
    """DDP or FSDP2 around `model` (already on env.device); unchanged on one
    process. FSDP2 shards each of `units` (e.g. the residual blocks), then the root."""
    if not env.is_distributed:
        return model
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [env.device.index] if env.device.type == "cuda" else None
        return DDP(model, device_ids=ids)
    if mode == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        # The blocks also return their decoding state, whose tensors can be views;
        # the trainer drops them unused, so FSDP2's warning about in-place ops on
        # returned views does not apply here.
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
        mesh = init_device_mesh(env.device.type, (env.world_size,))
        for unit in units or []:
            fully_shard(unit, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    raise ValueError(f"distributed: got {mode!r}, expected 'ddp' or 'fsdp2'")


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module: DDP's `.module`; FSDP2 shards in place (itself)."""
    return getattr(model, "module", model)


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool):
    """Skip the gradient all-reduce / reduce-scatter on non-final
    accumulation micro-steps (docs/reliability.md): DDP `no_sync`, FSDP2
    `set_requires_gradient_sync(False)`."""
    if enabled:
        yield
    elif hasattr(model, "no_sync"):
        with model.no_sync():
            yield
    elif hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield


# --------------------------------------------------------------------------- state dicts

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded, name-keyed ("module." stripped) weights; empty on ranks > 0
    when distributed (cpu_offload keeps them on rank 0 only). Collective."""
    state = get_model_state_dict(model, options=_FULL)
    # FSDP2 gathers a tied parameter once per name: share the tensor again, so
    # the weight file stores it once, as for a single process.
    for alias, name in tied_aliases(getattr(model, "module", model)).items():
        if alias in state and name in state:
            state[alias] = state[name]
    return state


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Optimizer state keyed by parameter name (not position), unsharded;
    loadable on any world size. Collective."""
    return get_optimizer_state_dict(model, optimizer, options=_FULL)


def load_full_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    model_state: dict,
    optimizer_state: dict | None,
    *,
    strict: bool = True,
) -> None:
    """Every rank passes the full state dicts (read from the checkpoint);
    FSDP2 keeps its own shard of each. strict=False: `model_state` may hold
    a subset of the weights (a task that checkpoints only what it trains)."""
    options = StateDictOptions(full_state_dict=True, strict=strict)
    set_model_state_dict(model, model_state, options=options)
    if optimizer is not None and optimizer_state is not None:
        set_optimizer_state_dict(model, optimizer, optimizer_state, options=options)
