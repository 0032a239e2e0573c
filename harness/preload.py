"""The imports every worker needs, paid once by the forkserver that forks the workers.

A worker started from a fresh interpreter spends ~2 s importing torch and ~3 s more importing
torch._dynamo the first time an optimizer is built; forked from a server that did both, it starts
in milliseconds. Nothing here imports a subject: each worker loads its own.
"""

import os

# one intra-op thread per worker: the parent runs several side by side on few cores
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import safetensors.torch  # noqa: E402, F401  (save_transformer / load_transformer)
import torch  # noqa: E402

import harness.probes  # noqa: E402, F401
import harness.subjects  # noqa: E402, F401
import harness.worker  # noqa: E402, F401

torch.set_num_threads(1)
torch.optim.Adam([torch.zeros(1, requires_grad=True)])  # imports torch._dynamo now
