"""Routers decide who writes the next reasoning step."""
