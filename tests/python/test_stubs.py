"""The shipped stubs (.pyi) describe the runtime API: same names, parameters and defaults."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import weightcast
from weightcast import _weightcast

PKG = Path(weightcast.__file__).parent


def _stub_functions(path: Path) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(path.read_text())
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def test_stubs_ship_with_the_package():
    for name in ("__init__.pyi", "_weightcast.pyi", "py.typed"):
        assert (PKG / name).is_file(), name


def test_public_stub_signatures_match_the_runtime():
    stubs = _stub_functions(PKG / "__init__.pyi")
    assert set(weightcast.__all__) <= set(stubs) | {"Error", "InputOutputError", "LoadHandle",
                                                     "LoadReport", "MissingInputError",
                                                     "Progress"}
    for name in ("load", "load_into", "load_async", "load_into_async", "build_info"):
        stub, real = stubs[name], inspect.signature(getattr(weightcast, name))
        params = stub.args.args + stub.args.kwonlyargs
        assert [p.arg for p in params] == list(real.parameters), name
        kw_defaults = [ast.literal_eval(d) if d is not None else inspect.Parameter.empty
                       for d in stub.args.kw_defaults]
        for p, default in zip(stub.args.kwonlyargs, kw_defaults):
            assert real.parameters[p.arg].kind is inspect.Parameter.KEYWORD_ONLY, (name, p.arg)
            assert real.parameters[p.arg].default == default, (name, p.arg)
        assert ast.get_docstring(stub), f"{name} has no docstring in the stub"


def test_extension_stub_names_exist():
    stubs = _stub_functions(PKG / "_weightcast.pyi")
    for name in stubs:
        assert hasattr(_weightcast, name), name
    public = {n for n in dir(_weightcast) if not n.startswith("_")}
    assert public <= set(stubs) | {"Cancel", "Catalogue", "LoadResult", "Settings"}, \
        public - set(stubs)


def test_dcp_stub_matches_the_reader():
    import pytest

    pytest.importorskip("torch.distributed.checkpoint")
    import weightcast.dcp

    tree = ast.parse((PKG / "dcp.pyi").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef)
               and n.name == "HuggingFaceStorageReader")
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    real_cls = weightcast.dcp.HuggingFaceStorageReader
    for name, stub in methods.items():
        real = inspect.signature(getattr(real_cls, name))
        params = [p.arg for p in stub.args.args + stub.args.kwonlyargs]
        if name == "validate_checkpoint_id":
            params = params[1:]  # cls, bound away on the classmethod
        assert params == list(real.parameters)[:len(params)], name
        if name == "__init__":
            assert params == list(real.parameters), name
            for p, d in zip(stub.args.kwonlyargs, stub.args.kw_defaults):
                assert real.parameters[p.arg].default == ast.literal_eval(d), p.arg
