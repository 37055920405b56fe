"""doctor's probe script run by a real shell: the user's python path is a word, never shell code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from clusterrun.doctor.probe import parse_probe, probe_script

ONLY_PYTHON: dict[str, str] = {"uname": "uname -r"}


def run_probe(python: str, cwd: Path) -> dict:
    script = probe_script(python, ONLY_PYTHON)
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=120, cwd=cwd,
                          stdin=subprocess.DEVNULL, check=False)
    return parse_probe("n0", done.stdout, ONLY_PYTHON)


def test_a_hostile_python_path_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    for python in (f"/x' y$(touch {marker})", f"/x; touch {marker}", f"/x`touch {marker}`", f"$(touch {marker})"):
        sections = run_probe(python, tmp_path)
        assert not marker.exists(), python
        assert sections["python"].exit_code == 127 and "not installed" in sections["python"].output, python
        assert python in sections["python"].output


def test_an_honest_path_with_a_space_is_found(tmp_path: Path) -> None:
    venv = tmp_path / "my env" / "bin"
    venv.mkdir(parents=True)
    os.symlink(sys.executable, venv / "python")
    sections = run_probe(str(venv / "python"), tmp_path)
    assert sections["python"].exit_code == 0, sections["python"].output
    assert '"python"' in sections["python"].output  # pyreport's JSON
