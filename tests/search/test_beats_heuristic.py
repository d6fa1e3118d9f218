"""On every zoo model at its typical GPU count, the solver's best is predicted at least as fast as the
rules-of-thumb layout (parallelism-strategy-rules.md), and it fits (the heuristic layout sometimes does not)."""

import pytest

from autopar.defaults import default_global_batch
from autopar.search import SearchOptions, solve
from autopar.specs import TrainingSpec
from autopar.specs.loaders import load_model

# Typical GPU counts: the rules document's size classes for dense models, its MoE table's EP·PP scale for MoE.
TYPICAL_GPUS = {
    "llama2_7b": 8, "llama2_13b": 16, "llama2_70b": 64, "llama3_8b": 8, "llama3_70b": 64, "llama3_405b": 1024,
    "gpt3_175b": 256, "nemotron4_15b": 16, "nemotron4_340b": 256, "mixtral_8x7b": 64, "mixtral_8x22b": 128,
    "olmoe": 8, "moonlight_16b_a3b": 16, "deepseek_v2": 128, "deepseek_v3": 1024, "qwen3_30b_a3b": 32,
    "qwen3_235b_a22b": 256, "glm45_air": 64, "glm45": 256, "kimi_k2": 1024, "gpt_oss_120b": 64,
    "llama4_scout": 64, "llama4_maverick": 256,
}


@pytest.mark.parametrize("name, gpus", sorted(TYPICAL_GPUS.items()))
def test_solver_at_least_as_fast_as_the_rules_of_thumb(name, gpus):
    model = load_model(name)
    gb, _ = default_global_batch(model, 4096)
    res = solve(model, "h100_sxm", TrainingSpec(seq_len=4096, global_batch=gb), gpus,
                SearchOptions(top_k=1, time_limit_s=60), explain=False)
    assert res.status == "OPTIMAL" and res.plans
    best = res.plans[0].estimate
    assert best.fits
    assert res.heuristic is not None, res.heuristic_reasons
    assert best.step_time_s <= res.heuristic.estimate.step_time_s * (1 + 1e-9)
