"""`python -m experiments.lm_variants` end to end in quick mode: real `latte train`
and `latte eval` subprocesses, the three result folders, resume."""

import json

import pytest

from experiments.lm_variants import study as LV
from experiments.lm_variants.report import spread


def test_spread_formats_mean_std_and_range():
    assert spread([2.0]) == "2.00"
    assert spread([1.0, 2.0, 3.0]) == "2.00 ± 1.00 (1.00-3.00)"


def test_every_variant_is_a_shipped_config():
    from latte.train.task import load_run_config

    for config, mixer, qk in LV.VARIANTS.values():
        cfg = load_run_config(config)
        assert cfg.model.mixer == mixer
        assert cfg.model.to_latte_config(4096).qk_mixer == (qk or cfg.model.to_latte_config(4096).qk_mixer)


def test_unknown_variant_is_refused(capsys):
    from tests.experiments.studies import study

    assert study(["lm-variants", "--quick", "--variants", "gpt"]) == 2
    assert "argument --variants: unknown 'gpt'; expected some of softmax" in capsys.readouterr().err


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
    extra = json.loads((res / "lm_variants" / "extrapolation" / "results.json").read_text())
    whole = [r for r in extra if r["bucket"] == "all"]
    assert [r["multiple"] for r in whole] == [1, 2] and all(r["ppl"] > 1 for r in whole)
    lat = json.loads((res / "lm_variants" / "latents" / "results.json").read_text())
    assert len(lat) == 4 and all(0 < r["p_window_mean"] < 1 and r["effective_latents"] >= 1 for r in lat)
    assert (res / "lm_variants" / "latents" / "macchiato.png").is_file()
    assert (res / "lm_variants" / "extrapolation" / "extrapolation.png").is_file()
    md = (res / "lm_variants" / "results.md").read_text()
    assert "python -m experiments.lm_variants --quick" in md and "| macchiato |" in md
    capsys.readouterr()
    assert LV.main(argv) == 0  # everything done: nothing reruns
    err = capsys.readouterr().err
    assert err.count("1 of 1 cells already done") == 3
    # report-only over a wider plan: nothing trains, the missing cells are named
    assert LV.main([*argv, "--seeds", "0,1", "--stages", "train", "--report-only"]) == 0
    assert not (tmp_path / "runs" / "macchiato" / "seed-1").exists()
    md = (res / "lm_variants" / "results.md").read_text()
    assert "not finished when it was written (the same command runs or resumes them): macchiato seed 1" in md
    assert "Seeds: 1 per variant" in md
    assert "| macchiato | 0 |" in md and "| finished |" in md  # the per-evaluation curve


def test_latents_by_layer_shows_where_a_collapse_sits():
    from experiments.lm_variants.report import _latents_by_layer

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


def test_long_plan_defaults_and_its_result_folders(tmp_path):
    from experiments.lm_variants.plans import stage_outputs

    a = LV.parse_args(["--plan", "long"])
    assert a.seeds == "0" and a.runs == "runs/lm_variants_long" and a.eval_tokens == 65536
    assert "latte-conv_rglru-L256" in a.variants.split(",") and "train.steps=3000" in a.plan_.sets
    assert (
        LV.train_args("latte-conv_rglru-L256", 0, tmp_path, 1, list(a.plan_.sets))[-1] == "--model.latents_per_head=64"
    )
    outs = stage_outputs(tmp_path, "lm_variants_long")
    assert outs["latents"] == (tmp_path / "lm_variants_long" / "latents", "lm_variants_long-latents")
    assert stage_outputs(tmp_path, "lm_variants")["train"] == (tmp_path / "lm_variants", "lm_variants")
    extra = (tmp_path / "lm_variants" / "extrapolation", "lm_variants-extrapolation")  # issue 58: one folder
    assert stage_outputs(tmp_path, "lm_variants")["extrapolation"] == extra
    with pytest.raises(SystemExit):  # argparse: "argument --eval-tokens: expected an integer >= 0 ..."
        LV.parse_args(["--eval-tokens", "-1"])


def test_curve_table_at_chosen_steps_relative_to_softmax_with_epochs(tmp_path):
    from experiments.lm_variants.curves import curve_table

    def run(variant: str, rows: list[tuple[int, float, int]], finished: bool) -> None:
        d = tmp_path / variant / "seed-0"
        d.mkdir(parents=True)
        (d / "val.csv").write_text(
            "step,val_loss,val_ppl,val_tokens\n" + "".join(f"{s},0,{p},{n}\n" for s, p, n in rows)
        )
        (d / "config.yaml").write_text("train:\n  global_batch_size: 16\ndata:\n  seq_len: 256\n")
        if finished:
            (d / "summary.json").write_text(json.dumps({"train_tokens": 4096 * 250}))

    run("softmax", [(100, 300.0, 64), (300, 200.0, 1000), (400, 180.0, 64), (1000, 100.0, 1000)], True)
    run("latte-none", [(100, 400.0, 64), (300, 250.0, 1000)], False)
    cells = [{"variant": v, "seed": 0} for v in ("softmax", "latte-none")]
    text, png = curve_table(cells, tmp_path, steps=(300, 1000, 2000), out=tmp_path)
    assert "| variant | seed | step 300 (1,000 tokens) | step 1000 (1,000 tokens) | run |" in text
    assert "| latte-none | 0 | 250.0 |  | not finished |" in text
    assert "| latte-none | 0 | 1.25 |  |" in text and "| softmax | 0 | 1.00 | 1.00 |" in text
    assert "step 300: 1.20, step 1000: 4.00" in text  # 300 x 4,096 tokens over a 1,024,000-token split
    all_steps, _ = curve_table(cells, tmp_path)  # no steps: every evaluation, no relative table
    assert "step 400 (64 tokens)" in all_steps and "relative to softmax" not in all_steps
