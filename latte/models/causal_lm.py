"""`LatteForCausalLM`: the backbone, a language-model head, the shifted loss
and `generate` (chunked prefill, then one recurrent step per token)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from latte.ops import linear_cross_entropy

from .cache import LatteCache
from .config import LatteConfig
from .io import PretrainedMixin
from .modeling import LatteModel, check_attention_mask, check_input_ids

IGNORE_INDEX = -100


@dataclass
class CausalLMOutput:
    loss: torch.Tensor | None  # mean over non-ignored target tokens
    logits: torch.Tensor | None  # [B, T, vocab_size]; None when the fused loss skipped them
    state: LatteCache | None  # continues after the last token


def _check_labels(name: str, labels: torch.Tensor, shape: tuple, V: int) -> None:
    if not isinstance(labels, torch.Tensor) or tuple(labels.shape) != shape:
        got = tuple(labels.shape) if isinstance(labels, torch.Tensor) else type(labels).__name__
        raise ValueError(f"{name}: expected shape {shape} like input_ids, got {got}")
    if labels.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{name}: expected an integer tensor, got dtype {labels.dtype}")
    bad = (labels != IGNORE_INDEX) & ((labels < 0) | (labels >= V))
    if bad.any():
        raise ValueError(f"{name}: found {int(labels[bad][0])}; {name} must be in [0, {V - 1}] or -100 (ignored)")


def next_token_targets(labels: torch.Tensor | None, shift_labels: torch.Tensor | None,
                       mask: torch.Tensor | None, shape: tuple, V: int) -> torch.Tensor:
    """Targets [B, T] aligned with the positions (position t predicts
    targets[:, t]; -100 = no loss there).

    labels: input_ids-aligned; shifted here, so the last position has no
    target, and labels at padded positions (mask False) are ignored.
    shift_labels: already shifted (what a loader of (x, y) windows yields),
    used as they are. Exactly one of the two is given."""
    if (labels is None) == (shift_labels is None):
        raise ValueError("labels, shift_labels: give exactly one (labels are shifted inside, "
                         "shift_labels are already shifted)")
    if shift_labels is not None:
        _check_labels("shift_labels", shift_labels, shape, V)
        return shift_labels.long()
    _check_labels("labels", labels, shape, V)
    labels = labels.long()
    if mask is not None:
        labels = labels.masked_fill(~mask, IGNORE_INDEX)
    return F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)


def mean_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits [B, T, V] against position-aligned targets
    (-100 ignored; 0 when every target is ignored)."""
    total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                            ignore_index=IGNORE_INDEX, reduction="sum")
    return total / (targets != IGNORE_INDEX).sum().clamp(min=1)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Next-token cross-entropy: position t predicts labels[t + 1]. Targets
    equal to -100 or at padded positions (mask False) are ignored; the loss is
    the mean over the remaining targets (0 if there are none)."""
    B, T, V = logits.shape
    return mean_cross_entropy(logits, next_token_targets(labels, None, mask, (B, T), V))


def head_and_loss(hidden: torch.Tensor, head: nn.Linear, targets: torch.Tensor | None, return_logits: bool | None,
                  training: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
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
    total = linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), head.weight, targets.reshape(-1),
                                 ignore_index=IGNORE_INDEX)
    return None, total / (targets != IGNORE_INDEX).sum().clamp(min=1)


class LatteForCausalLM(PretrainedMixin, nn.Module):
    """Causal language model. `forward(input_ids, *, labels=None, shift_labels=None,
    state=None, use_cache=False, attention_mask=None, return_logits=None)
    -> CausalLMOutput(loss, logits, state)`."""

    def __init__(self, config: LatteConfig):
        super().__init__()
        if not config.causal:
            raise ValueError("config.causal: a causal LM needs causal=True, got False "
                             "(use LatteForSequenceClassification for encoders)")
        self.config = config
        self.model = LatteModel(config)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        with torch.no_grad():
            self.model.init_weights()
            if config.tie_embeddings:
                self.lm_head.weight = self.model.embed.weight
            else:
                nn.init.normal_(self.lm_head.weight, 0.0, config.initializer_range)

    def forward(self, input_ids: torch.Tensor, *, labels: torch.Tensor | None = None,
                shift_labels: torch.Tensor | None = None, state: LatteCache | None = None,
                use_cache: bool = False, attention_mask: torch.Tensor | None = None,
                return_logits: bool | None = None) -> CausalLMOutput:
        """labels are input_ids-aligned (shifted inside, -100 ignored);
        shift_labels are already shifted (position t predicts shift_labels[:, t]).
        The loss is the mean over the targets that are not -100.

        return_logits: None (default) returns logits unless a loss is computed
        in training mode with gradients enabled: then the fused chunked head +
        cross-entropy is used and `logits` is None (a [B, T, V] tensor is
        50257 x 4 bytes per token). True or False forces either way.
        The state is returned when use_cache is set or a state was given."""
        B, T = check_input_ids(input_ids, self.config.vocab_size)
        mask = check_attention_mask(attention_mask, (B, T))
        targets = None
        if labels is not None or shift_labels is not None:
            targets = next_token_targets(labels, shift_labels, mask, (B, T), self.config.vocab_size)
        hidden, state = self.model(input_ids, state=state, attention_mask=attention_mask, use_cache=use_cache)
        logits, loss = head_and_loss(hidden, self.lm_head, targets, return_logits, self.training)
        return CausalLMOutput(loss, logits, state)

    def num_parameters(self, *, exclude_embeddings: bool = False) -> int:
        return num_parameters(self, exclude_embeddings=exclude_embeddings)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, eos_token_id: int | list[int] | None = None,
                 attention_mask: torch.Tensor | None = None, generator: torch.Generator | None = None,
                 do_sample: bool | None = None) -> torch.Tensor:
        """Continues `input_ids` [B, T]; returns [B, T + n] with n <= max_new_tokens.

        One chunked forward over the prompt, then one token at a time from the
        recurrent state (constant time per token for every mixer but softmax).
        Batches of different-length prompts use LEFT padding (attention_mask 0
        on the left). Greedy when temperature == 0 or do_sample is False;
        sampling otherwise (temperature, then top_k, then top_p). A row stops
        at eos_token_id and is padded with it afterwards; generation ends when
        every row has stopped. Runs in eval mode (dropout off), restoring the
        training flag afterwards.
        """
        greedy = _check_generate_args(max_new_tokens, temperature, top_k, top_p, do_sample)
        B, T = check_input_ids(input_ids, self.config.vocab_size)
        mask = check_attention_mask(attention_mask, (B, T))
        if mask is not None and not bool(mask[:, -1].all()):
            raise ValueError("attention_mask: generate needs LEFT padding (the last column all ones): "
                             "pad prompts on the left")
        if mask is not None and not bool(mask.any(1).all()):
            raise ValueError("attention_mask: every prompt needs at least one real token")
        eos = _check_eos(eos_token_id, self.config.vocab_size, input_ids.device)
        if max_new_tokens == 0:
            return input_ids
        was_training = self.training
        self.eval()
        try:
            # Prefill: one chunked pass; only the last position goes through
            # the head ([B, T, V] logits of a long prompt would be large).
            hidden, state = self.model(input_ids, attention_mask=mask, use_cache=True)
            done = torch.zeros(B, dtype=torch.bool, device=input_ids.device)
            new = []
            for i in range(max_new_tokens):
                logits = self.lm_head(hidden[:, -1]).float()  # [B, V]
                tok = logits.argmax(-1) if greedy else sample(logits, temperature, top_k, top_p, generator)
                if eos is not None:
                    tok = torch.where(done, eos[0], tok)
                    done = done | torch.isin(tok, eos)
                new.append(tok)
                if i + 1 == max_new_tokens or bool(done.all()):
                    break
                # The new token is real in every row: the state already knows
                # which prompt positions were padding, so no mask is needed.
                hidden, state = self.model(tok[:, None], state=state, use_cache=True)
        finally:
            self.train(was_training)
        return torch.cat([input_ids, torch.stack(new, 1).to(input_ids.dtype)], 1) if new else input_ids


def sample(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None,
           generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of logits [B, V]: temperature, top-k, nucleus (top-p)."""
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= top_p  # keep the smallest prefix with mass >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


def _check_generate_args(max_new_tokens, temperature, top_k, top_p, do_sample) -> bool:
    """Validates the sampling arguments; returns True for greedy decoding."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: expected an integer >= 0, got {max_new_tokens!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
        raise ValueError(f"temperature: expected a number >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k: expected None or an integer >= 1, got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise ValueError(f"top_p: expected None or a number in (0, 1], got {top_p!r}")
    if do_sample is not None and not isinstance(do_sample, bool):
        raise ValueError(f"do_sample: expected None, True or False, got {do_sample!r}")
    if do_sample and temperature == 0:
        raise ValueError("do_sample=True needs temperature > 0 (temperature 0 means greedy)")
    return temperature == 0 or do_sample is False


def _check_eos(eos_token_id, vocab_size: int, device) -> torch.Tensor | None:
    """None, an id or a list of ids in [0, vocab_size) -> tensor of ids or None."""
    if eos_token_id is None:
        return None
    ids = [eos_token_id] if isinstance(eos_token_id, int) and not isinstance(eos_token_id, bool) else eos_token_id
    if (not isinstance(ids, (list, tuple)) or not ids
            or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab_size for i in ids)):
        raise ValueError(f"eos_token_id: expected None, an id or a list of ids in [0, {vocab_size - 1}], "
                         f"got {eos_token_id!r}")
    return torch.tensor(list(ids), device=device)


def num_parameters(model: nn.Module, *, exclude_embeddings: bool = False) -> int:
    """Distinct parameters (a tied weight counts once)."""
    params = {id(p): p for p in model.parameters()}
    if exclude_embeddings:
        for m in model.modules():
            if isinstance(m, nn.Embedding):
                params.pop(id(m.weight), None)
    return sum(p.numel() for p in params.values())


