"""The node agent's ``collect`` mode: after a broken stream, what is left of a run on this node, and the rank log
lines clusterrun did not receive.

Its spec is ``protocol.COLLECT``, filled before it gets here: every key is present.

Standard library only: this module travels to the nodes with the agent.
"""

from __future__ import annotations

import json
import os

if __package__:
    from clusterrun.remote import containers, procs, protocol, tailing, wire
else:
    import containers
    import procs
    import protocol
    import tailing
    import wire


def collect(spec: dict) -> int:
    """Stop what is left of a run on this node, then send what its rank logs hold beyond what clusterrun got.

    ``spec``: run_id, node, grace, run_dir, rank_offset, max_bytes, ``skip``: {"<rank>/<stream>": bytes already
    received}, ``partial``: send an unfinished last line too (the run is over). Prints ``swept`` (or ``alive``),
    then per rank file one ``log`` event (its size and lines, where sending starts, what is left out: at most
    ``max_bytes`` from the end are sent, cut at a line start) followed by its ``out`` events, then ``record``.
    """
    exclude = {os.getpid(), os.getppid()}
    if spec["sweep"]:
        pids = procs.stop_processes(lambda: procs.marked(spec["run_id"], exclude, spec["node"]), spec["grace"])
        container = spec["container"]
        extra = {"containers": containers.remove(container["runtime"], container["labels"])} if container else {}
        wire.emit({"ev": protocol.SWEPT, "pids": pids, **extra})
    else:  # only reading the logs of a run that goes on (a detached one): say whether it still runs
        wire.emit({"ev": protocol.ALIVE, "pids": procs.marked(spec["run_id"], exclude, spec["node"])})
    run_dir = os.path.expanduser(spec["run_dir"])
    for path, local_rank, stream in tailing.rank_files(os.path.join(run_dir, "torchrun")):
        _send_file(spec, path, local_rank, stream)
    try:
        with open(os.path.join(run_dir, "exit.json")) as fh:
            wire.emit({"ev": protocol.RECORD, "exit": json.load(fh)})
    except (OSError, ValueError):
        wire.emit({"ev": protocol.RECORD, "exit": None})
    return 0


def _send_file(spec: dict, path: str, local_rank: int, stream: str) -> None:
    """One rank file's ``log`` event, then its bytes beyond ``skip`` (at most ``max_bytes`` from its end)."""
    rank = spec["rank_offset"] + local_rank
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below
    except OSError:
        return
    with fh:
        size = os.fstat(fh.fileno()).st_size
        start = min(int(spec["skip"].get(f"{rank}/{stream}", 0)), size)
        limit = spec["max_bytes"]
        begin = tailing.line_start_after(fh, size - limit) if size - start > limit else start
        wire.emit({"ev": protocol.LOG, "rank": rank, "stream": stream, "bytes": size,
                   "lines": tailing.count_lines(fh, 0, size), "from": begin, "skipped_bytes": begin - start,
                   "skipped_lines": tailing.count_lines(fh, start, begin)})
    f = tailing.RankFile(path, rank, local_rank, stream, offset=begin)
    while f.offset < size and not wire.is_broken():
        if not f.pump() and not f.pending:
            break
    for _ in range(64 if spec["partial"] else 0):  # its writers are gone: what is left is its unfinished end
        if not f.pump(final=True):
            break
    f.close()
