"""A stand-in for nccl-tests' ``all_reduce_perf``: the simulated cluster has no GPUs and no nccl-tests.

It prints output recorded from real runs (tests/fixtures/real/nccl_tests/, see SOURCE.md):
``STANDIN_NCCL_TESTS_OUTPUT`` names the file (a complete 2-node all_reduce_perf table by default) and
exits 1 where that output reports a failure, as the real tool does. Each call's arguments are appended
to ``STANDIN_NCCL_TESTS_LOG``.
"""

import os
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "real" / "nccl_tests"


def main(args: list[str]) -> int:
    if os.environ.get("STANDIN_NCCL_TESTS_LOG"):
        with open(os.environ["STANDIN_NCCL_TESTS_LOG"], "a") as log:
            log.write(" ".join(args) + "\n")
    text = (FIXTURES / os.environ.get("STANDIN_NCCL_TESTS_OUTPUT", "nccl_info_interleaved_efa_2node.txt")).read_text()
    sys.stdout.write(text)
    return 1 if "failure" in text else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
