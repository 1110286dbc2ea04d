"""widelimit.exact.solve."""
