"""Upper bounds of every size autopar accepts, each with the reason it exists.

A bound keeps the work of a search, a loop over layers or a cost table finite and its numbers exact: without
one, ``--gpus 2147483648`` or ``num_layers: 10000000`` ran for minutes and ended in a MemoryError, an
OverflowError or a NaN cast to an integer. Each bound sits far above the largest real value known to us (the
reason names it), so no real model, cluster or published run is turned away. The pydantic specs and the CLI
flags read their limits from :data:`BOUNDS`; ``docs/input-bounds.md`` prints this table (a test keeps the two
in step). An input above a bound gets one line naming the field and the bound, and exit status 2.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bound:
    """The largest value a size may take, and why."""

    limit: int | float
    why: str

    def __str__(self) -> str:
        return f"{self.limit:,}"


#: name -> bound. The names are the ones used in docs/input-bounds.md and in error messages.
BOUNDS: dict[str, Bound] = {
    "gpus": Bound(1_048_576, "2^20: the largest training clusters announced hold 100,000-200,000 GPUs (xAI "
                             "Colossus, 2025); the mesh enumeration and the smallest-count search grow with it"),
    "layers": Bound(1_024, "the deepest transformer trained to date has 1,000 layers (DeepNet, arXiv 2203.00555); "
                           "the zoo's deepest has 128; per-layer loops (MoE pattern, FLOPs, stage splits) are O(L)"),
    "hidden": Bound(131_072, "2^17, 5x the widest zoo model (Megatron 1T: 25,600); every weight count is O(h^2)"),
    "ffn": Bound(1_048_576, "2^20, 10x the widest zoo MLP (Megatron 1T: 102,400)"),
    "heads": Bound(4_096, "the hidden-size bound over a 32-wide head; the zoo's most is 160 (Megatron 1T)"),
    "head_dim": Bound(4_096, "16x the widest head in use (256: Gemma); also bounds the MLA ranks' per-head dims"),
    "lora_rank": Bound(131_072, "MLA latent ranks (DeepSeek-V3: 1,536 and 512) are at most the hidden size"),
    "experts": Bound(16_384, "8x the most routed experts trained (Switch-C: 2,048, arXiv 2101.03961); the "
                             "zoo's most is 384 (Kimi K2); expert-parallel candidates are the divisors"),
    "vocab": Bound(4_194_304, "2^22, 16x the largest vocabulary in use (Gemma 3: 262,144)"),
    "seq_len": Bound(16_777_216, "2^24 tokens, above the longest published context (Llama 4 Scout: 10M); also "
                                 "bounds max_position_embeddings and sliding_window"),
    "global_batch": Bound(16_777_216, "2^24 sequences, 1000x the largest published batch (DeepSeek-V3: 15,360)"),
    "tokens_per_step": Bound(2 ** 36, "seq_len x global_batch, about 1000x DeepSeek-V3's 63M tokens per step; "
                                      "keeps step times and their integer tables finite"),
    "degree": Bound(1_048_576, "a parallel degree (tp, pp, cp, ep, etp, dp, hsdp) cannot exceed the GPU "
                               "bound"),
    "vpp": Bound(1_024, "virtual stages per pipeline rank divide the layers, so at most the layer bound"),
    "micro_batch": Bound(16_777_216, "sequences per micro-batch: at most the global-batch bound"),
    "gpus_per_node": Bound(1_024, "server GPUs per node; the largest products have 8 (HGX) or 4 (GB200 trays)"),
    "nvlink_domain": Bound(65_536, "GPUs in one NVLink/xGMI domain; the largest announced is 576 "
                                   "(NVIDIA Rubin Ultra NVL576)"),
    "time_limit_s": Bound(86_400.0, "one day: the benchmark problems (benchmarks/bench_solve.py) prove their "
                                    "optimum in seconds; a limit must also be finite and positive"),
    "run_timeout_s": Bound(604_800.0, "one week per real run (autopar tune/profile --timeout): a run of a few "
                                      "steps that takes longer has hung"),
    "top_k": Bound(1_000, "layouts listed or kept from the solver; each one is a CP-SAT solution to enumerate"),
    "trials": Bound(100_000, "real training runs of one tuning study"),
    "steps": Bound(1_000_000, "training steps of one measurement run"),
    "seed": Bound(2 ** 32 - 1, "random seeds of numpy, torch and Optuna's samplers are 32-bit"),
    "hbm_gib": Bound(1_048_576, "2^20 GiB (1 PiB) of memory per GPU, 3,600x the most HBM on one GPU (B300: 288 GB); "
                                "memory enters the solver's integer tables, and 1e30 GiB overflowed them"),
    "hardware_rate": Bound(1_000_000_000, "TFLOP/s, TB/s and GB/s of one GPU or link: 200,000x the fastest chip "
                                          "(GB300: 5,000 dense FP8 TFLOP/s); step times stay finite"),
    "csv_rows": Bound(10_000, "rows of a runs CSV (autopar validate --csv): 200x the 50 published runs; each "
                              "row is an estimate with its unstated knobs filled (about 15 ms), so the bound caps "
                              "the work at a few minutes"),
}

#: The least value a hardware rate (peak TFLOP/s, HBM TB/s, link GB/s) may take: 0.001 of its unit, 10^5x below the
#: slowest real figure in the zoo (25 GB/s scale-out). Below it (1e-300 GB/s) step times overflow to infinity and the
#: solver's integer tables cannot hold them.
RATE_FLOOR = 1e-3


#: spec field -> the bound it is held to (used to explain a "less than or equal" error).
FIELD_BOUNDS: dict[str, str] = {
    "num_layers": "layers", "hidden_size": "hidden", "ffn_hidden_size": "ffn", "num_attention_heads": "heads",
    "num_kv_heads": "heads", "head_dim": "head_dim", "vocab_size": "vocab", "max_position_embeddings": "seq_len",
    "sliding_window": "seq_len", "sliding_window_every": "layers", "mtp_layers": "layers",
    "num_experts": "experts", "top_k": "experts", "expert_ffn_hidden_size": "ffn", "num_shared_experts": "experts",
    "shared_expert_ffn_hidden_size": "ffn", "first_dense_layers": "layers", "moe_layer_interval": "layers",
    "q_lora_rank": "lora_rank", "kv_lora_rank": "lora_rank", "qk_nope_head_dim": "head_dim",
    "qk_rope_head_dim": "head_dim", "v_head_dim": "head_dim",
    "seq_len": "seq_len", "global_batch": "global_batch",
    "tp": "degree", "pp": "degree", "cp": "degree", "ep": "degree", "etp": "degree", "dp": "degree",
    "hsdp_shard": "degree", "grad_accum": "global_batch", "vpp": "vpp", "micro_batch": "micro_batch",
    "stage_layers": "layers", "gpus_per_node": "gpus_per_node", "nvlink_domain_size": "nvlink_domain",
    "hbm_gib": "hbm_gib", "host_memory_gib": "hbm_gib", "reserve_gib": "hbm_gib",
    "peak_tflops_bf16": "hardware_rate", "peak_tflops_fp16": "hardware_rate", "peak_tflops_fp8": "hardware_rate",
    "peak_tflops_mxfp8": "hardware_rate", "peak_tflops_nvfp4": "hardware_rate", "hbm_tbps": "hardware_rate",
    "nvlink_gbps": "hardware_rate", "scaleout_gbps": "hardware_rate", "host_link_gbps": "hardware_rate",
}


def limit(name: str) -> int | float:
    """The bound's value, e.g. ``limit("gpus") == 1_048_576``."""
    return BOUNDS[name].limit


def bound_note(name: str) -> str:
    """'<= 1,048,576 (why)' for error messages."""
    b = BOUNDS[name]
    return f"<= {b} ({b.why})"
