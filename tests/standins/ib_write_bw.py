"""A stand-in for perftest's ``ib_write_bw``: the simulated cluster has no RDMA hardware.

It does what the real tool does over the network (the server listens on the ``-p`` TCP port for the
handshake, the client connects to the server's address given last), and prints output recorded
from real runs (tests/fixtures/real/ib_write_bw/): the client's report when the handshake worked,
perftest's own "Couldn't connect" report when it did not. ``STANDIN_IB_CLIENT_OUTPUT`` may name
another recorded file for the client. Each call's arguments are appended to ``STANDIN_IB_LOG``.
"""

import os
import socket
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "real" / "ib_write_bw"


def main(args: list[str]) -> int:
    if os.environ.get("STANDIN_IB_LOG"):
        with open(os.environ["STANDIN_IB_LOG"], "a") as log:
            log.write(" ".join(args) + "\n")
    port = int(args[args.index("-p") + 1]) if "-p" in args else 18515
    if args and not args[-1].startswith("-"):  # client: the server's address comes last
        try:
            socket.create_connection((args[-1], port), timeout=3).close()
        except OSError:
            sys.stdout.write((FIXTURES / "error_couldnt_connect.txt").read_text())
            return 1
        name = os.environ.get("STANDIN_IB_CLIENT_OUTPUT", "roce_92gbps_rdma_cm_cpu_freq_warning.txt")
        sys.stdout.write((FIXTURES / name).read_text())
        return 0
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(1)
    srv.settimeout(60)
    sys.stdout.write("\n************************************\n* Waiting for client to connect... *\n"
                     "************************************\n")
    sys.stdout.flush()
    conn, _ = srv.accept()
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
