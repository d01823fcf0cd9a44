"""The server's journal: the one SQLite file of the state folder and its records
(:mod:`~datamill.serve.journal.store`), its schema, version, checksums and folder lock
(:mod:`~datamill.serve.journal.schema`), and the group-committed lease writes
(:mod:`~datamill.serve.journal.leases`)."""

from __future__ import annotations

from datamill.serve.journal.schema import DB_NAME, StateError
from datamill.serve.journal.store import Journal, backup

__all__ = ["DB_NAME", "Journal", "StateError", "backup"]
