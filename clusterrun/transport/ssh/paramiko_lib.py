"""paramiko, as clusterrun imports it: without invoke.

paramiko's config module imports invoke (about 28 ms of every SSH command's start) only for the ``Match exec``
of paramiko's own ssh_config reader, which clusterrun does not use (ssh_resolve.py and ssh_config.py read the
config). So paramiko is imported with invoke blocked, and the block is lifted at once: anyone importing invoke
later gets it.
"""

import sys

if "paramiko" not in sys.modules and "invoke" not in sys.modules:
    sys.modules["invoke"] = None  # type: ignore[assignment]  # an ImportError for paramiko.config
    try:
        import paramiko
    finally:
        del sys.modules["invoke"]
else:
    import paramiko

__all__ = ["paramiko"]
