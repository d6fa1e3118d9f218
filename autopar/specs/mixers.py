"""Token mixers other than the model's standard attention: what a layer of a hybrid model uses to mix tokens.

A :class:`MixerSpec` is named in ``ModelSpec.mixers`` and placed by ``ModelSpec.layer_pattern``. Kinds:

``attention``       softmax attention with the model's heads (GQA/MQA/MHA or MLA, from the ModelSpec fields), with
                    this layer's own options: a sliding ``window`` (Mistral, Gemma 3, GPT-OSS), a ``chunk``
                    (Llama 4's chunked attention: a token attends only inside its chunk of ``chunk`` tokens),
                    ``sinks`` (GPT-OSS: one learned logit per head) and an ``output_gate`` (Qwen3-Next: a sigmoid
                    gate of width a·d on the attention output, projected from the hidden state).
``gla``             gated linear attention (Yang et al. 2023, arXiv 2312.06635; FLA ``GatedLinearAttention``).
``gated_deltanet``  gated delta rule (Yang, Kautz & Hatamizadeh 2024, arXiv 2412.06464; FLA ``GatedDeltaNet``,
                    Qwen3-Next ``Qwen3NextGatedDeltaNet``).
``kda``             Kimi Delta Attention (Kimi Linear, arXiv 2510.26692): the gated delta rule with a per-channel
                    (not per-head) forget gate, from low-rank gate projections (FLA ``KimiDeltaAttention``).
``lightning``       linear attention with a fixed per-head decay (Lightning Attention-2, Qin et al. 2024,
                    arXiv 2401.04658; MiniMax-01).
``mamba2``          state-space duality (Dao & Gu 2024, arXiv 2405.21060; Megatron-Core ``MambaMixer``,
                    mamba_ssm ``Mamba2``).
``mamba1``          the selective SSM of Mamba (Gu & Dao 2023, arXiv 2312.00752, sec. 3.2 Algorithm 2; mamba_ssm
                    ``Mamba``, HF ``MambaMixer`` and Jamba's ``JambaMambaMixer``): a per-channel diagonal state of
                    size N on each of d_inner channels, with Δ, B, C projected from the convolved input.

Every count below is per layer and, for FLOPs and activations, per token. Symbols: h hidden size, H heads
(GDN: H_k query/key heads, H_v value heads), d_k key head dim, d_v value head dim, r the GLA gate's low rank,
K the short-convolution kernel, C the chunk length of the chunked (parallel-in-chunk) form; Mamba-2: P head dim,
N state size, G groups, d_in = H·P; Mamba-1: d the inner width (``inner_size``, expand·h), R the rank of the Δ
projection (``dt_rank``), N the state size. A matmul of (m x k)·(k x n) costs 2·m·k·n FLOPs.

Chunked form FLOPs (forward, per token, per head; causal blocks counted for their unmasked half, as the
softmax attention of autopar.specs.model is):

* linear attention (GLA, Lightning; GLA paper sec. 4, eq. 6-7, the "chunkwise parallel form"):
  intra-chunk scores Q·K^T and scores·V over C/2 keys on average: 2·(C/2)·d_k + 2·(C/2)·d_v;
  inter-chunk output Q·S (S the d_k x d_v state): 2·d_k·d_v; state update K^T·V: 2·d_k·d_v.
* gated delta rule and KDA (GDN paper sec. 3.3; Kimi Linear sec. 3 uses the same chunkwise form with a per-channel
  decay; the WY/UT representation of the chunkwise delta rule, as FLA's
  ``chunk_gated_delta_rule`` computes it): the lower-triangular K·K^T (2·(C/2)·d_k), its triangular inverse
  (C²/3 per token: C³/3 per chunk), W = T·K and U = T·V (2·(C/2)·d_k + 2·(C/2)·d_v), the intra-chunk
  Q·K^T and scores·(U − W·S) (2·(C/2)·d_k + 2·(C/2)·d_v), and three d_k x d_v products with the state (W·S,
  Q·S, the update K^T·(U − W·S)): 6·d_k·d_v.
* Mamba-2 SSD (paper sec. 6, the chunked "SSD algorithm", and ``ssd_minimal_discrete``): C·B^T once per group
  (2·(C/2)·N per group), scores·X per head (2·(C/2)·P), chunk states B^T·X (2·N·P) and the state output C·S
  (2·N·P) per head.
* Mamba-1 selective scan (arXiv 2312.00752 Alg. 2; HF ``JambaMambaMixer.slow_forward`` is the reference loop,
  mamba_ssm's ``selective_scan_fn`` the fused kernel that runs it sequentially over time in SRAM, so there is no
  chunked matmul form to count). Per token, per channel c and state n, from the recurrence
  dA = exp(Δ_c·A_cn), h_cn = dA·h_cn + (Δ_c·x_c)·B_n, y_c = Σ_n C_n·h_cn + D_c·x_c:
  Δ·A (1), exp (1, counted as one FLOP), (Δx)·B (1), dA·h + ... (2), C·h accumulated (2): 7 per (c, n); per
  channel Δ·x (1) and the D skip (2): 7·N + 3 per channel. (mamba_ssm's own estimate, state-spaces/mamba issue
  #110, is 9·N per channel; the two differ by how the Δ·B·x products are grouped, < 0.5 % of a Jamba layer.)
* short causal convolutions (FLA ``ShortConvolution``, Mamba's conv1d): 2·K FLOPs per channel per token.

Projections are GEMMs: 2 FLOPs per weight per token (their weights are :func:`gemm_params`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from autopar.specs._base import Spec


MixerKind = Literal["attention", "gla", "gated_deltanet", "kda", "lightning", "mamba2", "mamba1"]
LINEAR_KINDS = ("gla", "gated_deltanet", "kda", "lightning", "mamba2", "mamba1")


class MixerSpec(Spec):
    """One token-mixer kind, placed on layers by ``ModelSpec.layer_pattern``. Fields not used by a kind must
    stay unset (checked)."""

    kind: MixerKind = Field(description="attention | gla | gated_deltanet | kda | lightning | mamba2 | mamba1.")
    # softmax attention options (heads and dims are the model's)
    window: int | None = Field(default=None, gt=0, description="attention: sliding window in tokens.")
    chunk: int | None = Field(default=None, gt=0, description="attention: chunked attention, tokens per chunk.")
    sinks: bool = Field(default=False, description="attention: one learned sink logit per head (GPT-OSS).")
    output_gate: bool = Field(default=False, description="Sigmoid/SiLU output gate of width heads·value dim "
                                                         "projected from the hidden state (Qwen3-Next, GLA, GDN).")
    # linear attention / SSM shape
    num_heads: int | None = Field(default=None, gt=0, description="Heads (GDN: query/key heads H_k; Mamba-2: H).")
    num_value_heads: int | None = Field(default=None, gt=0, description="GDN: value heads H_v; None = num_heads.")
    head_dim: int | None = Field(default=None, gt=0, description="Key head dim d_k (Mamba-2: head dim P).")
    value_head_dim: int | None = Field(default=None, gt=0, description="Value head dim d_v; None = head_dim.")
    gate_low_rank: int | None = Field(default=None, gt=0, description="GLA: rank r of the forget-gate projection.")
    conv_kernel: int = Field(default=0, ge=0, description="Short causal convolution width K (0 = none).")
    state_size: int | None = Field(default=None, gt=0, description="Mamba-1 / Mamba-2: state size N.")
    inner_size: int | None = Field(default=None, gt=0, description="Mamba-1: inner width d (expand·h; channels of "
                                                                   "the scan).")
    dt_rank: int | None = Field(default=None, gt=0, description="Mamba-1: rank R of the Δ projection "
                                                                "(x_proj -> R -> dt_proj).")
    bc_norms: bool = Field(default=False, description="Mamba-1: RMSNorms on Δ (R), B and C (N each) before the "
                                                      "scan (Jamba's dt/b/c_layernorm).")
    n_groups: int = Field(default=1, gt=0, description="Mamba-2: groups G sharing B and C.")
    chunk_size: int = Field(default=64, gt=0, description="Chunk length C of the chunked scan (FLA, SSD: 64).")

    @model_validator(mode="after")
    def _check(self) -> "MixerSpec":
        k = self.kind
        if k == "attention":
            extra = [f for f in ("num_heads", "num_value_heads", "head_dim", "value_head_dim", "gate_low_rank",
                                 "state_size") if getattr(self, f) is not None]
            if extra:
                raise ValueError(f"attention mixers use the model's heads and dims; unset {extra}")
            if self.window and self.chunk:
                raise ValueError("an attention mixer has a window or a chunk, not both")
            return self
        if self.window or self.chunk or self.sinks:
            raise ValueError(f"window, chunk and sinks are softmax-attention options, not {k}'s")
        if k == "mamba1":
            if self.inner_size is None or self.state_size is None or self.dt_rank is None:
                raise ValueError("a mamba1 mixer needs inner_size (d), state_size (N) and dt_rank (R)")
            extra = [f for f in ("num_heads", "num_value_heads", "head_dim", "value_head_dim", "gate_low_rank")
                     if getattr(self, f) is not None] + (["output_gate"] if self.output_gate else [])
            if extra:
                raise ValueError(f"mamba1 mixers have no heads (each of inner_size channels has its own state); "
                                 f"unset {extra}")
            return self
        if self.inner_size is not None or self.dt_rank is not None or self.bc_norms:
            raise ValueError(f"inner_size, dt_rank and bc_norms are mamba1 fields, not {k}'s")
        if self.num_heads is None or self.head_dim is None:
            raise ValueError(f"a {k} mixer needs num_heads and head_dim")
        if k == "mamba2":
            if self.state_size is None:
                raise ValueError("a mamba2 mixer needs state_size (N)")
            if self.num_heads % self.n_groups:
                raise ValueError(f"mamba2: num_heads ({self.num_heads}) not divisible by n_groups ({self.n_groups})")
        elif self.state_size is not None:
            raise ValueError(f"state_size is a mamba2 field, not {k}'s")
        if self.gate_low_rank is not None and k not in ("gla", "kda"):
            raise ValueError(f"gate_low_rank is a gla / kda field, not {k}'s")
        if self.num_value_heads is not None and k != "gated_deltanet":
            raise ValueError(f"num_value_heads is a gated_deltanet field, not {k}'s")
        if k == "gated_deltanet" and self.v_heads % self.num_heads:
            raise ValueError(f"gated_deltanet: num_value_heads ({self.v_heads}) must be a multiple of num_heads "
                             f"({self.num_heads})")
        return self

    # ---- shape ---------------------------------------------------------------------------------------------
    @property
    def is_linear(self) -> bool:
        """Linear attention or SSM: a fixed-size recurrent state instead of a KV cache."""
        return self.kind in LINEAR_KINDS

    @property
    def v_heads(self) -> int:
        return self.num_value_heads or self.num_heads or 0

    @property
    def dk(self) -> int:
        return self.head_dim or 0

    @property
    def dv(self) -> int:
        return self.value_head_dim or self.head_dim or 0

    @property
    def d_inner(self) -> int:
        """Mamba-2: H·P; Mamba-1: inner_size."""
        if self.kind == "mamba1":
            return self.inner_size or 0
        return (self.num_heads or 0) * (self.head_dim or 0)

    def conv_channels(self) -> int:
        """Channels of the short convolution (q, k, v for FLA layers; x, B, C for Mamba-2; x for Mamba-1)."""
        if not self.conv_kernel:
            return 0
        if self.kind == "mamba1":
            return self.d_inner
        if self.kind == "mamba2":
            return self.d_inner + 2 * self.n_groups * (self.state_size or 0)
        return 2 * (self.num_heads or 0) * self.dk + self.v_heads * self.dv

    # ---- parameters ---------------------------------------------------------------------------------------
    def gemm_params(self, h: int) -> int:
        """Projection weights (the GEMMs; every weight costs 2 FLOPs per token).

        gla (FLA GatedLinearAttention): q, k h·H·d_k each; v h·H·d_v; output gate h·H·d_v; forget gate
        h·r + r·H·d_k (the low-rank gk_proj); o H·d_v·h.
        gated_deltanet (Qwen3-Next in_proj_qkvz + in_proj_ba, FLA GatedDeltaNet): q, k h·H_k·d_k each;
        v h·H_v·d_v; output gate h·H_v·d_v; decay and β h·H_v each; o H_v·d_v·h.
        kda (FLA KimiDeltaAttention): q, k, v h·H·d each; forget gate h·r + r·H·d and output gate h·r + r·H·d
        (low rank r, default d); β h·H; o H·d·h.
        lightning (MiniMax-01): q, k, v h·H·d each; output gate h·H·d; o H·d·h.
        mamba2 (mamba_ssm Mamba2 in_proj / out_proj): h·(2·d_in + 2·G·N + H) in; d_in·h out.
        mamba1 (HF JambaMambaMixer / MambaMixer): in_proj h·2d (x and the gate z), x_proj d·(R + 2N) (Δ's low-rank
        input, B, C), dt_proj R·d, out_proj d·h."""
        H, dk, dv = self.num_heads or 0, self.dk, self.dv
        if self.kind == "gla":
            r = self.gate_low_rank or 0
            gk = h * r + r * H * dk if r else h * H * dk
            return 2 * h * H * dk + h * H * dv + (h * H * dv if self.output_gate else 0) + gk + H * dv * h
        if self.kind == "gated_deltanet":
            Hv = self.v_heads
            return (2 * h * H * dk + h * Hv * dv + (h * Hv * dv if self.output_gate else 0) + 2 * h * Hv
                    + Hv * dv * h)
        if self.kind == "lightning":
            return 3 * h * H * dk + (h * H * dk if self.output_gate else 0) + H * dk * h
        if self.kind == "kda":
            r = self.gate_low_rank or dv
            return 3 * h * H * dk + (h * r + r * H * dk) + (h * r + r * H * dv) + h * H + H * dv * h
        if self.kind == "mamba2":
            G, N, d = self.n_groups, self.state_size or 0, self.d_inner
            return h * (2 * d + 2 * G * N + H) + d * h
        if self.kind == "mamba1":
            d, N, R = self.d_inner, self.state_size or 0, self.dt_rank or 0
            return h * 2 * d + d * (R + 2 * N) + R * d + d * h
        raise ValueError(f"gemm_params of a {self.kind} mixer is the model's attention")  # pragma: no cover

    def other_params(self) -> int:
        """Non-GEMM weights: convolutions (K·channels; Mamba-2 + bias), gate biases, decay parameters, norms.

        gla: gk bias H·d_k (low-rank form), output norm d_v (FLA's per-head gated RMSNorm, shared by heads).
        gated_deltanet: A_log and dt_bias H_v each, output norm d_v. kda: A_log H, dt_bias H·d_k, output-gate
        bias H·d_v, output norm d_v. lightning: output norm H·d.
        mamba2: conv bias (channels), dt_bias, A_log, D (H each), gated RMSNorm d_in.
        mamba1: conv bias d, dt_proj bias d, A_log d·N, D d, and with bc_norms the Δ, B, C norm scales R + 2N."""
        H = self.num_heads or 0
        conv = self.conv_kernel * self.conv_channels()
        if self.kind == "gla":
            return conv + (H * self.dk if self.gate_low_rank else 0) + self.dv
        if self.kind == "gated_deltanet":
            return conv + 2 * self.v_heads + self.dv
        if self.kind == "lightning":
            return conv + H * self.dk
        if self.kind == "kda":
            return conv + H + H * self.dk + H * self.dv + self.dv
        if self.kind == "mamba2":
            return conv + self.conv_channels() + 3 * H + self.d_inner
        if self.kind == "mamba1":
            d, N, R = self.d_inner, self.state_size or 0, self.dt_rank or 0
            return conv + self.conv_channels() + d + d * N + d + ((R + 2 * N) if self.bc_norms else 0)
        return 0  # pragma: no cover

    # ---- FLOPs --------------------------------------------------------------------------------------------
    def core_flops(self) -> float:
        """Forward FLOPs per token of the chunked scan and the short convolution (not the projections); see
        the module docstring for each line's source."""
        C, dk, dv, H = float(self.chunk_size), self.dk, self.dv, self.num_heads or 0
        conv = 2.0 * self.conv_kernel * self.conv_channels()
        if self.kind in ("gla", "lightning"):
            return conv + H * (2 * (C / 2) * (dk + dv) + 4 * dk * dv)
        if self.kind in ("gated_deltanet", "kda"):
            Hv = self.v_heads    # FLA broadcasts q and k over the value heads: the scan runs per value head
            per_head = 2 * (C / 2) * dk + C * C / 3 + 2 * (C / 2) * (dk + dv) + 2 * (C / 2) * (dk + dv) + 6 * dk * dv
            return conv + Hv * per_head
        if self.kind == "mamba2":
            N, P, G = float(self.state_size or 0), float(self.head_dim or 0), self.n_groups
            return conv + G * 2 * (C / 2) * N + H * (2 * (C / 2) * P + 4 * N * P)
        if self.kind == "mamba1":
            return conv + self.d_inner * (7.0 * (self.state_size or 0) + 3.0)
        return 0.0  # pragma: no cover

    # ---- memory -------------------------------------------------------------------------------------------
    def state_elems(self) -> int:
        """Recurrent state of one sequence (what a CP rank hands to the next): H·d_k·d_v (Mamba-2: H·P·N;
        Mamba-1: d·N), plus the last K − 1 convolution inputs."""
        conv = max(self.conv_kernel - 1, 0) * self.conv_channels()
        if self.kind == "mamba1":
            return self.d_inner * (self.state_size or 0) + conv
        if self.kind == "mamba2":
            return (self.num_heads or 0) * (self.head_dim or 0) * (self.state_size or 0) + conv
        heads = self.v_heads if self.kind in ("gated_deltanet", "kda") else (self.num_heads or 0)
        return heads * self.dk * self.dv + conv

    def stored_elems(self) -> tuple[float, float]:
        """(projected inputs of the scan, scan output) elements per token kept for the backward pass, split by
        TP. The FLA chunk kernels and Mamba-2's ``mamba_chunk_scan_combined`` save their inputs (q, k, v, gates;
        x, B, C, dt, z) and recompute the chunk states in the backward pass; the output feeds the gated norm and
        the output projection. Mamba-1 (mamba_ssm ``selective_scan_fn`` saves u, Δ, B, C, z and recomputes the
        scan; HF ``JambaMambaMixer``): the conv input x (d), its output u (d, also x_proj's input), the gate z (d),
        Δ (d) and its low-rank input (R), B and C (2N), with bc_norms the un-normed Δ, B, C again (R + 2N); the
        gated output y (d) feeds out_proj. Split by TP except R and 2N (replicated after x_proj's all-reduce),
        counted split here: below 1 % of a Jamba layer's stored activations."""
        H, dk, dv = self.num_heads or 0, self.dk, self.dv
        conv_in = self.conv_channels()      # the convolution keeps its input as well
        if self.kind == "gla":
            return conv_in + 2 * H * dk + H * dv + H * dk + (H * dv if self.output_gate else 0), H * dv
        if self.kind == "gated_deltanet":
            Hv = self.v_heads
            return conv_in + 2 * H * dk + Hv * dv + 2 * Hv + (Hv * dv if self.output_gate else 0), Hv * dv
        if self.kind == "kda":   # q, k, v, the per-channel gate, β, the output gate
            return conv_in + 3 * H * dk + H * dk + H + H * dv, H * dv
        if self.kind == "lightning":
            return conv_in + 3 * H * dk + (H * dk if self.output_gate else 0), H * dk
        if self.kind == "mamba2":
            G, N, d = self.n_groups, self.state_size or 0, self.d_inner
            return conv_in + (d + 2 * G * N) + d + H, d
        if self.kind == "mamba1":
            d, N, R = self.d_inner, self.state_size or 0, self.dt_rank or 0
            return conv_in + d + d + d + R + 2 * N + ((R + 2 * N) if self.bc_norms else 0), d
        return 0.0, 0.0  # pragma: no cover

    # ---- widths of the scan's input and output ----------------------------------------------------------
    def out_width(self) -> int:
        """Width of the scan's output, the output projection's input: H_v·d_v (GDN, KDA), d_in (Mamba-1/2),
        H·d_v (GLA, Lightning)."""
        if self.kind in ("gated_deltanet", "kda"):
            return self.v_heads * self.dv
        if self.kind in ("mamba2", "mamba1"):
            return self.d_inner
        return (self.num_heads or 0) * self.dv

    def in_width(self, h: int) -> int:
        """Width of the input projections' output (everything the scan and its gates read per token)."""
        return (self.gemm_params(h) - self.out_width() * h) // h

    # ---- context parallel ---------------------------------------------------------------------------------
    def cp_problem(self, tp: int, cp: int, name: str) -> str | None:
        """Why this mixer cannot run all-to-all context parallelism over cp ranks (None = it can): the all-to-all
        hands each of the tp·cp ranks whole heads. Megatron-Core ``MambaContextParallel``: H/tp % cp == 0, and the
        groups G/tp divide cp or are divided by it; ``GatedDeltaNet``: key and value heads % (tp·cp) == 0. Other
        kinds: heads (Mamba-1: channels) % (tp·cp) == 0, the same head split."""
        if not self.is_linear or cp == 1:
            return None
        n = tp * cp
        if self.kind == "mamba1":
            if self.d_inner % n:
                return f"mixer '{name}' (mamba1): inner_size ({self.d_inner}) not divisible by tp·cp = {tp}·{cp}"
            return None
        if (self.num_heads or 0) % n:
            return (f"mixer '{name}' ({self.kind}): num_heads ({self.num_heads}) not divisible by tp·cp = {tp}·{cp} "
                    "(all-to-all context parallel splits heads)")
        if self.kind == "gated_deltanet" and self.v_heads % n:
            return (f"mixer '{name}' (gated_deltanet): num_value_heads ({self.v_heads}) not divisible by tp·cp = "
                    f"{tp}·{cp}")
        if self.kind == "mamba2":
            g = self.n_groups // tp
            if g and (cp % g if g < cp else g % cp):
                return (f"mixer '{name}' (mamba2): n_groups/tp ({g}) and cp ({cp}) must divide one another "
                        "(Megatron-Core MambaContextParallel)")
        return None

    # ---- tensor parallel ----------------------------------------------------------------------------------
    def tp_problem(self, tp: int, name: str) -> str | None:
        """Why this mixer cannot be split over tp ranks by heads (None = it can). Megatron-Core's MambaMixer
        also splits the groups, so G % tp == 0. Mamba-1 is split by channels (vLLM's ``MambaMixer``: in_proj and
        dt_proj column-parallel, x_proj row-parallel with an all-reduce of its R + 2N outputs, out_proj
        row-parallel), so d % tp == 0."""
        if not self.is_linear:
            return None
        if self.kind == "mamba1":
            if self.d_inner % tp:
                return f"mixer '{name}' (mamba1): inner_size ({self.d_inner}) not divisible by tp ({tp})"
            return None
        if (self.num_heads or 0) % tp:
            return f"mixer '{name}' ({self.kind}): num_heads ({self.num_heads}) not divisible by tp ({tp})"
        if self.kind == "gated_deltanet" and self.v_heads % tp:
            return f"mixer '{name}' (gated_deltanet): num_value_heads ({self.v_heads}) not divisible by tp ({tp})"
        if self.kind == "mamba2" and self.n_groups % tp:
            return f"mixer '{name}' (mamba2): n_groups ({self.n_groups}) not divisible by tp ({tp})"
        return None

