"""Suite-wide settings."""

import torch

# Every model in the suite is tiny: a second intra-op thread only spin-waits on such matrices,
# and on a loaded 2-core machine it made whole test files 4-10x slower (measured).
torch.set_num_threads(1)
