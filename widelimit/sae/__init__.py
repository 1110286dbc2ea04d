"""widelimit.sae.model."""
