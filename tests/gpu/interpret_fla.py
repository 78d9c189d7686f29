"""fla-core's real Triton kernels on CPU under TRITON_INTERPRET=1, through
latte/ops/latte/gla.py, against the float64 reference: the whole matrix, run
by hand (it needs Triton installed and patches to its interpreter, and takes
about 5 minutes on 2 cores; tests/ops/test_gla_interpret.py runs a capped
subset in the suite).

    TRITON_INTERPRET=1 python tests/gpu/interpret_fla.py

First the checks below, once per construction ("eager": two-level z, then
chunk_gla; "fused": fla's gate, then chunk_gla), then every float32 test of
tests/ops/test_gla_fused.py with LATTE_FLA_INTERPRET=1 (std 1 / 40 logits,
+80 spikes, common offsets of 1e3 / 1e4 with and without centring, initial
states, packed documents with masks, left padding, a fully padded row,
decoding steps, each op's fake implementation against the kernels).

The patches (Triton 3.6, 3.9): the autotuner has no driver to time configs
with, so it takes the first; loop variables of `for i in range(n)` are plain
ints in the interpreter but fla calls .to() on them, so range() yields
interpreter scalars inside kernels; interpreter scalars convert to int
through their single element (numpy 2 refuses int() of a 1-element array);
fla's gate scans with its own combine functions and calls libdevice's log1p,
which the interpreter (3.9) does not patch: both run in numpy (patch_scans).
The interpreter computes float32 dots exactly (no TF32).
"""

from __future__ import annotations

import builtins
import os
import subprocess
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton.language as tl  # noqa: E402
import triton.runtime.autotuner as AT  # noqa: E402
import triton.runtime.interpreter as I  # noqa: E402


def patch_triton():
    AT.Autotuner._bench = lambda self, *a, config, **k: [1.0, 1.0, 1.0]
    orig_patch_tensor, orig_call = I._patch_lang_tensor, I.GridExecutor.__call__

    def patch_tensor(tensor, scope):
        orig_patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    def tensor_range(*args):
        for i in builtins.range(*(int(a) for a in args)):
            yield tl.core.tensor(I.TensorHandle(np.array(i, dtype=np.int32), tl.int32), tl.int32)

    def call(self, *args, **kwargs):
        g = self.fn.__globals__
        had, old = "range" in g, g.get("range")
        g["range"] = tensor_range
        try:
            return orig_call(self, *args, **kwargs)
        finally:
            if had:
                g["range"] = old
            else:
                del g["range"]

    I._patch_lang_tensor = patch_tensor
    I.GridExecutor.__call__ = call
    patch_scans()


def patch_scans():
    """fla's gate (fla.ops.gsa.gate) scans with its own combine functions,
    which the interpreter runs element by element outside its patched
    language (Triton 3.9: libdevice's log1p returns None there). Both are
    computed in numpy instead: logaddexp, and the linear recurrence
    (a, b) -> (a_l a_r, b_l a_r + b_r) of the gate's backward."""
    orig = I.ScanOps.generic_scan

    def generic_scan(self, input):
        name = getattr(self.combine_fn, "fn", self.combine_fn).__name__
        data = [np.moveaxis(x.handle.data, self.axis, 0) for x in input]
        if name == "logaddexp":
            out = [np.logaddexp.accumulate(data[0], axis=0)]
        elif name == "_reverse_recurrence":
            a, b = (d.copy() for d in data)
            for t in builtins.range(1, a.shape[0]):
                a[t], b[t] = a[t - 1] * a[t], b[t - 1] * a[t] + b[t]
            out = [a, b]
        else:
            return orig(self, input)
        return [self.to_tensor(np.moveaxis(o, 0, self.axis), x.dtype) for o, x in zip(out, input)]

    I.ScanOps.generic_scan = generic_scan
    import types

    import fla.ops.utils.op as fla_op

    def log1p(x):  # libdevice is not patched by the interpreter (Triton 3.9)
        return tl.core.tensor(I.TensorHandle(np.log1p(x.handle.data), x.handle.dtype), x.type)

    fla_op.tldevice = types.SimpleNamespace(log1p=log1p)


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: tests.helpers
    patch_triton()
    from latte.ops import backend
    from latte.ops.latte import gla_ops

    backend._fla_error = lambda x: None  # CPU tensors: the interpreter runs the kernels on them
    gla_ops.CPU_IMPL = "triton"  # the custom ops run fla's kernels on them too
    worst = 0.0
    for name in ("eager", "fused"):
        print(f"-- construction {name}", flush=True)
        with backend.using_fla_construction(name):
            worst = max(worst, checks())
    print(f"worst relative error {worst:.1e}")
    env = dict(os.environ, LATTE_FLA_INTERPRET="1", TRITON_INTERPRET="1")
    root = Path(__file__).resolve().parents[2]
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "tests/ops/test_gla_fused.py"], cwd=root, env=env
    )
    return 0 if worst < 1e-4 and tests.returncode == 0 else 1


def logit_cases(fla, report, shape):
    """Std 1 and 40 key logits and +80 spikes, from an initial state, forward and gradients."""
    from latte.ops import LatteState
    from latte.ops import reference as R
    from tests.helpers import grads_of

    B, H, L, D = shape
    f64 = torch.float64
    for T, scale, spikes in [(1, 1.0, 0.0), (100, 1.0, 0.0), (100, 40.0, 0.0), (130, 1.0, 80.0)]:
        a, b, v = (
            torch.randn(B, T, H, L, dtype=f64),
            torch.randn(B, T, H, L, dtype=f64) * scale,
            torch.randn(B, T, H, D, dtype=f64),
        )
        b = b + spikes * (torch.rand(B, T, H, L) < 0.05)
        S0, z0 = torch.randn(B, H, L, D, dtype=f64), torch.randn(B, H, L, dtype=f64) * 3

        def fast(a, b, v, S0, z0):
            y, st = fla(a, b, v, initial_state=LatteState(S0, z0), output_final_state=True)
            return torch.cat([y.flatten(), st.S.flatten(), st.z.flatten()])

        def ref(a, b, v, S0, z0):
            y, (S, z) = R.latte_causal(a, b, v, initial_state=(S0, z0))
            return torch.cat([y.flatten(), S.flatten(), z.flatten()])

        out, g = grads_of(fast, [x.float() for x in (a, b, v, S0, z0)])
        out_ref, g_ref = grads_of(ref, [a, b, v, S0, z0])
        report(f"T={T} logits std {scale:g} spikes {spikes:g}", out, out_ref, g, g_ref)


def checks() -> float:
    """The kernels through latte_causal / latte_causal_step against the
    float64 reference; returns the worst relative error."""
    from latte.ops import latte_causal, latte_causal_step
    from latte.ops import reference as R
    from tests.helpers import rel_err

    def fla(*args, **kw):
        return latte_causal(*args, backend="fla", **kw)

    f64 = torch.float64
    torch.manual_seed(0)
    worst = 0.0

    def report(name, out, out_ref, g=(), g_ref=()):
        nonlocal worst
        errs = [rel_err(out, out_ref)] + [rel_err(x, xr) for x, xr in zip(g, g_ref)]
        worst = max(worst, *errs)
        print(
            f"{name:34s} forward {errs[0]:.1e}"
            + ("  grads (a b v S0 z0) " + " ".join(f"{e:.1e}" for e in errs[1:]) if len(errs) > 1 else ""),
            flush=True,
        )

    B, H, L, D = 2, 2, 16, 16
    logit_cases(fla, report, (B, H, L, D))

    lengths = [5, 64, 1, 70]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist())
    a, b, v = (torch.randn(1, sum(lengths), H, X, dtype=f64) * s for X, s in ((L, 1), (L, 20), (D, 1)))
    y = fla(a.float(), b.float(), v.float(), cu_seqlens=cu)[0]
    y_ref = torch.cat([R.latte_causal(a[:, s:e], b[:, s:e], v[:, s:e])[0] for s, e in zip(cu[:-1], cu[1:])], 1)
    report("packed documents (cu_seqlens)", y, y_ref)

    a, b, v = (
        torch.randn(B, 90, H, L, dtype=f64),
        torch.randn(B, 90, H, L, dtype=f64) * 5,
        torch.randn(B, 90, H, D, dtype=f64),
    )
    mask = torch.ones(B, 90, dtype=torch.bool)
    mask[0, :11] = False
    mask[1, 60:] = False
    y = fla(a.float(), b.float(), v.float(), mask=mask)[0]
    report("left/right padding mask", y[mask], R.latte_causal(a, b, v, mask=mask)[0][mask])

    state, ys = None, []
    for t in range(12):
        y_t, state = latte_causal_step(a[:, t].float(), b[:, t].float(), v[:, t].float(), state, backend="fla")
        ys.append(y_t)
    report("decode steps (fused_recurrent_gla)", torch.stack(ys, 1), R.latte_causal(a[:, :12], b[:, :12], v[:, :12])[0])
    return worst


if __name__ == "__main__":
    sys.exit(main())
