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


@pytest.mark.parametrize("ref, zoo", [("models/deepseek_v3.yaml", "deepseek_v3"), ("models/nope.json", None),
                                      ("a/b.yml", None)])
def test_missing_spec_file_is_a_file_not_a_hub_id(tmp_path, monkeypatch, ref, zoo):
    """Issue 22 #4: the README's 'models/deepseek_v3.yaml' run outside the checkout was taken for a Hub id (24 s of
    retries with the hf extra). A name ending in .yaml/.yml/.json is a file: missing at once, naming the zoo match."""
    import autopar.specs.loaders as loaders

    def no_hub(repo_id):
        raise AssertionError(f"{repo_id} was looked up on the Hub")
    monkeypatch.setattr(loaders, "hf_config_path", no_hub)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AutoparInputError, match="model file not found") as err:
        load_model(ref)
    if zoo:
        assert f"--model {zoo}" in str(err.value)
    else:
        assert "--model" not in str(err.value)
