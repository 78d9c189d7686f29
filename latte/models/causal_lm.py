"""`LatteForCausalLM`: the backbone (`modeling.py`), a language-model head,
the shifted loss and generation (chunked prefill, then one recurrent step per
token), whole (`generate`) or token by token (`stream`).

In reading order: the loss (labels shifted inside: position t predicts token
t + 1; IGNORE_INDEX (-100) and padded positions ignored; the mean over the
remaining targets; the fused chunked head + cross-entropy that never forms
[B, T, V] logits when training), choosing the next token (greedy or sampled:
temperature, then top-k, then nucleus top-p, with the one validation of these
arguments that `generate` and `stream` share), then the model.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from latte._checks import is_int, is_real
from latte.ops import linear_cross_entropy
from latte.ops._checks import check_cu_seqlens

from .config import LatteConfig
from .modeling import LatteCache, LatteModel, value_checks
from .pretrained import PretrainedMixin, architecture
from .static_decode import EOS_CHECK_EVERY, check_eos_every, layer_windows, static_tokens

# ---- the loss -------------------------------------------------------------------

IGNORE_INDEX = -100  # the target value that contributes no loss (PyTorch's and transformers' convention)


def _check_labels(name: str, labels: torch.Tensor, shape: tuple, V: int, values: bool) -> None:
    if not isinstance(labels, torch.Tensor) or tuple(labels.shape) != shape:
        got = tuple(labels.shape) if isinstance(labels, torch.Tensor) else type(labels).__name__
        raise ValueError(f"{name}: expected shape {shape} like input_ids, got {got}")
    if labels.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{name}: expected an integer tensor, got dtype {labels.dtype}")
    if not values:  # the value check is a host sync (see latte/models/modeling.py, "Validation")
        return
    bad = labels[(labels != IGNORE_INDEX) & ((labels < 0) | (labels >= V))]
    if bad.numel():
        raise ValueError(f"{name}: found {int(bad[0])}; {name} must be in [0, {V - 1}] or -100 (ignored)")


def next_token_targets(
    labels: torch.Tensor | None,
    shift_labels: torch.Tensor | None,
    mask: torch.Tensor | None,
    shape: tuple,
    V: int,
    *,
    values: bool = True,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Targets [B, T] aligned with the positions (position t predicts
    targets[:, t]; -100 = no loss there).

    labels: input_ids-aligned; shifted here, so the last position has no
    target, and labels at padded positions (mask False) are ignored; with
    cu_seqlens (packed documents, B == 1) neither has the last token of
    each document (the next document's first token is not its target).
    shift_labels: already shifted (what a loader of (x, y) windows yields),
    used as they are. Exactly one of the two is given. values=False skips
    the range check of the ids (a host sync)."""
    if (labels is None) == (shift_labels is None):
        raise ValueError(
            "labels, shift_labels: give exactly one (labels are shifted inside, shift_labels are already shifted)"
        )
    if shift_labels is not None:
        _check_labels("shift_labels", shift_labels, shape, V, values)
        return shift_labels.long()
    _check_labels("labels", labels, shape, V, values)
    labels = labels.long()
    if mask is not None:
        labels = labels.masked_fill(~mask, IGNORE_INDEX)
    targets = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)
    if cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens, *shape)
        targets = targets.index_fill(1, cu_seqlens[1:].long() - 1, IGNORE_INDEX)
    return targets


def mean_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits [B, T, V] against position-aligned targets
    (-100 ignored; 0 when every target is ignored)."""
    total = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    return total / (targets != IGNORE_INDEX).sum().clamp(min=1)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Next-token cross-entropy: position t predicts labels[t + 1]. Targets
    equal to -100 or at padded positions (mask False) are ignored; the loss is
    the mean over the remaining targets (0 if there are none)."""
    B, T, V = logits.shape
    return mean_cross_entropy(logits, next_token_targets(labels, None, mask, (B, T), V))


def head_and_loss(
    hidden: torch.Tensor, head: nn.Linear, targets: torch.Tensor | None, return_logits: bool | None, training: bool
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(logits or None, mean loss or None) of an LM head over hidden [B, T, D].

    return_logits None means: skip the logits exactly when a loss is computed
    in training mode with gradients on (the usual training step). Without
    logits the loss comes from the fused, chunked head + cross-entropy
    (latte.ops.linear_cross_entropy), which never forms [B, T, V]."""
    if return_logits is None:
        return_logits = not (targets is not None and training and torch.is_grad_enabled())
    if return_logits:
        logits = head(hidden)
        return logits, None if targets is None else mean_cross_entropy(logits, targets)
    if targets is None:
        raise ValueError("return_logits=False needs labels or shift_labels: there would be nothing to return")
    if head.bias is not None:
        raise ValueError("return_logits=False: the fused loss supports an LM head without bias")
    total = linear_cross_entropy(
        hidden.reshape(-1, hidden.shape[-1]), head.weight, targets.reshape(-1), ignore_index=IGNORE_INDEX
    )
    return None, total / (targets != IGNORE_INDEX).sum().clamp(min=1)


# ---- choosing the next token ---------------------------------------------------


def check_sampling_args(max_new_tokens, temperature, top_k, top_p, do_sample=None) -> bool:
    """Validates the generation arguments; returns True for greedy decoding
    (temperature 0 or do_sample=False). Each bad value is a ValueError that
    names the argument, the value and what is allowed."""
    if not is_int(max_new_tokens) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: expected an integer >= 0, got {max_new_tokens!r}")
    if not is_real(temperature) or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature: expected a finite number >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None and (not is_int(top_k) or top_k < 0):
        raise ValueError(f"top_k: expected None or an integer >= 0 (0 = off), got {top_k!r}")
    if top_p is not None and (not is_real(top_p) or not 0 < top_p <= 1):  # NaN fails the comparison
        raise ValueError(f"top_p: expected None or a number in (0, 1] (1 = off), got {top_p!r}")
    if do_sample is not None and not isinstance(do_sample, bool):
        raise ValueError(f"do_sample: expected None, True or False, got {do_sample!r}")
    if do_sample and temperature == 0:
        raise ValueError("do_sample=True needs temperature > 0 (temperature 0 means greedy)")
    return temperature == 0 or do_sample is False


def check_eos(eos_token_id, vocab_size: int, device) -> torch.Tensor | None:
    """None, an id or a list of ids in [0, vocab_size) -> tensor of ids or None."""
    if eos_token_id is None:
        return None
    ids = [eos_token_id] if is_int(eos_token_id) else eos_token_id
    if not isinstance(ids, (list, tuple)) or not ids or not all(is_int(i) and 0 <= i < vocab_size for i in ids):
        raise ValueError(
            f"eos_token_id: expected None, an id or a list of ids in [0, {vocab_size - 1}], got {eos_token_id!r}"
        )
    return torch.tensor([int(i) for i in ids], device=device)


def sample(
    logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None, generator: torch.Generator | None
) -> torch.Tensor:
    """One token per row of logits [B, V]: temperature, top-k, nucleus (top-p)."""
    logits = logits / temperature
    if top_k and top_k < logits.shape[-1]:  # None or 0: off
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs >= top_p  # keep the smallest prefix with mass >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


def next_token(
    logits: torch.Tensor,
    greedy: bool,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """logits [B, V] -> token ids [B]."""
    return logits.argmax(-1) if greedy else sample(logits, temperature, top_k, top_p, generator)


@torch.no_grad()
def token_stream(
    model: nn.Module,
    prefill: Callable[[], tuple[torch.Tensor, Any]],
    step: Callable[[torch.Tensor, Any], tuple[torch.Tensor, Any]],
    max_new_tokens: int,
    eos: torch.Tensor | None,
    pick: dict,
) -> Iterator[torch.Tensor]:
    """The one decoding loop of both causal LMs' `stream` (this module's and
    the converted model's, latte/convert/modeling.py): `prefill()` runs the
    prompt and returns (the last position's logits [B, V], the decoding
    state); `step(tok [B], state)` feeds the chosen tokens and returns the
    same pair. Yields one token per row [B] per step; a row stops at eos
    (then repeats it); the loop ends after max_new_tokens or when every row
    has stopped. Runs without gradients and in eval mode (dropout off), the
    model's training flag restored after. `pick`: next_token's arguments."""
    if max_new_tokens == 0:
        return
    was_training = model.training
    model.eval()
    try:
        logits, state = prefill()
        done = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
        for i in range(max_new_tokens):
            tok = next_token(logits.float(), **pick)  # [B]
            if eos is not None:
                tok = torch.where(done, eos[0], tok)
                done = done | torch.isin(tok, eos)
            yield tok
            if i + 1 == max_new_tokens or bool(done.all()):
                break
            logits, state = step(tok, state)
    finally:
        model.train(was_training)


# ---- the model ------------------------------------------------------------------


@dataclass
class CausalLMOutput:
    loss: torch.Tensor | None  # mean over non-ignored target tokens
    logits: torch.Tensor | None  # [B, T, vocab_size]; None when the fused loss skipped them
    state: LatteCache | None  # continues after the last token


@architecture
class LatteForCausalLM(PretrainedMixin, nn.Module):
    """Causal language model. `forward(input_ids, *, labels=None, shift_labels=None,
    state=None, use_cache=False, attention_mask=None, return_logits=None)
    -> CausalLMOutput(loss, logits, state)`."""

    def __init__(self, config: LatteConfig):
        super().__init__()
        if not config.causal:
            raise ValueError(
                "config.causal: a causal LM needs causal=True, got False "
                "(use LatteForSequenceClassification for encoders)"
            )
        self.config = config
        self.model = LatteModel(config)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        with torch.no_grad():
            self.model.init_weights()
            if config.tie_embeddings:
                self.lm_head.weight = self.model.embed.weight
            else:
                nn.init.normal_(self.lm_head.weight, 0.0, config.initializer_range)

    def forward(
        self,
        input_ids: torch.Tensor,
        *,
        labels: torch.Tensor | None = None,
        shift_labels: torch.Tensor | None = None,
        state: LatteCache | None = None,
        use_cache: bool = False,
        attention_mask: torch.Tensor | None = None,
        return_logits: bool | None = None,
        cu_seqlens: torch.Tensor | None = None,
    ) -> CausalLMOutput:
        """labels are input_ids-aligned (shifted inside, -100 ignored);
        shift_labels are already shifted (position t predicts shift_labels[:, t]).
        The loss is the mean over the targets that are not -100.

        return_logits: None (default) returns logits unless a loss is computed
        in training mode with gradients enabled: then the fused chunked head +
        cross-entropy is used and `logits` is None (a [B, T, V] tensor is
        50257 x 4 bytes per token). True or False forces either way.
        The state is returned when use_cache is set or a state was given.
        cu_seqlens: packed documents in one row (LatteModel.forward); labels
        then give no target across a boundary (next_token_targets).
        Inputs are validated once here (see latte/models/modeling.py, "Validation")."""
        mask = self.model.check_inputs(input_ids, attention_mask)
        targets = None
        if labels is not None or shift_labels is not None:
            targets = next_token_targets(
                labels,
                shift_labels,
                mask,
                tuple(input_ids.shape),
                self.model.embed.num_embeddings,
                values=value_checks(self.model.validate_inputs, input_ids),
                cu_seqlens=cu_seqlens,
            )
        hidden, state = self.model(
            input_ids,
            state=state,
            attention_mask=mask,
            use_cache=use_cache,
            inputs_checked=True,
            cu_seqlens=cu_seqlens,
        )
        logits, loss = head_and_loss(hidden, self.lm_head, targets, return_logits, self.training)
        return CausalLMOutput(loss, logits, state)

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | list[int] | None = None,
        attention_mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        do_sample: bool | None = None,
        streamer: Callable[[torch.Tensor], None] | None = None,
        eos_check_every: int = EOS_CHECK_EVERY,
        static: bool = True,
    ) -> torch.Tensor:
        """Continues `input_ids` [B, T]; returns [B, T + n] with n <= max_new_tokens.

        One chunked forward over the prompt, then one token at a time from the
        recurrent state (constant time per token for every mixer but softmax).
        Batches of different-length prompts use LEFT padding (attention_mask 0
        on the left). Greedy when temperature == 0 or do_sample is False;
        sampling otherwise (temperature, then top_k (0 = off), then top_p).
        A row stops at eos_token_id and is padded with it afterwards;
        generation ends when every row has stopped. `streamer(tokens [B])`, if
        given, is called with each new column once it is known to be kept
        (in bursts of up to eos_check_every). Runs in eval mode (dropout
        off), restoring the training flag afterwards. eos_check_every and
        static: see `stream`.
        """
        tokens = self.stream(
            input_ids,
            max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            eos_token_id=eos_token_id,
            attention_mask=attention_mask,
            generator=generator,
            do_sample=do_sample,
            eos_check_every=eos_check_every,
            static=static,
        )
        new = []
        for tok in tokens:
            new.append(tok)
            if streamer is not None:
                streamer(tok)
        return torch.cat([input_ids, torch.stack(new, 1).to(input_ids.dtype)], 1) if new else input_ids

    def stream(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | list[int] | None = None,
        attention_mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        do_sample: bool | None = None,
        eos_check_every: int = EOS_CHECK_EVERY,
        static: bool = True,
    ) -> Iterator[torch.Tensor]:
        """`generate` one token at a time: an iterator of the new tokens [B],
        one column per step (rows that have stopped repeat their eos). Every
        argument is validated here, before the first token is asked for.

        static (default): the decoding state is allocated once and one
        fixed-shape step updates it in place, captured in a CUDA graph on
        CUDA (latte/models/static_decode.py); the end-of-sequence flags are
        read every eos_check_every tokens (columns come in bursts of that
        many). static=False: the step-by-step loop over the cache as a value
        (`token_stream`), the reference the static step is tested against."""
        greedy = check_sampling_args(max_new_tokens, temperature, top_k, top_p, do_sample)
        check_eos_every(eos_check_every)
        mask = self.model.check_inputs(input_ids, attention_mask)
        if mask is not None and value_checks(self.model.validate_inputs, mask):
            if not bool(mask[:, -1].all()):
                raise ValueError(
                    "attention_mask: generate needs LEFT padding (the last column all ones): pad prompts on the left"
                )
            if not bool(mask.any(1).all()):
                raise ValueError("attention_mask: every prompt needs at least one real token")
        self._check_positions(input_ids, mask, max_new_tokens)
        eos = check_eos(eos_token_id, self.model.embed.num_embeddings, input_ids.device)
        pick = dict(greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)

        def prefill():
            # One chunked pass; only the last position goes through the head
            # ([B, T, V] logits of a long prompt would be large).
            hidden, state = self.model(input_ids, attention_mask=mask, use_cache=True, inputs_checked=True)
            return self.lm_head(hidden[:, -1]), state

        def step(tok, state):
            # The new token is real in every row and a valid id: the state
            # already knows which prompt positions were padding, and the
            # positions were checked up front (_check_positions): no value read.
            hidden, state = self.model(
                tok[:, None], state=state, use_cache=True, inputs_checked=True, decoding_step=True
            )
            return self.lm_head(hidden[:, -1]), state

        if not static:
            return token_stream(self, prefill, step, max_new_tokens, eos, pick)
        every = dict(generator=generator, eos_check_every=eos_check_every)
        return self._static_stream(input_ids.shape[1], prefill, step, max_new_tokens, eos, pick, every)

    def _static_stream(self, T, prefill, step, max_new_tokens, eos, pick, every) -> Iterator[torch.Tensor]:
        """`stream` over one static state (latte/models/static_decode.py),
        through the same prefill and step as the value loop."""

        def feed(tok, layers, pos):
            logits, state = step(tok, LatteCache(layers, 0, pos))
            return logits, state.layers, state.pos

        def prefill_static():
            logits, state = prefill()
            return logits, state.layers, state.pos

        windows = layer_windows([block.mixer for block in self.model.blocks])
        chooser = functools.partial(next_token, **pick)
        return static_tokens(self, prefill_static, feed, windows, T, max_new_tokens, eos, chooser, **every)

    def _check_positions(self, input_ids: torch.Tensor, mask: torch.Tensor | None, max_new_tokens: int) -> None:
        """Absolute positions stop at max_position_embeddings: refuse up front
        a prompt and continuation that cannot fit, rather than failing after
        part of the output was streamed (each new token but the last is fed
        back at the next position)."""
        cfg = self.config
        checks = value_checks(self.model.validate_inputs, input_ids)
        if cfg.position_embedding == "none" or max_new_tokens == 0 or not checks:
            return
        prompt = int(mask.sum(1).max()) if mask is not None else input_ids.shape[1]
        if prompt + max_new_tokens - 1 > cfg.max_position_embeddings:
            raise ValueError(
                f"max_new_tokens={max_new_tokens}: a {prompt}-token prompt leaves room for at most "
                f"{max(cfg.max_position_embeddings - prompt + 1, 0)} new tokens within max_position_embeddings="
                f"{cfg.max_position_embeddings} (position_embedding={cfg.position_embedding!r})"
            )
