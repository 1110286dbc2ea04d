"""widelimit.data."""
