"""clusterrun: launch and check multi-node PyTorch training from one inventory."""

__version__ = "0.1.0"
