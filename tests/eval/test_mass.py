"""Where Macchiato's attention mass goes (latte.eval.mass): the shares of
the joint normaliser on window, sinks, memory slots and latents of a tiny
converted model, recorded from each layer's own op inputs, against the
layer's log-masses (a second path), and `latte eval --suite mass`."""

import json

import pytest
import torch

from latte.eval import mass as M

pytest.importorskip("transformers")

from tests.convert.test_decode_and_io import W, trained_like  # noqa: E402


def ids(T=60, seed=0):
    return torch.randint(0, 90, (T,), generator=torch.Generator().manual_seed(seed))


def test_latent_share_equals_the_layers_log_masses():
    """Without memory the latents' share at every query is 1 - sigmoid(lse
    of window and sinks - logsumexp(a) - beta), from the layer's own
    log_masses (float32, another path); every layer's shares sum to 1 and
    put nothing on the slots."""
    model = trained_like("llama", num_sinks=2)
    x, inputs = ids(), {}
    hooks = [
        a.register_forward_pre_hook(
            lambda mod, args, kw, i=i: inputs.__setitem__(i, (kw.get("hidden_states", args[0] if args else None), kw)),
            with_kwargs=True,
        )
        for i, a in enumerate(model.converted)
    ]
    try:
        layers = M.prompt_shares(model, x)
    finally:
        for h in hooks:
            h.remove()
    assert len(layers) == len(model.converted) > 1
    for i, attn in enumerate(model.converted):
        hidden, kw = inputs[i]
        lm = attn.log_masses(hidden, kw["position_embeddings"])
        lat = lm.latent + attn.beta.detach().float()
        p_lat = torch.exp(lat - torch.logaddexp(lm.window, lat))  # [B, T, H]
        assert layers[i]["mean"][3] == pytest.approx(float(p_lat.mean()), abs=1e-5)
        assert layers[i]["last"][3] == pytest.approx(float(p_lat[:, -1].mean()), abs=1e-5)
        for where in ("mean", "last"):
            assert sum(layers[i][where]) == pytest.approx(1.0, abs=1e-12) and layers[i][where][2] == 0.0
        assert layers[i]["mean"][1] > 0  # the sinks outside the window take some mass
    assert not any("latent_mix" in a.__dict__ for a in model.converted)  # the recorder is gone


def test_the_oracle_slots_take_mass_and_the_recorder_refuses_a_state():
    """Marked tokens that left the window are held and take a share of the
    mass; unmarked, the oracle holds nothing. A decoding call is refused."""
    model = trained_like("llama", memory_slots=8, memory_rule="oracle", memory_positions="cache")
    x = ids()
    marks = torch.zeros(len(x), dtype=torch.bool)
    marks[5:9] = True  # beyond the window of the last query
    assert len(x) - 1 - 8 > W
    held = M.prompt_shares(model, x, marks)
    none = M.prompt_shares(model, x)
    for lay, off in zip(held, none):
        assert sum(lay["mean"]) == pytest.approx(1.0, abs=1e-12) and off["mean"][2] == 0.0
        assert lay["last"][2] > 1e-4
    with M.recording(model), pytest.raises(ValueError, match="full-sequence forward"):
        cache = model(x[None, :10], use_cache=True).past_key_values  # a prefill from nothing: recorded
        model(x[None, 10:11], past_key_values=cache, use_cache=True)
    with pytest.raises(ValueError, match="no Macchiato layer"):
        with M.recording(torch.nn.Linear(2, 2)):
            pass


def test_a_native_model_window_share_is_its_p_window():
    """A native Macchiato model without sinks: the window's share is
    latents.py's p(window|t) (another path, from the layer's weights); with
    memory slots the shares still sum to 1 and the slots take some mass."""
    from latte.data import TokenWindows
    from latte.eval.latents import latent_utilisation
    from latte.models import LatteConfig, LatteForCausalLM

    torch.manual_seed(0)
    model = LatteForCausalLM(LatteConfig.tiny(mixer="macchiato")).eval()
    x = torch.randint(0, 64, (33,), generator=torch.Generator().manual_seed(1))
    layers = M.prompt_shares(model, x[:32])
    report = latent_utilisation(model, TokenWindows(x, 32))
    for got, want in zip(layers, report["layers"]):
        p_window = sum(h["p_window_mean"] for h in want["heads"]) / len(want["heads"])
        assert got["mean"][0] == pytest.approx(p_window, abs=1e-5) and got["mean"][1:3] == [0.0, 0.0]
    torch.manual_seed(0)
    slots = LatteForCausalLM(LatteConfig.tiny(mixer="macchiato", memory_slots=4, memory_rule="key_norm")).eval()
    for lay in M.prompt_shares(slots, x[:32]):
        assert sum(lay["mean"]) == pytest.approx(1.0, abs=1e-12) and lay["mean"][2] > 1e-3


def test_summary_averages_prompts_then_layers():
    cell = {"task": "passkey", "context": 1024}
    a = {**cell, "layers": [{"mean": [0.5, 0.1, 0.2, 0.2], "last": [0.4, 0.1, 0.3, 0.2]}] * 2}
    b = {**cell, "layers": [{"mean": [0.7, 0.1, 0.0, 0.2], "last": [0.6, 0.1, 0.1, 0.2]}] * 2}
    records, table = M.mass_summary([({"model": "m"}, "m [x]", [a, b])])
    assert len(records) == 2 and records[1]["layer"] == 1 and records[0]["prompts"] == 2
    assert records[0]["mean_window"] == pytest.approx(0.6) and records[0]["last_slots"] == pytest.approx(0.2)
    assert "| m [x] | passkey | 1,024 | 2 | 60.0 / 10.0 / 10.0 / 20.0 | 50.0 / 10.0 / 20.0 / 20.0 |" in table


def test_suite_mass(tmp_path, capsys):
    """`latte eval RUN --suite mass` on a converted run with a memory set: one record per
    (model, task, context, layer), shares summing to 1, the slots' share 0
    without memory and above 0 with the oracle; the original is not
    measured; a second command reuses the cells."""
    from latte.cli import main
    from tests.eval.test_runner import convert_tiny_llama

    run = convert_tiny_llama(tmp_path)
    out = tmp_path / "eval"
    cmd = ["eval", str(run), "--suite", "mass", "--tasks", "passkey", "--lengths", "256", "--threads", "1"]
    cmd += ["--against", "original", "--out", str(out)]
    cmd += ["--set", "oracle:model.memory_slots=16,model.memory_positions=cache,model.memory_rule=oracle"]
    assert main(cmd) == 0
    records = [r for r in json.loads((out / "results.json").read_text())["records"] if r["suite"] == "mass"]
    assert {r.get("subject", "") for r in records} == {"", "oracle"}  # no record of the original
    for r in records:
        for where in ("mean", "last"):
            assert sum(r[f"{where}_{p}"] for p in M.SHARES) == pytest.approx(1.0, abs=1e-9)
        assert (r["mean_slots"] > 0) == (r.get("subject") == "oracle")
    assert "## mass" in (out / "results.md").read_text()
    cells = sorted((out / "cells-mass").glob("*.json"))
    stamp = [c.stat().st_mtime_ns for c in cells]
    assert main(cmd) == 0
    assert [c.stat().st_mtime_ns for c in cells] == stamp
