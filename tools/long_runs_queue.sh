#!/usr/bin/env bash
# Issue 27's long CPU runs, one 1-thread job at a time, in a fixed order.
# Resumable: rerunning the same command continues where it stopped (`latte
# train` resumes from its last checkpoint, every 100 steps; finished sweep
# cells are skipped). Run it from a pinned checkout, not a working tree whose
# files change, with the venv active:
#
#   setsid nohup tools/long_runs_queue.sh now > runs/long_runs_queue.log 2>&1 &
#   setsid nohup tools/long_runs_queue.sh after-kernels > runs/long_runs_after_kernels.log 2>&1 &
#
# Phase "now": what the small-shape kernels barely change (the dim-192 LM
# recipe). Phase "after-kernels": the MQAR and T=1,024 runs the kernels make
# cheaper. Everything is written under RUNS (default runs/); the committed
# results are then written from those folders with --report-only.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD" OMP_NUM_THREADS=1
RUNS="${RUNS:-runs}"

step() {
    echo "== $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg): latte $*"
    python -m latte "$@"
}

lm_long() {  # 7 runs of 3,000 steps, then the extrapolation and latent stages on them
    step experiment lm-variants --plan long \
        --variants softmax,swa,linear,latte-none,latte-conv_rglru,latte-conv_rglru-L256,macchiato \
        --runs "$RUNS/lm_variants_long" --results "$RUNS/results"
}

case "${1:-}" in
    now)
        lm_long
        ;;
    *)
        echo "usage: $0 now|after-kernels" >&2
        exit 2
        ;;
esac
echo "== $(date -u +%FT%TZ) queue ${1} finished"
