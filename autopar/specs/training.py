"""TrainingSpec: what is being trained per step, and in which number formats."""

from __future__ import annotations

from functools import cached_property
from typing import Literal

from pydantic import Field, model_validator

from autopar.specs._base import Spec
from autopar.specs.bounds import bound_note, limit
from autopar.specs.hardware import Precision

OVERLAPS = ("tp", "dp", "ep", "cp")   # the communication overlaps a run can switch on (``*_comm_overlap``)
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "none": 0}

# The value sets of the switches a stack file also sets (StackKnobs, autopar/specs/stack.py), declared once.
Elementwise = Literal["fused", "compiled", "eager"]
AttentionImpl = Literal["best", "sdpa_fa2"]
Fp8Recipe = Literal["te", "tensorwise", "rowwise"]
CpRing = Literal["te_p2p", "torch_allgather"]
PpFsdp = Literal["per_microbatch", "per_step"]
CrossEntropy = Literal["fused", "te", "unfused"]
# TrainingSpec's loss kernel: a stack's cross_entropy knob, or 'compiled' where its compiled_loss knob compiles torch's
LossKernel = Literal[CrossEntropy, "compiled"]   # the knob's kernels, and torch.compile's of the unfused one
MoeWeighting = Literal["activation", "fp32_multiply"]
LossRuntime = Literal["megatron", "torch"]
SelectiveAc = Literal["modules", "op"]
Projections = Literal["fused", "separate"]
DpImpl = Literal["megatron", "fsdp2"]
OptimizerImpl = Literal["fused", "foreach"]
CudaGraphs = Literal["none", "partial", "full_iteration"]
MasterWeights = Literal["fp32", "none"]


class TrainingSpec(Spec):
    """Sequence length, batch and precisions of one pre-training run.

    Defaults follow Megatron-LM mixed precision with the Adam optimizer: bf16 weights (2 B), fp32 gradient
    buffers (4 B), fp32 master weights and two fp32 Adam moments (12 B): 2+4+12 = 18 B per parameter before
    sharding (Megatron-LM docs/source/api-guide/dist_optimizer.md, "18 bytes/parameter" for bf16 without the
    distributed optimizer; Rajbhandari et al. 2020 sec. 3.1 count 16 with half-precision gradients). Left unset,
    ``grad_dtype`` is what the framework does with ``weight_dtype`` (:meth:`_default_grad_dtype`): fp32 for bf16
    weights, as Megatron-LM's ``--bf16`` forces --accumulate-allreduce-grads-in-fp32 unless --grad-reduce-in-bf16
    (megatron/training/arguments.py, NVIDIA/Megatron-LM@1e057005; r0.8.0 @baf94af3 lines 299-305) and
    Megatron-Bridge's ``bf16_mixed`` keeps ``grad_reduce_in_fp32=True``; NVIDIA's performance recipes set
    ``grad_reduce_in_fp32=False`` and state ``grad_dtype: bf16``."""

    seq_len: int = Field(default=4096, gt=0, le=limit("seq_len"), description="Tokens per sequence (s).")
    global_batch: int = Field(default=1024, gt=0, le=limit("global_batch"),
                              description="Sequences per optimizer step (B).")
    precision: Precision = Field(default="bf16", description="Math precision of the transformer GEMMs.")
    weight_dtype: Literal["bf16", "fp16", "fp32"] = Field(default="bf16", description="Dtype of model weights.")
    grad_dtype: Literal["fp32", "bf16", "fp16"] = Field(
        default="fp32", description="Dtype of gradient buffers and of their reduction; unset: fp32 for bf16 or fp32 "
                                    "weights (Megatron-LM's --bf16 default), fp16 for fp16 weights.")
    master_weights_dtype: MasterWeights = Field(
        default="fp32", description="Optimizer's master copy of the weights; 'none' when weights are updated in place.")
    optimizer_state_dtype: Literal["fp32", "bf16", "fp16"] = Field(
        default="fp32", description="Dtype of each Adam moment (2 moments).")
    moe_routing: Literal["balanced", "dropless"] = Field(
        default="balanced",
        description="MoE token routing: 'balanced' (auxiliary-loss or forced balance: every expert gets its share) "
                    "or 'dropless' (no capacity limit: the busiest expert rank sets the pace, see "
                    "efficiency.moe_dropless_imbalance).")
    tp_comm_overlap: bool = Field(
        default=True,
        description="Framework overlaps TP/SP communication with the GEMMs (Megatron --tp-comm-overlap, Transformer "
                    "Engine userbuffers; on in NVIDIA's dense performance recipes). Off: every TP collective is "
                    "exposed; on: what the layer's TP-split GEMMs can cover is hidden (autopar.cost.tp).")
    tp_overlap_impl: Literal["userbuffers", "async_tp"] = Field(
        default="userbuffers",
        description="How TP overlap runs when tp_comm_overlap is on: 'userbuffers' (Transformer Engine: every "
                    "all-gather and reduce-scatter pipelined with its GEMM) or 'async_tp' (PyTorch's torch.compile "
                    "micro-pipelined TP: only the all-gather->matmul and matmul->reduce-scatter pairs its pattern "
                    "matcher finds, each GEMM split into TP chunks; autopar.cost.tp). Set by the stack's tp_overlap.")
    tp_dgrad_overlap: bool = Field(
        default=True,
        description="With TP overlap off, the backward reduce-scatter (all-reduce without SP) of each column-parallel "
                    "layer's input gradient is still issued asynchronously after its data-gradient GEMM and waited on "
                    "after its weight-gradient GEMM (Transformer Engine LayerNormLinear 'Overlap dgrad-RS/AR with "
                    "wgrad'; Megatron-LM's async tensor-parallel all-reduce since 2021-09): hidden behind that GEMM "
                    "(autopar.cost.tp). Off: PyTorch DTensor TP (torchtitan) and Megatron-LM before it.")
    dp_comm_overlap: bool = Field(
        default=True,
        description="Framework overlaps data-parallel traffic with compute (Megatron --overlap-grad-reduce / "
                    "--overlap-param-gather, FSDP2 prefetch). Off: every gradient reduction and parameter gather "
                    "is exposed; on: what the backward/forward window covers is hidden (autopar.cost.dp).")
    ep_comm_overlap: bool = Field(
        default=True,
        description="Framework overlaps the MoE dispatch/combine all-to-alls with another micro-batch's compute "
                    "(Megatron --overlap-moe-expert-parallel-comm, combined 1F1B). Counted only where Megatron-Core "
                    "allows that schedule (no full recompute, no 'moe' recompute, VPP when PP > 1; autopar.cost.ep).")
    cp_comm_overlap: bool = Field(
        default=True,
        description="Ring attention overlaps each KV block transfer with the attention block it feeds (Megatron-Core "
                    "p2p context parallelism). Off: the KV exchange is exposed (autopar.cost.cp).")
    pp_fsdp: PpFsdp = Field(
        default="per_microbatch",
        description="ZeRO-3/FSDP under pipeline parallelism: 'per_microbatch' (gathers and reduce-scatters every "
                    "micro-batch, as without PP) or 'per_step' (torchtitan + torch.distributed.pipelining: weights "
                    "kept unsharded between micro-batches, one gather per step, the gradients reduce-scattered "
                    "once after the stage's last backward, exposed; autopar.cost.dp).")
    cp_ring: CpRing = Field(
        default="te_p2p",
        description="Which ring attention runs context parallelism: 'te_p2p' (Megatron-Core / Transformer Engine: "
                    "one KV send per ring step, hidden behind that step's block) or 'torch_allgather' (PyTorch's "
                    "experimental context_parallel as torchtitan runs it: KV all-gathered once per layer and pass, "
                    "dK/dV passed around in fp32, the partial outputs merged by unfused elementwise kernels; "
                    "autopar.cost.cp).")
    elementwise: Elementwise = Field(
        default="fused",
        description="Elementwise kernels (norms, RoPE, SwiGLU): 'fused' (Transformer Engine / Megatron fusions), "
                    "'compiled' (torch.compile) or 'eager' (one PyTorch kernel per op, fp32 upcasts through HBM); "
                    "priced as HBM bytes per op (autopar/cost/compute.py ELEMENTWISE_BYTES).")
    bias_activation_fusion: bool = Field(
        default=True,
        description="The MLP's bias and activation in one fused kernel (Megatron-Core bias_swiglu / bias_gelu, "
                    "--no-bias-swiglu-fusion / --no-bias-gelu-fusion to turn off; NeMo's bias_activation_fusion). "
                    "Off: the activation runs as the PyTorch ops of the model's activation function, priced by "
                    "their HBM passes (autopar/blocks/mlp.py ACT_UNFUSED_EXTRA).")
    bias_dropout_add_fusion: bool = Field(
        default=True,
        description="Each sub-block's bias, dropout and residual add in one fused kernel (Megatron-Core "
                    "bias_dropout_add_fused_train, --no-bias-dropout-fusion to turn off). Off: a bias add, "
                    "dropout and the add as separate kernels (autopar/cost/compute.py bda_bytes).")
    hidden_dropout: float = Field(
        default=0.0, ge=0.0, lt=1.0,
        description="Dropout probability on each sub-block's output before the residual add (Megatron "
                    "--hidden-dropout, NeMo hidden_dropout). 0 (the Llama, Nemotron and DeepSeek recipes' value, "
                    "and autopar's default) runs no dropout kernel: torch's dropout returns its input at p = 0; "
                    "above 0 the mask is written forward and read backward (autopar/cost/compute.py bda_bytes). "
                    "Megatron-LM's own command-line default is 0.1: state it where a run used it.")
    attention_impl: AttentionImpl = Field(
        default="best",
        description="Attention kernel: 'best' (the hardware file's own flash-attention figures) or 'sdpa_fa2' "
                    "(PyTorch SDPA's FlashAttention-2 backend: the file's kernel_model.attention_kernels['fa2'] "
                    "figures, KernelModel.with_attention_kernel).")
    fp8_recipe: Fp8Recipe = Field(
        default="te",
        description="FP8 scaling recipe (precision fp8): 'te' (Transformer Engine, fused cast-transpose), "
                    "'tensorwise' or 'rowwise' (torchao Float8Linear); sets the quantisation kernels' HBM bytes.")
    fp8_param_gather: bool = Field(
        default=False,
        description="Keep the model weights as FP8 tensors only (Megatron --fp8-param-gather, Bridge "
                    "mixed_precision.fp8_param_gather; Transformer Engine fp8_model_init): no bf16 weight copy beside "
                    "the FP8 ones (the fp32 main weights stay in the distributed optimizer) and the parameter "
                    "all-gather in FP8 bytes (autopar.cost.memory, autopar.cost.dp). Needs an FP8 precision run by "
                    "Transformer Engine (fp8 with fp8_recipe te, fp8_block, mxfp8).")
    fp8_lm_head: bool = Field(
        default=False,
        description="Run the LM-head output projection in MXFP8 (Megatron-Core fp8_output_proj: 'run the LM-head "
                    "output projection with TE ColumnParallelLinear under MXFP8'; set by Megatron-Bridge's DeepSeek-V3 "
                    "and gpt-oss MXFP8 performance configs) instead of BF16 (autopar.cost.compute.head_time). "
                    "Precision mxfp8 only.")
    moe_weighting: MoeWeighting = Field(
        default="activation",
        description="Where the routing probabilities multiply the routed tokens, which sets what the MoE layer keeps "
                    "for the backward (memory only, autopar/cost/memory.py MOE_WEIGHTING_ELEMS): 'activation' "
                    "(Megatron-Core: inside the expert activation, weighted_bias_swiglu_impl and friends, so the "
                    "combine keeps nothing of the experts' output) or 'fp32_multiply' (torchtitan: "
                    "``(routed.to(float32) * scores).to(bf16)`` before or after the experts, whose multiply saves the "
                    "fp32 copy of the k routed copies: 4 B per element).")
    fused_grouped_mlp: bool = Field(
        default=False,
        description="Run the routed experts' MLP through Transformer Engine's op fuser (Megatron-Core "
                    "use_transformer_engine_op_fuser, set by Megatron-Bridge's cutedsl_fused_grouped_mlp: fused "
                    "grouped FC1, activation and FC2 with their biases) instead of TEGroupedMLP's eager path, whose "
                    "expert output bias is added in unfused PyTorch kernels (autopar.blocks.moe.EXPERT_BIAS_ELEMS; "
                    "models with expert biases only).")
    cuda_graphs: CudaGraphs = Field(
        default="none",
        description="CUDA graphs: 'none', 'partial' (Transformer Engine graphs of some scopes: attention, router, "
                    "EP preprocess; the routed experts stay eager) or 'full_iteration' (Megatron-Core's whole "
                    "forward-backward replayed as one graph: no host launch work, no device-host sync). Priced on "
                    "the per-layer host overhead (autopar.cost.compute.HOST_OVERHEAD_SHARE).")
    selective_ac: SelectiveAc = Field(
        default="modules",
        description="What the 'selective' recompute policy re-runs: 'modules' (Megatron-Core: the attention core) "
                    "or 'op' (torchtitan's op-level SAC: every second matmul and every elementwise op; "
                    "autopar/cost/compute.py OP_SAC_SHARE).")
    fp8_attention: bool = Field(
        default=False,
        description="Run the attention core (flash attention) in FP8 too. Off by default: FP8 recipes (Transformer "
                    "Engine, torchao Float8) quantise the linear layers and keep attention in BF16 flash kernels.")
    attention_kernel: Literal["flash", "unfused"] = Field(
        default="flash",
        description="Attention core: 'flash' (FlashAttention-class fused kernel, s x s scores never stored) or "
                    "'unfused' (batched QK^T and AV GEMMs around a fused softmax kernel, with the scores and "
                    "dropout stored: Megatron-LM before FlashAttention, e.g. its 2021 runs).")
    cross_entropy: LossKernel = Field(
        default="fused",
        description="Loss kernel over the vocabulary: 'fused' (Megatron --cross-entropy-loss-fusion, its native "
                    "vocab-parallel kernel: an fp32 softmax kept for the backward), 'te' (Megatron "
                    "cross_entropy_fusion_impl 'te', as NVIDIA's performance recipes set it: Transformer Engine's "
                    "Triton kernel before TE v2.18 writes the gradient in place into the bf16 logits, nothing "
                    "kept beside them), 'unfused' (plain torch log-softmax, as autopar's own runner) or 'compiled' "
                    "(the same torch cross entropy under torch.compile, as torchtitan compiles it with "
                    "--training.compile from 2025-04: Inductor fuses the upcast, log-softmax and NLL; loss_runtime "
                    "'torch' only): sets the HBM traffic and the buffers the last stage holds.")
    loss_runtime: LossRuntime = Field(
        default="megatron",
        description="Who holds the last stage's logits around the loss (memory only, autopar/cost/memory.py "
                    "logit_bytes_per_element): 'megatron' (the micro-batch's logits live through its loss backward) "
                    "or 'torch' (PyTorch's loss path as torchtitan runs it: the trainer drops the bf16 logits before "
                    "the backward, cross entropy through DTensor loss_parallel under TP, and under PP "
                    "torch.distributed.pipelining's last stage keeps every micro-batch's output for the step).")
    linear_cp: Literal["all_to_all", "state_pass"] = Field(
        default="all_to_all",
        description="Context parallelism of linear-attention / SSM layers: 'all_to_all' (Megatron-Core's Mamba "
                    "and GatedDeltaNet CP: an all-to-all swaps the sequence split for a head split around the "
                    "scan, so heads must divide by tp·cp) or 'state_pass' (each CP rank scans its own tokens and "
                    "the recurrent states are passed along the sequence: LASP, autopar's runner).")
    projections: Projections = Field(
        default="fused",
        description="How the stack launches the attention and MLP input projections: 'fused' (Megatron-Core: one "
                    "QKV GEMM, one gate-up GEMM) or 'separate' (torchtitan: wq, wk, wv and w1, w3 as their own "
                    "nn.Linear): the same FLOPs in smaller GEMMs, each priced at its own shape "
                    "(autopar.blocks Block.separate_gemms, autopar.cost.shapes).")
    dp_impl: DpImpl = Field(
        default="megatron",
        description="Data-parallel implementation: 'megatron' (Megatron-Core DDP / distributed optimizer: gradients "
                    "reduced in grad_dtype from contiguous buffers, parameters gathered in place) or 'fsdp2' "
                    "(PyTorch fully_shard as torchtitan@9dec370 sets it up: gradients reduce-scattered in fp32, "
                    "its mixed_precision_reduce, and each all-gather copied out into the unsharded parameters on "
                    "the compute stream; autopar.cost.dp).")
    optimizer_impl: OptimizerImpl = Field(
        default="fused",
        description="Adam(W) kernels: 'fused' (one pass over parameter, gradient and moments: Megatron's / "
                    "Transformer Engine's FusedAdam, torch fused=True) or 'foreach' (torch.optim.AdamW's default "
                    "multi-tensor path, one pass per elementwise op, as torchtitan@9dec370 runs it; "
                    "autopar.cost.optimizer).")
    activation_dtype: Literal["bf16", "fp16", "fp32"] = Field(
        default="bf16", description="Dtype activations are stored in (FP8 recipes still store most in bf16).")

    @model_validator(mode="before")
    @classmethod
    def _default_grad_dtype(cls, data: object) -> object:
        """The gradient dtype where none is stated, and FSDP2's, the one place that says them (memory, DP traffic
        and the optimizer read ``grad_bytes``):

        - under ``dp_impl`` fsdp2 the gradients are fp32: torchtitan@9dec370 hands FSDP2
          MixedPrecisionPolicy(reduce_dtype=float32) (config_manager.py --training.mixed_precision_reduce, default
          and only choice 'float32'), so the reduce-scatter runs in fp32 and the sharded gradients (the fp32
          parameters' grads) are fp32; a grad_dtype stated otherwise is a contradiction, refused;
        - otherwise unset means the framework's default for the weight dtype: fp16 weights keep fp16 gradient
          buffers (Megatron-LM leaves accumulate_allreduce_grads_in_fp32 off under --fp16), bf16 and fp32 weights
          fp32 ones (the class docstring's sources)."""
        if not isinstance(data, dict):
            return data
        given = data.get("grad_dtype")
        if data.get("dp_impl") == "fsdp2":
            if given not in (None, "fp32"):
                raise ValueError(f"grad_dtype {given}: FSDP2 as torchtitan runs it (dp_impl fsdp2) reduces and keeps "
                                 "gradients in fp32 (mixed_precision_reduce float32); leave grad_dtype out or say fp32")
            return {**data, "grad_dtype": "fp32"}
        if given is None:
            return {**data, "grad_dtype": "fp16" if data.get("weight_dtype") == "fp16" else "fp32"}
        return data

    @model_validator(mode="after")
    def _check(self) -> "TrainingSpec":
        if self.seq_len * self.global_batch > limit("tokens_per_step"):
            raise ValueError(f"seq_len x global_batch = {self.seq_len:,} x {self.global_batch:,} tokens per step, "
                             f"the bound is {bound_note('tokens_per_step')}")
        if self.fp8_param_gather and not self.fp8_params_te:
            raise ValueError(f"fp8_param_gather: needs an FP8 precision run by Transformer Engine (fp8 with "
                             f"fp8_recipe te, fp8_block or mxfp8), not precision {self.precision} with fp8_recipe "
                             f"{self.fp8_recipe}")
        if self.cross_entropy == "compiled" and self.loss_runtime != "torch":
            raise ValueError("cross_entropy compiled: a torch.compile'd torch cross entropy is PyTorch's loss path "
                             "(loss_runtime torch, as torchtitan runs it), not Megatron's (loss_runtime megatron)")
        if self.fp8_lm_head and self.precision != "mxfp8":
            raise ValueError(f"fp8_lm_head: Megatron-Core runs the LM head in FP8 only under the MXFP8 recipe "
                             f"(fp8_output_proj), not precision {self.precision}")
        return self

    @cached_property
    def fp8_params_te(self) -> bool:
        """The precision keeps Transformer Engine FP8 weights (the recipes fp8_param_gather applies to)."""
        return self.precision in ("fp8_block", "mxfp8") or (self.precision == "fp8" and self.fp8_recipe == "te")

    @cached_property
    def fp8_primary_weights(self) -> bool:
        """``fp8_param_gather`` in effect: the weights are FP8 tensors with no bf16 copy (autopar.cost.memory)."""
        return self.fp8_param_gather and self.fp8_params_te

    @cached_property
    def param_gather_bytes(self) -> int:
        """Bytes per parameter of the data-parallel parameter all-gather (ZeRO-1/2's updated weights, FSDP's
        gathers): the weight dtype, or FP8 (1 B) under ``fp8_param_gather`` (Megatron-LM d98e8a64
        megatron/core/distributed/distributed_data_parallel_config.py:78: 'keep the compute param in fp8 ... and
        perform the param all-gather in fp8')."""
        return DTYPE_BYTES["fp8"] if self.fp8_primary_weights else self.weight_bytes

    def overlaps(self) -> str:
        """The overlap switches that are on, as ``--overlap`` spells them ('tp,dp,ep,cp', 'none')."""
        on = [k for k in OVERLAPS if getattr(self, f"{k}_comm_overlap")]
        return ",".join(on) or "none"

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch

    @cached_property
    def weight_bytes(self) -> int:
        return DTYPE_BYTES[self.weight_dtype]

    @cached_property
    def grad_bytes(self) -> int:
        """Gradient bytes per parameter: fp32 under ``dp_impl`` fsdp2 whatever ``grad_dtype`` says (the validator
        ``_fsdp2_reduces_in_fp32`` sets it so on validation; a ``model_copy`` that switches ``dp_impl``, as a stack's
        free knobs do, is not validated again)."""
        return DTYPE_BYTES["fp32" if self.dp_impl == "fsdp2" else self.grad_dtype]

    @cached_property
    def optimizer_bytes(self) -> int:
        """Optimizer bytes per parameter: master weights + 2 Adam moments."""
        return DTYPE_BYTES[self.master_weights_dtype] + 2 * DTYPE_BYTES[self.optimizer_state_dtype]

    @cached_property
    def activation_bytes(self) -> int:
        return DTYPE_BYTES[self.activation_dtype]
