"""Shared setup for the kernels/ tests: run Triton kernels in the interpreter on CPU.

TRITON_INTERPRET must be set before triton is first imported. If another test module imported
triton first (compiled mode) and no GPU is present, the kernel tests cannot run in this process;
test_kernels_interpreted.py then re-runs them in a fresh interpreter process. (Conversely, if
these tests are collected first, in-process CPU callers of kernels/ run the interpreter too:
correct, only slower; subprocesses they start inherit TRITON_INTERPRET=1.)
"""

from __future__ import annotations

import os
import sys

_SET_HERE = "triton" not in sys.modules and "TRITON_INTERPRET" not in os.environ
if _SET_HERE:
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from constrain import kernels  # noqa: E402

# TRITON_INTERPRET stays set: triton reads it again later (lazy imports check it).

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KERNELS_RUN = kernels.HAS_TRITON and (kernels.INTERPRET or DEVICE == "cuda")
needs_kernels = pytest.mark.skipif(
    not KERNELS_RUN, reason="triton compiled without the interpreter here: see test_kernels_interpreted.py"
)


def rand_words(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Random int32 bitmask words (every bit pattern, sign bit included)."""
    return torch.randint(-(2**31), 2**31 - 1, shape, dtype=torch.int32, generator=g)


def chi2_pvalue(observed: torch.Tensor, expected_p: torch.Tensor) -> float:
    """Pearson chi-square goodness of fit p-value (cells with expected count >= 5 pooled)."""
    n = observed.sum()
    exp = expected_p.double() * n
    big = exp >= 5
    obs = torch.cat([observed[big].double(), observed[~big].double().sum().reshape(1)])
    ex = torch.cat([exp[big], exp[~big].sum().reshape(1)])
    keep = ex > 0
    stat = float(((obs[keep] - ex[keep]) ** 2 / ex[keep]).sum())
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), torch.tensor(stat / 2.0, dtype=torch.float64)))
