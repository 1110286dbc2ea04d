"""widelimit.relax.cones."""
