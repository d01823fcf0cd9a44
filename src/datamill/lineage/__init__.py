"""Lineage: everything that reads run records (the loader only writes them,
:func:`datamill.loader.record.run_record`).

* :func:`trace` / :class:`Tracer` (``datamill trace``): which steps read a sample, which samples a
  step read, from the record alone; :class:`RunTracer` several records of one run;
* :mod:`datamill.lineage.diff` (``datamill diff``), :mod:`datamill.lineage.splits`
  (``datamill check-splits``), :mod:`datamill.lineage.fetch` (records from a server).
"""

from __future__ import annotations

from datamill.lineage.join import RunTracer
from datamill.lineage.record import BatchTrace, Hit, load_record

# the function; the module stays datamill.lineage.trace in sys.modules
from datamill.lineage.trace import Tracer, trace

__all__ = ["BatchTrace", "Hit", "RunTracer", "Tracer", "load_record", "trace"]
