"""Every code block of README.md and docs/*.md runs (tests/docs_runner.py says how), so no example
can rot."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs_runner import DocBlockError, iter_pages, page_markers, parse_blocks, run_page

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


def _params() -> list[object]:
    params: list[object] = []
    for page in iter_pages(ROOT):
        name = str(page.relative_to(ROOT))
        blocks = parse_blocks(page.read_text(encoding="utf-8"), page=name)
        marks = [getattr(pytest.mark, m) for m in sorted(page_markers(blocks))]
        params.append(pytest.param(name, blocks, marks=marks, id=name))
    return params


@pytest.mark.parametrize(("name", "blocks"), _params())
def test_page_blocks_run(name: str, blocks: list[object], data_dir: Path, tmp_path: Path) -> None:
    """Each page's bash and python blocks run in order in a fresh folder without an error."""
    run_page(blocks, work=tmp_path / "work", data=data_dir, src=SRC)  # type: ignore[arg-type]


def test_readme_is_short_and_links_every_guide() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    for guide in ("preprocessing", "text-and-pretraining", "shardsets", "loading", "serving"):
        assert f"docs/{guide}.md" in readme, guide


def test_every_page_is_covered() -> None:
    """README.md and every docs page is walked, and each has no block in an unknown language."""
    pages = [p.name for p in iter_pages(ROOT)]
    assert pages[0] == "README.md"
    assert {p.name for p in (ROOT / "docs").glob("*.md")} <= set(pages)


BROKEN_BASH = """
# a page

```bash
echo fine > a.txt
```

```bash
cat a.txt
false
echo never
```
"""

BROKEN_PYTHON = """
```python
x = 1
```

Text between blocks.

```python
assert x == 1
y = undefined_name
```
"""


def test_a_failing_bash_block_fails_the_page(tmp_path: Path, data_dir: Path) -> None:
    blocks = parse_blocks(BROKEN_BASH, page="broken.md")
    with pytest.raises(DocBlockError, match=r"broken\.md, line 8: bash block exited with 1"):
        run_page(blocks, work=tmp_path / "w", data=data_dir, src=SRC)


def test_a_failing_python_block_fails_the_page_and_blocks_share_a_namespace(
    tmp_path: Path, data_dir: Path
) -> None:
    blocks = parse_blocks(BROKEN_PYTHON, page="broken.md")
    with pytest.raises(DocBlockError, match=r"broken\.md, line 8: python block raised NameError"):
        run_page(blocks, work=tmp_path / "w", data=data_dir, src=SRC)


def test_blocks_share_a_folder_files_and_the_shared_data(tmp_path: Path, data_dir: Path) -> None:
    page = """
<!-- docs-test: file=conf/x.yaml -->
```yaml
a: 1
```

```bash
test -f conf/x.yaml && test -f ../shared/data/timemachine.txt && test -n "$DATAMILL_DATA"
head -c 10 ../shared/data/timemachine.txt > head.txt
```

```python
from pathlib import Path
assert Path("head.txt").stat().st_size == 10
```
"""
    assert (
        run_page(parse_blocks(page, page="ok.md"), work=tmp_path / "w", data=data_dir, src=SRC) == 3
    )


@pytest.mark.parametrize(
    "bad",
    [
        "```\nno language\n```\n",
        "```sh\nls\n```\n",
        "```bash\nnever closed\n",
        "<!-- docs-test: sloow -->\n```bash\nls\n```\n",
    ],
)
def test_malformed_pages_are_refused(bad: str) -> None:
    with pytest.raises(DocBlockError, match=r"bad\.md, line"):
        parse_blocks(bad, page="bad.md")
