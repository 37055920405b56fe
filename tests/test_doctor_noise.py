"""The SSH library's complaints during a doctor run (paramiko logs "Socket exception: Bad file descriptor (9)"
when a connection closes under its thread) are kept for the report, never printed bare on doctor's stderr.

Run in a fresh interpreter: pytest's own log capture would hide what Python prints there by itself."""

from __future__ import annotations

import subprocess
import sys

from simjobs import clusterrun_env

LOG = "import logging; logging.getLogger('paramiko.transport').error('Socket exception: Bad file descriptor (9)')"


def python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=clusterrun_env(), check=False)


def test_without_a_handler_python_prints_paramikos_socket_errors_on_stderr() -> None:
    assert python(LOG).stderr.strip() == "Socket exception: Bad file descriptor (9)"


def test_socket_errors_during_and_after_a_doctor_run_are_kept_off_stderr() -> None:
    done = python("from clusterrun.doctor.noise import kept_noise\n"
                  f"with kept_noise() as noise:\n    {LOG}\n"
                  f"{LOG}\n"  # after the run: a connection's thread that logs late
                  "print(len(noise), noise[0])")

    assert done.returncode == 0 and done.stderr == ""
    count, line = done.stdout.split(" ", 1)
    assert count == "1"
    assert line.strip().endswith("paramiko.transport ERROR: Socket exception: Bad file descriptor (9)")
