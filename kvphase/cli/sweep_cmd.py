"""`kvphase sweep`."""
