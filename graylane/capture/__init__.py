"""Samples from recorded traffic: calibration sets and held-out checks from real requests."""
