"""The discrete-event model: SimPy executor with lock, GIL, link, copy and CPU-cost models."""
