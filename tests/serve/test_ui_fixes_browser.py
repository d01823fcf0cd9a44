"""The UI points of issue #43 in Debian's Chromium (playwright) against a real ``datamill serve``:
iterations newest first; a start with the name of a cancelled iteration says so; at 400 px every
column of the iterations and clients tables shows (one card per row, no inner scroller); path
columns whose files are elsewhere shown as text; a missing UID a message on the samples page; bad
query parameters and unknown ``/ui/...`` paths the UI's error page; years printed as years; a
sub-second duration in ms; an ETA on a running iteration; the lineage page linked from the dataset
page; BERT token ids decoded with the tokenizer the Parquet stores. Screenshots go to the test's
tmp folder."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamill.client import Client, Leases, RemoteLoader
from datamill.core.io import read_table
from datamill.shards.dataset import ShardsetDataset
from tests.serve._browser import chromium, expect, login, need_chromium
from tests.serve._opts import grouped
from tests.serve._proc import free_port, make_key, start_server, stop
from tests.serve.test_ui_browser import DATA

pytestmark = [pytest.mark.server, pytest.mark.browser]


def _build(root: Path) -> None:
    root.mkdir(parents=True)
    ShardsetDataset.create(
        root / "pics",
        pa.table({"uid": np.arange(20), "image_path": [f"train/{i}.png" for i in range(20)]}),
        uid="uid",
        shardset="main",
        shard_size=10,
    )
    houses = read_table(DATA / "house_prices_train.csv")
    pq.write_table(houses.select(["Id", "YearBuilt", "SalePrice"]), root / "houses.parquet")
    from datamill.pretrain.bert import build_bert_samples

    raw = root.parent / "wiki.raw"
    lines = (DATA / "wikitext2_test.raw").read_text("utf-8").splitlines()[:120]
    raw.write_text("\n".join(lines) + "\n")
    build_bert_samples(
        raw,
        out=root / "bert.parquet",
        vocab_size=500,
        max_seq_length=32,
        dupe_factor=1,
        seed=0,
        sentence_split="period",
    )


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    need_chromium()
    base = tmp_path_factory.mktemp("uifixes")
    _build(base / "root")
    state = base / "state"
    admin = make_key(state, "admin")
    port = free_port()
    env: dict[str, Any] = {"url": f"http://127.0.0.1:{port}", "admin": admin, "port": port}
    env["proc"] = start_server(base / "root", state, port, "--drain-timeout", "0")
    try:
        with Client(env["url"], admin) as c:
            for name, path in (
                ("pics", "pics"),
                ("houses", "houses.parquet"),
                ("bert", "bert.parquet"),
            ):
                env[name] = c.register(path, name=name)["id"]
        yield env
    finally:
        stop(env["proc"])


@pytest.fixture(scope="module")
def browser(srv: dict[str, Any]) -> Iterator[Any]:
    with chromium() as b:
        yield b


def _login(browser: Any, srv: dict[str, Any], *, width: int = 1280) -> Any:
    return login(browser, srv["url"], srv["admin"], width=width, path="/ui/login")


def _loader(srv: dict[str, Any], name: str, **kw: Any) -> RemoteLoader:
    return RemoteLoader(
        srv["url"], srv["admin"], "pics", **grouped(batch_size=2, name=name, collate="arrow", **kw)
    )


def test_iterations_newest_first_and_a_cancelled_name_says_so(
    browser: Any, srv: dict[str, Any], tmp_path: Path
) -> None:
    assert sum(1 for _ in _loader(srv, "first-done")) == 10
    with Client(srv["url"], srv["admin"]) as c:
        gone = c.iteration("pics", batch_size=2, leases=Leases(name="gone"))
        c.cancel(gone["id"])
        newest = c.iteration("pics", batch_size=2, leases=Leases(name="newest-running"))
    page = _login(browser, srv)
    page.goto(srv["url"] + "/ui/iterations")
    ids = [r.get_attribute("data-iteration") for r in page.locator("#iterations tbody tr").all()]
    assert ids[0] == newest["id"] and ids.index(newest["id"]) < ids.index(gone["id"])
    assert "newest first" in page.locator("#iterations caption").inner_text()
    # "Start" with the cancelled iteration's name: said, not silently opened
    page.fill("#it-name", "gone")
    page.fill("#it-batch", "2")
    page.click("#start-form button[type=submit]")
    alert = page.locator("p.error")
    assert "gone" in alert.inner_text() and "cancelled" in alert.inner_text()
    assert "/ui/iterations/" not in page.url and "Error" not in page.locator("h1").inner_text()
    page.screenshot(path=str(tmp_path / "name-clash.png"), full_page=True)
    page.context.close()


def _every_cell_shows(page: Any, table: str) -> list[str]:
    """Cells of ``table`` whose box leaves the viewport, or that sit in a scrolled container."""
    return list(
        page.eval_on_selector_all(
            f"{table} td, {table} th[scope=row]",
            """els => els.filter(e => {
                const r = e.getBoundingClientRect();
                let p = e.parentElement, inner = false;
                while (p) {
                    if (p.scrollWidth > p.clientWidth + 1 &&
                        getComputedStyle(p).overflowX !== 'visible') inner = true;
                    p = p.parentElement;
                }
                return inner || r.right > window.innerWidth + 1 || r.left < -1 ||
                    e.offsetParent === null;
            }).map(e => e.outerHTML.slice(0, 80))""",
        )
    )


def test_at_400px_every_column_of_the_iterations_and_clients_tables_shows(
    browser: Any, srv: dict[str, Any], tmp_path: Path
) -> None:
    loader = _loader(srv, "narrow", lease_size=1)
    it = iter(loader)
    for _ in range(3):
        next(it)  # a client holding a lease: a row in the clients table
    page = _login(browser, srv, width=400)
    page.goto(srv["url"] + "/ui/iterations")
    assert _every_cell_shows(page, "#iterations") == []
    labels = page.eval_on_selector_all(
        "#iterations tbody tr:first-child td",
        "els => els.map(e => getComputedStyle(e, '::before').content)",
    )
    assert all(x not in ("none", "normal", "") for x in labels), labels
    page.screenshot(path=str(tmp_path / "iterations-400.png"), full_page=True)
    it_id = loader.iteration_id
    page.goto(srv["url"] + f"/ui/iterations/{it_id}")
    page.locator("#clients tbody tr[data-client]").first.wait_for()
    assert _every_cell_shows(page, "#clients") == []
    shown = page.eval_on_selector_all(
        "#clients tbody tr[data-client]:first-child td",
        "els => els.map(e => getComputedStyle(e, '::before').content.replaceAll('\"', ''))",
    )
    assert shown == ["Rank", "Slot", "Leases", "Batches", "Batches/s", "Stall", "Idle"], shown
    assert page.locator("#chart-hint").is_visible()  # the chart keeps its size and says it scrolls
    over = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert over <= 0
    page.screenshot(path=str(tmp_path / "iteration-400.png"), full_page=True)
    page.context.close()
    getattr(it, "close", lambda: None)()  # the loader stops (its leases expire)


def test_samples_paths_as_text_missing_uid_and_the_ui_error_page(
    browser: Any, srv: dict[str, Any], tmp_path: Path
) -> None:
    page = _login(browser, srv)
    page.goto(srv["url"] + f"/ui/datasets/{srv['pics']}/samples?limit=5")
    cells = page.locator("#samples td[data-column=image_path]")
    assert cells.count() == 5 and cells.first.inner_text().strip() == "train/0.png"
    assert (
        page.locator("#samples .error").count() == 0 and page.locator("#samples img").count() == 0
    )
    page.fill("#find", "12345")
    page.click("#find-form button")
    msg = page.locator("#not-found")
    assert "no sample with UID '12345'" in msg.inner_text()
    assert page.locator("#samples tbody tr").count() == 5  # still the samples page
    assert "Error" not in page.content() and "NotFound" not in page.content()
    page.screenshot(path=str(tmp_path / "missing-uid.png"), full_page=True)
    for path in (
        f"/ui/datasets/{srv['pics']}/samples?offset=-1",
        f"/ui/datasets/{srv['pics']}/samples?limit=abc",
        "/ui/iterations?limit=0",
        "/ui/no-such-page",
        "/ui/datasets/nope/samples/more",
    ):
        res = page.goto(srv["url"] + path)
        assert res is not None and 400 <= res.status < 500, (path, res.status if res else None)
        assert res.headers["content-type"].startswith("text/html"), path
        assert page.locator("nav[aria-label=Main]").count() == 1  # the UI's own page
        assert (
            page.locator("p.error").count() == 1 and "{" not in page.locator("p.error").inner_text()
        )
    page.context.close()


def test_years_durations_eta_lineage_link_and_bert_tokens(
    browser: Any, srv: dict[str, Any], tmp_path: Path
) -> None:
    page = _login(browser, srv)
    # a year is a year
    page.goto(srv["url"] + f"/ui/datasets/{srv['houses']}")
    row = page.locator("tr", has=page.locator("th", has_text="YearBuilt")).first
    assert row.locator("[data-stat=min]").inner_text() == "1872"
    assert row.locator("[data-stat=max]").inner_text() == "2010"
    # the lineage page is linked from the dataset page
    page.goto(srv["url"] + f"/ui/datasets/{srv['pics']}")
    page.click("#lineage-link")
    assert page.url.endswith(f"/ui/datasets/{srv['pics']}/lineage")
    assert page.locator("#uid-form").count() == 1
    # an ETA on a running iteration (a client took 4 of 10 batches and acknowledged them)
    loader = _loader(srv, "eta", lease_size=1)
    it = iter(loader)
    for _ in range(5):
        next(it)
    page.goto(srv["url"] + f"/ui/iterations/{loader.iteration_id}")
    eta = page.locator("#eta")
    deadline = time.monotonic() + 20
    while "at this rate" not in eta.inner_text():  # the server's next upkeep tick has the rate
        assert time.monotonic() < deadline, eta.inner_text()
        page.reload()
        with contextlib.suppress(AssertionError):
            expect(eta).to_contain_text("at this rate", timeout=500)
    getattr(it, "close", lambda: None)()  # the loader stops (its leases expire)
    # a run shorter than a second: its duration in ms, never "0.0 s"
    assert sum(1 for _ in _loader(srv, "quick")) == 10
    page.goto(srv["url"] + "/ui/iterations?name=quick")
    dur = page.locator("#iterations [data-stat=duration]").first.inner_text()
    assert dur != "0.0 s" and dur.endswith((" ms", " s")), dur
    # BERT token ids decoded with the tokenizer the Parquet stores
    page.goto(srv["url"] + f"/ui/datasets/{srv['bert']}/samples?limit=3")
    tokens = page.locator("#samples td[data-column=tokens] .tokens").first.inner_text()
    assert tokens.startswith("[CLS]") and "[SEP]" in tokens, tokens
    ids = page.locator("#samples td[data-column=tokens] .ids").first.inner_text()
    assert ids.startswith("[") and any(ch.isdigit() for ch in ids)
    page.screenshot(path=str(tmp_path / "bert.png"), full_page=True)
    page.context.close()
