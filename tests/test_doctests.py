"""The ``>>>`` examples in the serving modules' docstrings run and say what the code does."""
import doctest
import importlib

import pytest

MODULES = ["kimi_eagle.serving.request", "kimi_eagle.serving.profiles", "kimi_eagle.serving.detokenizer", "kimi_eagle.serving.answer",
           "kimi_eagle.serving.unserve"]


@pytest.mark.parametrize("name", MODULES)
def test_the_docstring_examples_hold(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0, name
