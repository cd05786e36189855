"""From a model to the canonical IR: capture, freeze, one spelling per op (canonicalize, attention
forms), shape metadata for new nodes, and a normalised printer. Imports nothing above it.
"""
