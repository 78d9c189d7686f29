"""`latte experiment NAME [args]`: the paper's experiments as commands anyone can rerun.

Each experiment is a module `latte.experiments.<name>` (dashes become
underscores) with `main(argv) -> int`. Every experiment has a quick mode
(seconds; what the tests run) and a full mode (what produced the committed
files under `results/<name>/`), resumes a killed sweep where it stopped and
shows a progress bar. The shared pieces (resumable sweeps, result files)
are in `latte.experiments.results`; machine info, tables, plots and README
sections in `latte.reporting`.
"""

# The experiments this installation knows, in the order `latte experiment --help` lists them.
EXPERIMENTS: tuple[str, ...] = ("mqar", "lm-variants", "lra", "convert", "convert-sinks", "convert-data")
