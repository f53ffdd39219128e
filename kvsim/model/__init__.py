"""The formulas: copy paths and their selection, CPU cost, link sharing, the GIL hand-over.

Pure functions and data of a hardware description; no SimPy, no CUDA, no clock.
"""
