"""The models every evaluation stage of `latte experiment convert` compares,
all from one converted model: original, window, window+sinks, converted and
the sinks' ablations. They are the package's, shared with `latte eval`
(latte/eval/subjects.py, where each one is described); re-exported here
for the stages."""

from latte.eval import (  # noqa: F401
    DEFAULT_MODELS,
    DEFAULT_SINKS,
    MODELS,
    TRAINED,
    Subject,
    as_model,
    bos_cell,
    check_models,
    label,
    open_subject,
    original_context,
    sinks_cell,
    sinks_of,
)
