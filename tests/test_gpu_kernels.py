"""FlashHead's GPU kernels checked on a CPU: ``tests/interpreted/kernel_checks.py`` run by Triton's interpreter.

The checks run in a pytest process of their own with ``TRITON_INTERPRET=1`` set before anything imports
Triton (the switch decides, at Triton's first import, whether its standard library is compiled or interpreted,
and this process may have imported Triton already through torch). Skipped where Triton is not installed (the
CPU stack's ``kernels-cpu`` extra installs it; ``make test`` does).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")


def test_the_kernels_under_triton_s_interpreter():
    """The probe selection, both tie rules, the packed argmax and the kept histograms against plain torch."""
    here = Path(__file__).parent
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(here.parent),
                          str(here / "interpreted" / "kernel_checks.py")], env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout.splitlines()[-1], run.stdout[-2000:]
