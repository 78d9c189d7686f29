#!/usr/bin/env bash
# Issue 27's long CPU runs, one 1-thread job at a time, in a fixed order.
# Resumable: rerunning the same command continues where it stopped (`latte
# train` resumes from its last checkpoint, every 100 steps; finished sweep
# cells are skipped). Run it from a pinned checkout, not a working tree whose
# files change, with the venv active:
#
#   setsid nohup tools/long_runs_queue.sh now > runs/long_runs_queue.log 2>&1 &
#   RUNS=/path/of/the/first/checkout/runs setsid nohup tools/long_runs_queue.sh after-kernels > LOG 2>&1 &
#
# Phase "now": what the small-shape kernels barely change (the dim-192 LM
# recipe), then the MQAR linear-conv seeds. Phase "after-kernels", from a
# checkout that has the kernels, once "now" has finished (one worker at a
# time): the MQAR latte-conv seeds, Macchiato at twice the epochs, and the
# T=1,024 Macchiato/SWA pair. Everything is written under RUNS (default
# runs/); the committed results are then written from those folders with
# --report-only. The MQAR work folder starts from the published cells
# (--restore-from results/mqar), so its report keeps them.
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

mqar_t256() {  # MQAR at T=256, 16 pairs, width 64, lr 3e-3, into the shared work folder
    step experiment mqar --settings 256x16 --dims 64 --lrs 3e-3 --latent-multiples 1 \
        --work "$RUNS/mqar" --restore-from results/mqar "$@"
}

case "${1:-}" in
    now)
        lm_long
        mqar_t256 --mixers linear-conv --seeds 1,2 --out "$RUNS/results/mqar-linear-conv-seeds"
        ;;
    after-kernels)
        mqar_t256 --mixers latte-conv --seeds 1,2 --out "$RUNS/results/mqar-latte-conv-seeds"
        mqar_t256 --mixers macchiato --epochs 6 --out "$RUNS/results/mqar-macchiato-6-epochs"
        step experiment lm-variants --plan macchiato-vs-swa --runs "$RUNS/macchiato_vs_swa" --results "$RUNS/results"
        ;;
    *)
        echo "usage: $0 now|after-kernels" >&2
        exit 2
        ;;
esac
echo "== $(date -u +%FT%TZ) queue ${1} finished"
