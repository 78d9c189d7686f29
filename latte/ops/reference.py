"""Slow float64 ground truth for every op: O(T^2) matrices and plain loops,
written for clarity, not speed. Each one builds the attention matrix the
mathematics defines (docs/math.md) and shares no code with the fast paths.

Legend: B batch, T time, H heads, L latents per head, D value width,
K key/value heads, E query/key width. All functions return float64.
"""

from __future__ import annotations

import torch

f64 = torch.float64
EPS = 1e-6  # must equal latte.ops.linear_attention.EPS (checked by its tests)
NEG_INF = float("-inf")


def latte_bidirectional_matrix(a, b, mask=None):
    """A[b, h, t, s] = sum_l p(l|t) p(s|l) (docs/math.md §2)."""
    a, b = a.to(f64), b.to(f64)
    if mask is not None:
        b = b.masked_fill(~mask[:, :, None, None], NEG_INF)
    p_l = torch.softmax(a, -1)  # [B, T, H, L]
    p_s = torch.softmax(b, 1)  # [B, T(s), H, L]
    return torch.einsum("bthl,bshl->bhts", p_l, p_s)


def latte_bidirectional(a, b, v, mask=None):
    return torch.einsum("bhts,bshd->bthd", latte_bidirectional_matrix(a, b, mask), v.to(f64))


def _causal_log_weights(b, z0=None, mask=None):
    """log p(s|l,t) as [B, H, L, T(t), T(s)] (+ the initial state's column)."""
    b = b.to(f64)
    if mask is not None:
        b = b.masked_fill(~mask[:, :, None, None], NEG_INF)
    B, T, H, L = b.shape
    logits = b.permute(0, 2, 3, 1)[..., None, :].expand(B, H, L, T, T)  # [.., t, s]
    future = torch.ones(T, T, dtype=torch.bool, device=b.device).triu(1)
    logits = logits.masked_fill(future, NEG_INF)
    if z0 is not None:  # the initial state acts as one earlier pseudo-token
        init = z0.to(f64)[..., None, None].expand(B, H, L, T, 1)
        logits = torch.cat([init, logits], -1)
    return logits - torch.logsumexp(logits, -1, keepdim=True)


def latte_causal_matrix(a, b, mask=None):
    """A[b, h, t, s] = sum_l p(l|t) p(s|l,t): every row a probability vector."""
    logp = _causal_log_weights(b, mask=mask)
    p_l = torch.softmax(a.to(f64), -1).permute(0, 2, 3, 1)  # [B, H, L, T]
    return torch.einsum("bhlt,bhlts->bhts", p_l, logp.exp())


def latte_causal(a, b, v, initial_state=None, mask=None):
    """Returns (y [B, T, H, D], (S, z) after the last token)."""
    B, T, H, L = a.shape
    z0 = initial_state[1] if initial_state is not None else None
    w = _causal_log_weights(b, z0, mask).exp()  # [B, H, L, T, (1 +) T]
    vals = v.to(f64).permute(0, 2, 1, 3)[:, :, None].expand(B, H, L, T, v.shape[-1])
    if initial_state is not None:
        vals = torch.cat([initial_state[0].to(f64)[:, :, :, None], vals], 3)
    vbar = torch.einsum("bhlts,bhlsd->bhltd", w, vals)  # Vbar_{t,l}
    p_l = torch.softmax(a.to(f64), -1)  # [B, T, H, L]
    y = torch.einsum("bthl,bhltd->bthd", p_l, vbar)
    bb = b.to(f64)
    if mask is not None:
        bb = bb.masked_fill(~mask[:, :, None, None], NEG_INF)
    z = torch.logsumexp(bb, 1)  # [B, H, L]
    if z0 is not None:
        z = torch.logaddexp(z, z0.to(f64))
    return y, (vbar[:, :, :, -1], z)


def window_matrix_logits(q, k, window_size, scale=None, mask=None, softcap=None, num_sinks=0, sink_q=None):
    """Scores e[b, h, t, s] over the window (t - W, t] and, with num_sinks,
    the row's first num_sinks real tokens s <= t (docs/math.md §4.1); -inf
    elsewhere (soft-capped to c * tanh(e / c) when softcap = c is given).
    sink_q: the queries that score a sink outside the window (default q)."""
    B, T, H, E = q.shape
    kk = k.to(f64).repeat_interleave(H // k.shape[2], 2)
    scale = E**-0.5 if scale is None else scale

    def scores(qq):
        e = torch.einsum("bthe,bshe->bhts", qq.to(f64), kk) * scale
        return e if softcap is None else softcap * torch.tanh(e / softcap)

    e = scores(q)
    t = torch.arange(T, device=q.device)[:, None]
    s = torch.arange(T, device=q.device)[None, :]
    allowed = (s <= t) & (s > t - window_size)
    real = torch.ones(B, T, dtype=torch.bool, device=q.device) if mask is None else mask
    sink = real & (real.cumsum(1) <= num_sinks)  # [B, T(s)]: the first num_sinks real tokens
    if sink_q is not None:  # a sink outside the window is scored by sink_q
        outside = sink[:, None, None, :] & (s <= t - window_size)[None, None]
        e = torch.where(outside, scores(sink_q), e)
    allowed = (allowed[None, None] | (sink[:, None, None, :] & (s <= t))) & real[:, None, None, :]
    allowed = allowed | (s == t)  # a query always sees its own key
    return e.masked_fill(~allowed, NEG_INF)


def sliding_window_attention(q, k, v, window_size, scale=None, mask=None, softcap=None, num_sinks=0, sink_q=None):
    """Returns (y [B, T, H, D], lse [B, T, H])."""
    e = window_matrix_logits(q, k, window_size, scale, mask, softcap, num_sinks, sink_q)
    vv = v.to(f64).repeat_interleave(q.shape[2] // v.shape[2], 2)
    lse = torch.logsumexp(e, -1)  # [B, H, T]
    y = torch.einsum("bhts,bshd->bthd", torch.softmax(e, -1), vv)
    return y, lse.transpose(1, 2)


def macchiato_matrix(
    a,
    b,
    q,
    k,
    window_size,
    mix="joint",
    gate=None,
    beta=None,
    scale=None,
    mask=None,
    softcap=None,
    num_sinks=0,
    sink_q=None,
):
    """p(s|t) of docs/math.md §4 built term by term: [B, H, T, T]."""
    e = window_matrix_logits(q, k, window_size, scale, mask, softcap, num_sinks, sink_q)  # [B, H, T, T]
    return _macchiato_from_logits(e, a, b, mix, gate, beta, mask)


def _macchiato_from_logits(e, a, b, mix, gate, beta, mask):
    """p(s|t) given the local branch's scores e [B, H, T, T] (-inf: unseen)."""
    a64 = a.to(f64) + (0 if beta is None else beta.to(f64)[None, None, :, None])
    log_lat = a64.permute(0, 2, 1, 3)  # [B, H, T, L] log of unnormalised p(l|t)
    # log of the window state's unnormalised mass: its scores (joint) or the gate logit
    if mix == "joint":
        log_win = torch.logsumexp(e, -1, keepdim=True)  # [B, H, T, 1]
    else:
        log_win = gate.to(f64).permute(0, 2, 1)[..., None]
    p_win_rows = torch.softmax(e, -1)  # p(s | t, l = 0)
    log_z = torch.logsumexp(torch.cat([log_win, log_lat], -1), -1, keepdim=True)
    p_l = torch.exp(log_lat - log_z)  # [B, H, T, L]
    p_s_given_l = _causal_log_weights(b, mask=mask).exp()  # [B, H, L, T, T]
    lat = torch.einsum("bhtl,bhlts->bhts", p_l, p_s_given_l)
    return torch.exp(log_win - log_z) * p_win_rows + lat


def macchiato(a, b, v, q, k, window_size, *args, **kw):
    """y [B, T, H, D] = p(s|t) v; the other arguments as macchiato_matrix's."""
    A = macchiato_matrix(a, b, q, k, window_size, *args, **kw)
    vv = v.to(f64).repeat_interleave(q.shape[2] // v.shape[2], 2)
    return torch.einsum("bhts,bshd->bthd", A, vv)


def _hash32(x: int) -> int:
    """The 32-bit integer mix of docs/math.md §4.2, on Python integers."""
    x &= 0xFFFFFFFF
    x = (((x >> 16) ^ x) * 0x45D9F3B) & 0xFFFFFFFF
    x = (((x >> 16) ^ x) * 0x45D9F3B) & 0xFFFFFFFF
    return (x >> 16) ^ x


def memory_scores(rule, q, k, v, b, window_size, scale=None, mask=None, softcap=None, num_sinks=0, seed=0, mark=None):
    """The scores r [B, T, K] of docs/math.md §4.2, -inf for a token that is
    no candidate (padding, a sink, or unmarked under rule "oracle"); seed:
    the layer's seed' (rule "random"); mark [B, T] bool (rule "oracle")."""
    B, T, H, _ = q.shape
    K = k.shape[2]
    real = torch.ones(B, T, dtype=torch.bool, device=q.device) if mask is None else mask
    pos = real.long().cumsum(1) - 1  # real tokens before each one
    if rule == "recall":
        vv = v.to(f64).repeat_interleave(H // K, 2)
        y, _ = latte_causal(b, b, vv, mask=mask)  # softmax(b_s) read against Vbar_s
        r = (vv - y).norm(dim=-1).view(B, T, K, H // K).mean(-1)
    elif rule == "key_norm":
        r = k.to(f64).norm(dim=-1)
    elif rule == "attention":
        p = torch.softmax(window_matrix_logits(q, k, window_size, scale, mask, softcap), -1)  # [B, H, T, T]
        p = p * real[:, None, :, None]  # real queries only
        r = p.sum(2).view(B, K, H // K, T).mean(2).transpose(1, 2)
    elif rule == "random":
        r = torch.tensor(
            [
                [[_hash32(_hash32(_hash32(seed) + h) + int(pos[i, t])) / 2.0**32 for h in range(K)] for t in range(T)]
                for i in range(B)
            ],
            dtype=f64,
        )
    else:  # oracle
        r = torch.ones(B, T, K, dtype=f64)
    cand = real & (pos >= num_sinks) & (mark if rule == "oracle" else True)
    return torch.where(cand[:, :, None], r.to(f64), NEG_INF)


def memory_held(r, window_size, slots):
    """held [B, K, T(query), T(key)]: the M = slots best candidates s <= t - w,
    by score rounded to bfloat16, ties to the older position, at every query
    t, one by one."""
    B, T, K = r.shape
    held = torch.zeros(B, K, T, T, dtype=torch.bool)
    for i in range(B if slots else 0):  # no slots: nothing held
        for h in range(K):
            finite = (r[i, :, h] > NEG_INF).tolist()
            rank = r[i, :, h].detach().to(torch.bfloat16).to(f64).tolist()  # scores as ranked: bfloat16
            for t in range(T):
                cands = [s for s in range(t - window_size + 1) if finite[s]]
                best = sorted(cands, key=lambda s: (-rank[s], s))[:slots]
                held[i, h, t, best] = True
    return held


def _rope(x, cos, sin):
    """Llama's rotate-half rotation of x by (cos, sin), float64."""
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


def _slot_logits(mq, k, held, rotary, num_sinks, scale, softcap):
    """memory_q_t . (key s rotated back from its position, then to the
    position num_sinks + i of its slot i at query t) where held [B, H, T, T]
    is True, -inf elsewhere: [B, H, T, T]. Built at the held (t, s) only:
    at most M per query, not T x T rotated keys."""
    B, T, H, E = mq.shape
    kk = k.to(f64).repeat_interleave(H // k.shape[2], 2)  # [B, T(s), H, E]
    c, s_ = (x.to(f64) for x in rotary(torch.arange(T)))  # position p_s = s for every row (no padding here)
    raw = _rope(kk, c[None, :, None], -s_[None, :, None])  # rotated back by its own position
    slot = held.long().cumsum(-1) - 1 + num_sinks  # [B, H, T, T(s)]: n + its index among the held
    bi, hi, ti, si = held.nonzero(as_tuple=True)
    cs, ss = (x.to(f64) for x in rotary(slot[bi, hi, ti, si]))  # [N, E]
    keys = _rope(raw[bi, si, hi], cs, ss)  # [N, E]
    e = (mq.to(f64)[bi, ti, hi] * keys).sum(-1) * (E**-0.5 if scale is None else scale)
    e = e if softcap is None else softcap * torch.tanh(e / softcap)
    return torch.full(held.shape, NEG_INF, dtype=f64, device=mq.device).index_put((bi, hi, ti, si), e)


def memory_local_logits(b, v, q, k, window_size, *, slots, rule, seed=0, mark=None, memory_q=None, rotary=None, **kw):
    """(e, held) [B, H, T, T]: the local branch's scores of macchiato_memory
    (window, sinks and, where held, the slots'; -inf elsewhere) and the
    tokens the slots hold at each query; its arguments as
    macchiato_memory's (kw: macchiato_matrix's keywords, a and the mix's
    aside)."""
    mask, scale, softcap = kw.get("mask"), kw.get("scale"), kw.get("softcap")
    r = memory_scores(rule, q, k, v, b, window_size, scale, mask, softcap, kw.get("num_sinks", 0), seed, mark)
    held = memory_held(r, window_size, slots).repeat_interleave(q.shape[2] // k.shape[2], 1)  # [B, H, T, T]
    e = window_matrix_logits(q, k, window_size, scale, mask, softcap, kw.get("num_sinks", 0), kw.get("sink_q"))
    mq = q if memory_q is None else memory_q
    if rotary is None:
        e_mem = window_matrix_logits(mq, k, q.shape[1], scale, None, softcap)
    else:
        e_mem = _slot_logits(mq, k, held, rotary, kw.get("num_sinks", 0), scale, softcap)
    return torch.where(held, e_mem, e), held  # held tokens are outside the window and the sinks: disjoint


SHARES = ("window", "sinks", "slots", "latents")  # the parts of macchiato_memory_shares, in its order


def macchiato_memory_shares(a, b, v, q, k, window_size, *, slots, rule, **kw):
    """[B, H, T, 4]: the share of query t's joint normaliser Z_t (docs/math.md
    §4, §4.1, §4.2) on its window W(t), on the sinks outside it, on the
    tokens the slots hold and on the latents (SHARES), each row summing to
    1; under mix "gate" the local part's mass is the gate's. Arguments as
    macchiato_memory's (slots = 0: no slots, the model without memory)."""
    e, held = memory_local_logits(b, v, q, k, window_size, slots=slots, rule=rule, **kw)
    mix, gate, beta = kw.get("mix", "joint"), kw.get("gate"), kw.get("beta")
    log_lat = torch.logsumexp(a.to(f64) + (0 if beta is None else beta.to(f64)[None, None, :, None]), -1)
    log_lat = log_lat.permute(0, 2, 1)  # [B, H, T]
    log_loc = torch.logsumexp(e, -1) if mix == "joint" else gate.to(f64).permute(0, 2, 1)
    log_z = torch.logaddexp(log_loc, log_lat)
    T = q.shape[1]
    t = torch.arange(T, device=q.device)[:, None]
    s = torch.arange(T, device=q.device)[None, :]
    in_window = ((s <= t) & (s > t - window_size)) | (s == t)  # [T, T]: W(t), the query's own key included
    p_loc = torch.softmax(e, -1) * torch.exp(log_loc - log_z)[..., None]  # [B, H, T, T]
    window = (p_loc * in_window).sum(-1)
    slot = (p_loc * held).sum(-1)
    sinks = (p_loc * (~in_window & ~held)).sum(-1)  # seen outside the window and not held: a sink
    return torch.stack([window, sinks, slot, torch.exp(log_lat - log_z)], -1)


def macchiato_memory(a, b, v, q, k, window_size, *, slots, rule, seed=0, mark=None, memory_q=None, rotary=None, **kw):
    """y [B, T, H, D] of Macchiato with memory slots (docs/math.md §4.2): the
    local scores of macchiato_matrix (its keyword arguments in kw) plus, at
    the tokens the slots hold, q . k (memory_q . k with memory_q) under the
    one softmax; with rotary (positions -> (cos, sin)), each held key rotated
    back from its position and to its slot's, num_sinks + its index among the
    held (no padding: positions are the time indices)."""
    e, _ = memory_local_logits(
        b, v, q, k, window_size, slots=slots, rule=rule, seed=seed, mark=mark, memory_q=memory_q, rotary=rotary, **kw
    )
    A = _macchiato_from_logits(e, a, b, kw.get("mix", "joint"), kw.get("gate"), kw.get("beta"), kw.get("mask"))
    vv = v.to(f64).repeat_interleave(q.shape[2] // v.shape[2], 2)
    return torch.einsum("bhts,bshd->bthd", A, vv)


def linear_recurrence(x, log_a, initial_state=None):
    """h_t = exp(log_a_t) h_{t-1} + x_t, one step at a time."""
    x, a = x.to(f64), log_a.to(f64).exp()
    h = torch.zeros_like(x[:, 0]) if initial_state is None else initial_state.to(f64)
    out = []
    for t in range(x.shape[1]):
        h = a[:, t] * h + x[:, t]
        out.append(h)
    return torch.stack(out, 1), h


def linear_attention(q, k, v, *, causal=True, initial_state=None, mask=None):
    """y_t = (q_t S_t) / (q_t . z_t + eps) with the T x T matrix A = q k^T
    built explicitly, in float64. Returns (y [B,T,H,D], (S, z) after the last token)."""
    q, k, v = q.to(f64), k.to(f64), v.to(f64)
    if mask is not None:
        k = k * mask[:, :, None, None]
    T = q.shape[1]
    A = torch.einsum("bthe,bshe->bhts", q, k)  # [B, H, T, T]
    if causal:
        A = A * torch.ones(T, T, dtype=f64, device=A.device).tril()
    num = torch.einsum("bhts,bshd->bthd", A, v)
    den = A.sum(-1).transpose(1, 2)  # [B, T, H]
    S = torch.einsum("bthe,bthd->bhed", k, v)
    z = k.sum(1)
    if initial_state is not None:
        S0, z0 = initial_state[0].to(f64), initial_state[1].to(f64)
        num = num + torch.einsum("bthe,bhed->bthd", q, S0)
        den = den + torch.einsum("bthe,bhe->bth", q, z0)
        S, z = S + S0, z + z0
    return num / (den.unsqueeze(-1) + EPS), (S, z)


def linear_cross_entropy(hidden, weight, targets, ignore_index=-100):
    """Summed cross-entropy of the full logits hidden @ weight.T (float64)."""
    logits = hidden.to(f64) @ weight.to(f64).t()  # [N, V]
    return torch.nn.functional.cross_entropy(logits, targets.long(), ignore_index=ignore_index, reduction="sum")
