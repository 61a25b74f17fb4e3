"""Closed-form memory model (placeholder)."""
