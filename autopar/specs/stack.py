"""StackSpec: the software stack a run uses, as a file like a hardware file (``stacks/*.yaml``).

A prediction is for a framework as well as for a chip: the same layout of the same model runs up to 2x apart
between torchtitan eager, torchtitan with ``torch.compile`` and Megatron-Core's tuned recipes. A stack file says
what the framework does, as the :class:`StackKnobs` it runs by default:

* **elementwise kernels** (norms, RoPE, SwiGLU): ``fused`` (Transformer Engine / Megatron fusions, one kernel per
  op), ``compiled`` (``torch.compile``/Inductor fuses each op chain into one kernel) or ``eager`` (each PyTorch op
  one kernel, fp32 upcasts through HBM). Priced as bytes through HBM per op (:mod:`autopar.cost.compute`).
* **attention kernel**: ``best`` (the chip file's flash-attention figures: FA3 / cuDNN on Hopper, cuDNN / FA4 on
  Blackwell) or ``sdpa_fa2`` (PyTorch SDPA's flash backend, FlashAttention-2), priced by the chip file's measured
  FA2 figures (``kernel_model.attention_kernels['fa2']``, :meth:`KernelModel.with_attention_kernel`).
* **FP8 scaling recipe** for the ``fp8`` precision: ``te`` (Transformer Engine tensorwise, fused cast-transpose),
  ``tensorwise`` or ``rowwise`` (torchao Float8Linear): bytes of the quantisation kernels per GEMM operand.
* **communication overlap**: TP (``none``, ``async_tp``: PyTorch's micro-pipelined TP, ``userbuffers``: Transformer
  Engine's), and DP / EP / CP overlap on or off: the switches of :class:`TrainingSpec`; what hides is priced
  from the schedule's compute window (autopar.cost.tp, dp, ep, cp), never a fitted share.
* **stack constants** (``efficiency``): only what no kernel or link measurement sees, :data:`STACK_CONSTANTS`
  (the time per layer a framework spends between kernels), fitted to the stack's own runs within the bounds of
  :class:`autopar.specs.hardware.Efficiency`.
* **cross entropy**: fused (Megatron's native kernel), te (Transformer Engine's, in place in the logits) or
  unfused (plain ``torch.nn.functional.cross_entropy``), which ``compiled_loss`` has ``torch.compile`` compile
  when the blocks are compiled (torchtitan's ``compile.components`` 'loss'); and who holds
  the logits around it (``loss_runtime``: Megatron's loss path, or PyTorch's as torchtitan runs it), a memory term
  (:mod:`autopar.cost.memory`).
* **projections**: ``fused`` (Megatron-Core's one QKV GEMM and one gate-up GEMM) or ``separate`` (one GEMM per
  projection, torchtitan): the same FLOPs in smaller GEMMs, each priced at its own shape on the chip file's GEMM
  curve (:mod:`autopar.cost.shapes`).
* **optimizer state** (memory only): the Adam moments' dtype and whether a master copy of the weights is kept
  (``optimizer_state_dtype``, ``master_weights_dtype``), as a recipe states them (NeMo's distributed_fused_adam
  ``optim.dtype``, Megatron-Core's precision-aware optimizer).
* **CUDA graphs** (``none``, ``partial``, ``full_iteration``): a whole-iteration graph leaves no host launch work,
  so the per-layer host overhead is not paid (:data:`autopar.cost.compute.HOST_OVERHEAD_SHARE`).
* **recorded, not priced** (no measurement separates it from the fitted per-layer overheads yet; written by
  ``--emit`` and listed by ``autopar zoo stacks`` as such): MoE dispatcher (``all_to_all``, ``all_gather``,
  ``deepep``, ``hybridep``).

Precedence: a flag on the command line > the stack file > TrainingSpec's built-in default.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from autopar.errors import AutoparInputError
from autopar.specs._base import Spec
from autopar.specs.training import (AttentionImpl, CpRing, CrossEntropy, CudaGraphs, DpImpl, Elementwise, Fp8Recipe,
                                    LossRuntime, MasterWeights, MoeWeighting, OptimizerImpl, PpFsdp, Projections,
                                    SelectiveAc)

if TYPE_CHECKING:
    from autopar.specs.hardware import HardwareSpec

KNOB_RECORDED = ("dispatcher",)            # knobs written and listed but not priced; every other knob is priced
STACK_CONSTANTS = ("layer_overhead_us",)   # Efficiency fields a stack file may carry (fitted per stack)


class StackKnobs(Spec):
    """The switches of one stack (every field has the Megatron-Core default, so a stack file names only what
    differs). Each maps to :class:`autopar.specs.training.TrainingSpec` fields by :meth:`training_fields`."""

    elementwise: Elementwise = Field(
        default="fused", description="Elementwise kernels (norms, RoPE, SwiGLU): fused, compiled or eager.")
    bias_activation_fusion: bool = Field(
        default=True, description="MLP bias and activation in one fused kernel (TrainingSpec.bias_activation_fusion; "
                                  "NeMo's bias_activation_fusion).")
    bias_dropout_add_fusion: bool = Field(
        default=True, description="Bias, dropout and residual add in one fused kernel (TrainingSpec."
                                  "bias_dropout_add_fusion; NeMo's bias_dropout_add_fusion).")
    hidden_dropout: float = Field(
        default=0.0, ge=0.0, lt=1.0, description="Dropout before each residual add (TrainingSpec.hidden_dropout; "
                                                 "Megatron --hidden-dropout, NeMo hidden_dropout).")
    attention: AttentionImpl = Field(
        default="best", description="Attention kernel: the chip file's best (FA3/cuDNN/FA4) or SDPA's FA2.")
    fp8_recipe: Fp8Recipe = Field(
        default="te", description="FP8 scaling recipe and its quantisation kernels (precision fp8 only).")
    tp_overlap: Literal["none", "async_tp", "userbuffers"] = Field(
        default="userbuffers", description="TP communication overlap.")
    tp_dgrad_overlap: bool = Field(
        default=True, description="With TP overlap off, the backward input-gradient reduce-scatter of each column-"
                                  "parallel layer hidden behind its weight-gradient GEMM (Transformer Engine / "
                                  "Megatron-Core's async TP collective; TrainingSpec.tp_dgrad_overlap).")
    dp_overlap: bool = Field(default=True, description="DP/FSDP gradient and parameter communication overlapped.")
    ep_overlap: bool = Field(default=True, description="EP all-to-all overlapped (Megatron --overlap-moe-expert-"
                                                       "parallel-comm / moe_a2a_overlap).")
    cp_overlap: bool = Field(default=True, description="CP ring exchange overlapped with attention.")
    cp_ring: CpRing = Field(
        default="te_p2p", description="Ring attention implementation: Transformer Engine's p2p ring or PyTorch's "
                                      "all-gather ring (TrainingSpec.cp_ring).")
    pp_fsdp: PpFsdp = Field(
        default="per_microbatch", description="FSDP traffic under PP: every micro-batch, or once per step "
                                              "(TrainingSpec.pp_fsdp).")
    cross_entropy: CrossEntropy = Field(default="fused", description="Loss kernel.")
    compiled_loss: bool = Field(
        default=False, description="With elementwise=compiled, torch.compile compiles the unfused torch cross "
                                   "entropy too (torchtitan's compile.components 'loss'; TrainingSpec.cross_entropy "
                                   "'compiled': HBM traffic and the loss's memory). No effect on eager runs.")
    loss_runtime: LossRuntime = Field(
        default="megatron", description="Who holds the logits around the loss (memory only): Megatron's loss "
                                        "path, or PyTorch's as torchtitan runs it (TrainingSpec.loss_runtime).")
    selective_ac: SelectiveAc = Field(
        default="modules", description="What 'selective' recompute re-runs: Megatron's modules or torchtitan's "
                                       "op-level SAC.")
    fp8_attention: bool = Field(default=False, description="Attention core in FP8 (TE fp8_dot_product_attention).")
    fp8_param_gather: bool = Field(
        default=False, description="FP8 primary weights and FP8 parameter all-gather (Megatron --fp8-param-gather; "
                                   "TrainingSpec.fp8_param_gather). Transformer Engine FP8 precisions only (fp8 "
                                   "te, fp8_block, mxfp8): refused with others, as Megatron refuses fp8_param "
                                   "without fp8.")
    projections: Projections = Field(
        default="fused", description="Attention and MLP input projections: fused (Megatron-Core linear_qkv, "
                                     "linear_fc1) or separate GEMMs (torchtitan wq/wk/wv, w1/w3), each priced at its "
                                     "own shape.")
    fp8_output_proj: bool = Field(
        default=False, description="LM head in MXFP8 (Megatron-Core fp8_output_proj; TrainingSpec.fp8_lm_head). "
                                   "Precision mxfp8 only.")
    data_parallel: DpImpl = Field(
        default="megatron", description="Data-parallel implementation: Megatron-Core's DDP / distributed optimizer, "
                                        "or PyTorch FSDP2 as torchtitan sets it up (fp32 reduce-scatter, all-gather "
                                        "copy-out on the compute stream).")
    optimizer: OptimizerImpl = Field(
        default="fused", description="Adam(W) kernels: fused (one pass) or torch's foreach (one pass per op).")
    moe_weighting: MoeWeighting = Field(
        default="activation", description="Where the routing probabilities multiply the routed tokens (memory only; "
                                          "TrainingSpec.moe_weighting): in the expert activation (Megatron-Core) or "
                                          "an fp32 multiply around the experts (torchtitan).")
    fused_grouped_mlp: bool = Field(
        default=False, description="Routed experts through Transformer Engine's op fuser (Megatron-Core "
                                   "use_transformer_engine_op_fuser; Bridge cutedsl_fused_grouped_mlp): expert "
                                   "biases added inside the fused kernels (TrainingSpec.fused_grouped_mlp).")
    dispatcher: Literal["all_to_all", "all_gather", "deepep", "hybridep"] = Field(
        default="all_to_all", description="MoE token dispatcher (recorded, not priced).")
    optimizer_state_dtype: Literal["fp32", "bf16"] = Field(
        default="fp32", description="Dtype of the two Adam moments (TrainingSpec.optimizer_state_dtype; memory): bf16 "
                                    "as NeMo's distributed_fused_adam with optim.dtype bf16 (apex DistributedFusedAdam "
                                    "'dtype: datatype for optimizer state', NVIDIA/apex@f9f19d5c apex/contrib/optimizers/"
                                    "distributed_fused_adam.py) or Megatron-Core --exp-avg-dtype/--exp-avg-sq-dtype bf16.")
    master_weights_dtype: MasterWeights = Field(
        default="fp32", description="The optimizer's master copy of the weights (TrainingSpec.master_weights_dtype; "
                                    "memory): 'none' when the bf16 weights are updated in place, as NeMo 24.07 sets "
                                    "apex store_params=False when optim.dtype equals the model dtype (NVIDIA/NeMo@"
                                    "r2.0.0rc1 (579983fb) megatron_base_model.py setup_optimization).")
    cuda_graphs: CudaGraphs = Field(
        default="none", description="CUDA graphs: full_iteration removes the per-layer host overhead "
                                     "(TrainingSpec.cuda_graphs).")

    @model_validator(mode="after")
    def _check(self) -> "StackKnobs":
        if self.compiled_loss and (self.cross_entropy != "unfused" or self.loss_runtime != "torch"):
            raise ValueError(f"compiled_loss=on compiles PyTorch's own cross entropy (cross_entropy=unfused, "
                             f"loss_runtime=torch), not cross_entropy={self.cross_entropy} under "
                             f"loss_runtime={self.loss_runtime} (say compiled_loss=off)")
        if self.tp_overlap == "async_tp" and self.elementwise == "eager":
            raise ValueError("tp_overlap=async_tp needs elementwise=compiled (PyTorch's async TP is a torch.compile "
                             "pass: torchtitan refuses it without compile)")
        return self

    @property
    def loss_kernel(self) -> str:
        """TrainingSpec.cross_entropy: 'compiled' where torch.compile compiles the loss (compiled blocks and
        ``compiled_loss``, as torchtitan's build_cross_entropy_loss wraps it only when compiling), else the knob."""
        return "compiled" if self.compiled_loss and self.elementwise == "compiled" else self.cross_entropy

    def training_fields(self) -> dict[str, object]:
        """The TrainingSpec switches these knobs set."""
        return dict(elementwise=self.elementwise, attention_impl=self.attention, fp8_recipe=self.fp8_recipe,
                    tp_comm_overlap=self.tp_overlap != "none",
                    tp_overlap_impl="async_tp" if self.tp_overlap == "async_tp" else "userbuffers",
                    tp_dgrad_overlap=self.tp_dgrad_overlap, dp_comm_overlap=self.dp_overlap,
                    ep_comm_overlap=self.ep_overlap, cp_comm_overlap=self.cp_overlap, cp_ring=self.cp_ring,
                    pp_fsdp=self.pp_fsdp,
                    cross_entropy=self.loss_kernel, fp8_attention=self.fp8_attention,
                    selective_ac=self.selective_ac, fp8_param_gather=self.fp8_param_gather,
                    loss_runtime=self.loss_runtime, cuda_graphs=self.cuda_graphs,
                    fp8_lm_head=self.fp8_output_proj, projections=self.projections,
                    dp_impl=self.data_parallel, optimizer_impl=self.optimizer,
                    fused_grouped_mlp=self.fused_grouped_mlp, moe_weighting=self.moe_weighting,
                    bias_activation_fusion=self.bias_activation_fusion,
                    bias_dropout_add_fusion=self.bias_dropout_add_fusion, hidden_dropout=self.hidden_dropout,
                    optimizer_state_dtype=self.optimizer_state_dtype,
                    master_weights_dtype=self.master_weights_dtype)


class StackSpec(Spec):
    """One software stack: its framework, release, default knobs (with a source for each), the knobs the solver
    may choose, and the efficiency constants fitted to its own published runs."""

    name: str = Field(description="Short identifier, e.g. 'torchtitan'.")
    framework: str = Field(description="Framework and what it runs on (e.g. 'torchtitan on PyTorch FSDP2').")
    release: str = Field(description="Release or commit whose behaviour the knobs describe.")
    source: str = Field(description="Where the knobs were read (repository@commit paths).")
    knobs: StackKnobs = Field(default_factory=StackKnobs, description="The stack's default switches.")
    knob_sources: dict[str, str] = Field(default_factory=dict, description="Knob name -> where its value comes from.")
    allowed: dict[str, list[str]] = Field(
        default_factory=dict, description="Knob name -> the values this framework offers (others are rejected).")
    free: list[str] = Field(default_factory=list,
                            description="Knobs the solver may choose for the user (with the layout).")
    efficiency: dict[str, float] = Field(
        default_factory=dict, description="Efficiency constants fitted to this stack's runs; they replace the "
                                          "hardware file's for this stack.")
    efficiency_source: str = Field(default="", description="How and on what the efficiency constants were fitted.")

    @model_validator(mode="after")
    def _check(self) -> "StackSpec":
        names = set(StackKnobs.model_fields)
        for where, keys in (("knob_sources", self.knob_sources), ("allowed", self.allowed), ("free", self.free)):
            bad = [k for k in keys if k not in names]
            if bad:
                raise ValueError(f"{where}: unknown knob(s) {', '.join(bad)} (knobs: {', '.join(sorted(names))})")
        from autopar.specs.hardware import Efficiency
        bad = [k for k in self.efficiency if k not in STACK_CONSTANTS]
        if bad:
            raise ValueError(f"efficiency: {', '.join(bad)} not a stack constant (a stack carries only "
                             f"{', '.join(STACK_CONSTANTS)}; overlap is set by the knobs, kernel rates by the "
                             f"hardware file)")
        Efficiency.model_validate(self.efficiency)   # within the hardware fields' bounds
        self.check_knobs(self.knobs)
        return self

    def check_knobs(self, knobs: StackKnobs) -> None:
        """Reject a knob value this framework does not offer (e.g. Transformer Engine userbuffers in torchtitan)."""
        for k, vals in self.allowed.items():
            v = getattr(knobs, k)
            v = str(v).lower() if isinstance(v, bool) else v
            if v not in vals:
                raise AutoparInputError(f"stack '{self.name}': {k}={v} is not offered (choose {', '.join(vals)})")

    def on(self, hardware: "HardwareSpec") -> "HardwareSpec":
        """``hardware`` with this stack's fitted efficiency constants in place of the file's."""
        if not self.efficiency:
            return hardware
        return hardware.model_copy(update={"efficiency": hardware.efficiency.model_copy(update=self.efficiency)})

    def knob_choices(self, fixed: dict[str, object]) -> list[StackKnobs]:
        """Every valid setting of the free knobs the user did not fix (``fixed``: from --knobs), each with the
        fixed ones: what the solver searches together with the layout."""
        from itertools import product
        free = [k for k in self.free if k not in fixed]
        values = []
        for k in free:
            ann = StackKnobs.model_fields[k].annotation
            values.append(self.allowed.get(k) or ([True, False] if ann is bool else list(ann.__args__)))
        out = []
        for combo in product(*values):
            try:
                out.append(self.with_knobs({**fixed, **dict(zip(free, combo))}))
            except AutoparInputError:
                continue
        return out

    def with_knobs(self, overrides: dict[str, object]) -> StackKnobs:
        """The stack's knobs with ``overrides`` (from :func:`parse_knobs`) applied, checked against ``allowed``."""
        from autopar.specs._base import build_spec
        knobs = build_spec(StackKnobs, {**self.knobs.model_dump(), **overrides}, f"stack '{self.name}' knobs")
        self.check_knobs(knobs)
        return knobs


_SHORT = {"compile": ("elementwise", "compiled"), "eager": ("elementwise", "eager"),
          "async_tp": ("tp_overlap", "async_tp"), "fp8_attention": ("fp8_attention", True)}
_BOOL = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}


def parse_knobs(text: str) -> dict[str, object]:
    """``'compile,async_tp,fp8_recipe=rowwise,dp_overlap=off'`` -> knob overrides. Bare words are shorthands
    (``compile``, ``eager``, ``async_tp``, ``fp8_attention``); ``name=value`` sets any knob of
    :class:`StackKnobs`. Unknown names are errors naming the knob."""
    out: dict[str, object] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if "=" in part:
            k, v = (s.strip() for s in part.split("=", 1))
            if k not in StackKnobs.model_fields:
                raise AutoparInputError(f"knob '{k}': not a stack knob (knobs: {', '.join(StackKnobs.model_fields)})")
            ann = StackKnobs.model_fields[k].annotation
            if ann is bool:
                if v.lower() not in _BOOL:
                    raise AutoparInputError(f"knob '{k}': expected on/off, got '{v}'")
                out[k] = _BOOL[v.lower()]
            else:
                out[k] = v
        elif part in _SHORT:
            k, v = _SHORT[part]
            out[k] = v
        else:
            raise AutoparInputError(f"knob '{part}': not a shorthand ({', '.join(_SHORT)}) and not name=value")
    return out
