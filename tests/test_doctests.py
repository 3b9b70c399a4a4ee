"""Every example in a docstring of acmrl runs and prints what it shows.

The examples are documentation a reader copies (`>>>` lines in the modules); a module whose
example went stale fails here by name. Modules without examples are skipped, not counted.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import acmrl

MODULES = sorted(m.name for m in pkgutil.walk_packages(acmrl.__path__, "acmrl."))


def test_the_package_has_examples_to_check():
    finder = doctest.DocTestFinder()
    with_examples = [
        name
        for name in MODULES
        if any(t.examples for t in finder.find(importlib.import_module(name)))
    ]
    assert len(with_examples) >= 10, with_examples


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
