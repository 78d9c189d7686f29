"""`python -m experiments.gpu_suite` (in a checkout's root):
the CUDA suite of issue 26 in one resumable command (docs/gpu.md §5). It runs
the benchmarks (latte.bench, benchmarks/) and the experiments (experiments/)
as subprocesses, so it sits above both.

    stages.py  the stages, their limits and the command line (main)
    machine.py what the machine has; wheels installed (standard library only)
    dryrun.py  every stage's command checked without a GPU
    runner.py  budgets, one subprocess per stage, records, the tarball
    report.py  README.md of the suite's folder; tables rewritten from JSON
    kernels.py the kernel cache carried back, and in where GPU and Triton match
    targets.py the targets of issue 56, met or missed, with their figures
"""
