"""The pattern library: conversions, fusions and the fused modules they create.

Backends (``embedl_dynamo.backends.*``) pick from these to build their pattern lists.
"""
