"""Internal helpers (numerics)."""
