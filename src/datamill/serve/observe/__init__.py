"""Observability: ``/metrics`` (folds of the journal's records and the telemetry counters), the
structured log, the iterations' lifecycle and the UI's per-client ledger."""
