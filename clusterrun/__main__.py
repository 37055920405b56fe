import sys

from clusterrun.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
