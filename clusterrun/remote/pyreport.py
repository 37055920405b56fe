"""Doctor's report of a node's Python: versions of Python, torch, CUDA and NCCL, the distributed backends.

Printed as one JSON object. It imports torch (seconds of CPU): only doctor runs it, never a launch.
"""
import json
import platform
import sys

out = {"python": platform.python_version(), "executable": sys.executable}
try:
    import torch
    import torch.distributed as dist
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
    out["backends"] = [b for b, ok in (("gloo", dist.is_gloo_available()), ("nccl", dist.is_nccl_available()),
                                       ("mpi", dist.is_mpi_available())) if ok]
    try:
        out["cuda_devices"] = torch.cuda.device_count()
        if torch.cuda.is_available() and dist.is_nccl_available():
            out["nccl"] = ".".join(str(p) for p in torch.cuda.nccl.version())
    except Exception as exc:
        out["cuda_error"] = "%s: %s" % (type(exc).__name__, exc)
except Exception as exc:
    out["torch_error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
