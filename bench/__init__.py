"""embedl_dynamo's benchmark harness: ``python -m bench run <suite>`` (see ``bench/__main__.py``).

One runner and one timer (:mod:`bench.harness`), model plug-ins (:mod:`bench.models`), the
variants timed against each other, ours and the peers (:mod:`bench.variants`), the suites
the docs' tables come from (:mod:`bench.suites`) and one-off investigations on the same runner
(:mod:`bench.probes`). Importing it imports no torch: the LLM peers' own environments run
parts of it.
"""

__all__: list[str] = []
