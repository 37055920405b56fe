"""doctor's probe script run by a real shell: the user's python path is a word, never shell code."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from clusterrun import remote
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


# --- the python report: torch's versions from its files, torch itself never imported ------------------------------

VERSION_PY = """from typing import Optional

__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip']
__version__ = '{version}'
debug = False
cuda: Optional[str] = {cuda!r}
git_version = '63d5e9221bedd1546b7d364b5ce4171547db12a9'
hip: Optional[str] = None
"""


def fake_torch(root: Path, *, version: str = "2.3.1+cu121", cuda: str | None = "12.1", version_file: bool = True,
               metadata: bool = True, nccl: str | None = "2.20.5") -> Path:
    """A torch install on disk whose import leaves a marker file (so a test sees whether it was imported):
    torch/version.py as torch's wheels write it, torch's dist-info requiring nvidia-nccl-cu12, and that package's
    dist-info when ``nccl`` is given."""
    pkg = root / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"open({str(root / 'imported')!r}, 'w').close()\n")
    if version_file:
        (pkg / "version.py").write_text(VERSION_PY.format(version=version, cuda=cuda))
    if metadata:
        info = root / f"torch-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n"
                                       "Requires-Dist: filelock\nRequires-Dist: nvidia-nccl-cu12==2.20.5 ; "
                                       "platform_system == \"Linux\" and platform_machine == \"x86_64\"\n")
    if nccl:
        info = root / f"nvidia_nccl_cu12-{nccl}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: nvidia-nccl-cu12\nVersion: {nccl}\n")
    return root


def python_report(site: Path) -> dict:
    """What the probe's python section prints with ``site`` first on the path (the node's python is this one)."""
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-c", remote.source("pyreport")], capture_output=True, text=True,
                          timeout=60, env=env, stdin=subprocess.DEVNULL, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_report_of_a_cuda_torch_reads_its_versions_without_importing_it(tmp_path: Path) -> None:
    report = python_report(fake_torch(tmp_path))

    assert not (tmp_path / "imported").exists()
    assert report["imported"] is False
    assert (report["torch"], report["cuda"], report["nccl"]) == ("2.3.1+cu121", "12.1", "2.20.5")
    assert report["nccl_from"] == "nvidia-nccl-cu12"
    assert (report["backends"], report["backends_from"]) == (["gloo", "nccl"], "build")
    assert report["torch_path"] == str(tmp_path / "torch")
    assert report["python"] == platform.python_version()


def test_report_says_when_the_nccl_version_is_known_only_by_importing(tmp_path: Path) -> None:
    report = python_report(fake_torch(tmp_path, nccl=None))

    assert "nccl" not in report and "only when torch is imported" in report["nccl_unknown"]
    assert report["backends"] == ["gloo", "nccl"]
    assert not (tmp_path / "imported").exists()


def test_report_of_a_cpu_build_has_gloo_only(tmp_path: Path) -> None:
    report = python_report(fake_torch(tmp_path, version="2.3.1+cpu", cuda=None, metadata=False, nccl=None))

    assert (report["torch"], report["backends"]) == ("2.3.1+cpu", ["gloo"])
    assert "cuda" not in report and "nccl" not in report and "nccl_unknown" not in report


def test_report_falls_back_to_package_metadata_without_version_py(tmp_path: Path) -> None:
    report = python_report(fake_torch(tmp_path, version="2.4.0", version_file=False))

    assert report["torch"] == "2.4.0" and "version_file_error" in report
    assert "cuda" not in report  # not knowable from the metadata: not made up
    assert not (tmp_path / "imported").exists()


def test_report_without_torch_says_so(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "empty")}
    done = subprocess.run([sys.executable, "-S", "-c", remote.source("pyreport")], capture_output=True, text=True,
                          timeout=60, env=env, stdin=subprocess.DEVNULL, check=True)
    report = json.loads(done.stdout)

    assert "no module named 'torch'" in report["torch_error"] and "torch" not in report
