"""The lineage pages of the web UI in a real headless Chromium (Debian's, via playwright).

Ground truth: the batches RemoteLoaders received. A step's page must list exactly that batch's UIDs;
a sample's page must list the iterations, ranks/clients and steps that received it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from datamill.client import RemoteLoader
from tests.serve._browser import chromium, login
from tests.serve._opts import grouped

pytestmark = [pytest.mark.server, pytest.mark.browser]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


def _login(browser: Any, server: dict[str, Any]) -> Any:
    return login(browser, server["url"], server["read"])


def _uids(page: Any) -> list[int]:
    return [
        int(x)
        for x in page.eval_on_selector_all(
            "#step-samples tbody tr", "rs => rs.map(r => r.dataset.uid)"
        )
    ]


def test_step_and_sample_pages_agree_with_what_clients_received(
    browser: Any, server: dict[str, Any], tmp_path: Path
) -> None:
    kw: dict[str, Any] = {"batch_size": 40, "seed": 8, "collate": "arrow", "lease_size": 5}
    static: dict[int, list[list[int]]] = {}
    for rank in range(2):
        loader = RemoteLoader(
            server["url"],
            server["read"],
            "ds",
            **grouped(rank=rank, world_size=2, name="ui-lineage-s", **kw),
        )
        static[rank] = [b.column("uid").to_pylist() for b in loader]
        static_id = loader.iteration_id
    dyn = RemoteLoader(
        server["url"], server["read"], "ds", **grouped(mode="dynamic", name="ui-lineage-d", **kw)
    )
    dynamic = [b.column("uid").to_pylist() for b in dyn]
    page = _login(browser, server)
    # a run's page -> a step -> its samples
    page.goto(f"{server['url']}/ui/iterations/{static_id}")
    page.click("#trace-link")
    page.fill("#st-rank", "1")
    page.fill("#st-step", "3")
    page.click("#step-form button[type=submit]")
    page.wait_for_selector("#step-samples")
    assert _uids(page) == static[1][3]
    page.screenshot(path=str(tmp_path / "ui-lineage-step.png"), full_page=True)
    page.goto(f"{server['url']}/ui/iterations/{dyn.iteration_id}/steps")
    page.select_option("#st-client", dyn.client_id)
    page.fill("#st-step", "7")
    page.click("#step-form button[type=submit]")
    page.wait_for_selector("#step-samples")
    assert _uids(page) == dynamic[7]
    # a sample's page -> the runs and steps that read it
    uid = static[1][3][4]
    page.goto(f"{server['url']}/ui/datasets/ds/lineage")
    page.fill("#ln-uid", str(uid))
    page.click("#uid-form button[type=submit]")
    page.wait_for_selector("#sample-hits")
    rows = page.eval_on_selector_all(
        "#sample-hits tbody tr", "rs => rs.map(r => [...r.cells].map(c => c.innerText))"
    )
    ours = {r[0]: r for r in rows if r[0] in (static_id, dyn.iteration_id)}
    assert ours[static_id][3:] == ["rank 1", "3", "4"]
    where = next((s, p) for s, b in enumerate(dynamic) for p, u in enumerate(b) if u == uid)
    assert ours[dyn.iteration_id][3:] == [dyn.client_id, str(where[0]), str(where[1])]
    page.screenshot(path=str(tmp_path / "ui-lineage-sample.png"), full_page=True)
    page.locator("#sample-hits tbody tr", has_text=str(static_id)).locator(
        "a", has_text="3"
    ).last.click()
    page.wait_for_selector("#step-samples")
    assert _uids(page) == static[1][3]
    # a bad UID is a 4xx page, not a crash
    res = page.goto(f"{server['url']}/ui/datasets/ds/lineage?uid=not-a-number")
    assert res.status == 400 and "integers" in page.locator("p.error").inner_text()
    page.context.close()
