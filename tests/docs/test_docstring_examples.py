"""The ``>>>`` examples in the docstrings of the public names (those the API reference renders) run and print what
they show (those of a module whose extra is not installed, ``NEEDS``, are left out)."""
from __future__ import annotations

import doctest
import importlib
import inspect

import pytest

from tests.docs.test_api_reference import MODULES, _importable, public_names


def docstring_examples():
    finder, seen, out = doctest.DocTestFinder(recurse=True), set(), []
    for module_name in MODULES:
        if not _importable(module_name):
            continue
        module = importlib.import_module(module_name)
        for name in public_names(module):
            obj = getattr(module, name)
            if inspect.ismodule(obj) or id(obj) in seen:
                continue
            seen.add(id(obj))
            out += [t for t in finder.find(obj, f"{module_name}.{name}", module=False, globs={}) if t.examples]
    return out


@pytest.mark.usefixtures("one_thread")
def test_docstring_examples_run():
    examples = docstring_examples()
    if not examples:
        pytest.skip("no docstring has an example")
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = []
    for test in examples:
        result = runner.run(test, out=report.append)
        assert not result.failed, f"docstring example of {test.name} failed:\n" + "".join(report)[-3000:]
