"""Reduced-precision matrix products for the backbone of a prediction: ``"tf32"`` and ``"bf16"``.

Only the backbone g(x) of a :class:`~geodbk.models.basis_gp.BasisGP` may run at reduced
precision; the kernel features k_Z(g) and the folded projection (``mean = k_Z^T a + c``,
``var_f = ||B^T k_Z||^2``) always stay in the model's float32. The folded weights
B = L_ZZ^{-T} L carry the conditioning of K_ZZ, and rounding their inputs to a short
mantissa is what breaks the variance: on the Puerto Rico demo model (h=64, r=128,
``benchmarks/bench_prediction_precision.py``), rounding every product to TF32 gave sd errors
up to 7% and bf16 autocast of the whole forward up to 76%, while the backbone alone gives:

============  =========================  ==========================
precision     max |mean error|, log10    max relative sd error
============  =========================  ==========================
float32       2.4e-4                     8.1e-4
tf32          1.9e-3 (0.4% in Mbps)      4.4e-3
bf16          1.6e-2 (3.7% in Mbps)      4.0e-2
============  =========================  ==========================

(errors against the same model in float64 at the latest quarter, on the 16,050 tiles of the
demo dataset and 50,000 random points in their box;
TF32 emulated on the CPU by rounding every product's inputs to TF32's 10 mantissa bits,
which is what tensor cores do before accumulating in float32.) The speed-up of these
paths is a GPU matter: CUDA runs TF32 on tensor cores (``torch.backends.cuda.matmul``
``.allow_tf32``) and bf16 through ``torch.autocast``; a CPU has no TF32 unit, so ``"tf32"``
runs in float32 there, and bf16 autocast on a CPU without bf16 instructions is slower, not
faster.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import torch

Precision = Literal["float32", "tf32", "bf16"]

#: The precisions :func:`matmul_precision` accepts, in order of falling accuracy.
PRECISIONS: tuple[Precision, ...] = ("float32", "tf32", "bf16")


def check_precision(precision: str) -> Precision:
    """``precision`` if it is one of :data:`PRECISIONS`; ``ValueError`` otherwise."""
    for known in PRECISIONS:
        if precision == known:
            return known
    raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")


@contextmanager
def matmul_precision(precision: Precision, device: torch.device) -> Iterator[None]:
    """Run the enclosed float32 matrix products on ``device`` at ``precision``.

    ``"float32"`` changes nothing; ``"tf32"`` allows TF32 tensor-core products on CUDA (and
    is float32 elsewhere); ``"bf16"`` is ``torch.autocast`` to bfloat16 on ``device``'s type.
    The global TF32 switch is put back on exit.
    """
    if precision == "bf16":
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            yield
    elif precision == "tf32" and device.type == "cuda":
        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous
    else:
        yield


__all__ = ["PRECISIONS", "Precision", "check_precision", "matmul_precision"]
