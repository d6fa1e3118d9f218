"""gpt-oss-120b's BF16 rows of Megatron-Bridge's 26.04.01 container against `autopar estimate`, each with the switches its
recipe states (README 'Accuracy', "Left unexplained"). These runs are not in data/published_runs.csv and nothing is
fitted to them: the script prints the cost model's prediction, its memory and its step-time terms beside the measured
throughput, so the pattern by chip can be read off. About 5 s.

    python benchmarks/gpt_oss_2604.py

Measured: NVIDIA-NeMo/Megatron-Bridge@067f987d docs/performance-summary-archive.md, '26.04.01 NeMo Container',
Pre-Training Performance, 'Model: GPT OSS 120B' (64 GPUs, BF16, GBS 1280, 4,096 tokens, TP 1, CP 1, no FSDP).
The same runs are the mb2604a-gptoss120b-* rows of data/published_runs_holdout.csv, which read the recipes at v0.4.1
(the last tag before the rows were added); v0.4.2, the release the docs pair with 26.04.01, differs only in dropping
HybridEP on B200 and GB200, a dispatcher autopar records but does not price, so both give these predictions.
Recipes: Megatron-Bridge v0.4.2 (the 26.04.01 release) scripts/performance/configs/gpt_oss/
gpt_oss_workload_base_configs.py ``GPT_OSS_120B_PRETRAIN_CONFIG_<chip>_BF16_V2`` (EP, MBS, PP, recompute modules,
TE CUDA-graph scopes attn/moe_router/moe_preprocess on GB300 and B300, moe_a2a_overlap on GB200 only, HybridEP on
B300 only, the alltoall dispatcher of src/megatron/bridge/recipes/gpt_oss/gpt_oss.py elsewhere);
gpt_oss_llm_pretrain.py set_gpt_oss_common_configs (grad_reduce_in_fp32 False: bf16 gradients; forced load
balancing); utils/overrides.py _set_common_perf_overrides (cross_entropy_fusion_impl 'te', at the pinned Transformer
Engine 366798ef still in place in the logits).
"""

from __future__ import annotations

from autopar.cost.estimator import Estimator
from autopar.specs.layout import Layout
from autopar.specs.loaders import load_hardware, load_model, load_stack
from autopar.specs.training import TrainingSpec

# chip, EP, PP, MBS, recompute, knobs the recipe states (beside cross_entropy te), measured tokens/s/GPU
ROWS = (
    ("gb300_nvl72", 64, 1, 4, "none", {"ep_overlap": False, "cuda_graphs": "partial"}, 19200),
    ("gb200_nvl72", 64, 1, 4, "layernorm,moe_act", {"ep_overlap": True}, 16640),
    ("b300", 8, 1, 4, "none", {"ep_overlap": False, "cuda_graphs": "partial", "dispatcher": "hybridep"}, 15232),
    ("b200", 8, 1, 4, "layernorm,moe_act", {"ep_overlap": False}, 13568),
    ("h100_sxm", 8, 4, 1, "layernorm,moe_act", {"ep_overlap": False}, 5824),
)


def training(stack, knobs: dict) -> TrainingSpec:
    """The TrainingSpec ``autopar estimate --knobs`` builds: the stack's knobs with the recipe's, then the run."""
    fields = stack.with_knobs({"cross_entropy": "te", **knobs}).training_fields()
    return TrainingSpec(seq_len=4096, global_batch=1280, precision="bf16", grad_dtype="bf16", **fields)


def main() -> None:
    model = load_model("gpt_oss_120b")
    print(f"{'chip':<12} {'layout':<34} {'pred':>7} {'meas':>7} {'err':>7} {'GiB':>6}  step-time terms (s)")
    for chip, ep, pp, mbs, rc, knobs, measured in ROWS:
        stack = load_stack("megatron_core")
        est = Estimator(model, stack.on(load_hardware(chip)), training(stack, knobs), 64).estimate(
            Layout(tp=1, pp=pp, ep=ep, micro_batch=mbs, zero_stage=1, recompute=rc))
        pred = est.tokens_per_s_per_gpu
        terms = {k: round(v, 3) for k, v in est.time_s.to_dict().items() if v and k != "total"}
        print(f"{chip:<12} {f'EP{ep} PP{pp} mbs{mbs} rc:{rc}':<34} {pred:>7.0f} {measured:>7} "
              f"{100 * (pred / measured - 1):>+6.1f}% {est.memory_gib.total:>6.1f}  {terms}")


if __name__ == "__main__":
    main()
