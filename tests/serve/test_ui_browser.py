"""The web UI in a real headless Chromium (Debian's, driven by playwright) against a real ``datamill
serve``.

One server subprocess and one browser for the module; every loop is bounded in count and time; every
process started here is stopped by pid in a finally. Screenshots of each page go to the tests' tmp
folders.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from datamill.client import Client, Leases
from datamill.core.io import read_table
from datamill.shards.dataset import ShardsetDataset
from tests.serve._browser import chromium, expect, login, need_chromium
from tests.serve._proc import free_port, make_key, read_log, start_server, start_worker, stop

pytestmark = [pytest.mark.server, pytest.mark.browser]

DATA = Path(
    os.environ.get("DATAMILL_DATA", Path(__file__).resolve().parents[3] / "shared" / "data")
)
WIDTHS = (1280, 400)


def build_cifar(root: Path) -> Path:
    """cifar10_tiny as a shardset dataset (as ``datamill.shards.demo`` builds it), images also as
    paths."""
    src = DATA / "cifar10_tiny"
    labels = read_table(src / "labels.csv").rename_columns(
        ["uid", "image_path", "label"]
    )  # tests/serve/_worker logs "uid"
    files = labels.column("image_path").to_pylist()
    (root / "cifar_images").mkdir(parents=True)
    for f in files:
        shutil.copy(src / f, root / "cifar_images" / Path(f).name)
    images = pa.table(
        {
            "uid": labels.column("uid"),
            "png": pa.array([(src / f).read_bytes() for f in files], pa.binary()),
            "image_path": [f"../cifar_images/{Path(f).name}" for f in files],
        }
    )
    ds = ShardsetDataset.create(root / "cifar", images, uid="uid", shardset="image", shard_size=25)
    ds = ds.add("label", labels.select(["uid", "label"]), route=True)
    keep = np.flatnonzero(np.arange(labels.num_rows) % 5 != 4)  # every 5th sample has no caption
    lab = labels.take(pa.array(keep))
    captions = [f"a small photo of a {x}" for x in lab.column("label").to_pylist()]
    ds.add("caption", pa.table({"uid": lab.column("uid"), "caption": captions}), route=True)
    return root / "cifar"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    need_chromium()
    base = tmp_path_factory.mktemp("ui")
    path = build_cifar(base / "root")
    state = base / "state"
    admin = make_key(state, "admin")
    port = free_port()
    proc = start_server(base / "root", state, port)
    try:
        url = f"http://127.0.0.1:{port}"
        with Client(url, admin) as c:
            ds = c.register("cifar", name="cifar10_tiny")
        yield {"url": url, "admin": admin, "path": path, "id": ds["id"], "base": base}
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def browser(server: dict[str, Any]) -> Iterator[Any]:
    with chromium() as b:
        yield b


def _login(browser: Any, server: dict[str, Any], key: str, *, width: int = 1280) -> Any:
    return login(browser, server["url"], key, width=width)


def test_login_then_datasets(browser: Any, server: dict[str, Any], tmp_path: Path) -> None:
    page = browser.new_context().new_page()
    res = page.goto(server["url"] + "/ui/datasets")
    assert res.status == 401 and page.locator("#key").count() == 1
    assert page.locator("#datasets").count() == 0  # without a key only the login form
    page.fill("#key", server["admin"][:-2] + "xx")
    page.click("form[action='/ui/login'] button[type=submit]")
    assert "invalid" in page.locator("p.error").inner_text()
    page.fill("#key", server["admin"])
    page.click("form[action='/ui/login'] button[type=submit]")
    row = page.locator(f"#datasets tr[data-dataset='{server['id']}']")
    assert "shardset dataset" in row.inner_text() and "image, label, caption" in row.inner_text()
    cookie = next(c for c in page.context.cookies() if c["name"] == "datamill_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert (
        server["admin"] not in cookie["value"]
        and server["admin"].split(".")[1] not in cookie["value"]
    )
    assert page.evaluate("document.cookie") == ""  # scripts cannot read the key
    page.screenshot(path=str(tmp_path / "ui-datasets.png"), full_page=True)
    page.context.close()


def test_statistics_equal_describe_and_values(
    browser: Any, server: dict[str, Any], tmp_path: Path
) -> None:
    page = _login(browser, server, server["admin"])
    page.click(f"#datasets a[href='/ui/datasets/{server['id']}']")
    ds = ShardsetDataset(server["path"])
    d = ds.describe()
    assert page.locator("#summary [data-stat=num_samples]").inner_text() == f"{d['num_samples']:,}"
    assert page.locator("#summary [data-stat=num_shards]").inner_text() == f"{d['num_shards']:,}"
    for s in d["shardsets"]:
        row = page.locator(f"#shardsets tr[data-shardset='{s['name']}']")
        for stat in ("num_shards", "rows", "missing"):
            assert row.locator(f"[data-stat={stat}]").inner_text() == f"{s[stat]:,}", (
                s["name"],
                stat,
            )
        shown = {
            c.get_attribute("data-column"): c.get_attribute("data-type")
            for c in row.locator("code").all()
        }
        assert shown == {c["name"]: c["type"] for c in s["columns"]}
    assert (
        page.locator("#shardsets tr[data-shardset='caption'] [data-stat=missing]").inner_text()
        == "20"
    )
    assert page.locator("#check-status").inner_text().startswith("No violations")
    # top values: computed on demand, equal to a direct count
    row = page.locator("#columns tr[data-column='label']")
    row.locator("button.values").click()
    page.wait_for_selector("#columns tr[data-values-for='label'] [data-status=done]")
    out = page.locator("#columns tr[data-values-for='label']")
    out.locator("details summary").click()  # the bar chart's numbers as a table
    top = {
        r.locator("td").nth(0).inner_text(): int(
            r.locator("td").nth(1).inner_text().replace(",", "")
        )
        for r in out.locator("table.top tbody tr").all()
    }
    counts = ds.to_table(columns=["label"]).column("label").value_counts().to_pylist()
    assert top == {c["values"]: c["counts"] for c in counts}
    png = page.locator("#columns tr[data-column='png']")
    png.locator("button.values").click()
    page.wait_for_selector("#columns tr[data-values-for='png'] [data-status=done] svg rect")
    page.screenshot(path=str(tmp_path / "ui-dataset.png"), full_page=True)
    page.context.close()


def test_samples_images_load_and_missing_is_missing(
    browser: Any, server: dict[str, Any], tmp_path: Path
) -> None:
    page = _login(browser, server, server["admin"])
    page.goto(server["url"] + f"/ui/datasets/{server['id']}/samples?limit=30")
    page.wait_for_load_state("load")
    imgs = page.locator("#samples img")
    assert imgs.count() == 60  # png bytes and image_path files, 30 rows each
    # every image loaded or failed (a promise per image; wait_for_function evaluates a string, which
    # the page's CSP forbids)
    page.eval_on_selector_all(
        "#samples img",
        "els => Promise.all(els.map(i => i.complete || new Promise(r => { i.onload = r; "
        "i.onerror = r; })))",
    )
    widths = page.eval_on_selector_all(
        "#samples img", "els => els.map(i => [i.naturalWidth, i.alt])"
    )
    assert [x for x in widths if not (x[0] > 0 and x[1])] == []
    table = ShardsetDataset(server["path"]).read_shard(
        0, columns=["caption"]
    )  # first 25 rows: shard 0
    expected = {i for i, v in enumerate(table.column("caption").to_pylist()) if v is None}
    missing = set()
    for r in page.locator("#samples tbody tr").all()[:25]:
        cell = r.locator("td[data-column=caption]")
        if cell.locator(".missing").count():
            assert cell.inner_text().strip() == "missing"
            missing.add(int(r.locator("th").inner_text()))
        else:
            assert cell.inner_text().startswith("a small photo of a ")
    assert missing == expected and len(expected) == 5
    # columns are selectable; paging moves on
    page.uncheck("input[name=col][value=png]")
    page.uncheck("input[name=col][value=image_path]")
    page.click("form.columns-form button[type=submit]")
    assert page.locator("#samples img").count() == 0
    assert page.locator("#samples thead th").all_inner_texts() == ["row", "uid", "label", "caption"]
    page.click("a[rel=next]")
    assert page.locator("#range").inner_text().startswith("Rows 31 to 60")
    page.screenshot(path=str(tmp_path / "ui-samples.png"), full_page=True)
    page.context.close()


def test_iteration_started_from_page_shows_live_progress(
    browser: Any, server: dict[str, Any], tmp_path: Path
) -> None:
    page = _login(browser, server, server["admin"])
    page.goto(server["url"] + "/ui/iterations")
    page.fill("#it-name", "ui-live")
    page.fill("#it-batch", "4")
    page.fill("#it-lease", "1")
    page.click("#start-form button[type=submit]")
    page.wait_for_selector("#progress-all")
    bar = page.locator("#progress-all")
    assert bar.get_attribute("max") == "25" and bar.get_attribute("value") == "0"
    log = server["base"] / "ui-live.log"
    worker = start_worker(
        server["url"],
        server["admin"],
        "cifar10_tiny",
        log,
        batch_size=4,
        name="ui-live",
        lease_size=1,
        sleep=0.15,
    )
    try:
        # the bar advances while the client pulls leases (a value strictly between), then fills
        expect(bar).to_have_attribute(
            "value", re.compile(r"^(?:[1-9]|1\d|2[0-4])$"), timeout=40_000
        )
        expect(bar).to_have_attribute("value", "25", timeout=40_000)
        assert worker.wait(timeout=30) == 0, (log.with_suffix(".log.err")).read_text()
    finally:
        stop(worker)
    assert page.locator("#progress-text").inner_text().endswith("(100%)")
    assert page.locator("#clients tbody tr").count() == 1
    page.wait_for_selector("#live svg polyline", state="attached")
    uids = [u for batch in read_log(log) for u in batch]
    assert sorted(uids) == sorted(ShardsetDataset(server["path"]).uids.to_pylist())
    page.screenshot(path=str(tmp_path / "ui-iteration.png"), full_page=True)
    page.goto(server["url"] + "/ui/iterations")
    assert (
        page.locator("#iterations tr", has_text="ui-live")
        .locator("progress")
        .get_attribute("value")
        == "25"
    )
    page.screenshot(path=str(tmp_path / "ui-iterations.png"), full_page=True)
    page.context.close()


def test_revoked_key_is_refused(browser: Any, server: dict[str, Any], tmp_path: Path) -> None:
    admin = _login(browser, server, server["admin"])
    admin.goto(server["url"] + "/ui/keys")
    admin.select_option("#key-role", "read")
    admin.fill("#key-note", "browser test")
    admin.click("#create-key button[type=submit]")
    key = admin.locator("#new-key-value").input_value()
    key_id = key.removeprefix("dmk_").split(".")[0]
    admin.screenshot(path=str(tmp_path / "ui-keys.png"), full_page=True)
    reader = _login(browser, server, key)
    assert reader.locator("nav a[href='/ui/keys']").count() == 0
    assert reader.goto(server["url"] + "/ui/keys").status == 403
    assert reader.goto(server["url"] + "/ui/datasets").status == 200
    admin.goto(server["url"] + "/ui/keys")
    admin.click(f"#keys tr[data-key='{key_id}'] button.danger")
    admin.click("#confirm")  # revoking asks first
    assert "revoked" in admin.locator(f"#keys tr[data-key='{key_id}']").inner_text()
    res = reader.goto(server["url"] + "/ui/datasets")
    assert res.status == 401 and reader.locator("#datasets").count() == 0
    assert "revoked" in reader.locator("p.error").inner_text()
    res = reader.request.get(server["url"] + f"/api/v1/datasets/{server['id']}/describe")
    assert res.status == 401
    admin.context.close()
    reader.context.close()


def test_post_without_csrf_token_is_refused(browser: Any, server: dict[str, Any]) -> None:
    page = _login(browser, server, server["admin"])
    page.goto(server["url"] + "/ui/keys")
    before = page.locator("#keys tbody tr").count()
    for body in ("role=admin&note=forged", "role=admin&note=forged&csrf=0123456789abcdef"):
        status = page.evaluate(
            """async (body) => (await fetch('/ui/keys', {method: 'POST', body,
            headers: {'Content-Type': 'application/x-www-form-urlencoded'}})).status""",
            body,
        )
        assert status == 403
    res = page.request.post(
        server["url"] + "/ui/iterations/it-x/rewind", form={"rank": "0", "consumed": "0"}
    )
    assert res.status == 403
    page.goto(server["url"] + "/ui/keys")
    assert page.locator("#keys tbody tr").count() == before
    page.context.close()


def test_accessibility_basics_at_two_widths(
    browser: Any, server: dict[str, Any], tmp_path: Path
) -> None:
    with Client(server["url"], server["admin"]) as c:
        iteration = c.iteration("cifar10_tiny", batch_size=10, leases=Leases(name="ui-a11y"))
    pages = {
        "login": "/ui/login",
        "datasets": "/ui/datasets",
        "dataset": f"/ui/datasets/{server['id']}",
        "samples": f"/ui/datasets/{server['id']}/samples?limit=8",
        "iterations": "/ui/iterations",
        "iteration": f"/ui/iterations/{iteration['id']}",
        "keys": "/ui/keys",
    }
    for width in WIDTHS:
        page = _login(browser, server, server["admin"], width=width)
        for name, path in pages.items():
            page.goto(server["url"] + path)
            page.wait_for_load_state("load")
            unlabeled = page.eval_on_selector_all(
                "input:not([type=hidden]), select, textarea",
                "els => els.filter(e => !(e.labels && e.labels.length) && "
                "!e.getAttribute('aria-label'))"
                ".map(e => e.outerHTML)",
            )
            assert unlabeled == [], (name, width, unlabeled)
            no_alt = page.eval_on_selector_all(
                "img", "els => els.filter(i => !i.alt).map(i => i.outerHTML)"
            )
            assert no_alt == [], (name, width)
            over = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert over <= 1, (name, width, over)
            assert (
                page.locator("h1").count() == 1
                and page.evaluate("document.documentElement.lang") == "en"
            )
            page.screenshot(path=str(tmp_path / f"ui-{name}-{width}.png"), full_page=True)
        page.context.close()
    assert len(list(tmp_path.glob("ui-*.png"))) == 2 * len(pages)
