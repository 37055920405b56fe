"""``python -m clusterrun`` and the ``clusterrun`` command: the nodes of ``up`` dialled first (cli/first_dial.py),
then the command line."""

import sys


def main() -> int:
    try:
        from clusterrun.cli.first_dial import dial_nodes

        dial_nodes(sys.argv[1:])
        from clusterrun.cli.main import main as run

        return run()
    except KeyboardInterrupt:  # Ctrl-C where the command line has not turned it into its own end
        print("clusterrun: aborted", file=sys.stderr)
        _exit_now(130)
        return 130


def _exit_now(code: int) -> None:
    """End without joining threads that still wait on a node (a connect to a host that drops every packet lasts
    its whole connect_timeout); the usual exit where there are none."""
    import os
    import threading

    if any(t.is_alive() for t in threading.enumerate() if t is not threading.main_thread()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
