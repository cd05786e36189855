"""``torch.compile`` integration: the dynamo backends (:mod:`.entry_points`) and what they run
per subgraph (:mod:`.compile`: freeze, pipeline, runtime, fallback, warm start, lazy INT8).
"""
