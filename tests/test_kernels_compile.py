"""Every Triton kernel the engine launches on a GPU compiles for sm_90 (the H200), on this CPU machine:
tests/_compile_sm90.py runs Triton's compiler and the wheel's ptxas in a process without the interpreter
(which runs code that the compiler refuses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


@pytest.mark.skipif(not PTXAS.exists(), reason="this Triton ships no ptxas")
def test_every_kernel_compiles_for_sm90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    repo = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(repo), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, str(Path(__file__).parent / "_compile_sm90.py")], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout)
    assert len(result) >= 12
    assert {k: v for k, v in result.items() if v != "ok"} == {}
