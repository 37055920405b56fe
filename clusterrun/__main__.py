"""``python -m clusterrun`` and the ``clusterrun`` command: the nodes of ``up`` dialled first (cli/first_dial.py),
then the command line."""

import sys


def main() -> int:
    from clusterrun.cli.first_dial import dial_nodes

    dial_nodes(sys.argv[1:])
    from clusterrun.cli.main import main as run

    return run()


if __name__ == "__main__":
    sys.exit(main())
