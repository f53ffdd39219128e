"""What both executors share: the API table, the per-call pipeline, the records and metrics
of a run, and the one result type both produce. No clock of its own.
"""
