"""kvsim: a discrete-event model and a hardware execution mode for a paged, tiered KV-cache manager.

The package never imports CUDA, CuPy or NVML at import time: the simulator side works on a
machine without a GPU. The GPU side lives in the separate ``hw`` package.
"""

__version__ = "0.1.0"
