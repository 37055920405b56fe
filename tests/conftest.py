"""Shared fixtures: the simulated cluster (see tests/simcluster.py and SIMCLUSTER notes) and the Slurm test bed
on a cluster of its own (tests/slurmbed.py).

Tests that use ``sim_cluster`` or ``slurm_bed`` are marked ``@pytest.mark.cluster``. The cluster needs root,
iproute2, iptables and openssh, the bed also slurm-wlm and munge (``.ci/install-cluster-deps``); without them
their tests are skipped, or fail when the ``CI`` environment variable is set, so CI never passes by skipping them.

Timing bounds scale with the machine's load (tests/loadscale.py): each test holds one load factor, sampled
before it starts, and its own time limit (pytest-timeout's ``timeout``) stretches by the same factor.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import loadscale
import pytest
from simcluster import SimCluster, missing_requirements
from slurmbed import SlurmBed, slurm_missing

# A shell without job control starts its background commands with SIGINT ignored, and their children inherit it
# (`python -m pytest &` in a script): Ctrl-C would then reach neither this process nor the clusterruns the tests
# start, and every test of Ctrl-C would fail. The tests need Ctrl-C as a terminal gives it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

SIM_CLUSTER_NODES = 4
ROOT = Path(__file__).resolve().parent.parent
SLURM_BED_NODES = 4


def pytest_sessionstart(session: pytest.Session) -> None:
    """Stop at once when the ``clusterrun`` that other processes import is not this checkout's.

    The CLI runs and the simulated cluster's nodes start ``python`` outside this directory: they import the
    installed clusterrun. Installed from another checkout, or no longer installed, the suite would test another
    tree, or fail by the dozen on "No module named clusterrun".
    """
    probe = "import clusterrun, os; print(os.path.dirname(os.path.realpath(clusterrun.__file__)))"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    bound = loadscale.scaled(60)
    try:
        done = subprocess.run([sys.executable, "-c", probe], cwd="/", env=env, capture_output=True, text=True,
                              timeout=bound, check=False)
    except subprocess.TimeoutExpired:
        pytest.exit(f"{sys.executable} -c 'import clusterrun' did not return within {bound:.0f} s", returncode=4)
    found = done.stdout.strip() if done.returncode == 0 else None
    if found != str(ROOT / "clusterrun"):
        where = f"installed from {found}, not from this checkout ({ROOT})" if found else \
            f"not installed (this checkout: {ROOT})"
        pytest.exit(f"clusterrun is {where}: the CLI runs and the simulated nodes would not test this tree. "
                    f"Install it from here, as README.md says: cd {ROOT} && "
                    "pip install torch==2.13.0 -e '.[torch,test]'", returncode=4)


@pytest.fixture(scope="session")
def cluster_requirements() -> None:
    """Skip the test when this machine cannot run a simulated cluster (fail instead when ``CI`` is set).

    For tests that build their own SimCluster; ``sim_cluster`` implies it.
    """
    problems = missing_requirements()
    if problems:
        reason = "simulated cluster unavailable: " + "; ".join(problems)
        if "CI" in os.environ:
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def sim_cluster(cluster_requirements: None) -> Iterator[SimCluster]:
    """A started 4-node SimCluster (management 200mbit, data 2gbit) shared by the whole session.

    Torn down at session end, also after failures and Ctrl-C. After each test that used it, it is
    put back as it was started (:meth:`SimCluster.reset`: faults undone, sshds running, node processes
    killed), so one test's fault never leaks into the next.
    """
    cluster = SimCluster(SIM_CLUSTER_NODES)
    cluster.start()  # cleans up after itself if it fails
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def slurm_bed(cluster_requirements: None) -> Iterator[SlurmBed]:
    """A started Slurm test bed (munged, slurmctld, a slurmd per node) on a 4-node SimCluster of its own, shared
    by the whole session and torn down at its end, also after failures and Ctrl-C.

    Its own cluster: the shared ``sim_cluster`` is reset after each test, which kills every node process
    (slurmd included). Tests put it back themselves (:meth:`SlurmBed.reset`).
    """
    problems = slurm_missing()
    if problems:
        reason = "slurm test bed unavailable: " + "; ".join(problems)
        if "CI" in os.environ:
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    cluster = SimCluster(SLURM_BED_NODES)
    cluster.start()  # cleans up after itself if it fails
    try:
        with SlurmBed(cluster) as bed:  # stops what it started if its start fails
            yield bed
    finally:
        cluster.stop()


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Each test's timing bounds scale by one factor, the machine's load as the test starts; so does the test's
    own time limit (set here, before pytest-timeout reads it), or a test whose bounds stretched would be cut
    off by it."""
    factor = loadscale.hold()
    limit = item.config.getini("timeout")  # pytest-timeout's, from pyproject.toml
    marker = item.get_closest_marker("timeout")
    base = marker.args[0] if marker is not None and marker.args else limit
    if base and factor > 1:
        item.add_marker(pytest.mark.timeout(float(base) * factor), append=False)
    yield


@pytest.fixture(autouse=True)
def _reset_sim_cluster(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    # funcargs: only tests that asked for the cluster (never starts it for the others)
    cluster = request.node.funcargs.get("sim_cluster") if hasattr(request.node, "funcargs") else None
    if isinstance(cluster, SimCluster):
        cluster.reset()
