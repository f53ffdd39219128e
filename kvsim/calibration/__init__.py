"""Calibration: fitting model parameters to measurements."""
