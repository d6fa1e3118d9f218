"""Hugging Face config.json -> ModelSpec (``autopar.specs.hf_config``).

Each family is tested with a config written out below and compared with the zoo file of the same model (equal
parameter counts: total, active, MoE split, MTP), or, where the zoo has no such model, with the published count.

Where the configs come from (none of the Hugging Face pages themselves was reachable from here):
- VERBATIM: copied from AI-Hypercomputer/maxtext src/MaxText/utils/ckpt_conversion/utils/hf_model_configs.py, whose
  dicts say "from https://huggingface.co/<repo>/blob/main/config.json" (DeepSeek-V2-Lite, DeepSeek-V3, gpt-oss-120b,
  Mixtral 8x7B / 8x22B) or are the transformers config of the checkpoint (Llama 3.1, Qwen3, Qwen3-MoE), the
  ``quantization_config`` left out as MaxText does (and ``auto_map`` left out here);
  Llama 4 Maverick from NVIDIA/TensorRT-LLM's test LLAMA_4_MAVERICK_TWO_LAYER_CONFIG with its two changes undone
  (num_hidden_layers 2 -> 48; its added "no_rope_layer_interval" dropped).
- KEYS: the config's structural keys only, with values confirmed by the sources cited in the zoo files (OLMoE,
  Moonlight, Kimi K2, DeepSeek-V2, GLM-4.5, GLM-4.5-Air, Llama 4 Scout, Qwen2.5-7B, Mistral 7B).
"""

from __future__ import annotations

import copy
import json

import pytest

from autopar.errors import AutoparInputError
from autopar.specs.hf_config import IGNORED_KEYS, SUPPORTED_MODEL_TYPES, model_from_hf_config
from autopar.specs.loaders import load_model
from autopar.specs.model import ModelSpec

WHERE = "/models/x/config.json"

# ---- Llama ------------------------------------------------------------------------------------------------------
# VERBATIM (maxtext llama31_8b_config) plus model_type/architectures.
LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072, "head_dim": 128,
    "rms_norm_eps": 1e-5, "bos_token_id": 128000, "eos_token_id": 128001, "attention_bias": False,
    "attention_dropout": 0.0, "hidden_act": "silu", "initializer_range": 0.02, "mlp_bias": False,
    "pretraining_tp": 1,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "use_cache": True,
}
# VERBATIM (maxtext llama31_405b_config) plus model_type/architectures.
LLAMA31_405B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "vocab_size": 128256, "hidden_size": 16384, "intermediate_size": 53248, "num_hidden_layers": 126,
    "num_attention_heads": 128, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05, "bos_token_id": 128000, "eos_token_id": 128001,
}
# KEYS: Mistral 7B v0.1 (paper arXiv 2310.06825 Table 1: window_size 4096 on every layer).
MISTRAL_7B_V01 = {
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 32000, "sliding_window": 4096, "tie_word_embeddings": False, "hidden_act": "silu",
}
# ---- Mixtral (VERBATIM) -----------------------------------------------------------------------------------------
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32, "num_experts_per_tok": 2,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": False,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.36.0.dev0",
    "use_cache": True, "vocab_size": 32000,
}
MIXTRAL_8X22B = {
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 6144, "initializer_range": 0.02, "intermediate_size": 16384,
    "max_position_embeddings": 65536, "model_type": "mixtral", "num_attention_heads": 48, "num_experts_per_tok": 2,
    "num_hidden_layers": 56, "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": False,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.38.0", "use_cache": True,
    "vocab_size": 32768,
}
# ---- Qwen2 / Qwen3 dense ----------------------------------------------------------------------------------------
# KEYS: Qwen2.5-7B (maxtext qwen2.5-7b.yml: 28 layers, 3584, 18944, 28 heads, 4 KV heads, vocab 152064, biases).
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
    "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
    "tie_word_embeddings": False, "use_sliding_window": False, "hidden_act": "silu", "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
}
# VERBATIM (maxtext qwen3_8b_config) plus model_type/architectures.
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
    "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 40960, "rms_norm_eps": 1.0e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
# ---- Qwen3-MoE (VERBATIM, the 2507 releases: same architecture as Qwen3-235B-A22B / Qwen3-30B-A3B) --------------
QWEN3_235B_A22B = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288, "max_position_embeddings": 262144,
    "max_window_layers": 94, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 1536,
    "norm_topk_prob": True, "num_attention_heads": 64, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 94, "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 5000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 262144,
    "max_window_layers": 48, "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": True,
    "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
    "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 10000000, "router_aux_loss_coef": 0.001, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}
# ---- DeepSeek-V2 / V3, Moonlight, Kimi K2 -----------------------------------------------------------------------
# VERBATIM (maxtext deepseek2_16b_dict, "from .../DeepSeek-V2-Lite/blob/main/config.json").
DEEPSEEK_V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001, "bos_token_id": 100000, "eos_token_id": 100001, "first_k_dense_replace": 1,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 10944,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v2",
    "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2,
    "norm_topk_prob": False, "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27,
    "num_key_value_heads": 16, "pretraining_tp": 1, "q_lora_rank": None, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": True,
    "tie_word_embeddings": False, "topk_group": 1, "topk_method": "greedy", "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1", "use_cache": True, "v_head_dim": 128, "vocab_size": 102400,
}
# KEYS: DeepSeek-V2 (values as in models/deepseek_v2.yaml).
DEEPSEEK_V2 = {
    **DEEPSEEK_V2_LITE, "hidden_size": 5120, "intermediate_size": 12288, "moe_intermediate_size": 1536,
    "n_routed_experts": 160, "n_shared_experts": 2, "num_attention_heads": 128, "num_key_value_heads": 128,
    "num_experts_per_tok": 6, "num_hidden_layers": 60, "q_lora_rank": 1536, "first_k_dense_replace": 1,
}
# VERBATIM (maxtext deepseek3_671b_dict, "from .../DeepSeek-V3/blob/main/config.json").
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3, "hidden_act": "silu",
    "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
    "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": False,
    "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "transformers_version": "4.33.1",
    "use_cache": True, "v_head_dim": 128, "vocab_size": 129280,
}
# The FP8 entry of the released checkpoint (deepseek-ai/DeepSeek-V3 README_WEIGHTS.md); it changes weight bytes.
FP8_QUANTIZATION = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                    "weight_block_size": [128, 128]}
# KEYS: Moonlight-16B-A3B and Kimi K2 (DeepSeek-V3 code; values as in their zoo files).
MOONLIGHT = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 2048,
    "intermediate_size": 11264, "moe_intermediate_size": 1408, "num_hidden_layers": 27, "num_attention_heads": 16,
    "num_key_value_heads": 16, "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "q_lora_rank": None, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 163840,
    "tie_word_embeddings": False, "num_nextn_predict_layers": 0, "scoring_func": "sigmoid",
    "topk_method": "noaux_tc", "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.446,
}
KIMI_K2 = {
    **MOONLIGHT, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 64,
    "num_key_value_heads": 64, "n_routed_experts": 384, "n_shared_experts": 1, "num_experts_per_tok": 8,
    "first_k_dense_replace": 1, "q_lora_rank": 1536, "max_position_embeddings": 131072,
    "routed_scaling_factor": 2.827,
}
# ---- OLMoE (KEYS, as quoted in public test fixtures of allenai/OLMoE-1B-7B-0924's config.json) ------------------
OLMOE = {
    "architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 1024, "num_hidden_layers": 16, "num_experts": 64, "num_experts_per_tok": 8,
    "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 50304, "tie_word_embeddings": False,
    "clip_qkv": None, "norm_topk_prob": False, "router_aux_loss_coef": 0.01, "rms_norm_eps": 1e-05,
}
# ---- GLM-4.5 (KEYS; values as in models/glm45.yaml and models/glm45_air.yaml) ----------------------------------
GLM45 = {
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "hidden_size": 5120,
    "intermediate_size": 12288, "moe_intermediate_size": 1536, "num_hidden_layers": 92, "num_attention_heads": 96,
    "num_key_value_heads": 8, "head_dim": 128, "n_routed_experts": 160, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "num_nextn_predict_layers": 1, "attention_bias": True,
    "use_qk_norm": True, "partial_rotary_factor": 0.5, "vocab_size": 151552, "tie_word_embeddings": False,
    "max_position_embeddings": 131072, "routed_scaling_factor": 2.5,
}
GLM45_AIR = {
    **GLM45, "hidden_size": 4096, "intermediate_size": 10944, "moe_intermediate_size": 1408,
    "num_hidden_layers": 46, "n_routed_experts": 128, "first_k_dense_replace": 1, "use_qk_norm": False,
    "routed_scaling_factor": 1.0,
}
# ---- gpt-oss-120b (VERBATIM) --------------------------------------------------------------------------------------
GPT_OSS_120B = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0, "eos_token_id": 200002,
    "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096,
    "initializer_range": 0.02, "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4,
    "num_hidden_layers": 36, "num_key_value_heads": 8, "num_local_experts": 128, "output_router_logits": False,
    "pad_token_id": 199999, "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True, "vocab_size": 201088,
}
# ---- Llama 4 ----------------------------------------------------------------------------------------------------
# VERBATIM text_config of TensorRT-LLM's LLAMA_4_MAVERICK_TWO_LAYER_CONFIG with num_hidden_layers restored to 48
# and its added no_rope_layer_interval removed; vision_config abbreviated to its model_type.
LLAMA4_MAVERICK = {
    "architectures": ["Llama4ForConditionalGeneration"], "boi_token_index": 200080, "eoi_token_index": 200081,
    "image_token_index": 200092, "model_type": "llama4",
    "text_config": {
        "_attn_implementation_autoset": True, "attention_bias": False, "attention_chunk_size": 8192,
        "attention_dropout": 0.0, "bos_token_id": 200000, "eos_token_id": [200001, 200007, 200008],
        "for_llm_compressor": False, "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
        "initializer_range": 0.02, "interleave_moe_layer_step": 2, "intermediate_size": 8192,
        "intermediate_size_mlp": 16384, "max_position_embeddings": 1048576, "model_type": "llama4_text",
        "num_attention_heads": 40, "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8,
        "num_local_experts": 128, "output_router_logits": False, "pad_token_id": 200018, "rms_norm_eps": 1e-05,
        "rope_scaling": None, "rope_theta": 500000.0, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0,
        "torch_dtype": "bfloat16", "use_cache": True, "use_qk_norm": False, "vocab_size": 202048,
    },
    "torch_dtype": "bfloat16", "transformers_version": "4.51.0.dev0",
    "vision_config": {"model_type": "llama4_vision_model"},
}
# KEYS: Llama 4 Scout (16 experts, every layer MoE, L2 Q/K norm; values as in models/llama4_scout.yaml).
LLAMA4_SCOUT = copy.deepcopy(LLAMA4_MAVERICK)
LLAMA4_SCOUT["text_config"].update(num_local_experts=16, interleave_moe_layer_step=1, use_qk_norm=True)

# ---- hybrid and recent families (issue 12) ------------------------------------------------------------------------
# VERBATIM from AI-Hypercomputer/maxtext src/maxtext/checkpoint_conversion/utils/hf_model_configs.py (commit e591f30c):
# QWEN3_NEXT_80B (qwen3_next_80b_a3b_dict), GEMMA3_27B (gemma3_27b_config), GPT_OSS_20B (gpt_oss_20b_dict, its
# 24-entry layer_types written as a product).
# VERBATIM from NVIDIA-NeMo/Megatron-Bridge's NemotronHBridge unit test (nemotronh_8b_config_dict, the
# nvidia/Nemotron-H-8B-Base-8K config; its test-only "n_routed_experts": None dropped): NEMOTRON_H_8B.
# KEYS: NEMOTRON3_NANO (Nemotron 3 Nano 30B-A3B, as ai-dynamo/aiconfigurator's test_parse_nemotronh_config writes it),
# KIMI_LINEAR (Kimi-Linear-48B-A3B as public inference-engine config-parser tests quote it).
QWEN3_NEXT_80B = {"architectures": ["Qwen3NextForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 5120, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_value_head_dim": 128, "max_position_embeddings": 262144, "mlp_only_layers": [], "model_type": "qwen3_next", "moe_intermediate_size": 512, "norm_topk_prob": True, "num_attention_heads": 16, "num_experts": 512, "num_experts_per_tok": 10, "num_hidden_layers": 48, "num_key_value_heads": 2, "output_router_logits": False, "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 10000000, "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 512, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.57.0.dev0", "use_cache": True, "vocab_size": 151936}
NEMOTRON_H_8B = {"architectures": ["NemotronHForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "attention_head_dim": 128, "bos_token_id": 1, "chunk_size": 128, "conv_kernel": 4, "eos_token_id": 2, "expand": 2, "hidden_act": "relu2", "hidden_dropout": 0.0, "hidden_size": 4096, "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-", "initializer_range": 0.02, "intermediate_size": 21504, "layer_norm_epsilon": 1e-05, "mamba_head_dim": 64, "mamba_hidden_act": "silu", "mamba_num_heads": 128, "mamba_proj_bias": False, "max_position_embeddings": 8192, "mlp_bias": False, "mlp_hidden_act": "relu2", "model_type": "nemotron_h", "n_groups": 8, "num_attention_heads": 32, "num_hidden_layers": 52, "num_key_value_heads": 8, "num_logits_to_keep": 1, "pad_token_id": 0, "rescale_prenorm_residual": True, "residual_in_fp32": False, "rms_norm_eps": 1e-05, "ssm_state_size": 128, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.48.0.dev0", "use_bias": False, "use_cache": True, "use_conv_bias": True, "use_mamba_kernels": True, "vocab_size": 131072}
NEMOTRON3_NANO = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "num_hidden_layers": 52, "num_key_value_heads": 2, "hidden_size": 2688, "num_attention_heads": 32, "intermediate_size": 1856, "vocab_size": 131072, "max_position_embeddings": 262144, "num_experts_per_tok": 6, "n_routed_experts": 128, "moe_intermediate_size": 1856, "head_dim": 128, "hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME", "mamba_num_heads": 64, "mamba_head_dim": 64, "ssm_state_size": 128, "conv_kernel": 4, "n_groups": 8, "chunk_size": 128, "moe_shared_expert_intermediate_size": 3712, "tie_word_embeddings": False}
GEMMA3_27B = {"architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3", "text_config": {"attention_bias": False, "attention_dropout": 0.0, "attn_logit_softcapping": None, "cache_implementation": "hybrid", "final_logit_softcapping": None, "head_dim": 128, "hidden_activation": "gelu", "hidden_size": 5376, "initializer_range": 0.02, "intermediate_size": 21504, "max_position_embeddings": 163840, "model_type": "gemma3_text", "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16, "query_pre_attn_scalar": 168, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0, "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "rope_theta": 10000.0, "sliding_window": 1024, "sliding_window_pattern": 6, "use_cache": True, "vocab_size": 262144}, "torch_dtype": "bfloat16", "vision_config": {"attention_dropout": 0.0, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 1152, "image_size": 896, "intermediate_size": 4304, "layer_norm_eps": 1e-06, "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_channels": 3, "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": False}}
GPT_OSS_20B = {"architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0, "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02, "intermediate_size": 2880, "layer_types": ["sliding_attention", "full_attention"] * 12, "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32, "output_router_logits": False, "pad_token_id": 199999, "rms_norm_eps": 1e-05, "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096, "rope_theta": 150000, "rope_type": "yarn", "truncate": False}, "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0, "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True, "vocab_size": 201088}
KIMI_LINEAR = {"architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "hidden_act": "silu", "q_lora_rank": None, "mla_use_nope": True, "moe_router_activation_func": "sigmoid", "num_expert_group": 1, "topk_group": 1, "moe_layer_freq": 1, "tie_word_embeddings": False, "hidden_size": 2304, "num_hidden_layers": 27, "vocab_size": 163840, "rms_norm_eps": 1e-5, "num_attention_heads": 32, "num_key_value_heads": 32, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "num_experts": 256, "num_experts_per_token": 8, "num_shared_experts": 1, "moe_intermediate_size": 1024, "routed_scaling_factor": 2.446, "moe_renormalize": True, "first_k_dense_replace": 1, "intermediate_size": 9216, "eos_token_id": 163586, "linear_attn_config": {"full_attn_layers": [4, 8, 12, 16, 20, 24, 27], "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26], "head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4}}
# KEYS, Jamba-v0.1: the structural keys of ai21labs/Jamba-v0.1's config.json as a public config-parser test trims it
# (attn/expert periods and offsets, Mamba sizes, experts, vocabulary), plus intermediate_size and mamba_dt_rank from
# transformers' JambaConfig defaults, which its docstring says reproduce Jamba-v0.1.
JAMBA_V01 = {"architectures": ["JambaForCausalLM"], "model_type": "jamba", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "attn_layer_offset": 4, "attn_layer_period": 8, "expert_layer_offset": 1, "expert_layer_period": 2, "mamba_d_conv": 4, "mamba_d_state": 16, "mamba_expand": 2, "mamba_dt_rank": 256, "mamba_conv_bias": True, "mamba_proj_bias": False, "num_experts": 16, "num_experts_per_tok": 2, "vocab_size": 65536, "max_position_embeddings": 262144, "tie_word_embeddings": False, "use_mamba_kernels": True, "torch_dtype": "bfloat16"}
# KEYS, Falcon-H1-7B-Base: the shape in transformers' falcon_h1 docs table, the other keys as a public test fixture
# copies the config (FALCON_H1_7B_HF), plus the µP multipliers every Falcon-H1 config carries (values illustrative).
FALCON_H1_7B = {"architectures": ["FalconH1ForCausalLM"], "model_type": "falcon_h1", "hidden_size": 3072, "num_hidden_layers": 44, "num_attention_heads": 12, "num_key_value_heads": 2, "head_dim": 128, "intermediate_size": 12288, "vocab_size": 130048, "tie_word_embeddings": False, "mamba_d_state": 256, "mamba_n_groups": 1, "mamba_n_heads": 24, "mamba_d_head": 128, "mamba_d_ssm": 3072, "mamba_expand": 2, "mamba_d_conv": 4, "mamba_chunk_size": 128, "max_position_embeddings": 262144, "mamba_conv_bias": True, "mamba_proj_bias": False, "mamba_rms_norm": False, "mamba_norm_before_gate": False, "projectors_bias": False, "attention_bias": False, "mlp_bias": False, "attention_in_multiplier": 1.0, "attention_out_multiplier": 1.0, "key_multiplier": 1.0, "ssm_in_multiplier": 1.0, "ssm_out_multiplier": 1.0, "ssm_multipliers": [1.0, 1.0, 1.0, 1.0, 1.0], "mlp_multipliers": [1.0, 1.0], "embedding_multiplier": 1.0, "lm_head_multiplier": 1.0, "rope_theta": 1e11}
# KEYS, Nemotron-H-56B-Base-8K: Megatron-Bridge's NemotronHModelProvider56B shape written as config.json keys.
NEMOTRON_H_56B = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-", "hidden_size": 8192, "num_hidden_layers": 118, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 32768, "mamba_num_heads": 256, "mamba_head_dim": 64, "n_groups": 8, "ssm_state_size": 256, "conv_kernel": 4, "expand": 2, "chunk_size": 128, "vocab_size": 131072, "tie_word_embeddings": False, "max_position_embeddings": 8192}


def _counts(m: ModelSpec) -> tuple:
    return (m.total_params, m.active_params, m.expert_params_total, m.num_moe_layers,
            m.mtp_layers * m.mtp_module_params if m.mtp_layers else 0)


def _map(cfg: dict, name: str = "x") -> tuple[ModelSpec, set[str]]:
    return model_from_hf_config(copy.deepcopy(cfg), name=name, where=WHERE)


ROUND_TRIP = [
    ("llama", LLAMA31_8B, "llama3_8b"),
    ("llama", LLAMA31_405B, "llama3_405b"),
    ("mixtral", MIXTRAL_8X7B, "mixtral_8x7b"),
    ("mixtral", MIXTRAL_8X22B, "mixtral_8x22b"),
    ("qwen3_moe", QWEN3_235B_A22B, "qwen3_235b_a22b"),
    ("qwen3_moe", QWEN3_30B_A3B, "qwen3_30b_a3b"),
    ("deepseek_v2", DEEPSEEK_V2, "deepseek_v2"),
    ("deepseek_v3", DEEPSEEK_V3, "deepseek_v3"),
    ("deepseek_v3", MOONLIGHT, "moonlight_16b_a3b"),
    ("kimi_k2", KIMI_K2, "kimi_k2"),
    ("olmoe", OLMOE, "olmoe"),
    ("glm4_moe", GLM45, "glm45"),
    ("glm4_moe", GLM45_AIR, "glm45_air"),
    ("gpt_oss", GPT_OSS_120B, "gpt_oss_120b"),
    ("llama4", LLAMA4_MAVERICK, "llama4_maverick"),
    ("llama4", LLAMA4_SCOUT, "llama4_scout"),
    ("qwen3_next", QWEN3_NEXT_80B, "qwen3_next_80b_a3b"),
    ("nemotron_h", NEMOTRON_H_8B, "nemotron_h_8b"),
    ("nemotron_h", NEMOTRON3_NANO, "nemotron3_nano_30b_a3b"),
    ("gemma3", GEMMA3_27B, "gemma3_27b"),
    ("gpt_oss", GPT_OSS_20B, "gpt_oss_20b"),
    ("kimi_linear", KIMI_LINEAR, "kimi_linear_48b_a3b"),
    ("jamba", JAMBA_V01, "jamba_v0_1"),
    ("falcon_h1", FALCON_H1_7B, "falcon_h1_7b"),
    ("nemotron_h", NEMOTRON_H_56B, "nemotron_h_56b"),
]


@pytest.mark.parametrize("family,cfg,zoo", ROUND_TRIP, ids=[r[2] for r in ROUND_TRIP])
def test_config_maps_to_the_zoo_model(family, cfg, zoo):
    assert cfg["model_type"] == family
    ours, _ = _map(cfg, name=zoo)
    ref = load_model(zoo)
    assert _counts(ours) == _counts(ref), f"{zoo}: {ours.summary()} vs zoo {ref.summary()}"
    # The shape fields agree too (source and the informational max_position_embeddings may differ).
    skip = {"source", "max_position_embeddings"}
    a = ours.model_dump(exclude=skip)
    b = ref.model_dump(exclude=skip)
    if zoo == "llama4_scout":  # the zoo's dense FFN width is unused (every layer MoE) and unconfirmed
        a.pop("ffn_hidden_size"), b.pop("ffn_hidden_size")
    assert a == b


# Published figures for the configs that have no zoo file (same tolerance rule as test_zoo_models.py).
@pytest.mark.parametrize("cfg,count,printed,source", [
    (QWEN25_7B, "total", "7.61", "Qwen/Qwen2.5-7B model card"),
    (QWEN25_7B, "total_no_emb", "6.53", "Qwen/Qwen2.5-7B model card (non-embedding)"),
    (QWEN3_8B, "total", "8.2", "Qwen/Qwen3-8B model card"),
    (QWEN3_8B, "total_no_emb", "6.95", "Qwen/Qwen3-8B model card (non-embedding)"),
    (MISTRAL_7B_V01, "total", "7.3", "Mistral AI 'Mistral 7B' announcement"),
    (DEEPSEEK_V2_LITE, "total", "15.7", "DeepSeek-V2 paper arXiv 2405.04434 (DeepSeek-V2-Lite, 15.7B)"),
], ids=["qwen2.5-7b", "qwen2.5-7b-no-emb", "qwen3-8b", "qwen3-8b-no-emb", "mistral-7b", "deepseek-v2-lite"])
def test_config_without_zoo_file_matches_published(cfg, count, printed, source):
    m, _ = _map(cfg)
    emb = m.vocab_size * m.hidden_size * (1 if m.tie_embeddings else 2)
    ours = m.total_params - (emb if count == "total_no_emb" else 0)
    rel = abs(ours / 1e9 - float(printed)) / float(printed)
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    assert rel <= max(0.02, 0.5 * 10 ** -decimals / float(printed)), f"{source}: ours {ours / 1e9:.3f}B"


# ---- what each family maps to -------------------------------------------------------------------------------
def test_llama_fields():
    m, unmapped = _map(LLAMA31_405B)
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads, m.kv_heads) == \
        (126, 16384, 53248, 128, 8)
    assert m.head_dim is None and m.dim_per_head == 128  # head_dim 128 = 16384 / 128, the default
    assert (m.gated_mlp, m.norm, m.tie_embeddings, m.qkv_bias, m.linear_bias) == (True, "rmsnorm", False, False, False)
    assert unmapped == set()


def test_mistral_sliding_window_covers_every_layer():
    m, _ = _map(MISTRAL_7B_V01)
    assert (m.sliding_window, m.sliding_window_every) == (4096, 0)
    assert all(m.is_windowed_layer(i) for i in range(m.num_layers))
    mixtral, _ = _map(MIXTRAL_8X7B)  # "sliding_window": null
    assert mixtral.sliding_window is None


def test_qwen2_has_qkv_biases_and_an_inactive_window():
    m, unmapped = _map(QWEN25_7B)
    assert m.qkv_bias and not m.linear_bias
    assert m.sliding_window is None  # use_sliding_window false
    assert unmapped == set()
    on = {**QWEN25_7B, "use_sliding_window": True, "max_window_layers": 0, "sliding_window": 4096}
    assert _map(on)[0].sliding_window == 4096


def test_qwen3_moe_fields():
    m, unmapped = _map(QWEN3_30B_A3B)
    assert (m.head_dim, m.kv_heads, m.moe.num_experts, m.moe.top_k, m.moe.expert_ffn_hidden_size) == \
        (128, 4, 128, 8, 768)
    assert m.num_moe_layers == 48 and m.moe.num_shared_experts == 0
    assert unmapped == set()


def test_qwen3_moe_leading_dense_layers_and_sparse_step():
    lead = _map({**QWEN3_30B_A3B, "mlp_only_layers": [0, 1]})[0]
    assert (lead.moe.first_dense_layers, lead.moe.moe_layer_interval, lead.num_moe_layers) == (2, 1, 46)
    step = _map({**QWEN3_30B_A3B, "decoder_sparse_step": 2})[0]
    assert [step.is_moe_layer(i) for i in range(4)] == [False, True, False, True]


def test_deepseek_v3_fields_and_quantization_is_reported():
    m, unmapped = _map({**DEEPSEEK_V3, "quantization_config": FP8_QUANTIZATION})
    assert m.mla is not None and m.mla.q_lora_rank == 1536 and m.num_kv_heads is None
    assert (m.moe.num_experts, m.moe.top_k, m.moe.num_shared_experts, m.moe.first_dense_layers) == (256, 8, 1, 3)
    assert m.mtp_layers == 1 and m.num_moe_layers == 58
    assert unmapped == {"quantization_config"}


def test_deepseek_v2_lite_has_full_rank_q():
    m, unmapped = _map(DEEPSEEK_V2_LITE)
    assert m.mla.q_lora_rank is None and m.moe.num_shared_experts == 2 and m.mtp_layers == 0
    assert unmapped == set()


def test_glm45_fields():
    m, unmapped = _map(GLM45)
    assert m.qkv_bias and not m.linear_bias and m.head_dim == 128 and m.kv_heads == 8
    assert (m.moe.first_dense_layers, m.num_moe_layers, m.moe.num_shared_experts, m.mtp_layers) == (3, 89, 1, 1)
    assert unmapped == set()


def test_gpt_oss_fields():
    m, unmapped = _map(GPT_OSS_120B)
    assert m.linear_bias and m.moe.expert_bias and (m.moe.num_experts, m.moe.top_k) == (128, 4)
    assert (m.sliding_window, m.sliding_window_every) == (128, 2)
    assert [m.is_windowed_layer(i) for i in range(4)] == [True, False, True, False]  # as layer_types
    assert unmapped == set()
    implicit, _ = _map({k: v for k, v in GPT_OSS_120B.items() if k != "layer_types"})
    assert (implicit.sliding_window, implicit.sliding_window_every) == (128, 2)
    assert m.moe.activation_clamp == 7.0           # swiglu_limit: the experts' clamped activation
    assert _map({k: v for k, v in GPT_OSS_120B.items() if k != "swiglu_limit"})[0].moe.activation_clamp is None


def test_gpt_oss_yarn_concentration_factor():
    # Megatron-Core _yarn_get_concentration_factor: 0.1·ln(32) + 1 without mscale; the ratio of the two with both
    assert _map(GPT_OSS_120B)[0].rope_mscale == 1.3466
    both = {**GPT_OSS_120B, "rope_scaling": {**GPT_OSS_120B["rope_scaling"], "mscale": 1.0, "mscale_all_dim": 1.0}}
    assert _map(both)[0].rope_mscale == 1.0
    assert _map({k: v for k, v in GPT_OSS_120B.items() if k != "rope_scaling"})[0].rope_mscale == 1.0
    with pytest.raises(AutoparInputError, match="rope_scaling.factor"):
        _map({**GPT_OSS_120B, "rope_scaling": {**GPT_OSS_120B["rope_scaling"], "factor": float("nan")}})


@pytest.mark.parametrize("scaling, field", [
    ("yarn", "'rope_scaling' must be a mapping"), ([32], "'rope_scaling' must be a mapping"),
    ({"rope_type": ["yarn"], "factor": 32}, "rope_scaling.rope_type"),
    ({"rope_type": "yarn", "factor": 32, "mscale": "1", "mscale_all_dim": 1}, "rope_scaling.mscale"),
    ({"rope_type": "yarn", "factor": 32, "mscale": 1, "mscale_all_dim": -1}, "rope_scaling.mscale_all_dim"),
    ({"rope_type": "yarn", "factor": 32, "mscale": float("nan"), "mscale_all_dim": 1}, "rope_scaling.mscale"),
    ({"rope_type": "yarn", "factor": 1e6, "mscale": 1e6, "mscale_all_dim": 0}, "concentration factor"),
    ({"rope_type": "yarn", "factor": 1e6, "mscale": 0, "mscale_all_dim": 1e6}, "concentration factor")])
def test_gpt_oss_bad_rope_scaling_is_an_input_error(scaling, field):
    # a value that cannot be read is an error naming the key, never a silent fallback to the default factor
    with pytest.raises(AutoparInputError, match=field):
        _map({**GPT_OSS_120B, "rope_scaling": scaling})


def test_gpt_oss_yarn_with_one_mscale_takes_megatrons_default():
    # Megatron-Core _yarn_get_concentration_factor: either mscale or mscale_all_dim None -> 0.1·ln(factor) + 1;
    # a given 0 is a value (the ratio), not an absent key
    one = {**GPT_OSS_120B, "rope_scaling": {**GPT_OSS_120B["rope_scaling"], "mscale": 1.0}}
    assert _map(one)[0].rope_mscale == 1.3466
    zero = {**GPT_OSS_120B, "rope_scaling": {**GPT_OSS_120B["rope_scaling"], "mscale": 0, "mscale_all_dim": 1.0}}
    assert _map(zero)[0].rope_mscale == round(1 / 1.34657, 4)


@pytest.mark.parametrize("bad", [0, -7.0, "7", True, float("nan"), float("inf")])
def test_gpt_oss_bad_swiglu_limit_is_an_input_error(bad):
    with pytest.raises(AutoparInputError, match="swiglu_limit"):
        _map({**GPT_OSS_120B, "swiglu_limit": bad})


def test_llama4_maverick_layers_and_reported_keys():
    m, unmapped = _map(LLAMA4_MAVERICK)
    assert [m.is_moe_layer(i) for i in range(4)] == [False, True, False, True]  # transformers: moe_layers 1, 3, ...
    assert (m.ffn_hidden_size, m.moe.expert_ffn_hidden_size, m.moe.num_shared_experts) == (16384, 8192, 1)
    assert unmapped == {"vision_config", "text_config.attention_chunk_size"}
    explicit = copy.deepcopy(LLAMA4_MAVERICK)
    explicit["text_config"]["moe_layers"] = list(range(1, 48, 2))
    assert _counts(_map(explicit)[0]) == _counts(m)


def test_olmoe_fields():
    m, unmapped = _map(OLMOE)
    assert m.num_kv_heads is None and (m.moe.num_experts, m.moe.top_k, m.moe.expert_ffn_hidden_size) == (64, 8, 1024)
    assert unmapped == set()


# ---- unmapped-key reporting -----------------------------------------------------------------------------------
def test_unknown_keys_are_reported_and_bookkeeping_is_not():
    cfg = {**MIXTRAL_8X7B, "my_new_feature": 3, "router_z_loss_coef": 0.001, "transformers_version": "9"}
    _, unmapped = _map(cfg)
    assert unmapped == {"my_new_feature"}


def test_ignored_keys_are_documented():
    assert {"torch_dtype", "transformers_version", "bos_token_id", "eos_token_id", "rope_scaling",
            "initializer_range", "attention_dropout"} <= set(IGNORED_KEYS)
    assert all(reason for reason in IGNORED_KEYS.values())
    # Keys that change what autopar computes must never be silently ignored.
    assert not {"quantization_config", "vision_config", "attention_chunk_size", "sliding_window",
                "num_nextn_predict_layers", "mlp_only_layers"} & set(IGNORED_KEYS)


def test_mlp_bias_alone_is_reported():
    _, unmapped = _map({**LLAMA31_8B, "mlp_bias": True})
    assert unmapped == {"mlp_bias"}


def test_load_model_reads_a_config_folder_and_warns(tmp_path):
    folder = tmp_path / "Mixtral-8x7B-v0.1"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**MIXTRAL_8X7B, "my_new_feature": 1}))
    notes: list[str] = []
    m = load_model(folder, warn=notes.append)
    assert m.name == "Mixtral-8x7B-v0.1"
    assert _counts(m) == _counts(load_model("mixtral_8x7b"))
    assert len(notes) == 1 and "my_new_feature" in notes[0] and str(folder / "config.json") in notes[0]


# ---- errors ---------------------------------------------------------------------------------------------------
def test_unsupported_model_type_names_it_and_the_file():
    with pytest.raises(AutoparInputError) as err:
        _map({**LLAMA31_8B, "model_type": "bert"})
    msg = str(err.value)
    assert WHERE in msg and "'bert'" in msg and "model_type" in msg and "llama" in msg


def test_missing_model_type():
    cfg = {k: v for k, v in LLAMA31_8B.items() if k != "model_type"}
    with pytest.raises(AutoparInputError, match=r"required key 'model_type' is missing.*LlamaForCausalLM"):
        _map(cfg)


@pytest.mark.parametrize("cfg,key", [
    (LLAMA31_8B, "hidden_size"), (MIXTRAL_8X7B, "num_local_experts"), (QWEN3_8B, "head_dim"),
    (DEEPSEEK_V3, "kv_lora_rank"), (GPT_OSS_120B, "num_local_experts"), (QWEN3_30B_A3B, "moe_intermediate_size"),
])
def test_missing_required_key_names_key_and_file(cfg, key):
    with pytest.raises(AutoparInputError) as err:
        _map({k: v for k, v in cfg.items() if k != key})
    msg = str(err.value)
    assert WHERE in msg and f"'{key}'" in msg and "missing" in msg


def test_missing_text_config_of_llama4():
    with pytest.raises(AutoparInputError, match=r"'text_config' is missing"):
        _map({k: v for k, v in LLAMA4_MAVERICK.items() if k != "text_config"})
    bad = copy.deepcopy(LLAMA4_MAVERICK)
    del bad["text_config"]["intermediate_size_mlp"]
    with pytest.raises(AutoparInputError, match=r"'text_config\.intermediate_size_mlp' is missing"):
        _map(bad)


@pytest.mark.parametrize("key,value", [("num_hidden_layers", "32"), ("tie_word_embeddings", "no"),
                                        ("num_attention_heads", True), ("hidden_size", None)])
def test_wrong_type_names_key_and_value(key, value):
    with pytest.raises(AutoparInputError) as err:
        _map({**LLAMA31_8B, key: value})
    assert WHERE in str(err.value) and f"'{key}'" in str(err.value)


def test_spec_validation_errors_become_input_errors():
    with pytest.raises(AutoparInputError) as err:  # 32 heads cannot be split into 5 KV groups
        _map({**LLAMA31_8B, "num_key_value_heads": 5})
    assert WHERE in str(err.value) and "num_kv_heads" in str(err.value)
    with pytest.raises(AutoparInputError, match="top_k"):
        _map({**MIXTRAL_8X7B, "num_experts_per_tok": 9})


@pytest.mark.parametrize("cfg", [
    {**QWEN3_30B_A3B, "mlp_only_layers": [5]},                      # a dense layer in the middle
    {**DEEPSEEK_V3, "moe_layer_freq": 2},
    {**GPT_OSS_120B, "layer_types": ["full_attention"] + ["sliding_attention"] * 35},  # first layer global
    {**GPT_OSS_120B, "layer_types": ["sliding_attention", "full_attention"]},  # wrong length
])
def test_layer_patterns_autopar_cannot_model_are_refused(cfg):
    with pytest.raises(AutoparInputError) as err:
        _map(cfg)
    assert WHERE in str(err.value)


def test_every_supported_model_type_is_exercised():
    from .test_hf_2026 import PUBLISHED
    tested = ({cfg["model_type"] for _, cfg, _ in ROUND_TRIP} | {"mistral", "qwen2", "qwen3"}
              | {model_type for _, model_type, _ in PUBLISHED} | {"deepseek_v32"})   # test_2026_configs_...
    untested = set(SUPPORTED_MODEL_TYPES) - tested - {"llama4_text", "qwen2_moe", "gemma3_text"}
    assert not untested, untested


def test_llama4_text_and_qwen2_moe_directly():
    text = {**LLAMA4_MAVERICK["text_config"]}
    m, unmapped = _map(text)
    assert _counts(m) == _counts(load_model("llama4_maverick"))
    assert unmapped == {"attention_chunk_size"}
    # Qwen2-MoE: the shared expert has its own width (values illustrative, not a released model).
    qwen2_moe = {**QWEN25_7B, "model_type": "qwen2_moe", "num_experts": 8, "num_experts_per_tok": 2,
                 "moe_intermediate_size": 1024, "shared_expert_intermediate_size": 4096}
    m, _ = _map(qwen2_moe)
    assert (m.moe.num_shared_experts, m.moe.shared_ffn, m.moe.expert_ffn_hidden_size) == (1, 4096, 1024)


# ---- hybrid families: what each maps to ------------------------------------------------------------------------------
def test_qwen3_next_layers_are_gated_deltanet_with_gated_attention_every_fourth():
    m, unmapped = _map(QWEN3_NEXT_80B)
    assert unmapped == set()
    assert [m.mixer_name(i) for i in range(4)] == ["gated_deltanet"] * 3 + ["gated_attention"]
    gdn = m.mixers["gated_deltanet"]
    assert (gdn.num_heads, gdn.v_heads, gdn.dk, gdn.dv, gdn.conv_kernel) == (16, 32, 128, 128, 4)
    assert m.mixer_of(3).output_gate and m.head_dim == 256 and m.kv_heads == 2
    # q_proj yields query and gate: 2·a·d rows (Qwen3NextAttention); k, v 2 heads x 256; o a·d -> h
    assert m.mixer_params(3) == 2048 * 16 * 256 * 2 + 2 * 2048 * 2 * 256 + 16 * 256 * 2048
    typed = {**QWEN3_NEXT_80B, "layer_types": ["linear_attention"] * 47 + ["full_attention"]}
    assert _map(typed)[0].attention_layers == (47,)


def test_nemotron_h_blocks_and_block_type_lists_agree():
    m, unmapped = _map(NEMOTRON_H_8B)
    assert unmapped == set()
    assert (m.mixer_name(0), m.channel_of(0)) == ("mamba", "none")
    assert (m.mixer_name(1), m.channel_of(1)) == ("none", "dense")
    assert (m.mixer_name(7), m.channel_of(7)) == ("attention", "none")
    assert not m.gated_mlp and m.mixers["mamba"].d_inner == 2 * 4096
    names = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
    listed = {k: v for k, v in NEMOTRON3_NANO.items() if k != "hybrid_override_pattern"}
    listed["layers_block_type"] = [names[c] for c in NEMOTRON3_NANO["hybrid_override_pattern"]]
    assert _counts(_map(listed)[0]) == _counts(_map(NEMOTRON3_NANO)[0])
    nano = _map(NEMOTRON3_NANO)[0]
    assert nano.num_moe_layers == 23 and nano.moe.shared_ffn == 3712 and nano.moe.top_k == 6


def test_nemotron_h_pattern_errors_name_the_symbol_and_the_count():
    with pytest.raises(AutoparInputError, match=r"unknown symbol\(s\) \['X'\]"):
        _map({**NEMOTRON_H_8B, "hybrid_override_pattern": "MX" * 26})
    with pytest.raises(AutoparInputError, match="has 4 layers but num_hidden_layers is 52"):
        _map({**NEMOTRON_H_8B, "hybrid_override_pattern": "M-M*"})


def test_gemma3_has_five_local_layers_per_global_and_tied_embeddings():
    m, unmapped = _map(GEMMA3_27B)
    assert unmapped == {"vision_config", "mm_tokens_per_image"}     # the vision tower is reported, not counted
    assert m.tie_embeddings and m.sliding_window == 1024 and m.sliding_window_every == 6
    assert [m.is_windowed_layer(i) for i in range(6)] == [True] * 5 + [False]


def test_kimi_linear_layers_follow_linear_attn_config():
    m, unmapped = _map(KIMI_LINEAR)
    assert unmapped == set()
    assert m.attention_layers == (3, 7, 11, 15, 19, 23, 26) and m.mla is not None
    assert m.mixers["kda"].kind == "kda" and m.moe.first_dense_layers == 1
    bad = copy.deepcopy(KIMI_LINEAR)
    bad["linear_attn_config"]["kda_layers"] = [1, 2]
    with pytest.raises(AutoparInputError, match="must cover layers 1..27 once"):
        _map(bad)


def test_jamba_maps_to_mamba1_layers_with_attention_every_eighth():
    m, unmapped = _map(JAMBA_V01)
    assert unmapped == set()
    assert m.attention_layers == (4, 12, 20, 28) and m.position_embedding == "none"
    mx = m.mixers["mamba"]
    assert (mx.kind, mx.d_inner, mx.state_size, mx.dt_rank, mx.conv_kernel, mx.bc_norms) == ("mamba1", 8192, 16, 256,
                                                                                             4, True)
    assert [m.is_moe_layer(i) for i in range(4)] == [False, True, False, True] and m.num_moe_layers == 16
    # "auto" Δ rank is ceil(h / 16); explicit block-type lists give the same model
    assert _map({**JAMBA_V01, "mamba_dt_rank": "auto"})[0].mixers["mamba"].dt_rank == 256
    listed = {**JAMBA_V01, "layers_block_type": ["attention" if i % 8 == 4 else "mamba" for i in range(32)],
              "layers_num_experts": [16 if i % 2 else 1 for i in range(32)]}
    assert _counts(_map(listed)[0]) == _counts(m)
    with pytest.raises(AutoparInputError, match="mamba_dt_rank' must be a positive integer"):
        _map({**JAMBA_V01, "mamba_dt_rank": "big"})
    assert _map({**JAMBA_V01, "mamba_proj_bias": True})[1] == {"mamba_proj_bias"}


def test_falcon_h1_runs_attention_and_mamba2_in_parallel_in_every_layer():
    m, unmapped = _map(FALCON_H1_7B)
    assert unmapped == set()                     # the µP multipliers are known and ignored
    assert m.mixer_counts() == {"attention+mamba": 44} and m.attention_layers == tuple(range(44))
    kinds = [mx.kind for mx in m.mixers_of(0)]
    assert kinds == ["attention", "mamba2"] and m.mixers["mamba"].d_inner == 3072
    # one layer = both mixers + one shared pre-norm + the MLP and its norm
    mamba = m.linear_mixers["mamba"]
    assert m.layer_nonexpert_params(0) == (m.attention_params + mamba.gemm_params() + mamba.other_params()
                                           + m.mlp_params(12288) + 2 * 3072)
    with pytest.raises(AutoparInputError, match=r"mamba_n_heads·mamba_d_head = 24·100 must equal the SSM width 3072"):
        _map({**FALCON_H1_7B, "mamba_d_head": 100})
    auto = {k: v for k, v in FALCON_H1_7B.items() if k not in ("mamba_d_ssm", "mamba_d_head")}
    assert _map(auto)[0].mixers["mamba"].d_inner == 2 * 3072        # mamba_expand·h, head dim "auto"


def test_2026_configs_with_latent_moe_sparse_attention_and_mtp():
    """DeepSeek-V3.2 (sparse-attention indexer), Nemotron 3 Super and Ultra (LatentMoE, MTP) load within 2% of their
    published totals (tests/specs/fixtures/hf/SOURCES.md)."""
    from pathlib import Path
    fx = Path(__file__).parent / "fixtures" / "hf"
    for name, billions, with_mtp in (("deepseek-v3.2-exp", 685.0, True), ("nemotron-3-super-120b-a12b", 120.0, False),
                                     ("nemotron-3-ultra-550b-a55b", 550.0, False)):
        m, unmapped = _map(json.loads((fx / f"{name}.json").read_text()), name)
        assert not unmapped, unmapped
        total = m.total_params + (m.mtp_layers * m.mtp_module_params if with_mtp else 0)
        assert abs(total / 1e9 - billions) / billions <= 0.02, (name, total / 1e9)
