"""Pure parsers for the output of the tools ``clusterrun doctor`` runs on a node.

Each module takes the text one tool printed and returns frozen records; output it
does not recognise raises :class:`clusterrun.errors.ParseError` naming the tool and
the offending line. A tool that ran and reported its own failure ("couldn't connect",
"No IB devices found", iperf3's ``error``) is a finding, returned in the record, not
raised. No module runs anything; probes should run the tools with ``LC_ALL=C``.

- ``nvidia_smi``: ``nvidia-smi --query-gpu`` and ``--query-compute-apps`` CSV, and the banner versions
- ``topo``: the ``nvidia-smi topo -m`` matrix (GPU/NIC links, CPU and NUMA affinity, NIC legend)
- ``ip``: ``ip -j addr show`` and ``ip -j link show``
- ``ibstat``: ``ibstat`` and ``ibv_devinfo [-v]`` (port state, physical state, rate, link layer, GIDs)
- ``ibdev2netdev``: MLNX/rdma-core ``ibdev2netdev [-v]`` (RDMA port -> netdev and its state)
- ``show_gids``: the MLNX ``show_gids`` table (GID index, GID, IPv4, RoCE version, netdev)
- ``ib_write_bw``: the perftest ``ib_write_bw`` report
- ``nccl_tests``: the nccl-tests ``*_perf`` results table (busbw per size, average, failures)
- ``ping``: iputils ``ping``
- ``iperf3``: ``iperf3 -J`` (client side)
- ``nccl_log``: NCCL_DEBUG lines in a log tail: version, network and devices, and known failures with hints

Recorded real outputs these are tested on live in ``tests/fixtures/real/<module>/`` with a SOURCE.md each.
"""
