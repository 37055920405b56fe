"""A stand-in for ``nvidia-smi`` on the simulated nodes, which have no GPUs: it replays real recorded output.

For ``--query-gpu=FIELDS --format=csv[,noheader]`` it prints the columns asked for from a recorded
``--query-gpu`` CSV (tests/fixtures/real/nvidia_smi/, ``STANDIN_SMI_CSV`` names which; the default is four
H200s), as nvidia-smi prints them; anything else gets the recorded file as it is. Each call's arguments are
appended to ``STANDIN_SMI_LOG`` when that is set.
"""

import os
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "real" / "nvidia_smi"


def main(args: list[str]) -> int:
    if os.environ.get("STANDIN_SMI_LOG"):
        with open(os.environ["STANDIN_SMI_LOG"], "a") as log:
            log.write(" ".join(args) + "\n")
    recorded = (FIXTURES / os.environ.get("STANDIN_SMI_CSV", "query_gpu_index_uuid_memory_h200_busy.csv")).read_text()
    header, *rows = [line for line in recorded.splitlines() if line.strip()]
    columns = [name.split(" [")[0].strip() for name in header.split(",")]
    query = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), None)
    fmt = next((a.split("=", 1)[1] for a in args if a.startswith("--format=")), "")
    if query is None:
        sys.stdout.write(recorded)
        return 0
    wanted = [columns.index(field) for field in query.split(",")]
    if "noheader" not in fmt:
        print(", ".join(header.split(",")[i].strip() for i in wanted))
    for row in rows:
        cells = [cell.strip() for cell in row.split(",")]
        print(", ".join(cells[i] for i in wanted))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
