"""Replays that run a trace straight through the real manager, without an executor."""
