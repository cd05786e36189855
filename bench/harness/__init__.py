"""The harness every suite and probe runs on: the one timer (:mod:`.timer`), the one result
record (:mod:`.record`) with its environment block (:mod:`.environment`), the runner
(:mod:`.runner`), and what reads records: ``compare``, ``plot``, tables and the docs pages.
Importing the package imports nothing heavy."""

__all__: list[str] = []
