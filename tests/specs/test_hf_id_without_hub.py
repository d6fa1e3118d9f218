"""Without huggingface_hub, a Hugging Face id is one clear error naming the extra to install."""

import sys

import pytest

from autopar.errors import AutoparInputError
from autopar.specs.loaders import load_model


def test_hf_id_needs_the_hf_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)      # import fails as when it is not installed
    with pytest.raises(AutoparInputError, match=r"autopar\[hf\]"):
        load_model("Qwen/Qwen2.5-7B")
    assert load_model("llama3_8b").num_layers == 32                 # zoo names are unaffected
