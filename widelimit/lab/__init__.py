"""widelimit.lab."""
