"""`LatteConfig`: one validated dataclass for the language model and the encoder.

Built directly (``LatteConfig(dim=256, ...)``), from a dict (`from_dict`, which
also rejects unknown keys) or from JSON (`load_json`). Every problem is
reported at once in one ValueError (`latte.config_io.ConfigError`) naming the
field, the value received and what is allowed (docs/design.md habit 5).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import typing
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from latte.ops.backend import BACKENDS
from latte.ops.macchiato import MIXES
from latte.ops.window.memory import MAX_MEMORY_SLOTS, MEMORY_RULES

from .._checks import MAX_WINDOW, WINDOW_ALLOWED, is_int
from ..config_io import ConfigError, ConfigErrors
from ..files import atomic_write
from ..layers import QK_MIXERS

Mixer = Literal["latte", "macchiato", "softmax", "linear", "swa"]
MIXERS: tuple[str, ...] = typing.get_args(Mixer)
# Mixers with a bidirectional form (docs/math.md §2); the window mixers are causal only.
BIDIRECTIONAL_MIXERS = ("latte", "softmax", "linear")
LATENT_MIXERS = ("latte", "macchiato")


@dataclass
class LatteConfig:
    """Architecture of a `LatteForCausalLM` (causal=True) or a
    `LatteForSequenceClassification` encoder (causal=False).

    mixer: one name for every layer or a list with one name per layer
        ("latte" latent attention, "macchiato" window + latents, "softmax",
        "linear" attention, "swa" sliding-window softmax).
    latents_per_head: L, the latent states of each head (docs/math.md); a
        layer holds num_heads * latents_per_head in all. Configs saved with
        the old `num_latents` (the total) still load: it maps to
        num_latents / num_heads with a FutureWarning (`upgrade_keys`).
    qk_mixer: how latent logits get order (docs/math.md §5); None resolves to
        "conv_rglru" for causal models and "none" for encoders (the RG-LRU is
        causal only).
    linear_qk_mixer: the same mixer in front of the q/k projections of
        "linear" layers; "none" (default) is the original baseline, "conv"
        the baseline with Latte-conv's short convolution (a like-for-like
        recall comparison, docs/evaluation.md §4).
    num_kv_heads: key/value heads of the softmax-style branches (softmax, swa,
        the macchiato window); None means num_heads.
    num_sinks: "macchiato" only: the first num_sinks tokens stay visible to
        every query next to its window (attention sinks, docs/math.md §4.1);
        0 (default) = the window alone.
    memory_slots, memory_rule: "macchiato" only: up to memory_slots exact
        tokens beyond the window per layer and key/value head, chosen by
        memory_rule (docs/math.md §4.2); 0 (default) = none, the model as
        without the fields, bit for bit. Settable on a saved model without
        retraining (`--set model.memory_slots=64`). memory_positions:
        "absolute" (a slot keeps its key's rotary position) or "cache"
        (slot i at num_sinks + i, the window after the slots).
    backend: the kernels of the latte and macchiato layers (latte.ops.backend),
        saved with the model: "auto" (default) leaves the choice to the
        process (set_backend / LATTE_BACKEND, else fla's kernels on CUDA
        where they import), "torch" or "fla" fix it. A saved "fla" on a
        machine without CUDA or fla-core is refused when the model is built
        (`--set model.backend=torch` overrides it). How fla builds its
        inputs (eager, compiled, fused) stays a process setting.
    mlp: "swiglu", "gelu", or "none" for attention-only blocks (no MLP and no
        second norm: the 2-layer models of the Zoology MQAR sweeps).
    ffn_dim: MLP hidden width; None derives it from mlp_ratio: mlp_ratio * dim
        for "gelu", and 2/3 of that rounded up to a multiple of 8 for "swiglu"
        (three matrices instead of two: about the same parameter count).
        Ignored with mlp "none".
    position_embedding: absolute positions added to the token embeddings.
        "none" suits causal LMs (recurrent qk_mixer / RoPE carry position);
        encoders need "learned" or "sinusoidal". Absolute positions count real
        (unpadded) tokens and are limited to max_position_embeddings.
    num_labels, pooling: the classification head ("mean" over real tokens, or
        "cls": the first real token).
    """

    vocab_size: int = 50257
    dim: int = 512
    num_layers: int = 8
    num_heads: int = 8
    latents_per_head: int = 32
    num_kv_heads: int | None = None
    mixer: Mixer | list[Mixer] = "latte"
    window_size: int = 128
    num_sinks: int = 0
    memory_slots: int = 0
    memory_rule: Literal[MEMORY_RULES] = "recall"  # defined by latte.ops.window.memory
    memory_positions: Literal["absolute", "cache"] = "absolute"
    mix: Literal[MIXES] = "joint"  # ("joint", "gate"), defined by latte.ops.macchiato
    qk_mixer: Literal[QK_MIXERS] | None = None  # ("none", "conv", "rglru", "conv_rglru")
    linear_qk_mixer: Literal[QK_MIXERS] = "none"
    conv_size: int = 3
    chunk_size: int = 64
    backend: Literal[BACKENDS] = "auto"  # ("torch", "fla", "auto"), defined by latte.ops.backend
    rope_theta: float = 10000.0
    mlp: Literal["swiglu", "gelu", "none"] = "swiglu"
    mlp_ratio: float = 4.0
    ffn_dim: int | None = None
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    norm_eps: float = 1e-5
    dropout: float = 0.0
    tie_embeddings: bool = True
    position_embedding: Literal["none", "learned", "sinusoidal"] = "none"
    max_position_embeddings: int = 2048
    causal: bool = True
    num_labels: int = 2
    pooling: Literal["mean", "cls"] = "mean"
    initializer_range: float = 0.02

    def __post_init__(self):
        if isinstance(self.mixer, tuple):
            self.mixer = list(self.mixer)
        if self.qk_mixer is None and isinstance(self.causal, bool):
            self.qk_mixer = "conv_rglru" if self.causal else "none"
        errs = ConfigErrors(type(self).__name__)
        bad = _check_types(self, errs)
        _check_ranges(self, errs, bad)  # skips the checks that involve an ill-typed field
        errs.raise_if_any()

    # ------------------------------------------------------------------ derived

    @property
    def mixers(self) -> list[str]:
        """The mixer of each layer."""
        return list(self.mixer) if isinstance(self.mixer, list) else [self.mixer] * self.num_layers

    @property
    def ffn_hidden(self) -> int:
        """The resolved MLP hidden width (see `ffn_dim`)."""
        if self.ffn_dim is not None:
            return self.ffn_dim
        width = self.mlp_ratio * self.dim
        if self.mlp == "gelu":
            return max(1, int(round(width)))
        return max(8, -(-int(round(2 * width / 3)) // 8) * 8)

    # ------------------------------------------------------------------ presets

    @classmethod
    def tiny(cls, mixer: str | list[str] = "latte", **overrides: Any) -> LatteConfig:
        """A model of a few thousand parameters for tests: runs in milliseconds.
        The window (8) and chunk (8) are small so short sequences cross both."""
        base = dict(
            vocab_size=64,
            dim=32,
            num_layers=2,
            num_heads=2,
            latents_per_head=4,
            window_size=8,
            chunk_size=8,
            mlp_ratio=2.0,
            max_position_embeddings=4096,
            mixer=mixer,
        )
        return cls(**{**base, **overrides})

    @classmethod
    def paper_table6(cls, mixer: str | list[str] = "latte", **overrides: Any) -> LatteConfig:
        """The paper's language model (Table 6, docs/math.md §6): 8 layers, 8 heads,
        D 512, GELU feed-forward 2048, 256 latents (32 per head), window 128,
        conv kernel 3, dropout 0.1, learned positions, GPT-2 BPE vocabulary.

        Choices the table leaves open: qk_mixer "conv" (the table lists a conv
        kernel of 3 and no RG-LRU), LayerNorm (GPT-2 style), tied embeddings,
        and max_position_embeddings 512 = the training sequence length; longer
        inputs raise unless it is overridden."""
        base = dict(
            vocab_size=50257,
            dim=512,
            num_layers=8,
            num_heads=8,
            latents_per_head=32,
            window_size=128,
            conv_size=3,
            qk_mixer="conv",
            mlp="gelu",
            ffn_dim=2048,
            norm="layernorm",
            dropout=0.1,
            position_embedding="learned",
            max_position_embeddings=512,
            tie_embeddings=True,
            mixer=mixer,
        )
        return cls(**{**base, **overrides})

    # ------------------------------------------------------------------ dict / JSON

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def upgrade_keys(cls, data: dict[str, Any]) -> dict[str, Any]:
        """`data` with the deprecated keys of older configs mapped to today's
        (a FutureWarning each); `from_dict` and `latte.config_io.build` call it."""
        return upgrade_num_latents(data, cls)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "LatteConfig") -> LatteConfig:
        """Builds from a plain dict; unknown keys, wrong types and out-of-range
        values are all reported together in one ValueError headed by `where`."""
        if not isinstance(data, dict):
            raise ConfigError(where, [("", f"expected a mapping of LatteConfig fields, got {type(data).__name__}")])
        names = sorted(f.name for f in dataclasses.fields(cls))
        problems = []
        try:
            data = cls.upgrade_keys(data)
        except ConfigError as e:
            raise ConfigError(where, e.problems) from None
        for key in data:
            if key not in names:
                close = difflib.get_close_matches(str(key), names, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                problems.append((str(key), f"unknown key{hint}; allowed keys: {', '.join(names)}"))
        try:
            config = cls(**{k: v for k, v in data.items() if k in names})
        except ConfigError as e:
            problems += e.problems
        if problems:
            raise ConfigError(where, problems)
        return config

    def save_json(self, path: str | os.PathLike) -> None:
        atomic_write(path, json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load_json(cls, path: str | os.PathLike) -> LatteConfig:
        return cls.from_dict(read_json(path), where=str(path))


def upgrade_num_latents(data: dict[str, Any], cls: type = LatteConfig) -> dict[str, Any]:
    """Maps the deprecated `num_latents` (the latents of all heads together,
    before latents_per_head was the one name) to latents_per_head =
    num_latents / num_heads, exactly, with a FutureWarning. A total that
    num_heads does not divide is refused when a layer uses latents (it never
    built); without one the field was unused and is dropped."""
    if not isinstance(data, dict) or "num_latents" not in data:
        return data
    data = dict(data)
    total = data.pop("num_latents")
    heads = data.get("num_heads", cls.num_heads)
    named = data.get("mixer", cls.mixer)
    named = named if isinstance(named, (list, tuple)) else [named]
    if "latents_per_head" in data:
        why = "latents_per_head alone (num_latents is its deprecated total over heads)"
        raise ConfigError(cls.__name__, [("num_latents", f"got {total!r} beside latents_per_head; give {why}")])
    if _is_int(total) and _is_int(heads) and heads >= 1 and total >= heads and total % heads == 0:
        data["latents_per_head"] = total // heads
        warnings.warn(
            f"config key num_latents is deprecated and goes in the next release: num_latents={total} over "
            f"num_heads={heads} is latents_per_head={total // heads}; write latents_per_head instead",
            FutureWarning,
            stacklevel=3,
        )
    elif set(named) & set(LATENT_MIXERS):
        allowed = f"a multiple of num_heads ({heads!r}), as latents_per_head = num_latents / num_heads"
        got = f"got {total!r} ({type(total).__name__})"
        raise ConfigError(cls.__name__, [("num_latents", f"{got}, expected {allowed} (num_latents is deprecated)")])
    return data


def read_json(path: str | os.PathLike) -> dict[str, Any]:
    """A JSON object from `path`; malformed JSON is a ValueError naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


# ---------------------------------------------------------------------- validation

_INT_FIELDS = (
    "vocab_size",
    "dim",
    "num_layers",
    "num_heads",
    "latents_per_head",
    "window_size",
    "conv_size",
    "chunk_size",
    "max_position_embeddings",
    "num_labels",
)
_FLOAT_FIELDS = ("rope_theta", "mlp_ratio", "norm_eps", "dropout", "initializer_range")
_CHOICES = {
    "mix": MIXES,
    "backend": BACKENDS,
    "memory_rule": MEMORY_RULES,
    "memory_positions": ("absolute", "cache"),
    "qk_mixer": QK_MIXERS,
    "linear_qk_mixer": QK_MIXERS,
    "mlp": ("swiglu", "gelu", "none"),
    "norm": ("rmsnorm", "layernorm"),
    "position_embedding": ("none", "learned", "sinusoidal"),
    "pooling": ("mean", "cls"),
}


def _is_int(v: Any) -> bool:
    # a Python int (not numpy's): the value is written to config.json and YAML
    return is_int(v) and isinstance(v, int)


def _check_types(cfg: LatteConfig, errs: ConfigErrors) -> set[str]:
    """Type and choice checks; converts ints given for float fields. Returns
    the names of the fields that failed."""
    n = len(errs.problems)
    for name in _INT_FIELDS:
        v = getattr(cfg, name)
        if errs.check(_is_int(v), name, v, "an integer >= 1"):
            errs.check(v >= 1, name, v, "an integer >= 1")
    v = cfg.num_sinks
    if errs.check(_is_int(v), "num_sinks", v, "an integer >= 0"):
        errs.check(v >= 0, "num_sinks", v, "an integer >= 0")
    v, allowed = cfg.memory_slots, f"an integer in [0, {MAX_MEMORY_SLOTS}] (0 = no memory slots)"
    if errs.check(_is_int(v), "memory_slots", v, allowed):
        errs.check(0 <= v <= MAX_MEMORY_SLOTS, "memory_slots", v, allowed)
    for name in ("num_kv_heads", "ffn_dim"):
        v = getattr(cfg, name)
        if v is not None and errs.check(_is_int(v), name, v, "None or an integer >= 1"):
            errs.check(v >= 1, name, v, "None or an integer >= 1")
    for name in _FLOAT_FIELDS:
        v = getattr(cfg, name)
        if errs.check(isinstance(v, (int, float)) and not isinstance(v, bool), name, v, "a number"):
            setattr(cfg, name, float(v))
    for name in ("tie_embeddings", "causal"):
        errs.check(isinstance(getattr(cfg, name), bool), name, getattr(cfg, name), "true or false")
    for name, allowed in _CHOICES.items():
        v = getattr(cfg, name)
        errs.check(isinstance(v, str) and v in allowed, name, v, "one of " + ", ".join(map(repr, allowed)))
    allowed = "one of " + ", ".join(map(repr, MIXERS)) + " or a list of those, one per layer"
    m = cfg.mixer
    if isinstance(m, list):
        for i, item in enumerate(m):
            errs.check(isinstance(item, str) and item in MIXERS, f"mixer[{i}]", item, allowed)
    else:
        errs.check(isinstance(m, str) and m in MIXERS, "mixer", m, allowed)
    return {p.split("[")[0] for p, _ in errs.problems[n:]}


def _check_ranges(cfg: LatteConfig, errs: ConfigErrors, bad: set[str]) -> None:
    def ok(*names: str) -> bool:
        return not bad.intersection(names)

    if ok("num_layers") and isinstance(cfg.mixer, list):
        errs.check(
            len(cfg.mixer) == cfg.num_layers,
            "mixer",
            cfg.mixer,
            f"a single name or a list of num_layers ({cfg.num_layers}) names",
        )
    named = cfg.mixer if isinstance(cfg.mixer, list) else [cfg.mixer]
    mixers = {m for m in named if isinstance(m, str) and m in MIXERS}  # the valid ones
    if ok("dim", "num_heads"):
        errs.check(cfg.dim % cfg.num_heads == 0, "dim", cfg.dim, f"a multiple of num_heads ({cfg.num_heads})")
    if ok("num_kv_heads", "num_heads") and cfg.num_kv_heads is not None:
        errs.check(
            cfg.num_heads % cfg.num_kv_heads == 0,
            "num_kv_heads",
            cfg.num_kv_heads,
            f"a divisor of num_heads ({cfg.num_heads})",
        )
    if cfg.causal is False:
        _check_bidirectional(cfg, errs, ok, mixers)
    if ok("memory_slots") and cfg.memory_slots:
        errs.check("macchiato" in mixers, "memory_slots", cfg.memory_slots, "0 without a 'macchiato' layer")
    _check_window(cfg, errs, ok, mixers)
    for name, cond, allowed in (
        ("rope_theta", lambda v: v > 0, "> 0"),
        ("mlp_ratio", lambda v: v > 0, "> 0"),
        ("norm_eps", lambda v: v > 0, "> 0"),
        ("dropout", lambda v: 0.0 <= v < 1.0, "in [0, 1)"),
        ("initializer_range", lambda v: v > 0, "> 0"),
    ):
        if ok(name):
            errs.check(cond(getattr(cfg, name)), name, getattr(cfg, name), allowed)


def _check_window(cfg: LatteConfig, errs: ConfigErrors, ok: Callable[..., bool], mixers: set[str]) -> None:
    """window_size at most MAX_WINDOW; with learned positions, at most
    max_position_embeddings when a layer has a window (no sequence is longer)."""
    if not ok("window_size"):
        return
    errs.check(cfg.window_size <= MAX_WINDOW, "window_size", cfg.window_size, WINDOW_ALLOWED)
    learned = cfg.position_embedding == "learned" and ok("max_position_embeddings")
    if learned and mixers & {"macchiato", "swa"}:
        limit = cfg.max_position_embeddings
        allowed = f"<= max_position_embeddings ({limit}) with learned positions: no sequence is longer"
        errs.check(cfg.window_size <= limit, "window_size", cfg.window_size, allowed)


def _check_bidirectional(cfg: LatteConfig, errs: ConfigErrors, ok: Callable[..., bool], mixers: set[str]) -> None:
    """What an encoder (causal=False) may not use: a causal-only mixer, or the
    RG-LRU (causal only) as a qk_mixer."""
    if ok("causal", "qk_mixer") and mixers & set(LATENT_MIXERS):
        errs.check(
            cfg.qk_mixer in ("none", "conv"),
            "qk_mixer",
            cfg.qk_mixer,
            "'none' or 'conv' with causal=False (the RG-LRU is causal only)",
        )
    if ok("causal", "linear_qk_mixer") and "linear" in mixers:
        errs.check(
            cfg.linear_qk_mixer in ("none", "conv"),
            "linear_qk_mixer",
            cfg.linear_qk_mixer,
            "'none' or 'conv' with causal=False (the RG-LRU is causal only)",
        )
    if ok("causal"):
        causal_only = sorted(mixers - set(BIDIRECTIONAL_MIXERS))
        errs.check(
            not causal_only,
            "mixer",
            cfg.mixer,
            f"with causal=False only {', '.join(map(repr, BIDIRECTIONAL_MIXERS))} "
            f"(no bidirectional form of {', '.join(map(repr, causal_only))})",
        )
