"""The server's journal: the one SQLite file and its records (``store``), its schema, version,
checksums and folder lock (``schema``), the group-committed lease writes (``leases``).
"""

from __future__ import annotations

from datamill.serve.journal.schema import DB_NAME, StateError
from datamill.serve.journal.store import Journal, backup

__all__ = ["DB_NAME", "Journal", "StateError", "backup"]
