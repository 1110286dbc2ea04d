"""widelimit.learn."""
