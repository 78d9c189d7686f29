"""`LatteForCausalLM`: the backbone, a language-model head, the shifted loss
and generation (chunked prefill, then one recurrent step per token), whole
(`generate`) or token by token (`stream`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from .cache import LatteCache
from .config import LatteConfig
from .inputs import value_checks
from .lm_loss import head_and_loss, next_token_targets
from .modeling import LatteModel
from .pretrained import PretrainedMixin
from .sampling import check_eos, check_sampling_args, token_stream


@dataclass
class CausalLMOutput:
    loss: torch.Tensor | None  # mean over non-ignored target tokens
    logits: torch.Tensor | None  # [B, T, vocab_size]; None when the fused loss skipped them
    state: LatteCache | None  # continues after the last token


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
    ) -> CausalLMOutput:
        """labels are input_ids-aligned (shifted inside, -100 ignored);
        shift_labels are already shifted (position t predicts shift_labels[:, t]).
        The loss is the mean over the targets that are not -100.

        return_logits: None (default) returns logits unless a loss is computed
        in training mode with gradients enabled: then the fused chunked head +
        cross-entropy is used and `logits` is None (a [B, T, V] tensor is
        50257 x 4 bytes per token). True or False forces either way.
        The state is returned when use_cache is set or a state was given.
        Inputs are validated once here (see latte.models.inputs)."""
        mask = self.model.check_inputs(input_ids, attention_mask)
        targets = None
        if labels is not None or shift_labels is not None:
            targets = next_token_targets(
                labels,
                shift_labels,
                mask,
                tuple(input_ids.shape),
                self.model.embed.num_embeddings,
                values=value_checks(self.model.validate_inputs),
            )
        hidden, state = self.model(
            input_ids, state=state, attention_mask=mask, use_cache=use_cache, inputs_checked=True
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
    ) -> torch.Tensor:
        """Continues `input_ids` [B, T]; returns [B, T + n] with n <= max_new_tokens.

        One chunked forward over the prompt, then one token at a time from the
        recurrent state (constant time per token for every mixer but softmax).
        Batches of different-length prompts use LEFT padding (attention_mask 0
        on the left). Greedy when temperature == 0 or do_sample is False;
        sampling otherwise (temperature, then top_k (0 = off), then top_p).
        A row stops at eos_token_id and is padded with it afterwards;
        generation ends when every row has stopped. `streamer(tokens [B])`, if
        given, is called with each new column as soon as it is chosen. Runs
        in eval mode (dropout off), restoring the training flag afterwards.
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
    ) -> Iterator[torch.Tensor]:
        """`generate` one token at a time: an iterator of the new tokens [B],
        one column per step (rows that have stopped repeat their eos). Every
        argument is validated here, before the first token is asked for."""
        greedy = check_sampling_args(max_new_tokens, temperature, top_k, top_p, do_sample)
        mask = self.model.check_inputs(input_ids, attention_mask)
        if mask is not None and value_checks(self.model.validate_inputs):
            if not bool(mask[:, -1].all()):
                raise ValueError(
                    "attention_mask: generate needs LEFT padding (the last column all ones): pad prompts on the left"
                )
            if not bool(mask.any(1).all()):
                raise ValueError("attention_mask: every prompt needs at least one real token")
        eos = check_eos(eos_token_id, self.model.embed.num_embeddings, input_ids.device)
        pick = dict(greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
        return self._decode(input_ids, mask, max_new_tokens, eos, pick)

    @torch.no_grad()
    def _decode(
        self,
        input_ids: torch.Tensor,
        mask: torch.Tensor | None,
        max_new_tokens: int,
        eos: torch.Tensor | None,
        pick: dict,
    ) -> Iterator[torch.Tensor]:
        if max_new_tokens == 0:
            return
        was_training = self.training
        self.eval()
        try:
            # Prefill: one chunked pass; only the last position goes through
            # the head ([B, T, V] logits of a long prompt would be large).
            hidden, state = self.model(input_ids, attention_mask=mask, use_cache=True, inputs_checked=True)

            def step(tok):
                # The new token is real in every row and a valid id: the state
                # already knows which prompt positions were padding.
                nonlocal state
                hidden, state = self.model(tok[:, None], state=state, use_cache=True, inputs_checked=True)
                return self.lm_head(hidden[:, -1])

            yield from token_stream(self.lm_head(hidden[:, -1]), step, max_new_tokens, eos, pick)
        finally:
            self.train(was_training)
