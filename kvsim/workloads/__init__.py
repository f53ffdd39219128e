"""Workload generators: sequences of manager API calls."""
