"""torchrun's own words about its workers, as the node agent reads them from torchrun's output.

* :data:`WORKER_FAILED`: the line torchrun prints the moment it sees a worker fail (before stopping the others);
* :func:`parse_failures`: each failed global rank's exit code, signal and time from its ``ChildFailedError``
  summary at the end (the first observed failure under "Root Cause").

Standard library only: this module travels to the nodes with the agent.
"""

import re

WORKER_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: \d+\)")
_FAIL_FIELD = re.compile(r"^\s*(time|rank|exitcode)\s*:\s*(.*?)\s*$")


def parse_failures(lines: list) -> dict:
    """Global rank -> {"rc", "time"} from torchrun's ``ChildFailedError`` summary."""
    out: dict = {}
    current: dict = {}
    in_root = False
    for line in lines:
        if "Root Cause" in line:
            in_root = True  # torchrun lists the first observed failure under this heading
        m = _FAIL_FIELD.match(line)
        if not m:
            continue
        key, value = m.group(1), m.group(2)
        if key == "time":
            current = {"time": value}
        elif key == "rank":
            rm = re.match(r"(\d+)", value)
            if rm:
                current["rank"] = int(rm.group(1))
        elif key == "exitcode" and "rank" in current:
            em = re.match(r"(-?\d+)", value)
            if em:
                code = int(em.group(1))
                sig = -code if code < 0 else None
                out[current["rank"]] = {"rc": 128 + sig if sig else code, "signal": sig,
                                        "time": current.get("time"), "root_cause": in_root}
            current = {}
    return out
