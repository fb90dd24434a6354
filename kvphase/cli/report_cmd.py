"""`kvphase report`."""
