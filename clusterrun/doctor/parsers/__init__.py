"""Pure parsers for the output of the tools ``clusterrun doctor`` runs on a node.

Each module takes the text one tool printed and returns frozen records; output it
does not recognise raises :class:`clusterrun.errors.ParseError` naming the tool and
the offending line. No module runs anything.

- ``nvidia_smi``: ``nvidia-smi --query-gpu`` and ``--query-compute-apps`` CSV
- ``topo``: the ``nvidia-smi topo -m`` matrix (GPU/NIC links, CPU and NUMA affinity, NIC legend)
- ``ip``: ``ip -j addr show`` and ``ip -j link show``
- ``ibstat``: ``ibstat``, ``ibv_devinfo [-v]``, ``show_gids`` and ``ibdev2netdev``
- ``ib_write_bw``: the perftest ``ib_write_bw`` report
- ``ping``: iputils ``ping``
- ``iperf3``: ``iperf3 -J`` (client side)
- ``nccl_log``: known NCCL / Gloo / torch.distributed failure lines in a log tail, with hints
"""
