"""Benchmarks: speed figures reported in notes, never asserted by the default test run."""
