"""The eager runtime."""
