"""`python -m experiments.mqar`: state sizes, the training harness, and a quick
end-to-end run that resumes."""

import json

import pytest
import torch

from experiments.common.results import write_results
from experiments.mqar import study as MS
from experiments.mqar import sweep as M
from experiments.mqar.report import best_lr, flat_records
from latte.data import mqar_splits
from latte.models import LatteForCausalLM


def float_bytes(state) -> int:
    """Bytes of the floating-point tensors inside a decoding state: what it
    remembers of the sequence (position counters and buffer masks excluded)."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size() if state.is_floating_point() else 0
    if isinstance(state, (tuple, list)):
        return sum(float_bytes(s) for s in state)
    return 0


def test_state_bytes_match_the_layers_decoding_state():
    """The formula per mixer against the float32 state each layer really
    keeps after T tokens."""
    T = 40
    for model, L in (
        ("softmax", None),
        ("linear", None),
        ("linear-conv", None),
        ("swa-16", None),
        ("latte-none", 16),
        ("latte-conv", 16),
        ("latte-conv_rglru", 64),
        ("macchiato", 16),
    ):
        cell = {"seq_len": T, "num_kv_pairs": 2, "model": model, "dim": 16, "num_latents": L, "lr": 1e-3}
        torch.manual_seed(0)
        lm = LatteForCausalLM(M.model_config(cell, vocab_size=64))
        state = lm(torch.randint(0, 64, (1, T)), use_cache=True).state.layers[0]
        mixer, qk, window, _ = M.FAMILIES[model]
        got = M.state_bytes(mixer, dim=16, seq_len=T, num_latents=L, window_size=window, qk_mixer=qk)
        assert float_bytes(state) == got["state_bytes"], model


def test_latte_with_dim_latents_holds_linear_attentions_state():
    for dim in (64, 128):
        lin = M.state_bytes("linear", dim=dim, seq_len=64)
        lat = M.state_bytes("latte", dim=dim, seq_len=64, num_latents=dim, qk_mixer="none")
        assert lin["attn_state_bytes"] == lat["attn_state_bytes"] == lat["state_bytes"]


def test_cells_cover_every_family_and_trace_latte_over_latents():
    cells = M.cells_for(((64, 4),), (64,), tuple(M.FAMILIES), M.LATENT_MULTIPLES, (1e-3,))
    latte = sorted(c["num_latents"] for c in cells if c["model"] == "latte-none")
    assert latte == [16, 64, 256]
    assert {c["model"] for c in cells} == set(M.FAMILIES)
    assert [c["num_latents"] for c in cells if c["model"] == "macchiato"] == [64]


def test_equal_state_table_pairs_like_with_like():
    from experiments.mqar.report import equal_state_table

    def rec(model, acc, L=None):
        r = {"seq_len": 64, "num_kv_pairs": 4, "dim": 64, "model": model, "num_latents": L, "accuracy": acc}
        return {
            **r,
            **M.state_bytes(M.FAMILIES[model][0], dim=64, seq_len=64, num_latents=L, qk_mixer=M.FAMILIES[model][1]),
        }

    table = equal_state_table(
        [
            rec("linear", 0.25),
            rec("linear-conv", 0.5),
            rec("latte-none", 0.26, 64),
            rec("latte-conv", 0.98, 64),
            rec("latte-conv", 0.1, 16),
        ]
    )
    header, _, row = table.splitlines()
    assert header.split(" | ")[3:] == ["linear", "latte-none", "linear-conv", "latte-conv", "latte-conv_rglru |"]
    assert row == "| 64, 4 | 64 | 8.4K | 0.250 | 0.260 | 0.500 | 0.980 |  |"


def test_best_lr_keeps_the_most_accurate_run():
    base = {"seq_len": 64, "num_kv_pairs": 4, "model": "linear", "dim": 64, "num_latents": None}
    recs = [
        {**base, "lr": 1e-3, "accuracy": 0.4},
        {**base, "lr": 3e-3, "accuracy": 0.6},
        {**base, "dim": 128, "lr": 1e-3, "accuracy": 0.9},
    ]
    best = best_lr(recs)
    assert sorted((r["dim"], r["lr"]) for r in best) == [(64, 3e-3), (128, 1e-3)]


def test_lr_table_shows_every_lr_where_more_than_one_ran():
    from experiments.mqar.report import lr_table

    base = {
        "seq_len": 256,
        "num_kv_pairs": 16,
        "model": "linear-conv",
        "mixer": "linear",
        "dim": 64,
        "num_latents": None,
    }
    one = {**base, "model": "softmax", "mixer": "softmax", "lr": 3e-3, "accuracy": 0.99}
    assert lr_table([{**base, "lr": 3e-3, "accuracy": 0.79}, one]) == ""
    table = lr_table(
        [
            {**base, "lr": 3e-3, "accuracy": 0.79},
            {**base, "lr": 1e-3, "accuracy": 0.5, "incomplete": True, "steps": 9, "planned_steps": 10},
            one,
            {**one, "seq_len": 64, "num_kv_pairs": 4, "lr": 1e-3, "accuracy": 0.98},
        ]
    )
    head, _, *rows = table.splitlines()
    assert head == "| T, pairs | dim | model | lr 0.003 | lr 0.001 |"
    assert rows == ["| 256, 16 | 64 | linear-conv | 0.790 | 0.500 (stopped at step 9 of 10) |"]


def test_unfinished_cells_are_grouped_by_width_lr_and_setting():
    from experiments.mqar.report import _unfinished

    cells = M.cells_for(((64, 4), (128, 8)), (64, 128), ("linear", "latte-conv"), (1.0, 0.25), (3e-3,))
    dim64 = [c for c in cells if c["dim"] == 64]
    pending = [c for c in cells if c is not dim64[0]]
    text = _unfinished(pending, cells)
    assert text.startswith("\n\n**Not finished: 11 of the 12 runs of this plan**")
    assert text.endswith(
        ": dim 64, lr 0.003: T=64: latte-conv, latte-conv L=16; T=128: all 3 runs. dim 128, lr 0.003: all 6 runs."
    )
    assert _unfinished([], cells) == ""


@pytest.mark.slow
def test_harness_learns_recall_with_softmax_attention():
    """The harness must be able to learn MQAR at all: softmax attention on a
    small vocabulary reaches the early-stop accuracy well within its epochs
    (12 epochs when written; chance is 1/8)."""
    torch.set_num_threads(1)
    train, test = mqar_splits(2000, 200, seq_len=8, num_kv_pairs=2, vocab_size=16, seed=0)
    budget = M.Budget({8: 2000}, 200, 30, 32, (3e-3,), vocab_size=16)
    cell = {"seq_len": 8, "num_kv_pairs": 2, "model": "softmax", "dim": 64, "num_latents": None, "lr": 3e-3}
    rec = M.train_cell(cell, train, test, budget)
    assert rec["accuracy"] >= 0.99 and rec["reached_target"] and rec["epochs"] < 30


@pytest.mark.slow
def test_quick_run_writes_results_and_resumes(tmp_path, capsys):
    out, work = tmp_path / "res", tmp_path / "work"
    argv = ["--quick", "--out", str(out), "--work", str(work), "--mixers", "softmax,latte-conv_rglru,macchiato"]
    assert MS.main(argv) == 0
    recs = json.loads((out / "results.json").read_text())
    assert {r["model"] for r in recs} == {"softmax", "latte-conv_rglru", "macchiato"}
    for r in recs:
        assert {"mixer", "seq_len", "num_kv_pairs", "state_bytes", "accuracy", "dim", "lr", "examples"} <= set(r)
        assert 0.0 <= r["accuracy"] <= 1.0 and r["steps"] == 4
        assert r["ms_per_step"] > 0 and r["ms_per_step_last_interval"] > 0
    series = json.loads((out / "step_times.json").read_text())
    assert all(len(s["epoch_train_seconds"]) == 1 and len(s["interval_ms_per_step"]) == 1 for s in series)
    assert all(s["accuracy_curve"][-1][0] == 4 for s in series)
    assert (out / "accuracy_vs_state.png").stat().st_size > 0
    md = (out / "results.md").read_text()
    assert "python -m experiments.mqar --quick" in md and "| softmax |" in md and "## Step time" in md
    assert "reduced CPU budget" not in md
    # a second run finds every cell done and trains nothing
    capsys.readouterr()
    assert MS.main(argv) == 0
    assert "3 of 3 cells already done" in capsys.readouterr().err
    # another seed of one cell, run by a narrower command into the same work folder, is
    # reported by the standard command beside the seed-0 runs
    assert MS.main([*argv[:-2], "--mixers", "softmax", "--seeds", "1"]) == 0
    assert MS.main([*argv, "--report-only"]) == 0
    md = (out / "results.md").read_text()
    assert "## Seeds and longer training" in md and "| 16, 2 | 16 | softmax | 0.003 | 1 | 0, 1 |" in md
    assert "| softmax seed 1 | 16, 2 |" in md  # its step-time row
    assert {r["seed"] for r in json.loads((out / "results.json").read_text())} == {0, 1}


def test_a_narrowed_sweep_says_so_and_rejects_bad_latent_multiples():
    a = M.parse_args(["--settings", "64x4", "--dims", "64", "--lrs", "3e-3"])
    scope = M._scope(a)
    assert "reduced CPU budget" in scope and "settings 64x4" in scope and "lrs 3e-3" in scope
    assert M._scope(M.parse_args([])) == ""
    with pytest.raises(ValueError, match="--latent-multiples"):
        M._plan(M.parse_args(["--dims", "64", "--latent-multiples", "0.3"]))


def test_a_deadline_stops_a_cell_where_it_is_and_marks_it_incomplete():
    import time

    torch.set_num_threads(1)
    train, test = mqar_splits(64, 16, seq_len=8, num_kv_pairs=2, vocab_size=16, seed=0)
    budget = M.Budget({8: 64}, 16, 2, 16, (3e-3,), vocab_size=16)
    cell = {"seq_len": 8, "num_kv_pairs": 2, "model": "latte-none", "dim": 16, "num_latents": 16, "lr": 3e-3}
    rec = M.train_cell(cell, train, test, budget, deadline=time.time())
    assert rec["steps"] == 1 and rec["planned_steps"] == 8 and rec["incomplete"]
    assert len(rec["interval_ms_per_step"]) == 1
    assert not M.train_cell(cell, train, test, budget)["incomplete"]
    with pytest.raises(ValueError, match="--deadline"):
        M.utc_deadline("18h45", "--deadline")


def test_restored_cells_reproduce_the_published_report(tmp_path):
    """The published results/mqar rebuilt from its own results.json and
    step_times.json: the same tables, the same records (plus the protocol
    fields seed 0 and 3 epochs that the old cells imply)."""
    import shlex
    from pathlib import Path

    published = Path(__file__).resolve().parents[2] / "results" / "mqar"
    command = shlex.split(json.loads((published / "run.json").read_text())["command"])
    argv = command[3:]
    if "--readme" in argv:  # the published command also rewrote a README; the test must not
        i = argv.index("--readme")
        argv = argv[:i] + argv[i + 2 :]
    work, out = tmp_path / "work", tmp_path / "out"
    assert MS.main([*argv, "--restore-from", str(published), "--work", str(work), "--out", str(out)]) == 0
    body = lambda p: (p / "results.md").read_text().split("\n\n")[3:]  # noqa: E731 (after command and machine)
    assert body(out) == body(published)

    def without_protocol(path):
        return [{k: v for k, v in r.items() if k not in ("seed", "max_epochs")} for r in json.loads(path.read_text())]

    for name in ("results.json", "step_times.json"):
        assert without_protocol(out / name) == without_protocol(published / name), name
    protocols = lambda p: sorted((r.get("seed", 0), r.get("max_epochs", 3)) for r in json.loads(p.read_text()))  # noqa: E731
    assert protocols(out / "results.json") == protocols(published / "results.json")
    assert all("seed" in r and "max_epochs" in r for r in json.loads((out / "results.json").read_text()))
    assert M.restore_cells(published, work) == 0  # already there: nothing rewritten


def test_cells_carry_seed_and_epochs_keeping_the_old_file_names():
    from experiments.mqar.cells import LEGACY, cell_file_key, with_protocol

    assert LEGACY["max_epochs"] == M.FULL.epochs
    cells = M.cells_for(((256, 16),), (64,), ("linear-conv",), (1.0,), (3e-3,), seeds=(0, 1, 2))
    assert [c["seed"] for c in cells] == [0, 1, 2] and {c["max_epochs"] for c in cells} == {3}
    old = "dim=64,lr=0.003,model=linear-conv,num_kv_pairs=16,num_latents=None,seq_len=256"
    assert [cell_file_key(c) for c in cells] == [old] + [
        f"dim=64,lr=0.003,model=linear-conv,num_kv_pairs=16,num_latents=None,seed={s},seq_len=256" for s in (1, 2)
    ]
    six = dict(cells[0], max_epochs=6)
    assert "max_epochs=6" in cell_file_key(six) and "seed" not in cell_file_key(six)
    legacy = {"seq_len": 64, "lr": 3e-3, "accuracy": 0.5}
    assert list(with_protocol(legacy)) == ["seq_len", "lr", "seed", "max_epochs", "accuracy"]


def test_other_seeds_and_epochs_get_their_own_table():
    from experiments.mqar.report import headline, seed_table

    def rec(model, seed, acc, epochs=3):
        base = {"seq_len": 256, "num_kv_pairs": 16, "dim": 64, "lr": 3e-3, "mixer": "latte", "num_latents": 64}
        return {**base, "model": model, "seed": seed, "max_epochs": epochs, "accuracy": acc}

    records = [rec("latte-conv", 0, 0.684), rec("latte-conv", 1, 0.70), rec("latte-conv", 2, 0.60)]
    records += [rec("latte-none", 0, 0.1), rec("macchiato", 0, 0.044), rec("macchiato", 0, 0.5, epochs=6)]
    records[-2]["mixer"] = records[-1]["mixer"] = "macchiato"
    records[-2]["window_size"] = records[-1]["window_size"] = 16
    head, other = headline(records, 3)
    assert [r["model"] for r in head] == ["latte-conv", "latte-none", "macchiato"] and len(other) == 3
    table = seed_table(head, other, 3)
    assert "| 256, 16 | 64 | latte-conv L=64 | 0.003 | 3 | 0, 1, 2 | 0.684, 0.700, 0.600 | 0.661 ± 0.054" in table
    assert "| macchiato L=64 w=16 | 0.003 | 3 | 0 | 0.044 | 0.044 |" in table
    assert "| macchiato L=64 w=16 | 0.003 | 6 | 0 | 0.500 | 0.500 |" in table
    assert "latte-none" not in table  # one seed, one budget: only in the headline tables
    assert headline([rec("latte-conv", 1, 0.7)], 3)[0][0]["seed"] == 1  # a report of other seeds only


def test_t_distribution_matches_published_tables():
    from experiments.common.stats import t_central, t_quantile

    # two-sided 5% critical values of Student's t (any statistics table)
    for df, crit in ((1, 12.7062), (2, 4.3027), (4, 2.7764), (10, 2.2281), (30, 2.0423)):
        assert t_quantile(0.975, df) == pytest.approx(crit, abs=1e-4)
        assert t_central(crit, df) == pytest.approx(0.95, abs=1e-5)
    assert 1 - t_central(2.0, 2) == pytest.approx(1 - 2 / 6**0.5, abs=1e-12)  # df 2: P(|T| <= t) = t / sqrt(2 + t^2)
    assert t_central(0.0, 5) == 0.0 and t_central(1e9, 3) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="df >= 1"):
        t_central(1.0, 0)


def test_paired_comparison_over_seeds():
    from experiments.mqar.report import paired_stats, paired_table

    st = paired_stats([0.1, 0.2, -0.05])
    assert st["mean"] == pytest.approx(0.25 / 3) and st["p_sign_flip"] == 0.5  # 4 of the 8 sign patterns
    assert st["ci_low"] < 0 < st["ci_high"]
    assert paired_stats([0.1, 0.2, 0.3])["p_sign_flip"] == 0.25  # 3 seeds can never go below 2/8
    with pytest.raises(ValueError, match="at least 2"):
        paired_stats([0.1])

    def rec(model, seed, acc, latents=64):
        base = {"seq_len": 256, "num_kv_pairs": 16, "dim": 64, "lr": 3e-3, "max_epochs": 3}
        return {**base, "model": model, "seed": seed, "accuracy": acc, "num_latents": latents}

    records = [rec("latte-conv", s, a) for s, a in ((0, 0.6845), (1, 0.6109), (2, 0.9133), (3, 0.5))]
    records += [rec("linear-conv", s, a, None) for s, a in ((0, 0.7919), (1, 0.8492), (2, 0.9031))]
    records += [rec("latte-conv", 0, 0.99, 16)]  # another state size: not the equal-state pair
    table = paired_table(records)
    assert "| 256, 16 | 64 | 0.003 | 3 | 0, 1, 2 | -0.107, -0.238, +0.010 | -0.112 ± 0.124 |" in table
    assert "p = 0.260 | 0.500 | undecided" in table  # scipy.stats.ttest_1samp: p = 0.2595
    assert "about 12 seeds would detect a gap this size at 80% power" in table

    ahead = [rec("latte-conv", s, 0.9 + 0.01 * s) for s in range(8)]
    ahead += [rec("linear-conv", s, 0.5 + 0.02 * s, None) for s in range(8)]
    assert "latte-conv ahead (p < 0.05)" in paired_table(ahead) and "| 0.008 |" in paired_table(ahead)
    assert paired_table(records[:1] + records[4:5]) == ""  # one paired seed: nothing to test


def test_seeds_for_power_matches_the_normal_approximation_for_large_n():
    from experiments.mqar.report import seeds_for_power

    # normal approximation: ((1.95996 + 0.84162) * 1 / 0.2)^2 = 196.2; t adds about 2 seeds
    assert 197 <= seeds_for_power(0.2, 1.0) <= 200
    assert seeds_for_power(1.0, 0.1) == 2  # a gap ten times the spread: two seeds, the least a t-test takes
    assert seeds_for_power(0.0, 0.1) is None and seeds_for_power(0.001, 1.0) is None  # over the cap


TIMES = {"seconds", "loadavg_start", "loadavg_end", "resumed_from_steps"}


def _same_run(a: dict, b: dict) -> bool:
    """Equal in everything but time measurements and resume provenance."""
    drop = lambda r: {k: v for k, v in r.items() if k not in TIMES and "ms" not in k and "seconds" not in k}  # noqa: E731
    return drop(a) == drop(b)


def test_a_killed_or_stopped_cell_resumes_where_it_was_with_the_uninterrupted_result(tmp_path, monkeypatch):
    import time

    torch.set_num_threads(1)
    train, test = mqar_splits(64, 16, seq_len=8, num_kv_pairs=2, vocab_size=16, seed=0)
    budget = M.Budget({8: 64}, 16, 3, 16, (3e-3,), vocab_size=16, eval_every=2)  # 12 steps, 6 evaluations
    cell = {"seq_len": 8, "num_kv_pairs": 2, "model": "latte-conv", "dim": 16, "num_latents": 16, "lr": 3e-3}
    proto = {"fillers": "zeros"}
    reference = M.train_cell(cell, train, test, budget)
    assert reference["steps"] == 12 and len(reference["accuracy_curve"]) == 6

    progress = tmp_path / "progress" / "cell.pt"
    real, calls = M.accuracy, []

    def killed_at_third_evaluation(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # what a kill leaves: the progress of step 4 on disk
        return real(*args, **kwargs)

    monkeypatch.setattr(M, "accuracy", killed_at_third_evaluation)
    with pytest.raises(KeyboardInterrupt):
        M.train_cell(cell, train, test, budget, progress=progress, protocol=proto)
    monkeypatch.undo()
    resumed = M.train_cell(cell, train, test, budget, progress=progress, protocol=proto)
    assert resumed["resumed_from_steps"] == [4] and _same_run(resumed, reference)
    # results.json takes flat records only: the resumed steps become a string there
    run = {"command": "python -m experiments.mqar", "machine": {}, "wall_s": 0.0}
    write_results(tmp_path / "out", "mqar", flat_records([{**cell, **resumed}]), "", run)
    assert json.loads((tmp_path / "out" / "results.json").read_text())[0]["resumed_from_steps"] == "4"

    # finished: the saved record is returned (the sweep had not written its cell file), nothing trains
    monkeypatch.setattr(M, "scored_logits", lambda *a: (_ for _ in ()).throw(AssertionError("trained again")))
    assert M.train_cell(cell, train, test, budget, progress=progress, protocol=proto) == resumed
    monkeypatch.undo()

    # a deadline between evaluations: saved before the extra evaluation, continued by the next sweep
    progress.unlink()
    stopped = M.train_cell(cell, train, test, budget, deadline=time.time(), progress=progress, protocol=proto)
    assert stopped["incomplete"] and stopped["steps"] == 1
    again = M.train_cell(cell, train, test, budget, progress=progress, protocol=proto)
    assert again["resumed_from_steps"] == [1] and _same_run(again, reference)

    # another protocol's progress is set aside (kept), never resumed
    other = M.train_cell(cell, train, test, budget, progress=progress, protocol={"fillers": "random"})
    assert "resumed_from_steps" not in other and _same_run(other, reference)
    assert (progress.parent / "cell.pt.set-aside-1").is_file()
    progress.write_bytes(b"not a checkpoint")  # damaged: set aside too
    assert _same_run(M.train_cell(cell, train, test, budget, progress=progress, protocol=proto), reference)
    assert (progress.parent / "cell.pt.set-aside-2").read_bytes() == b"not a checkpoint"
