"""What the ``embedl_*`` dynamo backends did with each subgraph, reachable by the user.

One :class:`~.subgraph.SubgraphReport` per subgraph, holding what it shows (names, numbers,
the plan's rows as a :class:`~.plan_rows.PlanSnapshot`), never a graph or a weight; the record
of the last compile's subgraphs (:mod:`.record`: :func:`~.record.last_report`,
:func:`~.record.clear_reports`, :func:`~.record.explain`); their summary,
:class:`~.compile_report.CompileReport`; and its HTML page (:mod:`.html`). Imports run one way:
plan_rows < subgraph < html < compile_report < record.
"""

__all__: list[str] = []
