"""Every surface's bounds come from the settings registry (core/settings.hpp): the keyword
tables of docs/python.md and docs/config.md, ``load``'s docstring and the Python keywords'
messages state each setting's bounds and default as the registry has them, and the default
port is stated in one document. A new setting's footprint: scripts/setting_footprint.sh."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

import weightcast
from weightcast import Error, _options

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = _options.registry()
BOUNDED = [name for name in _options.KEYWORD_KEYS if REGISTRY[name]["min"] is not None]


def _squashed(text: str) -> str:
    """``text`` without white space, so "1 B – 4 GiB" reads as the registry's "1B" and "4GiB"."""
    return re.sub(r"\s+", "", text)


def _table_rows(doc: Path) -> dict[str, str]:
    """A Markdown document's table rows by their first cell's `name`."""
    rows = {}
    for line in doc.read_text().splitlines():
        match = re.match(r"\| `([^`]+)` \|(.*)", line)
        if match:
            rows.setdefault(match.group(1), match.group(2))
    return rows


def _range(setting: dict, dash: str) -> str:
    """"1–1024", "1B–4GiB": a size's bare byte count takes its unit, as the docs write it."""
    low = setting["min_text"] + ("B" if setting["type"] == "size" and
                                 setting["min_text"].isdigit() else "")
    return f"{low}{dash}{setting['max_text']}"


def test_the_registry_lists_every_keyword_that_is_a_config_key():
    for name in _options.KEYWORD_KEYS:
        assert name in REGISTRY, name
    assert REGISTRY["rendezvous.port"]["type"] == "count"


@pytest.mark.parametrize("name", BOUNDED)
def test_python_md_states_each_keywords_bounds_and_default(name):
    setting = REGISTRY[name]
    row = _squashed(_table_rows(ROOT / "docs" / "python.md")[name])
    if setting["type"] == "duration":
        assert _squashed(f"at most {setting['max_text']}") in row
    else:
        assert _range(setting, "–") in row
    assert f"default{setting['default']}" in row


def test_python_md_states_the_ports_bounds():
    port = REGISTRY["rendezvous.port"]
    assert _range(port, "–") in _squashed(_table_rows(ROOT / "docs" / "python.md")
                                          ["rendezvous_port"])


@pytest.mark.parametrize("name", ["chunk_size", "buffer_depth", "io_depth", "rendezvous.port"])
def test_config_md_states_each_keys_greatest_value(name):
    setting = REGISTRY[name]
    row = _squashed(_table_rows(ROOT / "docs" / "config.md")[name])
    # "1–1024", "> 0, ≤ 4GiB"; a port's bounds are TCP's ("TCP port").
    if name == "rendezvous.port":
        assert (setting["min"], setting["max"]) == (1, 65535) and "TCPport" in row
    elif setting["type"] == "size":
        assert f"≤{setting['max_text']}" in row
    else:
        assert _range(setting, "–") in row


def test_loads_docstring_states_the_registrys_bounds():
    doc = _squashed(weightcast.load.__doc__ or "")
    for name in BOUNDED:
        setting = REGISTRY[name]
        if setting["type"] == "duration":
            assert f"default{setting['default']}" in doc, name
        else:
            assert _range(setting, "to") in doc, name
    port = REGISTRY["rendezvous.port"]
    assert _range(port, "to") in doc
    assert f"``rendezvous.port``,{port['default']}" in doc


def test_the_default_port_is_stated_in_config_md_alone():
    # Every other document links there, so changing the default changes one table row.
    default = REGISTRY["rendezvous.port"]["default"]
    stating = sorted(str(p.relative_to(ROOT)) for p in [*(ROOT / "docs").glob("*.md"),
                                                      ROOT / "README.md"]
                     if re.search(rf"\b{default}\b", p.read_text()))
    assert stating == ["docs/config.md"]


def test_keyword_type_messages_give_the_registrys_bounds():
    timeout = REGISTRY["timeout"]
    with pytest.raises(Error, match=re.escape(f"(at most {timeout['max_text']})")):
        _options.keyword_text("timeout", float("nan"))
    port = REGISTRY["rendezvous.port"]
    with pytest.raises(Error, match=re.escape(f"(an int, {port['min']} to {port['max']})")):
        _options.checked_port("29555")
    with pytest.raises(Error, match="is not one of 'auto', 'on', 'off', True, False"):
        _options.keyword_text("direct_io", 1)
    with pytest.raises(Error, match="is not one of 'auto', 'uring', 'pread'$"):
        _options.keyword_text("reader", True)


def test_every_keyword_reaches_the_config_as_its_keys_text():
    # A keyword's bad value gets the config's own message, whatever the keyword.
    for name, bad in [("chunk_size", 0), ("buffer_depth", 0), ("io_depth", 0),
                      ("direct_io", "sometimes"), ("timeout", "0s"), ("reader", "mmap")]:
        with pytest.raises(Error, match=rf"^keyword {name}=") as raised:
            _options.Options.of(config=None, **{name: bad})
        assert raised.value.status == 78
    assert _options.keyword_text("verify", True) == "true"
    assert _options.keyword_text("direct_io", False) == "false"


def test_the_footprint_script_counts_a_settings_files():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("scripts/setting_footprint.sh lists files with git: no git checkout here")
    out = subprocess.run([str(ROOT / "scripts" / "setting_footprint.sh"), "io_depth"],
                         capture_output=True, text=True, check=True).stdout
    found = re.match(r"io_depth: (\d+) files \((\d+) defining, (\d+) using\)", out)
    count, defining, using = (int(g) for g in found.groups())
    assert count == len(out.splitlines()) - 1 == defining + using
    # A plain setting is defined in four files: its registry entry, its Config field and
    # plain-key line, its docs/config.md row and its configs/default.yaml line; the key
    # table and the registry's list are built from them.
    assert defining == 4
    assert "uses     src/config/keys.cpp" not in out and "src/core/settings.cpp" not in out
