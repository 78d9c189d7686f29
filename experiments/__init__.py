"""The paper's experiments as commands anyone can rerun from a checkout.

One folder per experiment, each with a README stating its contract: it
imports `latte` (never the other way round: tests/test_package.py), writes
`results/NAME/`, and has its own tests under tests/experiments/. Run one as

    python -m experiments.mqar --quick        # (`python -m experiments mqar --quick` too)

Every experiment has a quick mode (seconds; what the tests run) and a full
mode (what produced the committed files under `results/<name>/`), resumes a
killed sweep where it stopped and shows a progress bar. The shared pieces
(resumable sweeps, result files, provenance) are in experiments/common/;
machine info, tables, plots and README sections in `latte.reporting`.
"""

# name (as `python -m experiments NAME` takes it) -> the module whose main(argv) runs it,
# in the order `python -m experiments --help` lists them
MODULES: dict[str, str] = {
    "mqar": "experiments.mqar.study",
    "lm-variants": "experiments.lm_variants.study",
    "lra": "experiments.lra.study",
    "convert": "experiments.convert.study",
    "convert-sinks": "experiments.sinks.study",
    "convert-recipes-v3": "experiments.pilots.study",
}
EXPERIMENTS: tuple[str, ...] = tuple(MODULES)
# how each is run with `python -m` (a folder's __main__.py runs its main module)
COMMANDS: dict[str, str] = {
    "mqar": "experiments.mqar",
    "lm-variants": "experiments.lm_variants",
    "lra": "experiments.lra",
    "convert": "experiments.convert",
    "convert-sinks": "experiments.sinks",
    "convert-recipes-v3": "experiments.pilots",
}
# the modules that ran a study before it moved to a folder of its own, as
# results/*/run.json records them -> its name (experiments/README.md, "Moved")
MOVED: dict[str, str] = {
    "experiments.convert.convert_sinks": "convert-sinks",
    "experiments.convert.convert_recipes_v3": "convert-recipes-v3",
}
