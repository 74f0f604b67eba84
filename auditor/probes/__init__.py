"""Measured proof: the probe program, the limits it is judged by, and its runners."""
