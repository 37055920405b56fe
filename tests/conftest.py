"""Shared fixtures: the simulated cluster (see tests/simcluster.py and SIMCLUSTER notes).

Tests that use ``sim_cluster`` are marked ``@pytest.mark.cluster``. The cluster needs root, iproute2,
iptables and openssh (``.ci/install-cluster-deps``); without them its tests are skipped, or fail when the
``CI`` environment variable is set, so CI never passes by skipping them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from simcluster import SimCluster, missing_requirements

SIM_CLUSTER_NODES = 4


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


@pytest.fixture(autouse=True)
def _reset_sim_cluster(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    # funcargs: only tests that asked for the cluster (never starts it for the others)
    cluster = request.node.funcargs.get("sim_cluster") if hasattr(request.node, "funcargs") else None
    if isinstance(cluster, SimCluster):
        cluster.reset()
