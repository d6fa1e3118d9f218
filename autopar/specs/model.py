"""ModelSpec: the architecture of a decoder-only transformer, dense or mixture-of-experts.

The fields are typed inputs; what one layer of each kind is (parameters, FLOPs, kernels, stored activations, state,
divisibility rules) lives in its block file under :mod:`autopar.blocks`. ModelSpec builds the blocks of every
layer (:meth:`ModelSpec.mixer_blocks`, :meth:`ModelSpec.channel_block`) and sums them: parameter counts are exact
for the architecture described (every weight matrix, bias and norm); FLOPs follow Kaplan et al. 2020 / Narayanan
et al. 2021 (arXiv 2104.04473, eq. 3): a matmul (m x k)·(k x n) costs 2·m·k·n FLOPs, training 3x the forward
pass (backward = 2x forward) without recomputation, and causal attention once per unmasked score
(:mod:`autopar.blocks.attention`).

Hybrid models: ``layer_pattern`` names each layer's token mixer — ``attention`` (the model's own
softmax attention, GQA or MLA from the fields below), ``none`` (no token mixer: Nemotron-H's MLP-only layers)
or a key of ``mixers`` (linear attention, SSM, or attention with its own window/chunk/sinks/gate;
:mod:`autopar.specs.mixers`). ``mlp_pattern`` names each layer's channel mixer (dense, moe, none)
where the MoE placement rule of :class:`MoESpec` cannot say it. Both repeat to num_layers.

Parallel mixers (Falcon-H1, arXiv 2507.22448; HF ``FalconH1DecoderLayer``): a layer_pattern entry may join
several mixer names with ``+`` (``attention+mamba``): the mixers read the same normed input and their outputs are
summed into the residual stream (Falcon-H1 scales each output by a constant µP multiplier first: no weights, no
FLOPs worth counting). Why a pattern syntax and not a "parallel" mixer kind: every per-mixer formula keeps its
one home (the mixer's own kind, or the model's attention), and a layer's parameters, FLOPs, activations and
recurrent state are plainly the sum over its mixers (:meth:`ModelSpec.mixers_of`); a combined kind would need a
second copy of each part's formulas or a mixer that refers to other mixers. One pre-norm serves all of a layer's
mixers. TP and CP rules are those of every part (the intersection of what each allows): each part is split by its
own heads, and under CP attention parts exchange K, V while linear parts pass their state.

Symbols used below: h = hidden size, L = layers, a = attention heads, k = routed experts per token (top-k),
V = vocabulary.
"""

from __future__ import annotations

from functools import cached_property
from typing import Literal

from pydantic import Field, model_validator

from autopar.blocks import MLP, Attention, Block, Rule, attention_block, channel_block, mixer_block
from autopar.blocks.mlp import activation_of
from autopar.specs._base import Spec
from autopar.specs.bounds import limit
from autopar.specs.mixers import MixerSpec

ChannelKind = Literal["dense", "moe", "none"]


class MoESpec(Spec):
    """Mixture-of-experts settings of the MoE layers."""

    num_experts: int = Field(gt=0, le=limit("experts"), description="Routed experts per MoE layer (E).")
    top_k: int = Field(gt=0, le=limit("experts"), description="Routed experts each token is sent to (k).")
    expert_ffn_hidden_size: int = Field(gt=0, le=limit("ffn"),
                                        description="FFN hidden size of one routed expert (f_e).")
    num_shared_experts: int = Field(default=0, ge=0, le=limit("experts"),
                                    description="Always-active shared experts per MoE layer.")
    shared_expert_ffn_hidden_size: int | None = Field(
        default=None, gt=0, le=limit("ffn"),
        description="FFN hidden size of ONE shared expert; defaults to expert_ffn_hidden_size.")
    first_dense_layers: int = Field(
        default=0, ge=0, le=limit("layers"),
        description="Leading layers with a dense MLP instead of MoE (DeepSeek-V3: 3).")
    moe_layer_interval: int = Field(
        default=1, gt=0, le=limit("layers"),
        description="After the leading dense layers, every n-th layer is MoE (Llama 4 Maverick: 2); others dense.")
    expert_bias: bool = Field(default=False, description="Expert linear layers carry biases (GPT-OSS).")
    activation_clamp: float | None = Field(
        default=None, gt=0, le=1e6,
        description="The routed experts' gated activation clamps its inputs to this limit (GPT-OSS: swiglu_limit "
                    "7.0); priced by the clamp's own kernels where Megatron-Core runs it unfused "
                    "(autopar.blocks.moe.CLAMP_ELEMS). None = no clamp.")
    latent_size: int | None = Field(
        default=None, gt=0, le=limit("hidden"),
        description="LatentMoE (Nemotron 3 Super/Ultra): routed experts run at this width l; the tokens are projected "
                    "h -> l before the dispatch and l -> h after the combine (autopar.blocks.moe). None = h.")

    @model_validator(mode="after")
    def _check(self) -> "MoESpec":
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) > num_experts ({self.num_experts})")
        return self

    @property
    def shared_ffn(self) -> int:
        return self.shared_expert_ffn_hidden_size or self.expert_ffn_hidden_size


class IndexerSpec(Spec):
    """DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2-Exp; autopar.blocks.mla): a small multi-query
    scoring over all earlier keys that picks the top-k keys each query attends to."""

    n_heads: int = Field(gt=0, le=limit("heads"), description="Index heads (H_I; index_n_heads).")
    head_dim: int = Field(gt=0, le=limit("head_dim"), description="Width of an index head and of the shared index "
                                                                  "key (d_I; index_head_dim).")
    topk: int = Field(gt=0, le=limit("seq_len"), description="Keys each query attends to (index_topk).")


class MLASpec(Spec):
    """Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434 sec. 2.1): low-rank Q and joint KV."""

    q_lora_rank: int | None = Field(default=None, gt=0, le=limit("lora_rank"),
                                    description="Rank of the Q down-projection; None = full Q.")
    kv_lora_rank: int = Field(gt=0, le=limit("lora_rank"), description="Rank of the joint KV compression (d_c).")
    qk_nope_head_dim: int = Field(gt=0, le=limit("head_dim"), description="Per-head Q/K dim without rotary embedding.")
    qk_rope_head_dim: int = Field(gt=0, le=limit("head_dim"), description="Per-head decoupled rotary Q/K dim.")
    v_head_dim: int = Field(gt=0, le=limit("head_dim"), description="Per-head value dim.")
    indexer: IndexerSpec | None = Field(default=None, description="DeepSeek Sparse Attention's indexer; None = "
                                                                  "dense MLA.")


# Activations whose MLP has gate and up matrices (Shazeer 2020, arXiv 2002.05202: SwiGLU, GeGLU).
GATED_ACTIVATIONS = ("swiglu", "geglu")


class ModelSpec(Spec):
    """A decoder-only transformer. Field names follow Megatron-LM; every size is a count, not bytes."""

    name: str = Field(description="Short identifier, e.g. 'llama3_70b'.")
    source: str = Field(default="", description="Where the numbers come from (official config URL or paper).")
    num_layers: int = Field(gt=0, le=limit("layers"), description="Transformer blocks (L), MTP modules excluded.")
    hidden_size: int = Field(gt=0, le=limit("hidden"), description="Model width (h).")
    ffn_hidden_size: int = Field(gt=0, le=limit("ffn"), description="Hidden size of the dense MLP (f).")
    num_attention_heads: int = Field(gt=0, le=limit("heads"), description="Query heads (a).")
    num_kv_heads: int | None = Field(default=None, gt=0, le=limit("heads"),
                                     description="Key/value heads (g); None = a (MHA).")
    head_dim: int | None = Field(default=None, gt=0, le=limit("head_dim"),
                                 description="Per-head dim (d); None = h / a.")
    vocab_size: int = Field(gt=0, le=limit("vocab"), description="Vocabulary size (V).")
    tie_embeddings: bool = Field(default=False, description="LM head shares the input embedding matrix.")
    gated_mlp: bool = Field(default=True, description="SwiGLU/GeGLU MLP with 3 matrices; False = 2-matrix MLP.")
    activation: Literal["swiglu", "geglu", "gelu", "relu", "squared_relu"] | None = Field(
        default=None, description="The dense MLP's activation function, as the model's config states it (priced "
                                  "by its kernels when a recipe runs it unfused, autopar.blocks.mlp); None = "
                                  "swiglu for a gated MLP, gelu for a plain one. Gated ones (swiglu, geglu) need "
                                  "gated_mlp true, the others false.")
    norm: Literal["rmsnorm", "layernorm"] = Field(default="rmsnorm", description="Normalisation type.")
    qkv_bias: bool = Field(default=False, description="Q/K/V projections carry biases (Qwen2, GPT-OSS).")
    linear_bias: bool = Field(default=False, description="All dense linear layers carry biases (GPT-2/3).")
    position_embedding: Literal["rope", "learned", "none"] = Field(
        default="rope", description="Rotary (no parameters) or a learned absolute table.")
    max_position_embeddings: int = Field(default=4096, gt=0, le=limit("seq_len"),
                                         description="Rows of a learned position table.")
    sliding_window: int | None = Field(default=None, gt=0, le=limit("seq_len"),
                                       description="Sliding-window size of windowed layers.")
    sliding_window_every: int = Field(
        default=0, ge=0, le=limit("layers"),
        description="Every n-th layer is global, the rest windowed (GPT-OSS: 2); 0 = all windowed.")
    rope_mscale: float = Field(
        default=1.0, gt=0, le=1000,
        description="The factor RoPE's cos and sin are scaled by (YaRN's attention concentration: 0.1·ln(factor) + 1 "
                    "without an explicit mscale; gpt-oss, YaRN factor 32: 1.3466). Megatron-Core's fused RoPE does "
                    "not take it, so a model with a factor other than 1 runs RoPE unfused (priced by its kernels, "
                    "autopar.blocks.attention.ROPE_UNFUSED_EXTRA). 1 = plain RoPE.")
    moe: MoESpec | None = Field(default=None, description="MoE settings; None = dense model.")
    mla: MLASpec | None = Field(default=None, description="Multi-head latent attention; None = standard GQA.")
    mtp_layers: int = Field(default=0, ge=0, le=limit("layers"),
                            description="Multi-token-prediction modules (DeepSeek-V3: 1).")
    mtp_layer_pattern: tuple[str, ...] | None = Field(
        default=None, description="Token mixer of each sub-layer of one MTP module, as in layer_pattern (Nemotron 3: "
                                  "['attention', 'none']); None = one sub-layer of the last layer's kinds.")
    mtp_mlp_pattern: tuple[ChannelKind, ...] | None = Field(
        default=None, description="Channel mixer of each sub-layer of one MTP module (Nemotron 3: ['none', 'moe']); "
                                  "given with mtp_layer_pattern.")
    mixers: dict[str, MixerSpec] = Field(
        default_factory=dict, description="Named token mixers that layer_pattern can place (linear attention, SSM, "
                                          "attention variants); see autopar.specs.mixers.")
    layer_pattern: tuple[str, ...] | None = Field(
        default=None, description="Token mixer of each layer, repeated to num_layers: 'attention' (the model's own), "
                                  "'none', a key of mixers, or several of these joined by '+' (run in parallel on "
                                  "the same input, outputs summed: Falcon-H1's 'attention+mamba'). None = "
                                  "'attention' on every layer.")
    mlp_pattern: tuple[ChannelKind, ...] | None = Field(
        default=None, description="Channel mixer of each layer (dense | moe | none), repeated to num_layers; "
                                  "None = the MoE placement of moe (first_dense_layers, moe_layer_interval).")

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        for field_name in ("layer_pattern", "mlp_pattern"):
            pat = getattr(self, field_name)
            if pat is not None and (not pat or self.num_layers % len(pat)):
                raise ValueError(f"{field_name} has {len(pat)} entries, which does not tile num_layers "
                                 f"({self.num_layers}); give one entry per layer or a period dividing it")
        if self.layer_pattern is not None:
            known = {"attention", "none", *self.mixers}
            bad = sorted({n for entry in self.layer_pattern for n in entry.split("+") if n not in known})
            if bad:
                raise ValueError(f"layer_pattern names unknown mixer(s) {bad}; known: {sorted(known)}")
            reserved = {"attention", "none"} & set(self.mixers)
            if reserved:
                raise ValueError(f"mixers may not be named {sorted(reserved)} (reserved for the model's own "
                                 "attention and for no mixer)")
            for entry in self.layer_pattern:
                parts = entry.split("+")
                if len(parts) > 1 and ("none" in parts or len(set(parts)) != len(parts)):
                    raise ValueError(f"layer_pattern entry '{entry}': parallel mixers are distinct names, none of "
                                     "them 'none'")
                if sum(self._named_mixer(n).is_softmax for n in parts if n != "none") > 1:
                    raise ValueError(f"layer_pattern entry '{entry}': at most one softmax attention per layer")
        used = {n for entry in (self.layer_pattern or ()) for n in entry.split("+")}
        unused = sorted(set(self.mixers) - used)
        if unused:
            raise ValueError(f"mixers {unused} are defined but no layer_pattern entry uses them")
        if (self.mtp_layer_pattern is None) != (self.mtp_mlp_pattern is None) or (
                self.mtp_layer_pattern is not None and len(self.mtp_layer_pattern) != len(self.mtp_mlp_pattern)):
            raise ValueError("mtp_layer_pattern and mtp_mlp_pattern go together, one entry per MTP sub-layer each")
        if self.mtp_layer_pattern is not None:
            bad = sorted({n for n in self.mtp_layer_pattern if n not in {"attention", "none", *self.mixers}})
            if bad or ("moe" in self.mtp_mlp_pattern and self.moe is None):
                raise ValueError(f"mtp_layer_pattern names unknown mixer(s) {bad} or places 'moe' without moe")
        if self.mlp_pattern is not None and "moe" in self.mlp_pattern and self.moe is None:
            raise ValueError("mlp_pattern places 'moe' layers but moe is not set")
        if self.mlp_pattern is not None and self.moe is not None and "moe" not in self.mlp_pattern:
            raise ValueError("moe is set but mlp_pattern places no 'moe' layer")
        if any(not self.mixers_of(i) and self.channel_of(i) == "none" for i in range(self.num_layers)):
            raise ValueError("a layer has neither a token mixer nor a channel mixer (layer_pattern 'none' where "
                             "mlp_pattern is 'none')")
        if self.activation is not None and (self.activation in GATED_ACTIVATIONS) != self.gated_mlp:
            raise ValueError(f"activation '{self.activation}' is {'not ' if self.gated_mlp else ''}a gated "
                             f"activation but gated_mlp is {str(self.gated_mlp).lower()}: gated ones "
                             f"({', '.join(GATED_ACTIVATIONS)}) go with gated_mlp true, the others with false")
        a, g = self.num_attention_heads, self.kv_heads
        if a % g:
            raise ValueError(f"num_attention_heads ({a}) must be a multiple of num_kv_heads ({g})")
        if self.head_dim is None and self.mla is None and self.hidden_size % a:
            raise ValueError(f"hidden_size ({self.hidden_size}) not divisible by num_attention_heads ({a}); "
                             "set head_dim")
        return self

    # ---- shape helpers --------------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def qk_head_dim(self) -> int:
        """Per-head Q·K dot-product width (MLA: nope + rope)."""
        return self.attention_block.qk_dim

    @property
    def v_head_dim(self) -> int:
        return self.attention_block.v_dim

    @cached_property
    def attention_block(self) -> Attention:
        """The model's own softmax attention (GQA/MQA/MHA, or MLA), without per-layer options
        (:mod:`autopar.blocks.attention`, :mod:`autopar.blocks.mla`)."""
        return attention_block(self)

    def channel_of(self, i: int) -> ChannelKind:
        """Channel mixer of 0-based layer i: 'dense' MLP, 'moe' block or 'none'."""
        if self.mlp_pattern is not None:
            return self.mlp_pattern[i % len(self.mlp_pattern)]
        if self.moe is None or i < self.moe.first_dense_layers:
            return "dense"
        return "moe" if (i - self.moe.first_dense_layers + 1) % self.moe.moe_layer_interval == 0 else "dense"

    def is_moe_layer(self, i: int) -> bool:
        """Whether 0-based layer i has an MoE block (rather than a dense MLP or none)."""
        return self.channel_of(i) == "moe"

    @cached_property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    @cached_property
    def num_dense_layers(self) -> int:
        """Layers with a dense MLP (computed once: the layout rules ask for every mesh the search checks)."""
        return sum(self.channel_of(i) == "dense" for i in range(self.num_layers))

    def mixer_name(self, i: int) -> str:
        """Name of layer i's token mixer in layer_pattern ('attention' without a pattern; 'a+b' for parallel
        mixers)."""
        return "attention" if self.layer_pattern is None else self.layer_pattern[i % len(self.layer_pattern)]

    def _named_mixer(self, name: str) -> MixerSpec:
        return MixerSpec(kind="attention") if name == "attention" else self.mixers[name]

    def mixers_of(self, i: int) -> tuple[MixerSpec, ...]:
        """Token mixers of 0-based layer i: none, one, or several run in parallel (softmax attention first). The
        model's own attention comes back as an ``attention`` mixer carrying the layer's sliding window."""
        return self._layer_mixers[i]

    def mixer_of(self, i: int) -> MixerSpec | None:
        """The token mixer of a layer with at most one (None: the layer has none). Layers with parallel mixers
        raise: use :meth:`mixers_of`."""
        parts = self._layer_mixers[i]
        if len(parts) > 1:
            raise ValueError(f"layer {i} of {self.name} has parallel mixers ({self.mixer_name(i)}); use mixers_of")
        return parts[0] if parts else None

    @cached_property
    def _layer_mixers(self) -> tuple[tuple[MixerSpec, ...], ...]:
        plain, windowed = MixerSpec(kind="attention"), None
        out: list[tuple[MixerSpec, ...]] = []
        for i in range(self.num_layers):
            parts: list[MixerSpec] = []
            for name in self.mixer_name(i).split("+"):
                if name == "none":
                    continue
                if name == "attention" and self.is_windowed_layer(i):
                    # the model's standard attention over its sliding window
                    windowed = windowed or MixerSpec(kind="attention", window=self.sliding_window)
                    parts.append(windowed)
                else:
                    parts.append(plain if name == "attention" else self.mixers[name])
            parts.sort(key=lambda m: not m.is_softmax)     # softmax attention first (stable)
            out.append(tuple(parts))
        return tuple(out)

    def attention_part(self, i: int) -> MixerSpec | None:
        """Layer i's softmax-attention mixer, if it has one (alone or next to parallel mixers)."""
        return next((m for m in self.mixers_of(i) if m.is_softmax), None)

    @cached_property
    def is_hybrid(self) -> bool:
        """Layers differ in their token-mixer kind (linear attention or SSM next to softmax attention, parallel
        mixers, or mixer-less layers): pipeline stages are then balanced by cost, not by layer count."""
        return any(len(parts) != 1 or not parts[0].is_softmax for parts in self._layer_mixers)

    @cached_property
    def attention_layers(self) -> tuple[int, ...]:
        """Layers with softmax attention (those that hold a KV cache and exchange K, V under CP)."""
        return tuple(i for i in range(self.num_layers) if self.attention_part(i) is not None)

    def is_windowed_layer(self, i: int) -> bool:
        """Whether the model's own attention is windowed on layer i (sliding_window / sliding_window_every)."""
        if self.sliding_window is None:
            return False
        return not (self.sliding_window_every and (i + 1) % self.sliding_window_every == 0)

    @property
    def mlp_activation(self) -> str:
        """The dense MLP's activation: the stated one, else swiglu (gated) or gelu (plain)."""
        return activation_of(self.activation, self.gated_mlp)

    # ---- parameter counts (exact) ---------------------------------------------------------------------
    @property
    def norm_params(self) -> int:
        """One norm: RMSNorm has a scale (h), LayerNorm a scale and a bias (2h)."""
        return self.hidden_size * (2 if self.norm == "layernorm" else 1)

    def mixer_blocks(self, i: int) -> tuple[Block, ...]:
        """The blocks of layer i's token mixers (:mod:`autopar.blocks`), in :meth:`mixers_of` order."""
        return self._mixer_blocks[i]

    def channel_block(self, i: int) -> Block | None:
        """The block of layer i's channel mixer (dense MLP or MoE), None for 'none'."""
        return self._channel_blocks[self.channel_of(i)]

    @cached_property
    def _mixer_blocks(self) -> tuple[tuple[Block, ...], ...]:
        built: dict[int, Block] = {}     # one block per distinct MixerSpec
        return tuple(tuple(built.setdefault(id(mx), mixer_block(self, mx)) for mx in parts)
                     for parts in self._layer_mixers)

    @cached_property
    def _channel_blocks(self) -> dict[str, Block | None]:
        return {kind: channel_block(self, kind) for kind in {self.channel_of(i) for i in range(self.num_layers)}}

    @cached_property
    def linear_mixers(self) -> dict[str, Block]:
        """The blocks of the named linear-attention / SSM mixers, by name (attention mixers are the model's own
        attention with options: :attr:`attention_block` states their rules)."""
        return {name: blk for name, mx in self.mixers.items() if not (blk := mixer_block(self, mx)).keeps_kv}

    @cached_property
    def channel_blocks(self) -> tuple[Block, ...]:
        """The channel-mixer blocks whose rules bind: the dense MLP when some layer has one, the MoE block when moe
        is set."""
        dense = (channel_block(self, "dense"),) if self.num_dense_layers else ()
        return dense + ((channel_block(self, "moe"),) if self.moe else ())

    @cached_property
    def layout_rules(self) -> tuple[tuple[str, bool, tuple[Rule, ...]], ...]:
        """The blocks' divisibility rules as the layout check reads them, in message order: (prefix, first only,
        rules). The model's attention and its channel mixers report every broken rule; each named linear mixer its
        first, prefixed by its name."""
        named = tuple((f"mixer '{name}' ({blk.kind}): ", True, blk.rules()) for name, blk in self.linear_mixers.items())
        return (("", False, self.attention_block.rules()), *named,
                *(("", False, blk.rules()) for blk in self.channel_blocks))

    def broken_rules(self, axes: tuple[str, ...], tp: int, cp: int = 1, ep: int = 1, etp: int = 1) -> tuple[str, ...]:
        """The messages of the :attr:`layout_rules` on ``axes`` that these degrees break, in order (memoized: the
        search checks thousands of meshes with few distinct degrees)."""
        key = (axes, tp, cp, ep, etp)
        memo = self._broken_memo
        if key not in memo:
            out = []
            for prefix, first_only, rules in self.layout_rules:
                for rule in rules:
                    why = rule.axis in axes and rule.problem(tp, cp, ep, etp)
                    if why:
                        out.append(prefix + why)
                        if first_only:
                            break
            memo[key] = tuple(out)
        return memo[key]

    @cached_property
    def _broken_memo(self) -> dict[tuple, tuple[str, ...]]:
        return {}

    @cached_property
    def attention_params(self) -> int:
        """Attention weights of one layer (norm excluded), without per-layer sinks or gate."""
        return self.attention_block.projection_params()

    def mlp_params(self, ffn: int, bias: bool = False) -> int:
        """One MLP of FFN width ``ffn`` (:mod:`autopar.blocks.mlp`)."""
        return MLP(self.hidden_size, ffn, self.gated_mlp, bias or self.linear_bias).params()

    @cached_property
    def expert_params(self) -> int:
        """One routed expert."""
        assert self.moe is not None
        return channel_block(self, "moe").one_expert_params()

    def mixer_params(self, i: int) -> int:
        """Token-mixer weights of layer i (norm excluded): the sum over its mixers (parallel mixers add up)."""
        return sum(b.params() for b in self.mixer_blocks(i))

    def mixer_gemm_params(self, i: int) -> int:
        """The GEMM part of :meth:`mixer_params` (2 FLOPs per weight per token): everything for attention
        (biases and sinks are below 0.01 % and kept), the projections for linear/SSM mixers."""
        return sum(b.gemm_params() for b in self.mixer_blocks(i))

    def layer_norms(self, i: int) -> int:
        """Norm weights of layer i: one pre-norm per sub-block present (the token mixers, however many run in
        parallel, share one; the channel mixer has its own)."""
        return self.norm_params * (bool(self.mixers_of(i)) + (self.channel_of(i) != "none"))

    def channel_nonexpert_params(self, i: int) -> int:
        """Channel-mixer weights of layer i outside the routed experts: dense MLP, or router + shared experts."""
        ch = self.channel_block(i)
        return ch.params() if ch else 0

    def layer_nonexpert_params(self, i: int) -> int:
        """Layer i without its routed experts (sharded by TP): mixer + dense MLP or router/shared + norms."""
        return self.mixer_params(i) + self.channel_nonexpert_params(i) + self.layer_norms(i)

    def layer_expert_params(self, i: int) -> int:
        """Routed experts of layer i (sharded by EP·ETP)."""
        ch = self.channel_block(i)
        return ch.expert_params() if ch else 0

    @cached_property
    def moe_layer_expert_params(self) -> int:
        """Routed experts of one MoE layer (E · expert)."""
        return channel_block(self, "moe").expert_params() if self.moe else 0

    @property
    def embedding_params(self) -> int:
        p = self.vocab_size * self.hidden_size
        if self.position_embedding == "learned":
            p += self.max_position_embeddings * self.hidden_size
        return p

    @property
    def lm_head_params(self) -> int:
        """Output projection (0 when tied to the embedding); the final norm is counted here."""
        return (0 if self.tie_embeddings else self.vocab_size * self.hidden_size) + self.norm_params

    def _mtp_sublayers(self) -> list[tuple[tuple[Block, ...], Block | None]]:
        """(token-mixer blocks, channel block) of each sub-layer of one MTP module: mtp_layer_pattern /
        mtp_mlp_pattern (Nemotron 3: an attention sub-layer and an MoE sub-layer), else the last layer's."""
        if self.mtp_layer_pattern is None:
            last = self.num_layers - 1
            return [(self.mixer_blocks(last), self.channel_block(last))]
        return [(tuple(mixer_block(self, self._named_mixer(n)) for n in name.split("+") if n != "none"),
                 channel_block(self, ch)) for name, ch in zip(self.mtp_layer_pattern, self.mtp_mlp_pattern)]

    def pricing_notes(self) -> list[str]:
        """What the cost model approximates for this model's blocks, said beside every estimate."""
        notes = []
        if self.mla is not None and self.mla.indexer is not None:
            notes.append("DeepSeek Sparse Attention: the indexer's scores over all keys are priced at the attention "
                         "kernel's speed (its FP8 kernel is not in the hardware file) and its top-k selection is "
                         "not priced; MLA attends to the top-k keys")
        if self.mtp_layers and self.mtp_layer_pattern is not None and len(self.mtp_layer_pattern) > 1:
            notes.append(f"each MTP module's {len(self.mtp_layer_pattern)} sub-layers are counted in parameters, "
                         "FLOPs and memory, but its time is priced as one layer of the last layer's kind")
        return notes

    @cached_property
    def mtp_module_expert_params(self) -> int:
        """Routed-expert weights of one MTP module (sharded by EP·ETP)."""
        return sum(ch.expert_params() for _, ch in self._mtp_sublayers() if ch is not None)

    @cached_property
    def mtp_module_params(self) -> int:
        """One MTP module (DeepSeek-V3, arXiv 2412.19437 sec. 2.2; Nemotron 3's two-sub-layer depth): 2 norms, a
        2h x h projection and its sub-layers (each with its norms); embedding and head are shared with the main
        model."""
        block = 0
        for mixers, ch in self._mtp_sublayers():
            block += sum(b.params() for b in mixers) + self.norm_params * (bool(mixers) + (ch is not None))
            block += (ch.params() + ch.expert_params()) if ch is not None else 0
        return 2 * self.norm_params + 2 * self.hidden_size * self.hidden_size + block

    @cached_property
    def total_params(self) -> int:
        """All parameters of the main model (MTP modules excluded, as published figures count them)."""
        p = self.embedding_params + self.lm_head_params
        p += sum(self.layer_nonexpert_params(i) + self.layer_expert_params(i) for i in range(self.num_layers))
        return p

    @cached_property
    def active_params(self) -> int:
        """Parameters a token passes through: routed experts counted k of E (embedding included)."""
        if not self.moe:
            return self.total_params
        inactive = self.num_moe_layers * (self.moe.num_experts - self.moe.top_k) * self.expert_params
        return self.total_params - inactive

    @cached_property
    def expert_params_total(self) -> int:
        """All routed-expert parameters (sharded by EP·ETP; everything else is sharded by TP)."""
        return self.num_moe_layers * self.moe_layer_expert_params

    # ---- FLOPs -------------------------------------------------------------------------------------------
    def attention_core_flops_per_token(self, i: int, seq_len: int) -> float:
        """Softmax-attention scores of layer i per token: QK^T and AV (:mod:`autopar.blocks.attention`)."""
        return sum((b.attention_core_flops(seq_len) for b in self.mixer_blocks(i)), 0.0)

    def mixer_core_flops_per_token(self, i: int) -> float:
        """Chunked linear-attention / SSM scan and short convolution of layer i per token (0 for attention; summed
        over parallel mixers)."""
        return sum((b.scan_flops() for b in self.mixer_blocks(i)), 0.0)

    def channel_forward_flops_per_token(self, i: int) -> float:
        """Dense MLP, or MoE router (2·h·E) + k routed + shared experts, of layer i per token."""
        ch = self.channel_block(i)
        return ch.forward_flops() if ch else 0.0

    def layer_forward_flops_per_token(self, i: int, seq_len: int) -> float:
        """Forward FLOPs of layer i for one token: 2·(matmul params touched) + attention scores or the chunked
        scan of a linear/SSM mixer. Norms, softmax and gates' elementwise work are ignored."""
        return (2.0 * self.mixer_gemm_params(i) + self.attention_core_flops_per_token(i, seq_len)
                + self.mixer_core_flops_per_token(i) + self.channel_forward_flops_per_token(i))

    def head_forward_flops_per_token(self) -> float:
        """LM head logits: 2·h·V per token."""
        return 2.0 * self.hidden_size * self.vocab_size

    def mtp_forward_flops_per_token(self, seq_len: int) -> float:
        """MTP modules: projection 2·(2h·h), its sub-layers, and one more LM head each."""
        if not self.mtp_layers:
            return 0.0
        block = 0.0
        for mixers, ch in self._mtp_sublayers():
            block += sum(2.0 * b.gemm_params() + b.attention_core_flops(seq_len) + b.scan_flops() for b in mixers)
            block += ch.forward_flops() if ch is not None else 0.0
        per = 2.0 * 2 * self.hidden_size ** 2 + block + self.head_forward_flops_per_token()
        return self.mtp_layers * per

    def forward_flops_per_token(self, seq_len: int) -> float:
        """Forward FLOPs per token of the whole model (MTP included)."""
        layers = sum(self.layer_forward_flops_per_token(i, seq_len) for i in range(self.num_layers))
        return layers + self.head_forward_flops_per_token() + self.mtp_forward_flops_per_token(seq_len)

    def training_flops_per_token(self, seq_len: int) -> float:
        """Model FLOPs per trained token: forward + backward (2x forward) = 3x forward, no recomputation.
        This is the numerator of MFU (PaLM, Chowdhery et al. 2022, appendix B)."""
        return 3.0 * self.forward_flops_per_token(seq_len)

    def mixer_counts(self) -> dict[str, int]:
        """Layers per token-mixer name, in order of first appearance (e.g. {'gla': 16, 'attention': 5})."""
        out: dict[str, int] = {}
        for i in range(self.num_layers):
            out[self.mixer_name(i)] = out.get(self.mixer_name(i), 0) + 1
        return out

    @staticmethod
    def count_text(n: float) -> str:
        """A parameter count as every command prints it: one decimal of the largest unit that keeps it at least 1
        (70.6B, 120.0M, 45.1K), rounded once from the count (autopar zoo's billions use the same rounding)."""
        for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
            if n >= scale:
                return f"{n / scale:.1f}{unit}"
        return f"{n:.0f}"

    def summary(self) -> str:
        kind = f"MoE {self.moe.num_experts}x top-{self.moe.top_k}" if self.moe else "dense"
        mix = ""
        if self.is_hybrid:
            mix = " (" + " + ".join(f"{n} {k}" for k, n in self.mixer_counts().items()) + ")"
        return (f"{self.name}: {self.count_text(self.total_params)} total, {self.count_text(self.active_params)} "
                "active, "
                f"{self.num_layers} layers{mix}, h={self.hidden_size}, {kind}")

