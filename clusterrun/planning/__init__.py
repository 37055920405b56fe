"""Planning: what ``up`` runs on each node, computed from the inventory (and completed from the nodes' facts).

``plan`` makes the launch plan; ``planfile`` holds its records (plan.json's, standard library only: a detached run's
supervisor reads them on rank 0's node); ``nccl`` the NCCL/Gloo environment rules; ``network`` the data network
and each node's path on it; ``container`` the container command; ``gpuchoice`` which GPUs a node gives the run;
``complete`` the plan completed from what the nodes report.
"""
