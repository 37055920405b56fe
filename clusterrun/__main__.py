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
        from clusterrun.waits import exit_without_waiting

        print("clusterrun: aborted", file=sys.stderr)
        exit_without_waiting(130)
        return 130


if __name__ == "__main__":
    sys.exit(main())
