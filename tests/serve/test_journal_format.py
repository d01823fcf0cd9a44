"""The journal's format (issue #37 point 2): a journal written by the release of 4f4bf47 is migrated
(schema version, checksums); one written by 7500b5a (whose metrics, lifecycle, ledger and direct
modules created their own tables) opens with every record and the one schema's every table; a
record whose bytes were flipped refuses to start, by table and row, though SQLite's
``quick_check`` passes."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from datamill.serve.journal.schema import DB_NAME, SCHEMA_VERSION, SEALED, StateError, seal
from datamill.serve.journal.store import Journal

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "serve"


def test_a_journal_of_release_4f4bf47_is_migrated(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    shutil.copyfile(FIXTURE / "journal-4f4bf47.sqlite3", state / DB_NAME)
    expected = json.loads((FIXTURE / "journal-4f4bf47.json").read_text())
    j = Journal(state)
    try:
        assert [r["id"] for r in j.iterations()] == expected["iterations"]
        for it_id, units in expected["done"].items():
            assert [u for a, b in j.done_runs(it_id) for u in range(a, b)] == units
        assert [k["id"] for k in j.list_keys()] == expected["keys"]
        assert all(j.is_cancelled(i) for i in expected["cancelled"])
        leases = [r[0] for r in j._exec("SELECT id FROM leases ORDER BY rowid")]
        assert leases == expected["leases"]
        assert j._exec("PRAGMA user_version")[0][0] == SCHEMA_VERSION
        for table in SEALED:  # every record of the old release was sealed by the migration
            assert j._exec(f"SELECT COUNT(*) FROM {table} WHERE crc IS NULL")[0][0] == 0
    finally:
        j.close()
    Journal(state).close()  # and opens again, checked


def _tables(j: Journal) -> dict[str, list[str]]:
    names = [r[0] for r in j._exec("SELECT name FROM sqlite_master WHERE type = 'table'")]
    return {t: [r[1] for r in j._exec(f"PRAGMA table_info({t})")] for t in sorted(names)}


def test_a_journal_of_release_7500b5a_opens_with_every_record(tmp_path: Path) -> None:
    from datamill.serve.data.direct import ClientLocations

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    shutil.copyfile(FIXTURE / "journal-7500b5a.sqlite3", state / DB_NAME)
    expected = json.loads((FIXTURE / "journal-7500b5a.json").read_text())
    fresh = Journal(tmp_path / "fresh")
    j = Journal(state)
    try:
        assert _tables(j) == _tables(fresh)  # one schema, whichever release created a table
        assert [r["id"] for r in j.iterations()] == expected["iterations"]
        for it_id, units in expected["done"].items():
            assert [u for a, b in j.done_runs(it_id) for u in range(a, b)] == units
        assert [k["id"] for k in j.list_keys()] == expected["keys"]
        assert all(j.is_cancelled(i) for i in expected["cancelled"])
        assert [r[0] for r in j._exec("SELECT id FROM leases ORDER BY rowid")] == expected["leases"]
        for ds, loc in expected["client_locations"].items():
            assert ClientLocations(j).get(ds) == loc
        counters = j._exec("SELECT iteration, name, value FROM counters")
        assert sorted(list(r) for r in counters) == expected["counters"]
        lifecycle = j._exec("SELECT iteration, status FROM lifecycle")
        assert sorted(list(r) for r in lifecycle) == expected["lifecycle"]
        assert j._exec("PRAGMA user_version")[0][0] == SCHEMA_VERSION
    finally:
        j.close()
        fresh.close()


def test_a_flipped_byte_in_a_record_refuses_to_start_naming_it(tmp_path: Path) -> None:
    j = Journal(tmp_path)
    j.add_done("it-1", [(0, 4)], lease="lease-AAAAAAAA")
    j.add_done("it-1", [(4, 8)], lease="lease-BBBBBBBB")
    j.close()
    db = tmp_path / DB_NAME
    raw = db.read_bytes()
    assert raw.count(b"lease-BBBBBBBB") == 1
    db.write_bytes(raw.replace(b"lease-BBBBBBBB", b"lease-BBBBBBBC"))
    con = sqlite3.connect(db)
    try:
        assert con.execute("PRAGMA quick_check").fetchone()[0] == "ok"  # SQLite sees nothing
    finally:
        con.close()
    with pytest.raises(StateError) as err:
        Journal(tmp_path)
    text = str(err.value)
    assert "done record (rowid 2)" in text and "checksum" in text and str(db) in text


def test_a_journal_of_a_newer_schema_is_refused(tmp_path: Path) -> None:
    Journal(tmp_path).close()
    con = sqlite3.connect(tmp_path / DB_NAME)
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    con.close()
    with pytest.raises(StateError, match="newer datamill"):
        Journal(tmp_path)


@given(st.integers(-(10**300), 10**300), st.integers(-(1 << 53), 1 << 53))
def test_a_seal_reads_an_int_as_the_float_it_is_stored_as(n: int, exact: int) -> None:
    # an int is covered as the text of float(int) (".17g"), however the seal formats it
    for v in (n, exact):
        assert seal("it", v, None) == seal("it", format(float(v), ".17g"), None)
    assert seal(exact) == seal(float(exact))
