"""Doctor checks; importing this package registers all of them, in the order reports show them."""

import importlib

#: Check modules in report order: facts of one node, then across nodes, then traffic between them.
MODULES = ("node", "nics", "gpu", "rdma", "roce_gid", "peermem", "limits", "ping", "net", "ib_bw", "cluster",
           "nccl_tests")

for _module in MODULES:
    importlib.import_module(f"{__name__}.{_module}")
