"""Built-in targets, one module each: ``tensorrt``, ``onnxruntime``, ``openvino``, ``lattice``.

Each target module exposes ``BACKEND``, registered in the ``embedl_dynamo.backends`` entry-point
group. The other modules hold what targets share: placement rules (``placement_rules``,
``attention_placement``), ONNX Runtime's preparation (``ort_preparation``) and the shared
SmoothQuant list (``common``; the shared conversions and fusions are
:mod:`embedl_dynamo.patterns.common`).
"""
