"""`latte train`: a trainer that survives kill -9, pluggable by task.

task.py        the Task interface (what is trained), the task registry and
               build_run_config / load_run_config; lm.py, the language model
config.py      RunConfig (task, optim, train) and the LM's sections
loop.py        train(cfg): setup, fit, evaluate
setup.py       everything fit needs, built in order
step.py        one optimizer step, the non-finite guard
state.py       the trainer's state as Stateful parts; the Checkpointer collecting them
checkpoint.py  the commit protocol (manifest last), retention, loading
manifest.py    the checkpoint folder's layout, its manifest and verification
sharded.py     FSDP2 checkpoints with torch.distributed.checkpoint
rundir.py      the run-folder lock, which checkpoint to resume, branches
runs.py        open a trained run for inference (generate, eval, export)
validation.py  LM validation loss and perplexity
distributed.py torchrun, DDP / FSDP2, collectives
metrics.py     progress bar, CSV, TensorBoard, loss curve
schedule.py, rng.py, faults.py (the test hooks: no-ops unless LATTE_FAULTS is set)
"""
