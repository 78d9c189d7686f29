"""`latte train`: a trainer that survives kill -9, pluggable by task.

task.py        the Task interface (what is trained); lm.py, the language model
config.py      RunConfig (task, optim, train) and the LM's sections
loop.py        train(cfg): setup, fit, evaluate
setup.py       everything fit needs, built in order
step.py        one optimizer step, the non-finite guard
checkpoint.py  the commit protocol (manifest last), verification, retention
sharded.py     FSDP2 checkpoints with torch.distributed.checkpoint
rundir.py      the run-folder lock, which checkpoint to resume, branches
runs.py        open a trained run for inference (generate, eval, export)
validation.py  LM validation loss and perplexity
distributed.py torchrun, DDP / FSDP2, collectives
metrics.py     progress bar, CSV, TensorBoard, loss curve
schedule.py, rng.py, faults.py (test-only fault injection)
"""
