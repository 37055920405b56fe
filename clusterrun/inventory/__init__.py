"""Inventory: models, loading and other host sources."""
