"""Built-in targets, one module each: ``tensorrt``, ``onnxruntime``, ``lattice``.

Each module exposes ``BACKEND``, registered in the ``embedl_dynamo.backends`` entry-point group.
"""
