"""widelimit.engine."""
