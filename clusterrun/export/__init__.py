"""The launch plan written for another engine: a Slurm batch script, a Kubeflow PyTorchJob or TrainJob.

Pure, like the plan: a :class:`clusterrun.planning.plan.LaunchPlan` (and its inventory) in, text out; nothing is
contacted. What the engine decides itself (which nodes, each node's rank, the master's address, the GPUs)
is taken from it at run time; what clusterrun derived and the engine can carry (processes per node, the
NCCL/Gloo environment, the script and its arguments) is written down; what it cannot carry is listed in
the document's comments. What the inventory's hosts alone make true (their NICs and HCAs) is kept by the
batch script, which runs on them, and left out of pods, whose network is another. A secret's value is
never written.

    environment.py   the plan's environment split: the same on every node, differing, secret, left out
    naming.py        job names (Kubernetes object names) and the checks of user-given names
    carry.py         what clusterrun does at run time that an exported job does without
    comments.py      the documents' comment lines, safe whatever text they quote
    sbatch.py        `clusterrun export sbatch`
    kubeflow.py      `clusterrun export pytorchjob` and `export trainjob`
"""
