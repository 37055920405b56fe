"""Other launchers' flags (torchrun, fleetrun/paddle.distributed.launch, DeepSpeed, mpirun): what each is in clusterrun.

One table for every command: :func:`explain` turns an option clusterrun does not have into a one-line answer that
names clusterrun's equivalent, says that clusterrun derives the value itself, or says why there is none. `up`,
`plan` and `export` read their command line with it (:mod:`clusterrun.cli.job_argv`); the other commands get it
through click's no-such-option error (:func:`clusterrun.cli.main.main`). Imports nothing: ``--help`` stays fast.
"""

from __future__ import annotations

from collections.abc import Collection

#: Other launchers' spellings of clusterrun's options, understood as clusterrun's (`up`, `plan`, `export`).
ALIASES = {
    "--nproc_per_node": "--nproc-per-node",
    "--num_gpus": "--nproc-per-node", "--num-gpus": "--nproc-per-node",  # DeepSpeed: processes per node
    "--num_accelerators": "--nproc-per-node",  # DeepSpeed's newer name for --num_gpus
    "--master_port": "--master-port",
    "--devices": "--gpus",  # fleetrun / paddle.distributed.launch: device indices on every node
    "--env_forward": "--env-forward", "--runs_dir": "--runs-dir", "--data_nic": "--data-nic",
    "--ssh_user": "--ssh-user", "--ssh_config": "--ssh-config",
}

# What clusterrun works out itself: given by hand, it would contradict the plan.
_NODES = "clusterrun counts the nodes it is given (inventory, --ips, --hostfile, --slurm); --nodes picks some of them"
_RANK = "each node's rank is its place in the node list (the first is 0); `node_rank` in the inventory pins ranks"
_MASTER = ("the master is rank 0's node on the data network: list the node you want first (or pin `node_rank: 0`); "
           "--data-nic chooses the network")
_RDZV = "clusterrun sets the rendezvous itself (rank 0's data address and --master-port)"
_BIND = "each rank is bound to its GPU's NUMA node from the node's topology"
#: flag -> why clusterrun sets it itself (the message ends "; drop it").
DERIVED = {
    "--nnodes": _NODES, "--num_nodes": _NODES, "--num-nodes": _NODES,
    "--node_rank": _RANK, "--node-rank": _RANK,
    "--rank": _RANK,  # fleetrun: this node's rank
    "--master_addr": _MASTER, "--master-addr": _MASTER,
    "--master": f"{_MASTER}, --master-port the port",  # fleetrun: --master IP:PORT
    "--rdzv_endpoint": _RDZV, "--rdzv-endpoint": _RDZV, "--rdzv_backend": _RDZV, "--rdzv-backend": _RDZV,
    "--rdzv_id": _RDZV, "--rdzv-id": _RDZV, "--rdzv_conf": _RDZV, "--rdzv-conf": _RDZV,
    "--job_id": "each run gets its own run id (printed at the start; runs/<run-id>/)",
    "--standalone": "SCRIPT alone, with no inventory and no --ips/--hostfile/--slurm, runs on this machine "
                    "(clusterrun up train.py)",
    "--bind_cores_to_rank": _BIND, "--bind-to": _BIND, "--map-by": _BIND,
}

#: derived flag -> (an option of clusterrun it may have been meant for, what that one does).
_NEAR = {"--rank": ("--ranks", "--ranks LIST shows only some ranks' output")}

_LOGS = "--runs-dir DIR (every rank's output is written to DIR/<run-id>/<node>/rank<R>.log; default ./runs)"
_SHOWN = "--ranks LIST (every rank's output is shown prefixed [node:rank] and logged; --ranks shows only some)"
_ACCEL = ("--gpus LIST for device indices, --nproc-per-node N for a count (clusterrun selects NVIDIA GPUs with "
          "CUDA_VISIBLE_DEVICES; other accelerators' device lists are not set)")
_PER_NODE = "--nproc-per-node N (processes on every node; clusterrun counts per node, not in total)"
_RESTARTS = "--max-restarts N (the whole job starts again after the nodes are checked; --min-nodes M to go on " \
            "without a lost node)"
_SSH_PORT = "host:PORT in --ips, Port in ssh_config (--ssh-config), or ssh.port in an inventory"
#: flag -> (clusterrun's option, text): "clusterrun's equivalent is TEXT". The option must exist on the command
#: for the answer to be given (`doctor` has no --runs-dir); TEXT starts with it.
EQUIVALENTS = {
    "--log_dir": ("--runs-dir", _LOGS), "--log-dir": ("--runs-dir", _LOGS),
    "--tee": ("--ranks", _SHOWN), "--redirects": ("--ranks", _SHOWN),
    "--local-ranks-filter": ("--ranks", _SHOWN), "--local_ranks_filter": ("--ranks", _SHOWN),
    "--npus": ("--gpus", _ACCEL), "--xpus": ("--gpus", _ACCEL),
    "-np": ("--nproc-per-node", _PER_NODE), "-npernode": ("--nproc-per-node", _PER_NODE),
    "--npernode": ("--nproc-per-node", _PER_NODE),
    "--max_restarts": ("--max-restarts", _RESTARTS), "--max_restart": ("--max-restarts", _RESTARTS),
    "--max-restart": ("--max-restarts", _RESTARTS), "--elastic_level": ("--max-restarts", _RESTARTS),
    "--min_elastic_nodes": ("--min-nodes", _RESTARTS), "--max_elastic_nodes": ("--min-nodes", _RESTARTS),
    "--host": ("--ips", "--ips HOSTS (comma-separated, in rank order; processes per node from --nproc-per-node)"),
    "-H": ("--ips", "--ips HOSTS for a host list, --hostfile FILE for a hostfile"),
    "--include": ("--nodes", "--nodes PATTERN to pick nodes, --gpus LIST for their GPUs"),
    "--exclude": ("--nodes", "--nodes PATTERN: list the nodes to use (a name glob, gpu0[1-3] or label=VALUE)"),
    "--launcher": ("--transport", "--transport ssh|srun (how clusterrun reaches the nodes)"),
    "--ssh_port": ("--ips", _SSH_PORT), "--ssh-port": ("--ips", _SSH_PORT),
    "--local_addr": ("--data-nic", "--data-nic NAME|CIDR (each node's address is taken on that network)"),
    "--local-addr": ("--data-nic", "--data-nic NAME|CIDR (each node's address is taken on that network)"),
    "-x": ("--env", "-e KEY=VALUE (or --env-forward PATTERN to send this machine's variables)"),
}

#: mpirun's single-dash words, matched whole (a short option with its value would read -np as -n p).
SINGLE_DASH = frozenset({"-np", "-npernode"})

#: flag -> why clusterrun has no such option (and what to do instead).
WITHOUT = {
    "--no_python": "clusterrun runs Python: SCRIPT or -m MODULE; for any other command on every node use clusterrun exec",
    "--no-python": "clusterrun runs Python: SCRIPT or -m MODULE; for any other command on every node use clusterrun exec",
    "--no_local_rank": "clusterrun passes no --local_rank argument; the script reads LOCAL_RANK from its environment",
    "--servers": "clusterrun runs collective jobs under torchrun; parameter-server mode is not supported",
    "--workers": "clusterrun runs collective jobs under torchrun; parameter-server mode is not supported",
}


def explain(flag: str, options: Collection[str]) -> str | None:
    """The one-line answer for ``flag`` (without its ``=value``), an option of another launcher that the command
    (whose option strings are ``options``) lacks; None when the table does not know it, or when its clusterrun
    equivalent is not an option of this command."""
    if flag in DERIVED:
        near, does = _NEAR.get(flag, ("", ""))
        return f"{flag}: clusterrun sets this itself; {DERIVED[flag]}; drop it" + (f" ({does})" if near in options else "")
    if flag in ALIASES and ALIASES[flag] in options:
        return f"no such option: {flag}; clusterrun's equivalent is {ALIASES[flag]}"
    if flag in EQUIVALENTS:
        option, text = EQUIVALENTS[flag]
        return f"no such option: {flag}; clusterrun's equivalent is {text}" if option in options else None
    if flag in WITHOUT:
        return f"no such option: {flag}; {WITHOUT[flag]}"
    return None
