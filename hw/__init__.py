"""GPU execution side of kvsim; imports CuPy/NVML lazily."""
