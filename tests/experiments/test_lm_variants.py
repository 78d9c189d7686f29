"""`latte experiment lm-variants` end to end in quick mode: real `latte train`
and `latte eval` subprocesses, the three result folders, resume."""

import json

import pytest

from latte.experiments import lm_variants as LV
from latte.experiments.lm_report import spread


def test_spread_formats_mean_std_and_range():
    assert spread([2.0]) == "2.00"
    assert spread([1.0, 2.0, 3.0]) == "2.00 ± 1.00 (1.00-3.00)"


def test_every_variant_is_a_shipped_config():
    from latte.train.config import load_run_config

    for config, mixer, qk in LV.VARIANTS.values():
        cfg = load_run_config(config)
        assert cfg.model.mixer == mixer
        assert cfg.model.to_latte_config(4096).qk_mixer == (qk or cfg.model.to_latte_config(4096).qk_mixer)


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError, match="--variants: unknown"):
        LV.main(["--quick", "--variants", "gpt"])


@pytest.mark.slow
def test_quick_run_all_stages_and_resume(tmp_path, capsys):
    argv = [
        "--quick",
        "--variants",
        "macchiato",
        "--seeds",
        "0",
        "--runs",
        str(tmp_path / "runs"),
        "--results",
        str(tmp_path / "results"),
    ]
    assert LV.main(argv) == 0
    res = tmp_path / "results"
    [train] = json.loads((res / "lm_variants" / "results.json").read_text())
    assert {"mixer", "qk_mixer", "seed", "val_ppl", "tokens_per_s"} <= set(train)
    assert train["mixer"] == "macchiato" and train["qk_mixer"] == "conv_rglru" and train["steps"] == 2
    assert train["val_ppl"] > 1 and train["tokens_per_s"] > 0
    assert (tmp_path / "runs" / "macchiato" / "seed-0" / "summary.json").is_file()
    extra = json.loads((res / "extrapolation" / "results.json").read_text())
    whole = [r for r in extra if r["bucket"] == "all"]
    assert [r["multiple"] for r in whole] == [1, 2] and all(r["ppl"] > 1 for r in whole)
    lat = json.loads((res / "latents" / "results.json").read_text())
    assert len(lat) == 4 and all(0 < r["p_window_mean"] < 1 and r["effective_latents"] >= 1 for r in lat)
    assert (res / "latents" / "macchiato.png").is_file() and (res / "extrapolation" / "extrapolation.png").is_file()
    md = (res / "lm_variants" / "results.md").read_text()
    assert "latte experiment lm-variants --quick" in md and "| macchiato |" in md
    capsys.readouterr()
    assert LV.main(argv) == 0  # everything done: nothing reruns
    err = capsys.readouterr().err
    assert err.count("1 of 1 cells already done") == 3
    # report-only over a wider plan: nothing trains, the missing cells are named
    assert LV.main([*argv, "--seeds", "0,1", "--stages", "train", "--report-only"]) == 0
    assert not (tmp_path / "runs" / "macchiato" / "seed-1").exists()
    md = (res / "lm_variants" / "results.md").read_text()
    assert "Not run (reduced CPU budget): macchiato seed 1" in md and "Seeds: 1 per variant" in md
    assert "| macchiato | 0 |" in md and "| finished |" in md  # the per-evaluation curve


def test_latents_by_layer_shows_where_a_collapse_sits():
    from latte.experiments.lm_report import _latents_by_layer

    flat = [
        {"variant": "latte-none", "layer": layer, "head": h, "effective_latents": eff}
        for layer, effs in ((0, (8.0, 6.0)), (1, (1.1, 1.3)))
        for h, eff in enumerate(effs)
    ]
    flat += [{"variant": "macchiato", "layer": 0, "head": 0, "effective_latents": 4.0, "p_window_mean": 0.9}]
    table = _latents_by_layer(flat).splitlines()
    assert table[2] == "| variant | layer 0 | layer 1 |"
    assert "| latte-none | 7.0 (6.0) | 1.2 (1.1) |" in table
    assert "| macchiato | 4.0 (4.0); p(window) 0.90 | - |" in table
