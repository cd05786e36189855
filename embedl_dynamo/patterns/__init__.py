"""The pattern library: conversions, fusions and the fused modules they create.

Backends (``embedl_dynamo.backends.*``) pick from these to build their pattern lists; the lists
the built-in targets share are :mod:`embedl_dynamo.patterns.common`.
"""
