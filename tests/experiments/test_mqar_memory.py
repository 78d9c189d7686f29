"""`python -m experiments.mqar --memory`: the slots' state bytes, Latte at
the same state, training with the slots in place, and the quick run."""

import json

import pytest
import torch

from experiments.mqar import memory as X
from experiments.mqar import study as MS
from experiments.mqar import sweep as M
from latte.models import LatteConfig, LatteForCausalLM


def _bytes(state, floating: bool) -> int:
    """Bytes of the floating-point (or the other) tensors inside a decoding state."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size() if state.is_floating_point() == floating else 0
    if isinstance(state, (tuple, list)):
        return sum(_bytes(s, floating) for s in state)
    return 0


@pytest.mark.parametrize("slots", [1, 4])
def test_state_bytes_with_memory_match_the_layers_decoding_state(slots):
    """The formula with M slots against the state each layer really keeps
    after T tokens, T past the window: floats in state_bytes, the slots'
    integers and flags in memory_index_bytes."""
    T, dim = 40, 16
    cell = {"seq_len": T, "num_kv_pairs": 2, "model": "macchiato", "dim": dim, "num_latents": 16, "lr": 1e-3}
    mem = {**cell, "memory_slots": slots, "memory_rule": "key_norm"}
    states = []
    for c in (cell, mem):
        torch.manual_seed(0)
        lm = LatteForCausalLM(M.model_config(c, vocab_size=64))
        states.append(lm(torch.randint(0, 64, (1, T)), use_cache=True).state.layers[0])
    mixer, qk, window, _ = M.FAMILIES["macchiato"]
    got = M.state_bytes(mixer, dim=dim, seq_len=T, num_latents=16, window_size=window, qk_mixer=qk, memory_slots=slots)
    assert _bytes(states[1], True) == got["state_bytes"]
    assert got["memory_state_bytes"] == _bytes(states[1].attn.memory, True) > 0
    assert got["memory_index_bytes"] == _bytes(states[1].attn.memory, False)
    assert _bytes(states[1], True) - _bytes(states[0], True) == got["memory_state_bytes"]


def test_latte_gets_the_state_nearest_the_macchiato_with_slots():
    for dim, slots in ((64, 32), (16, 4), (64, 8)):
        target = X._bytes_of(X.MACCHIATO, dim, dim, slots)
        L = X.matched_latents(dim, slots)
        gap = abs(X._bytes_of(X.LATTE, dim, L) - target)
        assert L % M.NUM_HEADS == 0
        for other in (L - M.NUM_HEADS, L + M.NUM_HEADS):  # no neighbour is nearer
            assert abs(X._bytes_of(X.LATTE, dim, other) - target) >= gap
    assert X.matched_latents(64, 32) == 250  # 33,768 bytes beside the Macchiato's 33,656


def _keys_and_their_gradients(T: int, W: int, slots: int):
    """One Macchiato layer (rule key_norm), a loss at the last position only:
    (its keys [T, K, E], the norm of each key's gradient [T, K])."""
    config = LatteConfig(
        vocab_size=32, dim=16, num_layers=1, num_heads=2, latents_per_head=4, mixer="macchiato",
        window_size=W, mlp="none", memory_slots=slots, memory_rule="key_norm",
    )  # fmt: skip
    torch.manual_seed(0)
    lm = LatteForCausalLM(config)
    keys = []
    lm.model.blocks[0].mixer.k_proj.register_forward_hook(lambda m, i, out: keys.append(out) or out.retain_grad())
    hidden, _ = lm.model(torch.randint(0, 32, (1, T), generator=torch.Generator().manual_seed(1)))
    hidden[0, -1].square().sum().backward()
    return keys[0].detach().view(T, 2, -1), keys[0].grad.view(T, 2, -1).norm(dim=-1)


def test_training_reaches_the_held_keys_and_never_the_selection():
    """The gradient reaches the window's keys, and beyond the window exactly
    the keys the slots hold (per KV head: the M largest key norms among the
    tokens that left it); a key not held, whose norm chose it out, gets none.
    Without slots no key beyond the window gets any."""
    T, W, Mslots = 24, 4, 3
    grads = {slots: _keys_and_their_gradients(T, W, slots) for slots in (0, Mslots)}
    k, g0 = grads[0]
    _, g = grads[Mslots]
    left = T - W  # positions 0 .. left - 1 have left the last query's window
    assert (g0[:left] == 0).all() and (g0[left:] > 0).all()
    for head in range(2):
        norms = k[:left, head].norm(dim=-1).bfloat16().float()  # compared rounded, ties to the older (§4.2)
        held = set(sorted(range(left), key=lambda s: (-norms[s].item(), s))[:Mslots])
        for s in range(left):
            assert (g[s, head] > 0) == (s in held), (head, s)


def test_memory_refuses_the_sweeps_plan_options():
    with pytest.raises(ValueError, match="--dims.*--memory runs its own plan"):
        X._plan(M.parse_args(["--memory", "--dims", "64"]))


@pytest.mark.slow
def test_quick_memory_run_reports_every_cell_and_resumes(tmp_path, capsys):
    out, work = tmp_path / "res", tmp_path / "work"
    argv = ["--memory", "--quick", "--out", str(out), "--work", str(work)]
    assert MS.main(argv) == 0
    recs = json.loads((out / "results.json").read_text())
    rules = sorted(r.get("memory_rule", "") for r in recs if r["model"] == "macchiato")
    assert rules == ["", "attention", "key_norm", "random", "recall"]
    latte = [r for r in recs if r["model"] == "latte-conv_rglru"]
    assert [r["num_latents"] for r in latte] == [X.matched_latents(X.QUICK_DIM, X.QUICK_SLOTS)]
    with_slots = [r for r in recs if r.get("memory_slots")]
    assert all(r["state_bytes"] == with_slots[0]["state_bytes"] > r["memory_state_bytes"] > 0 for r in with_slots)
    assert all(r["steps"] == 4 and 0.0 <= r["accuracy"] <= 1.0 for r in recs)
    md = (out / "results.md").read_text()
    assert "python -m experiments.mqar --memory --quick" in md and "| 4, recall |" in md
    assert md.count("| macchiato L=16 w=16 |") == 5 and "not run" not in md
    capsys.readouterr()
    assert MS.main(argv) == 0
    assert "6 of 6 cells already done" in capsys.readouterr().err
