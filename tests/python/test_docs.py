"""The public API documents itself: ``help()`` on each public name shows its documentation,
which names every parameter it takes, from the code (the stubs carry signatures only)."""

from __future__ import annotations

import inspect
import pydoc
import re

import pytest

import weightcast


def _documentation(obj: object) -> str:
    """What ``help(obj)`` shows of the object's own words: its docstring and, for a class,
    its ``__init__``'s."""
    doc = inspect.getdoc(obj) or ""
    if inspect.isclass(obj) and obj.__init__ is not object.__init__:
        doc += "\n" + (inspect.getdoc(obj.__init__) or "")
    return doc


def _check_documented(name: str, obj: object) -> None:
    doc = _documentation(obj)
    assert ".pyi" not in doc, f"{name}'s documentation points at a stub: {doc!r}"
    # help() prints it: the first line of the docstring is on the page.
    first = doc.strip().splitlines()[0]
    assert first in pydoc.render_doc(obj, renderer=pydoc.plaintext), name
    params = [p for p in inspect.signature(obj).parameters if p not in ("self", "cls")]
    undocumented = [p for p in params if not re.search(rf"\b{re.escape(p)}\b", doc)]
    assert not undocumented, f"{name}'s documentation does not mention {undocumented}"


@pytest.mark.parametrize("name", weightcast.__all__)
def test_every_public_name_documents_its_parameters(name):
    _check_documented(f"weightcast.{name}", getattr(weightcast, name))


def test_load_and_load_into_document_what_they_return_and_raise():
    for fn in (weightcast.load, weightcast.load_into):
        doc = inspect.getdoc(fn)
        for section in ("Args:", "Returns:", "Raises:"):
            assert section in doc, (fn.__name__, section)


def test_the_dcp_reader_documents_itself():
    pytest.importorskip("torch.distributed.checkpoint")
    from weightcast.dcp import HuggingFaceStorageReader as reader

    _check_documented("weightcast.dcp.HuggingFaceStorageReader", reader)
    for method in ("reset", "validate_checkpoint_id", "read_metadata", "read_data",
                   "prepare_local_plan", "prepare_global_plan"):
        assert inspect.getdoc(getattr(reader, method)), method
