"""Scenario files: loading with line numbers, validation, running and reporting."""
