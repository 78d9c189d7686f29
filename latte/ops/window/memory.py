"""Memory slots: exact keys and values of a few tokens that have left the
window, chosen by a fixed score (docs/math.md §4.2).

Legend: B batch, T time, H query heads, K key/value heads (H = K * G), G
queries per KV head, E query/key width, D value width, M slots, w the window
size, P = w - 1 window-buffer tokens, C <= M + Q keys of one query block.

A token is a candidate when it is real, not a sink, and (rule "oracle")
marked; a non-candidate scores -inf. Candidates are ranked per KV head by
(score descending, position ascending); the slots of query t hold the M best
candidates s <= t - w, kept in position order. A candidate's score is fixed
when it leaves the window and depends on no selection, so:

- a sequence first scores every token (`token_scores`, plus the window
  attention received for rule "attention"), then scans blocks of Q queries:
  the M held tokens and the block's new candidates, each visible to a query
  from its entry until M better ones have entered (`_block`);
- a decoding step attends to the M held tokens, then lets the token that
  leaves the window compete for a slot (`_insert`, in O(M)).

Given the window and sinks' (y, lse) (`local`), both paths join them under
the slots' softmax as one more column and return the merged pair.

The window phase works on the "extended" sequence: the P tokens of the
window buffer (their scores waiting in MemoryState.pending) followed by the
T new ones; extended token j leaves the window before query j + 1 - P + P,
that is it is visible to new query t from t = j + 1 on.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch

from .._checks import check_mask, check_shape, state_dtype
from .._exp import exp_floor, exp_floored
from ..layout import no_autocast
from .memory_positions import indexed_scores, rotate, slot_tables, unrotated

MEMORY_RULES = ("recall", "key_norm", "attention", "random", "oracle")
MAX_MEMORY_SLOTS = 4096
_COMPACT = ("cpu",)  # devices where a prefill block drops the tokens that cannot be held (_new_tokens)
_MASK32 = 0xFFFFFFFF
_HASH_MUL = 0x45D9F3B
_SCORE_TAPS: list = []  # diagnostics (score_tap): each called with every sequence's ranked scores


class Memory(NamedTuple):
    """The settings of the slot branch: M slots, the rule, the layer's seed'
    (docs/math.md §4.2: hash(seed) + layer index; rule "random" only) and
    `rotary`: None (the slots' keys keep their own positions) or a function
    from positions [N] (int64) to (cos, sin) [N, E], the rotate-half rotary
    tables of the model, which puts slot i at position num_sinks + i
    (memory_positions.py)."""

    slots: int
    rule: str = "key_norm"
    seed: int = 0
    rotary: object = None


class MemoryArgs(NamedTuple):
    """What the slot branch of one call needs besides its tensors."""

    memory: Memory
    window_size: int
    num_sinks: int
    scale: float
    softcap: float | None
    block: int  # queries per block of the scan


class MemoryState(NamedTuple):
    """The M held tokens per row and KV head, last and in position order
    (free slots first: zeros, score -inf; keys as the op received them),
    their scores as ranked (`coarse`), and the scores of the window buffer's
    tokens."""

    k: torch.Tensor  # [B, M, K, E] (work dtype)
    v: torch.Tensor  # [B, M, K, D]
    score: torch.Tensor  # [B, M, K] (work dtype)
    pos: torch.Tensor  # [B, M, K] int64: absolute position (real tokens before it)
    mask: torch.Tensor  # [B, M, K] bool: the slot holds a token
    pending: torch.Tensor  # [B, P, K] scores of the window buffer (-inf: no candidate)
    pending_pos: torch.Tensor  # [B, P] int64
    count: torch.Tensor  # [B] int64: real tokens seen


def check_memory(memory) -> None:
    if memory is None:
        return
    if not isinstance(memory, Memory):
        raise ValueError(f"memory: expected None or a Memory(slots, rule, seed), got {type(memory).__name__}")
    M = memory.slots
    if isinstance(M, bool) or not isinstance(M, int) or not 0 <= M <= MAX_MEMORY_SLOTS:
        raise ValueError(f"memory.slots: expected an integer in [0, {MAX_MEMORY_SLOTS}], got {M!r}")
    if memory.rule not in MEMORY_RULES:
        raise ValueError(f"memory.rule: expected one of {MEMORY_RULES}, got {memory.rule!r}")
    if isinstance(memory.seed, bool) or not isinstance(memory.seed, int) or memory.seed < 0:
        raise ValueError(f"memory.seed: expected an integer >= 0, got {memory.seed!r}")
    if memory.rotary is not None and not callable(memory.rotary):
        raise ValueError(f"memory.rotary: expected None or a function of positions, got {memory.rotary!r}")


def empty_memory_state(k, v, slots: int, window_size: int, work) -> MemoryState:
    B, K, M, P, dev = k.shape[0], k.shape[-2], slots, window_size - 1, k.device
    return MemoryState(
        k.new_zeros(B, M, K, k.shape[-1], dtype=work),
        v.new_zeros(B, M, K, v.shape[-1], dtype=work),
        torch.full((B, M, K), float("-inf"), dtype=work, device=dev),
        torch.zeros(B, M, K, dtype=torch.int64, device=dev),
        torch.zeros(B, M, K, dtype=torch.bool, device=dev),
        torch.full((B, P, K), float("-inf"), dtype=work, device=dev),
        torch.zeros(B, P, dtype=torch.int64, device=dev),
        torch.zeros(B, dtype=torch.int64, device=dev),
    )


def check_memory_state(state, B: int, k, v, memory, window_size: int, name: str) -> None:
    if memory is None or not memory.slots:
        if state is not None:
            raise ValueError(f"{name}: a MemoryState needs memory slots (got memory={memory!r})")
        return
    if not isinstance(state, MemoryState):
        got = type(state).__name__
        raise ValueError(f"{name}: memory slots need the MemoryState of a run with the same memory, got {got}")
    M, K, P = memory.slots, k.shape[-2], window_size - 1
    check_shape(f"{name}.k", state.k, (B, M, K, k.shape[-1]), "[B, slots, K, E]")
    check_shape(f"{name}.v", state.v, (B, M, K, v.shape[-1]), "[B, slots, K, D]")
    check_shape(f"{name}.score", state.score, (B, M, K), "[B, slots, K]")
    check_shape(f"{name}.pending", state.pending, (B, P, K), "[B, window_size - 1, K]")
    check_mask(f"{name}.mask", state.mask, (B, M, K))
    for field, shape in (("pos", (B, M, K)), ("pending_pos", (B, P)), ("count", (B,))):
        x = getattr(state, field)
        if not isinstance(x, torch.Tensor) or x.dtype != torch.int64 or tuple(x.shape) != shape:
            got = (x.dtype, tuple(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{name}.{field}: expected an int64 tensor of shape {shape}, got {got}")


@contextlib.contextmanager
def score_tap(fn):
    """Inside the block, every memory_sequence calls fn(r, pos) with the
    scores of its extended tokens as ranked (coarse; -inf: no candidate, or
    after the row's end) r [B, P + T, K] and their positions pos [B, P + T]
    (the window buffer's P tokens first): what a diagnostic ranks a token
    by (latte/eval/memory_coverage.py). Nothing else changes."""
    _SCORE_TAPS.append(fn)
    try:
        yield fn
    finally:
        _SCORE_TAPS.remove(fn)


def hash32(x: torch.Tensor) -> torch.Tensor:
    """The 32-bit integer mix of docs/math.md §4.2 on int64 tensors (every
    product stays below 2^59: no overflow)."""
    x = x & _MASK32
    x = (((x >> 16) ^ x) * _HASH_MUL) & _MASK32
    x = (((x >> 16) ^ x) * _HASH_MUL) & _MASK32
    return (x >> 16) ^ x


def _hash_int(x: int) -> int:
    """hash32 in Python integers."""
    x = x & _MASK32
    for _ in range(2):
        x = (((x >> 16) ^ x) * _HASH_MUL) & _MASK32
    return (x >> 16) ^ x


def layer_seed(seed: int, layer_index: int) -> int:
    """seed' = hash(seed) + layer index (docs/math.md §4.2), in Python integers."""
    return _hash_int(seed) + layer_index


def token_scores(memory: Memory, k, v, recall_y, pos, candidate) -> torch.Tensor:
    """The arrival scores r [B, T, K] of docs/math.md §4.2, -inf for a
    non-candidate; 0 for rule "attention" (its sum is added by the window).
    k [B, T, K, E], v [B, T, K, D]; recall_y [B, T, H, D] the latents read
    with the key-side weights softmax(b) after each token (rule "recall");
    pos [B, T] int64; candidate [B, T] bool (real, not a sink, marked)."""
    B, T, K = k.shape[:3]
    work = state_dtype(k.dtype)
    if memory.rule == "recall":
        H, D = recall_y.shape[-2:]
        err = v.to(work)[:, :, :, None] - recall_y.to(work).view(B, T, K, H // K, D)
        r = torch.linalg.vector_norm(err, dim=-1).mean(-1)
    elif memory.rule == "key_norm":
        r = torch.linalg.vector_norm(k.to(work), dim=-1)
    elif memory.rule == "random":
        # hash(seed') in Python (no host-to-device copy: a captured CUDA graph could not hold one)
        head = hash32(torch.arange(K, device=k.device) + _hash_int(memory.seed))
        r = hash32(head[None, None] + pos[:, :, None]).to(work) / 2.0**32
    else:  # "attention" (summed later) and "oracle" (the mark is the whole score)
        r = torch.full((B, T, K), 0.0 if memory.rule == "attention" else 1.0, dtype=work, device=k.device)
    return torch.where(candidate[:, :, None], r, float("-inf"))


@torch.no_grad()  # a score only ranks tokens (docs/math.md §4.2): no gradient
def window_received(q, kk, lse, real, window_size, scale, softcap, block: int = 64):
    """Attention each extended key received from the window's real queries,
    under the window's own normaliser, averaged over the query heads of its
    KV head: [B, P + T, K] (docs/math.md §4.2, rule "attention"). q [B, T,
    H, E], kk [B, P + T, K, E] (work dtype), lse [B, T, H] the window alone.
    Blocks of `block` keys: one product with the block's queries (the w
    that see each key), from which each key's band of w scores is taken:
    O(T (block + w)) scores at a time."""
    B, T, H, E = q.shape
    PT, K, W = kk.shape[1], kk.shape[2], window_size
    G, pad = H // K, (0, 0, 0, 0, W - 1, W)  # key j is seen by padded queries j .. j + w - 1
    qp = torch.nn.functional.pad(q.to(kk.dtype), pad).view(B, -1, K, G, E)
    lp = torch.nn.functional.pad(lse.to(kk.dtype), pad[2:]).view(B, -1, K, G)
    rp = torch.nn.functional.pad(real, (W - 1, W))
    band = torch.arange(block, device=q.device)[:, None] + torch.arange(W, device=q.device)  # [block, w]
    acc = []
    for j0 in range(0, PT, block):
        J = min(block, PT - j0)
        n = J + W - 1  # the queries that see keys j0 .. j0 + J - 1
        qb = qp[:, j0 : j0 + n].permute(0, 2, 1, 3, 4).reshape(B, K, n * G, E)
        s = torch.matmul(kk[:, j0 : j0 + J].transpose(1, 2), qb.transpose(-1, -2)).view(B, K, J, n, G)
        e = s.gather(3, band[:J].view(1, 1, J, W, 1).expand(B, K, J, W, G)).mul_(scale)  # [B, K, J, w, G]
        if softcap is not None:
            e = e.div_(softcap).tanh_().mul_(softcap)
        e.sub_(lp[:, j0 : j0 + n].unfold(1, W, 1).permute(0, 2, 1, 4, 3)).clamp_(min=exp_floor(e.dtype)).exp_()
        p = e.mean(-1) * rp[:, None, j0 : j0 + n].unfold(2, W, 1)  # [B, K, J, w]
        acc.append(p.sum(-1).transpose(1, 2))  # [B, J, K]
    return torch.cat(acc, 1)


def attend(q, ks, vs, keep, scale, softcap, tables=None, local=None):
    """Softmax of q [B, T, H, E] over per-head keys ks [B, K, C, E] where
    keep [B, K, T, C]: (y [B, T, H, D], lse [B, T, H]); y = 0 and lse = -inf
    where nothing is kept. tables: the slots' rotation (memory_positions.
    slot_tables; ks unrotated) or None. local: None, or the (y, lse) of the
    window and the sinks (lse finite), joined under the same softmax as one
    more key (sinks.merge in the same pass). Work dtype; no exp below the
    floor. Scores are laid out [B, K, T, G, C]: a block of queries is a
    contiguous [T * G] rows per KV head, one product with the keys."""
    B, T, H, E = q.shape
    K, C = ks.shape[1:3]
    G = H // K
    with no_autocast(q.device.type):
        if tables is None:
            qk = q.view(B, T, K, G, E).transpose(1, 2).reshape(B, K, T * G, E)
            s = torch.matmul(qk, ks.transpose(-1, -2)).view(B, K, T, G, C)
        else:
            s = indexed_scores(q.view(B, T, K, G, E), ks, keep, tables).transpose(2, 3)
        if scale != 1.0:
            s = s * scale
        if softcap is not None:
            s = torch.tanh(s / softcap) * softcap
        # masks by arithmetic on a float copy of keep: where() with a scalar and exp(-inf) are slow lanes on CPU
        kf = keep[:, :, :, None].to(s.dtype)  # [B, K, T, 1, C]
        m = (s.detach() + (kf - 1) * torch.finfo(s.dtype).max).amax(-1)  # [B, K, T, G]: the kept keys' max
        if local is None:
            some = keep[:, :, :, None].any(-1)
            m = torch.where(some, m, 0.0)
        else:
            lse_l = local[1].view(B, T, K, G).transpose(1, 2)
            m = torch.maximum(m, lse_l.detach())
        p = exp_floored(s - m.unsqueeze(-1)) * kf
        total = p.sum(-1)
        y = torch.matmul(p.reshape(B, K, T * G, C), vs).view(B, K, T, G, -1)
        if local is None:
            total = total + ~some
        else:
            w = exp_floored(lse_l - m)  # the local branch's weight
            total = total + w
            y = y + w.unsqueeze(-1) * local[0].view(B, T, K, G, -1).transpose(1, 2)
        y = (y / total.unsqueeze(-1)).transpose(1, 2)  # [B, T, K, G, D]
        lse = m + total.log()  # [B, K, T, G]
        if local is None:
            lse = torch.where(some, lse, float("-inf"))
    return y.reshape(B, T, H, -1), lse.transpose(1, 2).reshape(B, T, H)


def coarse(score: torch.Tensor) -> torch.Tensor:
    """Scores as they are ranked: rounded to bfloat16 (8 significant bits),
    so that the rounding noise of two float32 paths (a chunked prefill and
    the steps) almost never decides between two tokens whose exact scores
    are equal (the same token twice has the same key norm); such ties go to
    the older position (docs/math.md §4.2)."""
    return score.to(torch.bfloat16).to(score.dtype)


def _better(score, pos):
    """better[.., i, c]: key i ranks before key c (higher coarse score, ties
    to the older position); score, pos [B, K, C]."""
    score = coarse(score)
    si, sc = score[..., :, None], score[..., None, :]
    return (si > sc) | ((si == sc) & (pos[..., :, None] < pos[..., None, :]))


def _select(cand_k, cand_v, score, pos, slots: int, better=None):
    """The M best of C keys per row and KV head, in position order: cand_k
    [B, K, C, E], cand_v [B, K, C, D], score [B, K, C] (coarse; -inf: none),
    pos [B, K, C] -> (k [B, M, K, E], v, score, pos, mask [B, M, K]); a free
    slot's key, value and position are any candidate's. better: the held
    keys' _better [B, K, C, C] when the caller has it."""
    held = score > float("-inf")
    better = _better(score, pos) & held[..., :, None] if better is None else better
    rank = better.sum(-2)  # better held keys than c
    keep = held & (rank < slots)
    C = pos.shape[-1]  # the held tokens last (free slots first), in position order
    order = torch.where(keep, pos, torch.iinfo(torch.int64).min).argsort(dim=-1, stable=True)[..., C - slots :]

    def take(x):  # [B, K, C, *F] -> [B, M, K, *F]
        idx = order.view(*order.shape, *([1] * (x.dim() - 3))).expand(*order.shape, *x.shape[3:])
        return x.gather(2, idx).transpose(1, 2)

    mask = take(keep)  # a free slot scores -inf (its key, value and position: _canonical)
    return take(cand_k), take(cand_v), take(score).masked_fill(~mask, float("-inf")), take(pos), mask


def _canonical(k, v, score, pos, mask):
    """Held tokens with zeros in the free slots: one state for one selection."""
    return k * mask[..., None], v * mask[..., None], score, pos * mask, mask


def _insert(state, k_c, v_c, r_c, p_c):
    """_select of the M held tokens and one newer candidate, in O(M): the
    candidate (k_c [B, K, E], v_c, r_c [B, K], p_c [B]) displaces the worst
    slot (the lowest score, the newest of equal ones: the last free slot
    while one is free, as free slots score -inf and come first) if it scores
    higher, the later slots moving down one and the candidate taking the
    last, so that the held tokens stay last in arrival order. The held
    scores are kept as ranked (`coarse`): only the candidate's is rounded.
    Keys, values and scores move in one row gather, positions in another
    (index_select of flat rows: a gather with an expanded index is several
    times slower on CPU); a slot holds a token exactly when its score is
    above -inf."""
    score = state.score  # [B, M, K]
    B, M, K = score.shape
    E, dev = state.k.shape[-1], score.device
    i = torch.arange(M, device=dev)[None, :, None]  # [1, M, 1]
    r_c = coarse(r_c)  # [B, K]
    low = score.amin(1, keepdim=True)
    worst = torch.where(score == low, i, -1).amax(1, keepdim=True)
    src = i + ((i >= worst) & (r_c[:, None] > low))  # from [held, c]: a non-candidate (-inf) displaces none
    row = ((torch.arange(B, device=dev)[:, None, None] * (M + 1) + src) * K + torch.arange(K, device=dev)).view(-1)
    c = torch.cat([k_c, v_c, r_c[..., None]], -1)[:, None]  # [B, 1, K, E + D + 1]
    both = torch.cat([torch.cat([state.k, state.v, score[..., None]], -1), c], 1)
    moved = both.view(B * (M + 1) * K, -1).index_select(0, row).view(B, M, K, -1)
    pos = torch.cat([state.pos, p_c[:, None, None].expand(-1, 1, K)], 1).view(-1).index_select(0, row).view(B, M, K)
    new_score = moved[..., -1]
    return moved[..., :E], moved[..., E:-1], new_score, pos, new_score > float("-inf")


def _new_tokens(mem, kx, vx, rx, px, t0, t1):
    """The extended tokens j in [t0, t1) per KV head, in position order: (k
    [B, K, N, E], v, score [B, K, N] (coarse), pos [B, K, N], entry [B, K, N]
    = j + 1, the query it enters at). On a device in _COMPACT (one host sync
    per block) only those that beat the worst held token (mem's scores,
    coarse, -inf while a slot is free) are kept: the others can never be
    held (the held only get better, and a tie goes to the older), and the
    rest pad each head to the longest with non-candidates."""
    K = kx.shape[2]
    k, v, r = (x[:, t0:t1].transpose(1, 2) for x in (kx, vx, rx))  # [B, K, Q(, E)]
    pos = px[:, None, t0:t1].expand(-1, K, -1)
    entry = torch.arange(t0 + 1, t1 + 1, device=kx.device).expand_as(pos)
    if kx.device.type not in _COMPACT:
        return k, v, r, pos, entry
    useful = r > mem[2].amin(1)[..., None]  # [B, K, Q]
    n = int(useful.sum(-1).amax())
    if n == t1 - t0:
        return k, v, r, pos, entry
    idx = torch.argsort((~useful).to(torch.uint8), dim=-1, stable=True)[..., :n]  # [B, K, N]

    def take(x):
        return x.gather(2, idx.view(*idx.shape, *([1] * (x.dim() - 3))).expand(*idx.shape, *x.shape[3:]))

    pad = ~useful.gather(2, idx)  # a padding column never arrives: the arrived stay a prefix
    r, entry = take(r).masked_fill(pad, float("-inf")), take(entry).masked_fill(pad, t1 + 1)
    return take(k), take(v), r, pos.gather(2, idx), entry


def _block(mem, kx, vx, rx, px, t0, t1, memory_q, cfg, tables, local=None):
    """Queries [t0, t1) of a sequence against the held tokens `mem` (k, v,
    score, pos, mask of a MemoryState) and the extended tokens j in [t0, t1),
    which enter at query j + 1: (y, lse [B, t1 - t0, H(, D)], the held tokens
    after query t1 - 1, i.e. once j = t1 - 1 has entered too). local: None or
    the window and sinks' (y, lse) of these queries, joined (attend)."""
    k_n, v_n, r_n, p_n, e_n = _new_tokens(mem, kx, vx, rx, px, t0, t1)
    ks = torch.cat([mem[0].transpose(1, 2), k_n], 2)  # [B, K, C, E]
    vs = torch.cat([mem[1].transpose(1, 2), v_n], 2)
    score = torch.cat([mem[2].transpose(1, 2), r_n], 2)  # [B, K, C]
    pos = torch.cat([mem[3].transpose(1, 2), p_n], 2)
    M, slots = mem[0].shape[1], cfg.memory.slots
    arrived = e_n[:, :, None, :] <= torch.arange(t0, t1, device=kx.device)[:, None]  # [B, K, Q, N]
    held = score > float("-inf")  # [B, K, C]
    better = _better(score, pos) & held[..., :, None]  # [B, K, i, c]
    # better entered keys: query t0 + q sees the M held and a prefix of the new ones (arrived)
    seen = M - 1 + arrived.sum(-1, keepdim=True)  # [B, K, Q, 1]: the last key it sees
    ahead = better.cumsum(-2).gather(2, seen.expand(-1, -1, -1, score.shape[-1]))  # [B, K, Q, C]
    keep = held[:, :, None] & (ahead < slots)
    keep[..., M:] &= arrived
    part = None if local is None else (local[0][:, t0:t1], local[1][:, t0:t1])
    y, lse = attend(memory_q[:, t0:t1], ks, vs, keep, cfg.scale, cfg.softcap, tables, part)
    return y, lse, _select(ks, vs, score, pos, slots, better)


def _extended(k, v, scores, state, pos, window_state, work):
    """The window buffer's P tokens followed by the new ones: keys, values,
    scores and positions [B, P + T, ...]. A buffer that holds fewer than P
    positions (none yet, or a window state that grows to P) is padded in
    front with empty ones, whose pending scores are -inf."""
    P = state.pending.shape[1]
    kx, vx = k.to(work), v.to(work)
    if window_state is not None:
        kx, vx = torch.cat([window_state.k.to(work), kx], 1), torch.cat([window_state.v.to(work), vx], 1)
    front = P + k.shape[1] - kx.shape[1]
    if front:
        kx = torch.nn.functional.pad(kx, (0, 0, 0, 0, front, 0))
        vx = torch.nn.functional.pad(vx, (0, 0, 0, 0, front, 0))
    return kx, vx, torch.cat([state.pending, scores], 1), torch.cat([state.pending_pos, pos], 1)


def memory_sequence(q, k, v, memory_q, lse_window, recall_y, mark, mask, window_state, state, lengths, cfg, local=None):
    """The slot branch over a sequence (docs/math.md §4.2), in the work dtype:
    (y [B, T, H, D], lse [B, T, H], MemoryState after each row's end).

    q [B, T, H, E] (the window's queries, for rule "attention"), k, v [B, T,
    K, E|D]; memory_q [B, T, H, E] the queries that score the slots; lse_window
    [B, T, H] the window alone; recall_y: see token_scores; mark [B, T] bool
    (rule "oracle") or None; mask [B, T] or None; window_state: the window
    buffer before the sequence (None: empty); state: the MemoryState so far
    (None: empty); lengths [B] each row's end (default T); cfg: MemoryArgs;
    local: None, or the (y, lse) of the window and the sinks, which the slots
    then join under one softmax (returning the merged pair)."""
    B, T = q.shape[:2]
    memory, W, dev = cfg.memory, cfg.window_size, q.device
    work = state_dtype(q.dtype)
    state = state if state is not None else empty_memory_state(k, v, memory.slots, W, work)
    real = mask if mask is not None else torch.ones(B, T, dtype=torch.bool, device=dev)
    rank = state.count[:, None] + real.cumsum(1) - 1  # [B, T] absolute positions
    candidate = real & (rank >= cfg.num_sinks)
    if memory.rule == "oracle":
        candidate = candidate & (mark if mark is not None else torch.zeros_like(real))
    r = token_scores(memory, k, v, recall_y, rank, candidate)
    kx, vx, rx, px = _extended(k, v, r, state, rank, window_state, work)
    end = torch.full((B,), T, device=dev) if lengths is None else lengths.to(dev)
    if memory.rule == "attention":
        real_q = real & (torch.arange(T, device=dev)[None] < end[:, None])
        rx = rx + window_received(q, kx, lse_window, real_q, W, cfg.scale, cfg.softcap)
    if cfg.memory.rotary is not None:  # the slots keep their keys unrotated (memory_positions)
        kx = unrotated(cfg.memory.rotary, kx, px)
    return _scan(state, kx, vx, rx, px, memory_q, end, cfg, real, local)


def _scan(state, kx, vx, rx, px, memory_q, end, cfg, real, local=None):
    """The block scan of memory_sequence, then the state at each row's end."""
    B, T = memory_q.shape[:2]
    P, dev = cfg.window_size - 1, kx.device
    j = torch.arange(P + T, device=dev)
    late = (j[None, :] >= end[:, None])[..., None]  # enters after the row's end (packed rows)
    mem, ys, lses, rs = tuple(state[:4]), [], [], coarse(rx.masked_fill(late, float("-inf")))
    for tap in _SCORE_TAPS:
        tap(rs, px)
    tables = None if cfg.memory.rotary is None else slot_tables(cfg.memory.rotary, cfg.num_sinks, cfg.memory.slots, kx)
    cfg, memory_q = cfg._replace(scale=1.0), memory_q * cfg.scale  # scaled once, not per block
    for t0 in range(0, T, cfg.block):
        t1 = min(T, t0 + cfg.block)
        y, lse, mem = _block(mem, kx, vx, rs, px, t0, t1, memory_q, cfg, tables, local)
        ys.append(y)
        lses.append(lse)
    idx = end[:, None] + torch.arange(P, device=dev)[None]  # [B, P]: the buffer at each row's end
    pending = rx.gather(1, idx[..., None].expand(B, P, rx.shape[-1]))
    new = MemoryState(*_canonical(*mem), pending, px.gather(1, idx), state.count + real.sum(1))
    return torch.cat(ys, 1), torch.cat(lses, 1), new


def memory_step(
    q_t, k_t, v_t, memory_q_t, lse_window_t, recall_y_t, mark_t, mask_t, window_state, state, cfg, local=None
):
    """One decoding step of the slot branch: (y_t [B, H, D], lse_t [B, H],
    MemoryState). The query reads the held tokens; then the token that leaves
    the window (the buffer's oldest) competes for a slot. Arguments as
    memory_sequence's, for one token (window_state: the buffer before it);
    local: None, or the (y_t, lse_t) of the window and the sinks, which the
    read then joins under one softmax (returning the merged pair)."""
    memory, W = cfg.memory, cfg.window_size
    work = state_dtype(q_t.dtype)
    state = state if state is not None else empty_memory_state(k_t, v_t, memory.slots, W, work)
    if local is None:
        y, lse = _read_step(memory_q_t.to(work), state, cfg)
    else:
        y, lse = _read_merge_step(memory_q_t.to(work), state, cfg, local)
    rank = state.count[:, None]  # [B, 1]
    candidate = rank >= cfg.num_sinks if mask_t is None else mask_t[:, None] & (rank >= cfg.num_sinks)
    if memory.rule == "oracle":
        candidate = candidate & (mark_t[:, None] if mark_t is not None else torch.zeros_like(candidate))
    r = token_scores(
        memory, k_t[:, None], v_t[:, None], None if recall_y_t is None else recall_y_t[:, None], rank, candidate
    )
    rx, px = torch.cat([state.pending, r], 1), torch.cat([state.pending_pos, rank], 1)  # [B, P + 1(, K)]
    if memory.rule == "attention":
        kx = _extended(k_t[:, None], v_t[:, None], r, state, rank, window_state, work)[0]
        rx = rx + _received_step(q_t, kx, lse_window_t, mask_t, cfg.scale, cfg.softcap)
    k_c, v_c = _leaving(k_t, v_t, window_state, W - 1)
    if cfg.memory.rotary is not None:
        k_c = unrotated(cfg.memory.rotary, k_c[:, None].to(work), px[:, :1])[:, 0]
    held = _insert(state, k_c.to(work), v_c.to(work), rx[:, 0], px[:, 0])
    new = MemoryState(*held, rx[:, 1:], px[:, 1:], state.count + (1 if mask_t is None else mask_t.long()))
    return y, lse, new


def _slot_scores(q_t, state, cfg):
    """Scores [B, K, G, M] of one query q_t [B, H, E] (work dtype) against
    the held tokens, -inf at a free slot. At fixed rotary positions held key
    c sits at the slot of its index among the held (indexed_scores)."""
    B, H, E = q_t.shape
    ks, keep = state.k.transpose(1, 2), state.mask.transpose(1, 2)[:, :, None]  # [B, K, M, E], [B, K, 1, M]
    K, M = ks.shape[1], ks.shape[2]
    if cfg.memory.rotary is not None:
        cos, sin = slot_tables(cfg.memory.rotary, cfg.num_sinks, M, ks)
        idx = (keep[:, :, 0].long().cumsum(-1) - 1).clamp(0, M - 1)  # [B, K, M]
        ks = rotate(ks, cos[idx], sin[idx])
    s = torch.matmul(q_t.view(B, K, H // K, E), ks.transpose(-1, -2)) * cfg.scale
    if cfg.softcap is not None:
        s = torch.tanh(s / cfg.softcap) * cfg.softcap
    return torch.where(keep, s, float("-inf"))


def _read_step(q_t, state, cfg):
    """attend() for one query q_t [B, H, E] over the held tokens, in O(M):
    (y [B, H, D], lse [B, H]); y = 0 and lse = -inf while no slot is held."""
    B, H = q_t.shape[:2]
    with no_autocast(q_t.device.type):
        s = _slot_scores(q_t, state, cfg)  # [B, K, G, M]
        lse = torch.logsumexp(s, -1, keepdim=True)
        p = torch.exp(s - lse.clamp(min=torch.finfo(s.dtype).min))  # 0 where nothing is held
        y = torch.matmul(p, state.v.transpose(1, 2))  # [B, K, G, D]
    return y.reshape(B, H, -1), lse.reshape(B, H)


def _read_merge_step(q_t, state, cfg, local):
    """The local branch's (y [B, H, D], lse [B, H]) (the window and the
    sinks, lse finite) joined by the held tokens under one softmax, the
    local branch a column of its own: the read and sinks.merge in one."""
    B, H = q_t.shape[:2]
    y_l, lse_l = local
    with no_autocast(q_t.device.type):
        s = _slot_scores(q_t, state, cfg)  # [B, K, G, M]
        s = torch.cat([lse_l.to(s.dtype).view(*s.shape[:3], 1), s], -1)
        lse = torch.logsumexp(s, -1, keepdim=True)
        p = torch.exp(s - lse)  # 1 + M weights: few, so no exp floor
        y = torch.matmul(p[..., 1:], state.v.transpose(1, 2)) + p[..., :1] * y_l.view(*s.shape[:3], -1)
    return y.reshape(B, H, -1), lse.reshape(B, H)


def _leaving(k_t, v_t, window_state, P):
    """Key and value [B, K, E|D] of the token that leaves the window after
    this step: the buffer's oldest (this token itself for a window of one);
    zeros when the buffer holds fewer than P positions (nothing leaves, and
    its pending score is -inf)."""
    if P == 0:
        return k_t, v_t
    if window_state is None or window_state.k.shape[1] < P:
        return torch.zeros_like(k_t), torch.zeros_like(v_t)
    return window_state.k[:, 0], window_state.v[:, 0]


def _received_step(q_t, kx, lse_t, real, scale, softcap):
    """window_received for one query, which sees the whole extended window:
    [B, P + 1, K]; real [B] or None (a real token)."""
    B, H, E = q_t.shape
    K = kx.shape[2]
    e = torch.einsum("bkge,bjke->bjkg", q_t.to(kx.dtype).view(B, K, H // K, E), kx) * scale
    if softcap is not None:
        e = torch.tanh(e / softcap) * softcap
    p = exp_floored(e - lse_t.to(kx.dtype).view(B, 1, K, H // K))
    return p.mean(-1) if real is None else (p * real[:, None, None, None]).mean(-1)
