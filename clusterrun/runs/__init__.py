"""Runs on the orchestrator: their directories (:mod:`.dirs`), their record, status.json (:mod:`.record`), and
the judge of how a node and a run ended (:mod:`.judge`), the launch timeline and a running node's live state
(:mod:`.timeline`, :mod:`.live`)."""

from __future__ import annotations

from clusterrun.runs.dirs import DEFAULT_RUNS_DIR, DISK_FULL, RunDir, atomic_write, find_run, list_runs, new_run_id
from clusterrun.runs.record import (
    AttemptRecord,
    NodeRecord,
    RankRecord,
    RunRecord,
    RunState,
    read_record,
    run_record,
    write_record,
)

__all__ = ["DEFAULT_RUNS_DIR", "DISK_FULL", "AttemptRecord", "NodeRecord", "RankRecord", "RunDir", "RunRecord",
           "RunState", "atomic_write", "find_run", "list_runs", "new_run_id", "read_record", "run_record",
           "write_record"]
