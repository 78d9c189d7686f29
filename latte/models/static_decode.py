"""One decoding state per generation, allocated once, and the static step
that updates it in place (docs/design.md, "Decoding").

After the prompt's chunked prefill, `allocate` turns the layers' states into
the static state of the whole generation: every window buffer (sliding
window, Macchiato) a ring of min(W - 1, prompt + max_new_tokens - 1) slots,
the most any query of this generation can reach (`RingWindowState`: column c
at slot c mod R, written in place at a write index, empty slots masked and
weighing exactly 0; the memory slots' pending scores on the same slots),
every KV cache
of a softmax layer preallocated to prompt + max_new_tokens slots
(`StaticKVCache`, written at an index and masked by what it holds, as
gpt-fast does), the sinks (with their fill count), the memory slots, the
latent state, the qk-mixer state, the position counter per row, the rows'
end-of-sequence flags and the buffer of chosen tokens. From then on every
step has the same shapes.

The step (`decode_step`) feeds one token per row, picks the next one
(greedy, or sampled with the torch.Generator passed in) and writes every
result into the static state with `copy_` / `index_copy_` at tensor indices:
no Python branch on a value, no host read, no state reallocated. Values are
checked once, before the first token (the callers' `stream`). End of
sequence is read on the host every `eos_check_every` tokens only; the tokens
chosen after every row stopped are cut off afterwards, so the output is the
step-by-step loop's (`token_stream`) exactly.

On CUDA the step is captured once in a CUDA graph and replayed per token
(`capture`); on the CPU the very same step function runs eagerly, so the CPU
tests cover its logic. The captured path has not been measured on a GPU
(docs/gpu.md §5).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from .._checks import is_int
from ..layers import KVCache, StaticKVCache
from ..layers.states import _leaves
from ..ops.window.memory import MemoryState
from ..ops.window.sliding_window import WindowState, ring_layout, ring_window_state
from .modeling import map_state

EOS_CHECK_EVERY = 8  # tokens between two host reads of the end-of-sequence flags (the default k)


def check_eos_every(eos_check_every) -> None:
    """The k of "end of sequence read every k tokens": an integer >= 1."""
    if not is_int(eos_check_every) or eos_check_every < 1:
        raise ValueError(
            f"eos_check_every: expected an integer >= 1 (tokens between two reads of the eos flags), "
            f"got {eos_check_every!r}"
        )


@dataclass
class StaticState:
    """Everything one generation reads and writes, at fixed shapes."""

    layers: list[Any]  # one state per layer (window buffers full, KV caches preallocated)
    pos: torch.Tensor  # [B] int64: real tokens fed so far per row (the next token's position)
    done: torch.Tensor  # [B] bool: the row has produced an end-of-sequence token
    tokens: torch.Tensor  # [B, N] int64: the chosen tokens, N = max_new_tokens
    stopped: torch.Tensor  # [N] bool: every row had stopped after token i
    index: torch.Tensor  # [] int64: tokens chosen so far


def _static_layer(state: Any, window: int | None, capacity: int, prompt: int) -> Any:
    """One layer's state at the fixed shapes of the whole generation, after
    `prompt` columns: a window buffer becomes a ring of the earlier positions
    any query of the generation reaches, min(W - 1, capacity - 1)."""
    if isinstance(state, WindowState):
        return ring_window_state(state, min(window, capacity) - 1, prompt)
    if isinstance(state, MemoryState):  # pending scores aligned with the ring's slots when it is W - 1 long
        if min(window, capacity) - 1 < window - 1:  # no token leaves the window: pending is never read
            return map_state(lambda t: t.clone(), state)
        R = window - 1
        return state._replace(
            pending=ring_layout(state.pending, R, prompt, float("-inf")),
            pending_pos=ring_layout(state.pending_pos, R, prompt),
            **{f: getattr(state, f).clone() for f in ("k", "v", "score", "pos", "mask", "count")},
        )
    if isinstance(state, KVCache):
        B, S = state.mask.shape
        k = state.k.new_zeros(B, capacity, *state.k.shape[2:])
        v = state.v.new_zeros(B, capacity, *state.v.shape[2:])
        mask = state.mask.new_zeros(B, capacity)
        k[:, :S], v[:, :S], mask[:, :S] = state.k, state.v, state.mask
        return StaticKVCache(k, v, mask, torch.tensor(S, device=k.device))
    if isinstance(state, tuple) and hasattr(state, "_fields"):  # NamedTuple
        return type(state)(*(_static_layer(s, window, capacity, prompt) for s in state))
    return map_state(lambda t: t.clone(), state)  # fixed shapes already: a buffer of its own


def allocate(layers: list, windows: list, pos: torch.Tensor, prompt: int, max_new_tokens: int) -> StaticState:
    """The static state after a prefill of `prompt` positions: `layers` its
    states, `windows` each layer's window size (None: no window), `pos` [B]
    its position counter."""
    capacity = prompt + max_new_tokens
    B, dev = pos.shape[0], pos.device
    return StaticState(
        [_static_layer(s, w, capacity, prompt) for s, w in zip(layers, windows)],
        pos.clone(),
        torch.zeros(B, dtype=torch.bool, device=dev),
        torch.zeros(B, max(max_new_tokens, 1), dtype=torch.long, device=dev),
        torch.zeros(max(max_new_tokens, 1), dtype=torch.bool, device=dev),
        torch.zeros((), dtype=torch.long, device=dev),
    )


def copy_into(dst: Any, src: Any) -> None:
    """Writes a step's new state `src` into the static state `dst` in place
    (same structure and shapes, else a RuntimeError: a step that changed a
    shape would break a captured graph). Tensors the step wrote in place
    (ring buffers, KV caches) are `dst`'s own and are not copied."""
    d, s = list(_leaves(dst)), list(_leaves(src))
    if len(d) != len(s) or any(a.shape != b.shape for a, b in zip(d, s)):
        shapes = [tuple(a.shape) for a in d], [tuple(b.shape) for b in s]
        raise RuntimeError(f"static decoding: a step changed its state's structure or shapes: {shapes}")
    for a, b in zip(d, s):
        if a is not b:
            a.copy_(b)


def reorder(state: StaticState, index: torch.Tensor) -> None:
    """Beam search: row i of every per-row tensor becomes row index[i], in place."""
    B = state.pos.shape[0]
    index = index.to(state.pos.device)
    for t in [*_leaves(state.layers), state.pos, state.done, state.tokens]:
        if t.dim() and t.shape[0] == B:
            t.copy_(t.index_select(0, index))


Pick = Callable[[torch.Tensor], torch.Tensor]  # logits [B, V] (float32) -> tokens [B]


def choose(state: StaticState, logits: torch.Tensor, pick: Pick, eos: torch.Tensor | None) -> torch.Tensor:
    """Picks the next token per row from logits [B, V] and records it (a
    stopped row repeats its eos); returns the tokens [B]."""
    tok = pick(logits.float())
    if eos is not None:
        tok = torch.where(state.done, eos[0], tok)
        state.done.copy_(state.done | torch.isin(tok, eos))
    at = state.index.view(1)
    state.tokens.index_copy_(1, at, tok[:, None])
    state.stopped.index_copy_(0, at, state.done.all().view(1))
    state.index.add_(1)
    return tok


Feed = Callable[[torch.Tensor, list, torch.Tensor], tuple[torch.Tensor, list, torch.Tensor]]


def decode_step(feed: Feed, state: StaticState, tok: torch.Tensor, pick: Pick, eos) -> torch.Tensor:
    """The static step: feeds tok [B] (`feed(tok, layers, pos) -> (logits
    [B, V], new layers, new pos)`), writes the new state into `state` and
    returns the next tokens [B]. Fixed shapes, no host read."""
    logits, layers, pos = feed(tok, state.layers, state.pos)
    copy_into(state.layers, layers)
    state.pos.copy_(pos)
    return choose(state, logits, pick, eos)


def capture(step: Callable[[torch.Tensor], torch.Tensor], tok: torch.Tensor, generator=None):
    """(the step's output for tok, a function token -> next token). On CUDA
    the step runs once eagerly on a side stream (a real step, which also
    warms it up), is captured in a CUDA graph and then replayed per token
    (static input and output buffers; the generator's state registered so
    sampling advances under replay). Elsewhere: the step itself."""
    if tok.device.type != "cuda":
        return step(tok), step
    static_in = tok.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        first = step(static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    if generator is not None:
        graph.register_generator_state(generator)
    with torch.cuda.graph(graph):
        static_out = step(static_in)

    def replay(t: torch.Tensor) -> torch.Tensor:
        static_in.copy_(t)
        graph.replay()
        return static_out.clone()

    # The graph reads and writes the step's tensors (its static state) at the
    # addresses they had when it was captured: the replay keeps the step, and
    # so its state, alive. A caller that kept only the replay (bench decode,
    # one graph per context) otherwise freed the state, and the next
    # context's allocation reused its memory under the first graph.
    replay.step = step
    return first, replay


@torch.no_grad()
def static_tokens(
    model: torch.nn.Module,
    prefill: Callable[[], tuple[torch.Tensor, list, torch.Tensor]],
    feed: Feed,
    windows: list,
    prompt: int,
    max_new_tokens: int,
    eos: torch.Tensor | None,
    pick: Pick,
    *,
    generator: torch.Generator | None = None,
    eos_check_every: int = EOS_CHECK_EVERY,
    use_graph: bool = True,
) -> Iterator[torch.Tensor]:
    """The decoding loop over the static state: yields one token per row [B]
    per step, as `token_stream` does (a row stops at eos and repeats it; the
    loop ends after max_new_tokens or once every row has stopped), in bursts
    of up to `eos_check_every` tokens between two reads of the eos flags.
    `prefill() -> (logits [B, V], layers, pos [B])` runs the prompt; `pick`
    chooses tokens from logits (sampling with `generator`); use_graph:
    capture the step on CUDA (see `capture`). Runs in eval mode, the model's
    training flag restored after."""
    if max_new_tokens == 0:
        return
    was_training = model.training
    model.eval()
    try:
        yield from _loop(
            prefill, feed, windows, prompt, max_new_tokens, eos, pick, generator, eos_check_every, use_graph
        )
    finally:
        model.train(was_training)


def _loop(prefill, feed, windows, prompt, max_new_tokens, eos, pick, generator, eos_check_every, use_graph):
    logits, layers, pos = prefill()
    state = allocate(layers, windows, pos, prompt, max_new_tokens)
    tok, made, shown, step = choose(state, logits, pick, eos), 1, 0, None
    while True:
        if made == max_new_tokens or made % eos_check_every == 0:
            n, ended = _valid(state, made, eos)
            yield from (state.tokens[:, i].clone() for i in range(shown, n))
            shown = n
            if ended or made == max_new_tokens:
                return
        if step is None:
            run = lambda t: decode_step(feed, state, t, pick, eos)  # noqa: E731
            tok, step = capture(run, tok, generator) if use_graph else (run(tok), run)
        else:
            tok = step(tok)
        made += 1


def _valid(state: StaticState, made: int, eos) -> tuple[int, bool]:
    """(tokens to keep of the `made` chosen: up to the first after which every
    row had stopped; whether every row has stopped). One host read."""
    if eos is None:
        return made, False
    stopped = state.stopped[:made].nonzero()
    return (made, False) if not stopped.numel() else (int(stopped[0, 0]) + 1, True)


def layer_windows(modules: list) -> list:
    """The window size of each layer's mixer (None for mixers without a window)."""
    return [getattr(m, "window_size", None) for m in modules]
