"""The studies speak the library's one name for the number of latents
(latents_per_head, issue 58): every training cell of lra and lm_variants,
quick or not, resolves its config without the deprecated num_latents
(whose FutureWarning would be an error here), to the sizes it meant."""

import warnings
from pathlib import Path

import pytest

from latte.train import load_run_config


def _resolve(config: str, sets: list[str]):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        return load_run_config(config, [f"--{s}" for s in sets])


@pytest.mark.parametrize("quick", [False, True])
def test_lra_cells_resolve_without_the_deprecated_name(quick):
    from experiments.lra import study as lra

    extra = lra.QUICK if quick else []
    for task in lra.TASKS:
        for mixer in lra.ALL_MIXERS:
            if task not in lra.MODEL_TASKS.get(mixer, lra.TASKS):
                continue
            config, sets = lra.train_overrides(task, mixer, Path("runs/x"), extra)
            cfg = _resolve(config, sets)
            if mixer == "latte-paper":  # the paper's 40 latents over 4 heads; --quick: 4 over 2
                assert cfg.model.latents_per_head * cfg.model.num_heads == (4 if quick else 40)


@pytest.mark.parametrize("quick", [False, True])
def test_lm_variants_cells_resolve_without_the_deprecated_name(quick):
    from experiments.lm_variants import study as LV
    from experiments.lm_variants.plans import PLANS, VARIANT_SETS, VARIANTS

    sets = LV.QUICK_SET if quick else []
    for plan in PLANS.values():
        for v in VARIANTS:
            cfg = _resolve(VARIANTS[v][0], [*plan.sets, *sets, *VARIANT_SETS.get(v, ())])
            if v == "latte-conv_rglru-L256" and not quick:
                assert cfg.model.latents_per_head * cfg.model.num_heads == 256
    if quick:
        cfg = _resolve(VARIANTS["latte-conv_rglru"][0], list(LV.QUICK_SET))
        assert (cfg.model.latents_per_head, cfg.model.num_heads) == (4, 2)  # 8 latents in all, as before
