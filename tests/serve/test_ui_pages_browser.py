"""The UI points of issue #26 in Debian's Chromium (playwright) against a real ``datamill serve``.

Run status, lifecycle and filters; confirmations (cancel, rewind with leases held, revoking a key,
your own twice); a run's history across epochs; the throughput chart after a rewind and a cancel;
counters after a server restart; statistics (rows vs samples, top-values bars, float32 precision,
the HDF5 page); samples (UID and row lookup, filter, paging, typed cells, bounds); favicon and
config labels; and accessibility (labels, tab order, contrast, no overflow at 400 px). One server
for the module (restarted once, by pid, on the same state); every loop is bounded.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamill.client import Client, Leases, RemoteLoader, Transport
from datamill.core.io import read_table
from datamill.preprocessing.api import preprocess
from datamill.serve.journal.schema import DB_NAME
from datamill.shards.dataset import ShardsetDataset
from tests.serve._browser import chromium, login, need_chromium
from tests.serve._opts import grouped
from tests.serve._proc import free_port, make_key, start_server, stop
from tests.serve.test_ui_browser import DATA, build_cifar

pytestmark = [pytest.mark.server, pytest.mark.browser]


def _build(root: Path) -> dict[str, Path]:
    cifar = build_cifar(root)
    ds = ShardsetDataset(cifar)
    uids = ds.uids.to_pylist()
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((len(uids), 12)).astype(np.float32)
    feat = pa.table(
        {
            "uid": uids,
            "score": pa.array(rng.random(len(uids)).astype(np.float32) / 10, pa.float32()),
            "emb": pa.array(list(emb), pa.list_(pa.float32())),
        }
    )
    ds.add("feat", feat, route=True)
    houses = read_table(DATA / "house_prices_train.csv")
    pq.write_table(houses, root / "houses.parquet", row_group_size=500)
    pq.write_table(
        houses.select(["LotArea", "Street", "SalePrice"]).slice(0, 300), root / "small.parquet"
    )
    preprocess(
        root / "small.parquet",
        {
            "input_features": [
                {"name": "Street", "type": "category"},
                {"name": "LotArea", "type": "number"},
            ],
            "output_features": [{"name": "SalePrice", "type": "number"}],
            "preprocessing": {"split": {"type": "none"}},
        },
        output_dir=root / "pre",
    )
    return {"cifar": cifar}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    need_chromium()
    base = tmp_path_factory.mktemp("uipages")
    paths = _build(base / "root")
    state = base / "state"
    admin = make_key(state, "admin")
    port = free_port()
    env: dict[str, Any] = {
        "url": f"http://127.0.0.1:{port}",
        "admin": admin,
        "base": base,
        "state": state,
        "port": port,
        "path": paths["cifar"],
    }
    env["proc"] = start_server(base / "root", state, port)
    try:
        with Client(env["url"], admin) as c:
            env["id"] = c.register("cifar", name="cifar")["id"]
            env["houses"] = c.register("houses.parquet", name="houses")["id"]
            env["pre"] = c.register("pre/small.hdf5", name="pre")["id"]
        # what several tests open, made here so that each test runs alone (or on another
        # pytest-xdist worker, with its own server): the "hist" run of two finished epochs, and a
        # cancelled iteration
        assert _iterate(env, "hist", epoch=0) == 10
        assert _iterate(env, "hist", epoch=1) == 10
        with Client(env["url"], admin) as c:
            c.cancel(c.iteration("cifar", batch_size=10, leases=Leases(name="stopped"))["id"])
        yield env
    finally:
        stop(env["proc"])


@pytest.fixture(scope="module")
def browser(srv: dict[str, Any]) -> Iterator[Any]:
    with chromium() as b:
        yield b


def _login(browser: Any, srv: dict[str, Any], key: str | None = None, *, width: int = 1280) -> Any:
    return login(browser, srv["url"], key or srv["admin"], width=width, path="/ui/login")


def _iterate(
    srv: dict[str, Any],
    name: str,
    *,
    epoch: int = 0,
    batch_size: int = 10,
    lease_size: int = 2,
    **kw: Any,
) -> int:
    loader = RemoteLoader(
        srv["url"],
        srv["admin"],
        "cifar",
        **grouped(
            batch_size=batch_size,
            name=name,
            epoch=epoch,
            collate="arrow",
            lease_size=lease_size,
            **kw,
        ),
    )
    return sum(1 for _ in loader)


def _take_lease(srv: dict[str, Any], it_id: str, client: str, rank: int = 0) -> None:
    """Take one lease over HTTP and never acknowledge it (a client holding a lease)."""
    conn = http.client.HTTPConnection("127.0.0.1", srv["port"], timeout=30)
    conn.request(
        "GET",
        f"/api/v1/iterations/{it_id}/next?client={client}&rank={rank}",
        headers={"Authorization": f"Bearer {srv['admin']}"},
    )
    res = conn.getresponse()
    res.read()
    conn.close()
    assert res.status == 200, res.status


def _svg_title(page: Any, scope: str) -> str:
    return str(page.locator(f"{scope} svg.chart title").first.text_content())


def _journal(srv: dict[str, Any], sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Rows of a query on the server's journal (read-only: what the server has written so far)."""
    db = srv["state"] / DB_NAME
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)) as conn:
        try:
            return list(conn.execute(sql, args))
        except sqlite3.OperationalError as exc:  # the table is made by the first upkeep tick
            if "no such table" in str(exc):
                return []
            raise


def _wait_for(what: str, ready: Callable[[], bool], *, timeout: float = 30.0) -> None:
    """Poll ``ready()`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"{what}: not after {timeout} s"
        time.sleep(0.05)


def _acks_journaled(srv: dict[str, Any], it_id: str, *, at_least: int) -> None:
    """Wait until the client's acks reached the server: journaled (``done``, the records the
    throughput chart is drawn from) before they are answered."""

    def ready() -> bool:
        with Client(srv["url"], srv["admin"]) as c:
            return int(c.progress(it_id)["done"]) >= at_least

    _wait_for(f"{at_least} acks of {it_id} journaled", ready)


# --------------------------------------------------------------------------------------- iterations
def test_status_badges_lifecycle_filters_and_paging(browser: Any, srv: dict[str, Any]) -> None:
    """The module's first test: the server holds the fixture's iterations and these two."""
    with Client(srv["url"], srv["admin"]) as c:
        cancelled = c.iteration("cifar", batch_size=10, leases=Leases(name="to-cancel"))
        c.cancel(cancelled["id"])
        running = c.iteration("cifar", batch_size=5, leases=Leases(name="still-running"))
    page = _login(browser, srv)
    page.goto(srv["url"] + "/ui/iterations")
    rows = {
        r.get_attribute("data-iteration"): r for r in page.locator("#iterations tbody tr").all()
    }
    assert rows[running["id"]].locator(".badge").inner_text() == "running"
    assert rows[cancelled["id"]].locator(".badge").inner_text() == "cancelled"
    fin = page.locator("#iterations tbody tr", has_text="hist").first
    assert fin.locator(".badge").inner_text() == "finished"
    cells = fin.locator("td").all_inner_texts()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", cells[4]) and cells[5][:2] == "20"
    assert re.fullmatch(r"\d+ ms|\d+\.\d s", cells[6]), cells
    assert rows[running["id"]].locator("[data-stat=duration]").inner_text().endswith("so far")
    # filters: status, name, dataset (a form of GETs)
    page.select_option("#f-status", "finished")
    page.click("#filters button[type=submit]")
    assert set(
        page.locator("#iterations tbody tr").evaluate_all("rs => rs.map(r => r.dataset.status)")
    ) == {"finished"}
    assert page.locator("#iterations tbody tr").count() == 2
    page.select_option("#f-status", "")
    page.fill("#f-name", "cancel")
    page.click("#filters button[type=submit]")
    assert [
        r.get_attribute("data-iteration") for r in page.locator("#iterations tbody tr").all()
    ] == [cancelled["id"]]
    page.goto(srv["url"] + "/ui/iterations?dataset=houses")
    assert page.locator("#no-iterations").count() == 1
    # paging: 2 per page, First/Next links walk every row exactly once
    seen: list[str] = []
    page.goto(srv["url"] + "/ui/iterations?limit=2")
    for _ in range(10):
        seen += [
            str(r.get_attribute("data-iteration"))
            for r in page.locator("#iterations tbody tr").all()
        ]
        if page.locator("#next-page").count() == 0:
            break
        page.click("#next-page")
    assert len(seen) == len(set(seen)) == 5  # hist 0 and 1, the fixture's cancelled, these two
    assert page.locator("#first-page").count() == 1
    # the iteration page: badge, start, end, duration; readable config labels
    page.goto(srv["url"] + f"/ui/iterations/{seen[-1]}")  # newest first: the last is "hist" 0
    assert page.locator("#status").inner_text() == "finished"
    assert page.locator("#lifecycle [data-stat=ended]").inner_text().endswith("UTC")
    assert re.fullmatch(
        r"\d+ ms|\d+\.\d s", page.locator("#lifecycle [data-stat=duration]").inner_text()
    )
    labels = page.locator("#config dt").all_inner_texts()
    assert (
        "batch size" in labels and "lease timeout" in labels and not any("_" in x for x in labels)
    )
    assert page.locator("#cancel-form").count() == 0 and page.locator("#rewind-form").count() == 0
    page.context.close()


def test_cancel_asks_first_and_names_what_is_lost(browser: Any, srv: dict[str, Any]) -> None:
    with Client(srv["url"], srv["admin"]) as c:
        it = c.iteration("cifar", batch_size=5, leases=Leases(name="cancel-me", size=1))
    stream = iter(
        RemoteLoader(
            srv["url"],
            srv["admin"],
            "cifar",
            batch_size=5,
            collate="arrow",
            leases=Leases(name="cancel-me", size=1),
            transport=Transport(prefetch=1),
        )
    )
    for _ in range(10):  # half of the 20 batches (the chart spans at least a second)
        next(stream)
    _acks_journaled(srv, it["id"], at_least=9)
    _take_lease(srv, it["id"], "holder")
    page = _login(browser, srv)
    page.goto(srv["url"] + f"/ui/iterations/{it['id']}")
    assert page.locator("#status").inner_text() == "running"
    page.click("#cancel-form button")
    lost = page.locator("#confirm-what").inner_text()
    assert (
        re.search(r"\b(9|10|11|12) of 20 batches not yet delivered", lost)
        and "cannot be undone" in lost
    ), lost
    assert re.search(r"\b[1-9]\d* leased now", lost), lost
    page.click("#keep")  # changed my mind: nothing happened
    assert page.locator("#status").inner_text() == "running"
    page.click("#cancel-form button")
    page.click("#confirm")
    assert page.url.endswith(f"/ui/iterations/{it['id']}")  # post/redirect/get
    assert (
        page.locator("#status").inner_text() == "cancelled"
        and page.locator("#cancel-form").count() == 0
    )
    assert "0 to 0.0 s" not in page.content()
    title = _svg_title(
        page, "#live"
    )  # the chart ends at the cancel, marked; its rate is the real one
    peak = float(re.search(r"peak ([\d,.]+) batches/s", title).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert (
        0 < peak < 100 and page.locator("#live svg text.mark", has_text="cancelled").count() == 1
    ), title
    page.reload()  # a reload repeats nothing
    assert page.locator("#status").inner_text() == "cancelled"
    stream.close()  # the loader's generator: its iteration is cancelled
    page.context.close()


def test_rewind_confirms_while_leases_are_held_and_shows_what_changed(
    browser: Any, srv: dict[str, Any]
) -> None:
    with Client(srv["url"], srv["admin"]) as c:
        it = c.iteration("cifar", batch_size=4, leases=Leases(name="rw-live", size=2))
    stream = iter(
        RemoteLoader(
            srv["url"],
            srv["admin"],
            "cifar",
            batch_size=4,
            collate="arrow",
            leases=Leases(name="rw-live", size=2),
        )
    )
    for _ in range(20):
        next(stream)
    _acks_journaled(srv, it["id"], at_least=19)  # acks flushed, a second of chart history
    with Client(srv["url"], srv["admin"]) as c:
        if c.progress(it["id"])["pending"]:
            _take_lease(srv, it["id"], "holder")
        assert c.progress(it["id"])["leased"] > 0
    page = _login(browser, srv)
    page.goto(srv["url"] + f"/ui/iterations/{it['id']}")
    before = _svg_title(page, "#live")
    page.fill("#rw-consumed", "5")
    page.click("#rewind-form button[type=submit]")
    warn = page.locator("#confirm-what").inner_text()
    assert "lease" in warn and "will be revoked" in warn and "to 5 done batches" in warn
    page.click("#confirm")
    assert re.search(rf"/ui/iterations/{it['id']}(#rewound)?$", page.url)
    change = page.locator("#rewound").inner_text()
    assert "rank 0 went from" in change and "to 5 done batches" in change and "revoked" in change
    page.reload()
    assert page.locator("#rewound").count() == 1
    # the chart: the rewind is a mark, not 122,009 batches/s over "0 to 0.0 s"
    after = _svg_title(page, "#live")
    peak = float(re.search(r"peak ([\d,.]+) batches/s", after).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert peak < 1000, (before, after)
    assert (
        " 0.0 s" not in after
        and page.locator("#live svg text.mark", has_text="rewind").count() == 1
    )
    axes = page.locator("#live svg text.axis").all_text_contents()
    assert "batches/s" in axes and any("(s)" in a for a in axes)
    # every chart text renders at >= 11 px, also at 400 px width
    for width in (1280, 400):
        page.set_viewport_size({"width": width, "height": 900})
        sizes = page.eval_on_selector_all(
            "#live svg text",
            """els => els.map(e => {
            const svg = e.ownerSVGElement;
            const scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
            return parseFloat(getComputedStyle(e).fontSize) * scale; })""",
        )
        assert sizes and min(sizes) >= 11, (width, min(sizes))
    stream.close()  # the abandoned loader's generator
    page.context.close()


def test_run_history_across_epochs_linked_from_the_dataset(
    browser: Any, srv: dict[str, Any]
) -> None:
    page = _login(browser, srv)
    page.goto(srv["url"] + f"/ui/datasets/{srv['id']}")
    page.locator("#runs a", has_text="hist").click()
    assert page.url.endswith("/ui/runs/hist")
    rows = page.locator("#epochs tbody tr")
    assert [r.get_attribute("data-epoch") for r in rows.all()] == ["0", "1"]
    for r in rows.all():
        assert r.locator("[data-stat=batches]").inner_text() == "10"
        assert re.fullmatch(r"[\d,.]+", r.locator("[data-stat=rate]").inner_text())
        assert re.fullmatch(r"\d+ ms|\d+\.\d s", r.locator("[data-stat=duration]").inner_text())
    for r in rows.all():  # each client's stall (and batches) per epoch
        assert (
            r.locator("[data-stat=clients]").inner_text()
            == str(r.locator("li[data-client]").count())
            != "0"
        )
        assert re.fullmatch(
            r"\S+ (\d+ ms|\d+\.\d s) \(\d+\)", r.locator("li[data-client]").first.inner_text()
        )
    page.click("#dataset-link")  # and back
    assert page.url.endswith(f"/ui/datasets/{srv['id']}")
    page.context.close()


def test_counters_survive_a_server_restart(browser: Any, srv: dict[str, Any]) -> None:
    with Client(srv["url"], srv["admin"]) as c:
        it = c.iteration("cifar", batch_size=10, leases=Leases(name="restart", size=1, timeout=1.0))
    _take_lease(srv, it["id"], "ghost")  # never acknowledged: expires, its batch is re-issued

    def ghost_expired() -> bool:  # reading the progress expires the leases past their deadline
        with Client(srv["url"], srv["admin"]) as c:
            return int(c.progress(it["id"])["leased"]) == 0

    _wait_for("the ghost's 1 s lease expired", ghost_expired)
    assert _iterate(srv, "restart", batch_size=10, lease_size=1, lease_timeout=1.0) >= 9

    def journaled() -> bool:  # an upkeep tick wrote the counters and the clients' batches
        counters = dict(
            _journal(srv, "SELECT name, value FROM counters WHERE iteration = ?", it["id"])
        )
        batches = _journal(srv, "SELECT SUM(batches) FROM ui_clients WHERE iteration = ?", it["id"])
        return (
            counters.get("leases_expired", 0) >= 1
            and counters.get("leases_reissued", 0) >= 1
            and bool(batches)
            and batches[0][0] == 10
        )

    _wait_for("counters and client batches journaled", journaled)
    page = _login(browser, srv)
    page.goto(srv["url"] + f"/ui/iterations/{it['id']}")
    before = {k: page.locator(f"#{k}").inner_text() for k in ("expired", "reissued")}
    clients = {
        r.get_attribute("data-client"): r.locator("[data-stat=batches]").inner_text()
        for r in page.locator("#clients tbody tr[data-client]").all()
    }
    assert int(before["expired"]) >= 1 and int(before["reissued"]) >= 1, before
    assert sum(int(v) for v in clients.values()) == 10 and len(clients) >= 1, clients
    stop(srv["proc"])
    srv["proc"] = start_server(srv["base"] / "root", srv["state"], srv["port"])
    page = _login(browser, srv)
    page.goto(srv["url"] + f"/ui/iterations/{it['id']}")
    assert {k: page.locator(f"#{k}").inner_text() for k in ("expired", "reissued")} == before
    assert {
        r.get_attribute("data-client"): r.locator("[data-stat=batches]").inner_text()
        for r in page.locator("#clients tbody tr[data-client]").all()
    } == clients
    page.context.close()


# --------------------------------------------------------------------------------------------- keys
def test_revoking_a_key_asks_and_your_own_key_asks_twice(browser: Any, srv: dict[str, Any]) -> None:
    with Client(srv["url"], srv["admin"]) as c:
        other = c.create_key(role="read", note="to revoke")
        mine = c.create_key(role="admin", note="my session")
    page = _login(browser, srv, mine["key"])
    page.goto(srv["url"] + "/ui/keys")
    page.click(f"#keys tr[data-key='{other['id']}'] button.danger")
    assert "is refused from now on" in page.locator("#confirm-what").inner_text()
    page.click("#keep")
    assert "active" in page.locator(f"#keys tr[data-key='{mine['id']}']").inner_text()
    assert "active" in page.locator(f"#keys tr[data-key='{other['id']}']").inner_text()
    page.click(f"#keys tr[data-key='{other['id']}'] button.danger")
    page.click("#confirm")
    assert (
        page.url.endswith("/ui/keys")
        and "revoked" in page.locator(f"#keys tr[data-key='{other['id']}']").inner_text()
    )
    # your own session's key: a first confirmation is not enough
    assert "(your session)" in page.locator(f"#keys tr[data-key='{mine['id']}']").inner_text()
    page.click(f"#keys tr[data-key='{mine['id']}'] button.danger")
    assert "YOUR OWN session" in page.locator("#confirm-what").inner_text()
    page.click("#confirm")
    assert "second confirmation" in page.locator("#confirm-what").inner_text()
    page.goto(
        srv["url"] + "/ui/keys"
    )  # still logged in: nothing was revoked after one confirmation
    assert "active" in page.locator(f"#keys tr[data-key='{mine['id']}']").inner_text()
    page.click(f"#keys tr[data-key='{mine['id']}'] button.danger")
    page.click("#confirm")
    page.click("#confirm")
    assert page.locator("#key").count() == 1  # logged out: the key is revoked
    page.context.close()


# --------------------------------------------------------------------------------------- statistics
def test_statistics_rows_vs_samples_top_values_precision_and_sources(
    browser: Any, srv: dict[str, Any]
) -> None:
    page = _login(browser, srv)
    page.goto(srv["url"] + f"/ui/datasets/{srv['id']}")
    cap = page.locator("#columns tr[data-column='caption']")
    assert cap.locator("[data-stat=nulls]").inner_text() == "0" and "0 of 80" in cap.inner_text()
    cap.locator("button.values").click()
    page.wait_for_selector("#columns tr[data-values-for='caption'] [data-status=done]")
    out = page.locator("#columns tr[data-values-for='caption']")
    joined = out.locator(".joined").inner_text()
    assert (
        "dataset’s 100 samples" in joined
        and out.locator("[data-stat=missing]").inner_text() == "20"
    )
    assert "shardset’s own rows" in page.locator("#stats-source").inner_text()
    # strings: a bar chart of the most common values, not a histogram of lengths
    lab = page.locator("#columns tr[data-column='label']")
    lab.locator("button.values").click()
    page.wait_for_selector("#columns tr[data-values-for='label'] [data-status=done]")
    out = page.locator("#columns tr[data-values-for='label']")
    bars = out.locator("svg.chart[aria-label^='Most common values']")
    assert bars.count() == 1 and bars.locator("rect").count() == 10
    assert out.locator("svg[aria-label^='Histogram']").count() == 0
    # float32 at float32 precision (0.0123 rather than 0.012300000153481960)
    score = page.locator("#columns tr[data-column='score']")
    table = ShardsetDataset(srv["path"]).to_table(columns=["score"]).column("score")
    lo = np.float32(np.min(table.to_numpy()))
    assert score.locator("[data-stat=min]").inner_text() == str(lo)
    assert len(str(lo)) < len(repr(float(lo)))  # the float64 digits of a float32 are noise
    # HDF5: numbers come from the metadata, not "Parquet footers"
    page.goto(srv["url"] + f"/ui/datasets/{srv['pre']}")
    src = page.locator("#stats-source").inner_text()
    assert "metadata" in src and "Parquet footers" not in page.locator("main").inner_text()
    page.goto(srv["url"] + f"/ui/datasets/{srv['houses']}/samples")
    assert page.locator("#range").inner_text() == "Rows 1 to 20 of 1,460."
    page.context.close()


# ------------------------------------------------------------------------------------------ samples
def test_samples_lookup_filter_paging_and_typed_cells(browser: Any, srv: dict[str, Any]) -> None:
    ds = ShardsetDataset(srv["path"])
    uids = ds.uids.to_pylist()
    page = _login(browser, srv)
    base = srv["url"] + f"/ui/datasets/{srv['id']}/samples"
    page.goto(base + "?limit=10")
    page.fill("#find", str(uids[57]))
    page.click("#find-form button")
    row = page.locator("#samples tr.mark")
    assert row.count() == 1 and row.locator("th").inner_text() == "57"
    assert row.locator("td[data-column=uid]").inner_text().strip() == str(uids[57])
    assert page.locator("#range").inner_text() == "Rows 51 to 60 of 100."
    page.fill("#find", "no-such-uid")
    page.click("#find-form button")
    assert (
        page.locator("p.error").count() == 1
        and "no sample with UID" in page.locator("p.error").inner_text()
    )
    # filter by a column value
    page.goto(base + "?limit=10")
    page.select_option("#where", "label")
    page.fill("#equals", "cat")
    page.click("#filter-form button")
    labels = ds.to_table(columns=["label"]).column("label").to_pylist()
    assert page.locator("#filtered").inner_text().startswith(f"{labels.count('cat')} row")
    assert {
        t.strip() for t in page.locator("#samples td[data-column=label]").all_inner_texts()
    } == {"cat"}
    # first / previous / next / last and jump to a page
    page.goto(base + "?limit=30")
    page.click("#last")
    assert page.locator("#range").inner_text() == "Rows 91 to 100 of 100."
    page.click("a[rel=prev]")
    assert page.locator("#range").inner_text() == "Rows 61 to 90 of 100."
    page.click("#first")
    assert page.locator("#range").inner_text() == "Rows 1 to 30 of 100."
    page.fill("#page-no", "3")
    page.click("#jump-form button")
    assert page.locator("#range").inner_text() == "Rows 61 to 90 of 100."
    # cells by type: images inline, floats rounded, vectors truncated with "show all", missing as
    # missing
    page.goto(base + "?limit=5&col=png&col=score&col=emb&col=caption")
    assert page.locator("#samples td[data-column=png] img").count() == 5
    s0 = page.locator("#samples td[data-column=score]").first.inner_text().strip()
    assert len(s0.replace("0.", "")) <= 5, s0
    emb = page.locator("#samples td[data-column=emb]").first
    assert "(12 values: show all)" in emb.inner_text() and emb.locator("code.all").is_hidden()
    emb.locator("summary").click()
    assert (
        emb.locator("code.all").is_visible()
        and emb.locator("code.all").inner_text().count(",") == 11
    )
    assert (
        page.locator("#samples td[data-column=caption] .missing").count() == 1
    )  # row 4 of the first 5
    # HDF5 and Parquet: a sample by row; category ids decoded through the vocabulary; large floats
    # grouped
    page.goto(srv["url"] + f"/ui/datasets/{srv['pre']}/samples")
    assert "Sample by row (0 to 299)" in page.locator("#find-form").inner_text()
    page.fill("#find", "123")
    page.click("#find-form button")
    marked = page.locator("#samples tr.mark")
    assert (
        marked.locator("th").inner_text() == "123"
        and page.locator("#range").inner_text() == "Rows 121 to 140 of 300."
    )
    street = marked.locator("td[data-column=Street]")
    assert street.get_attribute("data-t") == "tokens" and street.locator(
        ".tokens"
    ).inner_text() in ("Pave", "Grvl")
    price = page.locator("#samples td[data-column=SalePrice]").first.inner_text().strip()
    assert re.fullmatch(r"[\d,]+(\.\d)?", price) and "e+" not in price, price
    page.goto(srv["url"] + f"/ui/datasets/{srv['houses']}/samples")
    page.fill("#find", "1,459")
    page.click("#find-form button")
    assert page.locator("#samples tr.mark th").inner_text() == "1459"
    page.fill("#find", "1460")
    page.click("#find-form button")
    assert "no row 1,460" in page.locator("p.error").inner_text()
    # every request is bounded
    for q in ("limit=201", "find=" + "x" * 300, "where=label&equals=" + "y" * 300, "offset=-1"):
        res = page.request.get(base + "?" + q)
        assert res.status in (400, 422), (q, res.status)
    page.context.close()


# -------------------------------------------------------------------------------------- small, a11y
def _luminance(rgb: tuple[float, ...]) -> float:
    c = [x / 255 for x in rgb[:3]]
    lin = [x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4 for x in c]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def _contrast(fg: str, bg: str) -> float:
    f, b = (tuple(float(x) for x in re.findall(r"[\d.]+", s)) for s in (fg, bg))
    hi, lo = sorted((_luminance(f), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


_COLOURS = """els => els.filter(e => e.offsetParent !== null && e.textContent.trim()).map(e => {
    let bg = 'rgba(0, 0, 0, 0)', n = e;
    while (n && (bg === 'rgba(0, 0, 0, 0)' || bg === 'transparent')) {
        bg = getComputedStyle(n).backgroundColor; n = n.parentElement; }
    if (bg === 'rgba(0, 0, 0, 0)') bg = 'rgb(255, 255, 255)';
    return [e.tagName + '.' + e.className, getComputedStyle(e).color, bg]; })"""


def test_favicon_tab_order_contrast_and_no_overflow_at_400px(
    browser: Any, srv: dict[str, Any]
) -> None:
    with Client(srv["url"], srv["admin"]) as c:
        it = c.iteration("cifar", batch_size=10, leases=Leases(name="a11y"))
    pages = {
        "datasets": "/ui/datasets",
        "dataset": f"/ui/datasets/{srv['id']}",
        "hdf5": f"/ui/datasets/{srv['pre']}",
        "samples": f"/ui/datasets/{srv['id']}/samples?limit=8",
        "parquet": f"/ui/datasets/{srv['houses']}/samples",
        "iterations": "/ui/iterations",
        "iteration": f"/ui/iterations/{it['id']}",
        "run": "/ui/runs/hist",
        "keys": "/ui/keys",
    }
    page = _login(browser, srv, width=400)
    icon = page.locator("link[rel=icon]").get_attribute("href")
    res = page.request.get(srv["url"] + str(icon))
    assert res.status == 200 and res.headers["content-type"].startswith("image/svg+xml")
    for name, path in {"login": "/ui/login", **pages}.items():
        page.goto(srv["url"] + path)
        page.wait_for_load_state("load")
        over = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert over <= 0, (name, over)
        unlabeled = page.eval_on_selector_all(
            "input:not([type=hidden]), select, textarea",
            "els => els.filter(e => !(e.labels && e.labels.length) && "
            "!e.getAttribute('aria-label')).map(e => e.outerHTML)",
        )
        assert unlabeled == [], (name, unlabeled)
        assert (
            page.eval_on_selector_all("[tabindex]", "els => els.filter(e => e.tabIndex > 0).length")
            == 0
        )
        low = [
            (sel, fg, bg, round(_contrast(fg, bg), 2))
            for sel, fg, bg in page.eval_on_selector_all(
                "p, td, th, dt, dd, label, a, .badge, caption, li, h1, h2", _COLOURS
            )
            if _contrast(fg, bg) < 4.5
        ]
        assert low == [], (name, low[:5])
    # the confirmation page (cancelling the running iteration), at 400 px too; then kept running
    page.goto(srv["url"] + pages["iteration"])
    page.click("#cancel-form button")
    page.locator("#confirm-what").wait_for()
    over = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert over <= 0, ("confirmation", over)
    page.click("#keep")
    assert page.locator("#status").inner_text() != "cancelled"
    # the badges: each status's colours
    page.goto(srv["url"] + "/ui/iterations")
    seen = set()
    for sel, fg, bg in page.eval_on_selector_all(".badge", _COLOURS):
        assert _contrast(fg, bg) >= 4.5, (sel, fg, bg)
        seen.add(sel)
    assert {s.split("status-")[1] for s in seen} >= {"running", "finished", "cancelled"}
    # tab order: skip link, then the main navigation, in reading order
    page.goto(srv["url"] + "/ui/datasets")
    order = []
    for _ in range(4):
        page.keyboard.press("Tab")
        order.append(page.evaluate("document.activeElement.textContent.trim()"))
    assert order == ["Skip to content", "datamill", "Datasets", "Iterations"], order
    page.context.close()


def test_login_page_needs_no_script_and_every_page_answers(srv: dict[str, Any]) -> None:
    """Without a browser: the pages the tests above open answer 200 for an admin (a cheap guard)."""
    for path in ("/ui/datasets", f"/ui/datasets/{srv['id']}", "/ui/iterations", "/ui/runs/hist"):
        conn = http.client.HTTPConnection("127.0.0.1", srv["port"], timeout=30)
        conn.request(
            "GET", urllib.parse.quote(path), headers={"Authorization": f"Bearer {srv['admin']}"}
        )
        res = conn.getresponse()
        body = res.read().decode()
        conn.close()
        assert res.status == 200, (path, res.status, body[:300])
