"""widelimit.coding.pdas."""
