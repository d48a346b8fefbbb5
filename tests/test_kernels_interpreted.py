"""If triton was imported in compiled mode before the kernels tests (no GPU here), the kernel
tests skipped themselves; run them again in a fresh process under TRITON_INTERPRET=1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.kernels import KERNELS_RUN


def test_kernel_tests_ran_somewhere() -> None:
    if KERNELS_RUN:
        return  # they ran in this process (interpreter or GPU)
    here = Path(__file__).parent
    files = sorted(str(p) for p in here.glob("test_kernels_*.py") if p.name != Path(__file__).name)
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files],
                       cwd=here, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
