"""danaus.config: every setting is a documented field, read from ``DANAUS_<NAME>``."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import danaus
from danaus.config import Config

ROOT = Path(__file__).resolve().parents[2]
FIELDS = [f.name for f in dataclasses.fields(Config)]


def test_every_field_has_a_comment_in_config_py() -> None:
    source = (Path(danaus.__file__).parent / "config.py").read_text()
    body = source[source.index("class Config:") : source.index("def __post_init__")]
    lines = body.splitlines()
    undocumented = []
    for name in FIELDS:
        at = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{name}:"))
        above = at - 1
        while above >= 0 and re.fullmatch(r"\s*\w+: .*", lines[above]):
            above -= 1  # fields sharing one comment (tls_cert, tls_key, tls_ca)
        if not lines[above].strip().startswith("#:"):
            undocumented.append(name)
    assert undocumented == []


def test_every_field_is_named_in_the_settings_page() -> None:
    page = (ROOT / "docs" / "settings.md").read_text()
    assert page.startswith("# Settings\n")
    assert [name for name in FIELDS if f"`{name}`" not in page] == []


@pytest.mark.parametrize(
    ("var", "raw", "field", "value"),
    [
        ("DANAUS_LOG_LEVEL", "DEBUG", "log_level", "DEBUG"),
        ("DANAUS_COLLECTIVE_TIMEOUT", "12.5", "collective_timeout", 12.5),
        ("DANAUS_RDMA_DISABLE_IBVERBS", "1", "rdma_disable_ibverbs", True),
        ("DANAUS_RDMA_DISABLE_IBVERBS", "yes", "rdma_disable_ibverbs", True),
        ("DANAUS_RDMA_DISABLE_IBVERBS", "0", "rdma_disable_ibverbs", False),
        ("DANAUS_RDMA_DISABLE_IBVERBS", "", "rdma_disable_ibverbs", False),
        ("DANAUS_RDMA_BACKEND", "tcp", "rdma_backend", "tcp"),
    ],
)
def test_fields_read_their_variable(
    monkeypatch: pytest.MonkeyPatch, var: str, raw: str, field: str, value: object
) -> None:
    monkeypatch.setenv(var, raw)
    assert getattr(Config(), field) == value


#: Variables read outside danaus/config.py, and why. DANAUS_PROC_STARTUP is not a setting
#: but a channel: danaus.monarch writes it so that procs spawned later run its hook.
_READ_ELSEWHERE = {"DANAUS_PROC_STARTUP"}


def test_no_module_but_config_reads_a_danaus_variable() -> None:
    package = Path(danaus.__file__).parent
    read = re.compile(r"""environ(?:\.get\(|\[)\s*["'](DANAUS_\w+)|getenv\(\s*["'](DANAUS_\w+)""")
    found = {
        f"{path.relative_to(package)}: {a or b}"
        for path in package.rglob("*.py")
        if path.name != "config.py"
        for a, b in read.findall(path.read_text())
        if (a or b) not in _READ_ELSEWHERE
    }
    assert found == set()
