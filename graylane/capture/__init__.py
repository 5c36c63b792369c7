"""Samples from recorded traffic: calibration sets and held-out checks from real requests.

Room: the library. May import the library; no service.
"""
