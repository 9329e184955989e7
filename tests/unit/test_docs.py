"""The documentation is tested: every ```python block of the README and of docs/ that is a
whole program runs, the README's links into docs/ resolve, and the site builds strict."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Put just before a block that is a fragment, with the reason: `<!-- not-run: why -->`.
NOT_RUN = re.compile(r"<!-- not-run: \S.* -->")
#: How long one program may take (spawning procs, importing torch on a busy machine).
RUN_TIMEOUT = 120.0


class Block(NamedTuple):
    """One ```python block: where it is, its code, and whether it is run."""

    page: Path
    line: int
    code: str
    run: bool

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def python_blocks(page: Path) -> list[Block]:
    """The ```python blocks of ``page`` (fences may be indented, as in a list item)."""
    lines = page.read_text().split("\n")
    blocks = []
    i = 0
    while i < len(lines):
        m = re.fullmatch(r"( *)```python\s*", lines[i])
        if m is None:
            i += 1
            continue
        indent = m.group(1)
        start = i
        i += 1
        body = []
        while i < len(lines) and lines[i] != f"{indent}```":
            body.append(lines[i].removeprefix(indent))
            i += 1
        assert i < len(lines), f"{page.relative_to(ROOT)}:{start + 1}: unclosed block"
        before = next((x.strip() for x in reversed(lines[:start]) if x.strip()), "")
        blocks.append(Block(page, start + 1, "\n".join(body) + "\n", not NOT_RUN.fullmatch(before)))
        i += 1
    return blocks


BLOCKS = [b for page in PAGES for b in python_blocks(page)]
PROGRAMS = [b for b in BLOCKS if b.run]


def test_blocks_are_found() -> None:
    assert len(PROGRAMS) >= 3, [b.where for b in BLOCKS]
    assert any(b.page.name == "README.md" for b in PROGRAMS)


def test_every_not_run_marker_is_just_before_a_python_block() -> None:
    stray = []
    for page in PAGES:
        lines = page.read_text().split("\n")
        for n, line in enumerate(lines):
            if "not-run" not in line:
                continue
            after = next((x.strip() for x in lines[n + 1 :] if x.strip()), "")
            if NOT_RUN.fullmatch(line.strip()) is None or after != "```python":
                if "`<!-- not-run" not in line:  # the docs' own description of the marker
                    stray.append(f"{page.relative_to(ROOT)}:{n + 1}: {line.strip()}")
    assert stray == []


@pytest.mark.timeout(RUN_TIMEOUT + 30)
@pytest.mark.parametrize("block", PROGRAMS, ids=[b.where for b in PROGRAMS])
def test_program_runs(block: Block, tmp_path: Path) -> None:
    """The block, as a script of its own in a fresh interpreter, exits with status 0."""
    script = tmp_path / "program.py"
    script.write_text(block.code)
    try:
        out = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(
            f"{block.where} ran past {RUN_TIMEOUT} s; output so far:\n{e.stdout}\n{e.stderr}"
        )
    assert out.returncode == 0, (
        f"{block.where} exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
    )


def _anchors(page: Path) -> set[str]:
    """The ids MkDocs gives the headings of ``page`` (markup stripped, then slugified)."""
    ids = set()
    fenced = False
    for line in page.read_text().split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#+ (.*)", line)):
            ids.add(slugify(m.group(1).replace("`", ""), "-"))
    return ids


def test_readme_links_into_docs_resolve() -> None:
    """MkDocs checks the links between pages of docs/; the README is outside it."""
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\((docs/[^)#]*)(?:#([^)]*))?\)", readme)
    assert links
    broken = []
    for path, anchor in links:
        target = ROOT / path
        if not target.is_file():
            broken.append(path)
        elif anchor and anchor not in _anchors(target):
            broken.append(f"{path}#{anchor}")
    assert broken == []


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_site_builds_strict(tmp_path: Path) -> None:
    """What `make docs` does: a broken link, anchor or API reference fails the build."""
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "index.html").is_file()
    assert (tmp_path / "api" / "index.html").is_file()
