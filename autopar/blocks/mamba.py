"""State-space mixers: Mamba-2 (SSD) and Mamba-1 (the selective scan).

Mamba-2: Dao & Gu 2024, arXiv 2405.21060 (Megatron-Core ``MambaMixer``, mamba_ssm ``Mamba2``): H heads of P
channels (d_in = H·P), state N, G groups sharing B and C. Parameters: in_proj h·(2·d_in + 2·G·N + H) (z, x, B,
C, dt), out_proj d_in·h; other: the conv K·(d_in + 2·G·N) and its bias (channels), dt_bias, A_log, D (H each),
the gated RMSNorm d_in. SSD forward FLOPs per token (paper sec. 6, the chunked "SSD algorithm", and
``ssd_minimal_discrete``): C·B^T once per group 2·(C/2)·N, scores·X per head 2·(C/2)·P, chunk states B^T·X
2·N·P and the state output C·S 2·N·P per head. State H·P·N. Stored (``mamba_chunk_scan_combined`` saves x, B,
C, dt, z and recomputes the chunk states): the conv input, x/B/C (d_in + 2·G·N), z (d_in), dt (H); output d_in.
TP splits heads and groups (G % tp); all-to-all CP (Megatron-Core ``MambaContextParallel``): H/tp % cp == 0, and
the groups G/tp divide cp or are divided by it.

Mamba-1: Gu & Dao 2023, arXiv 2312.00752 sec. 3.2, Algorithm 2 (mamba_ssm ``Mamba``, HF ``MambaMixer`` and
Jamba's ``JambaMambaMixer``): a per-channel diagonal state of size N on each of d channels (``inner_size``,
expand·h), Δ, B, C projected from the convolved input. Parameters: in_proj h·2d (x and the gate z), x_proj
d·(R + 2N) (Δ's low-rank input, B, C), dt_proj R·d, out_proj d·h; other: conv K·d and bias d, dt_proj bias d,
A_log d·N, D d, and with ``bc_norms`` (Jamba's dt/b/c_layernorm) R + 2N. Scan FLOPs (HF
``JambaMambaMixer.slow_forward`` is the reference loop; mamba_ssm's ``selective_scan_fn`` runs it sequentially
in SRAM, so there is no chunked matmul form to count), per token, channel c and state n, from
dA = exp(Δ_c·A_cn), h_cn = dA·h_cn + (Δ_c·x_c)·B_n, y_c = Σ_n C_n·h_cn + D_c·x_c: Δ·A (1), exp (1, counted as
one FLOP), (Δx)·B (1), dA·h + ... (2), C·h accumulated (2): 7 per (c, n); per channel Δ·x (1) and the D skip
(2): 7·N + 3 per channel. (mamba_ssm's own estimate, state-spaces/mamba issue #110, is 9·N per channel; the two
differ by how the Δ·B·x products are grouped, < 0.5 % of a Jamba layer.) State d·N. Stored (``selective_scan_fn``
saves u, Δ, B, C, z and recomputes the scan): the conv input x (d), its output u (d), the gate z (d), Δ (d) and
its low-rank input (R), B and C (2N), with bc_norms the un-normed Δ, B, C again (R + 2N); the gated output y (d).
Split by TP except R and 2N (replicated after x_proj's all-reduce), counted split here: below 1 % of a Jamba
layer's stored activations. TP splits channels (vLLM's ``MambaMixer``: in_proj and dt_proj column-parallel,
x_proj row-parallel with an all-reduce of its R + 2N outputs, out_proj row-parallel): d % tp == 0.

Both: the short causal convolution costs 2·K FLOPs per channel per token and hands on its last K − 1 inputs.
Symbols: h hidden, K conv width, C chunk length.
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.blocks._base import Rule
from autopar.blocks._recurrent import _HEADS_NOTE, HeadMixer, Recurrent


@dataclass(frozen=True)
class Mamba2(HeadMixer):
    kind = "mamba2"
    title = "Mamba-2 (SSD)"
    source = "arXiv 2405.21060 sec. 6; Megatron-Core MambaMixer"
    own_fields = ("state_size",)

    state_size: int = 0
    n_groups: int = 1

    @classmethod
    def from_spec(cls, model, mixer) -> "Mamba2":
        return cls(hidden=model.hidden_size, conv_kernel=mixer.conv_kernel, heads=mixer.num_heads,
                   head_dim=mixer.head_dim, chunk_size=mixer.chunk_size, state_size=mixer.state_size,
                   n_groups=mixer.n_groups)

    @classmethod
    def _shape_problem(cls, spec) -> str | None:
        if spec.state_size is None:
            return "a mamba2 mixer needs state_size (N)"
        if spec.num_heads % spec.n_groups:
            return f"mamba2: num_heads ({spec.num_heads}) not divisible by n_groups ({spec.n_groups})"
        return None

    @property
    def d_inner(self) -> int:
        return self.heads * self.head_dim

    def conv_channels(self) -> int:
        """x, B and C."""
        return self.d_inner + 2 * self.n_groups * self.state_size if self.conv_kernel else 0

    def gemm_params(self) -> int:
        h, G, N, d = self.hidden, self.n_groups, self.state_size, self.d_inner
        return h * (2 * d + 2 * G * N + self.heads) + d * h

    def other_params(self) -> int:
        return self.conv_kernel * self.conv_channels() + self.conv_channels() + 3 * self.heads + self.d_inner

    def out_width(self) -> int:
        return self.d_inner

    def scan_flops(self) -> float:
        C, H, G = float(self.chunk_size), self.heads, self.n_groups
        N, P = float(self.state_size), float(self.head_dim)
        return self.conv_flops() + G * 2 * (C / 2) * N + H * (2 * (C / 2) * P + 4 * N * P)

    def state_elems(self) -> int:
        return self.heads * self.head_dim * self.state_size + self.conv_tail()

    def stored_io(self) -> tuple[float, float]:
        G, N, d = self.n_groups, self.state_size, self.d_inner
        return self.conv_channels() + (d + 2 * G * N) + d + self.heads, d

    def rules(self) -> tuple[Rule, ...]:
        return (Rule("tp", "num_heads", self.heads), Rule("tp", "n_groups", self.n_groups),
                Rule("tp·cp", "num_heads", self.heads, note=_HEADS_NOTE),
                Rule("cp", "n_groups", self.n_groups, mutual=True, per_tp=True,
                     note=" (Megatron-Core MambaContextParallel)"))


@dataclass(frozen=True)
class Mamba1(Recurrent):
    kind = "mamba1"
    title = "Mamba-1 selective-scan"
    source = "arXiv 2312.00752 sec. 3.2, Alg. 2; HF JambaMambaMixer"

    inner_size: int = 0
    state_size: int = 0
    dt_rank: int = 0
    bc_norms: bool = False

    @classmethod
    def from_spec(cls, model, mixer) -> "Mamba1":
        return cls(hidden=model.hidden_size, conv_kernel=mixer.conv_kernel, inner_size=mixer.inner_size,
                   state_size=mixer.state_size, dt_rank=mixer.dt_rank, bc_norms=mixer.bc_norms)

    @classmethod
    def _own_field_problem(cls, spec) -> str | None:
        if spec.inner_size is None or spec.state_size is None or spec.dt_rank is None:
            return "a mamba1 mixer needs inner_size (d), state_size (N) and dt_rank (R)"
        extra = [f for f in ("num_heads", "num_value_heads", "head_dim", "value_head_dim", "gate_low_rank")
                 if getattr(spec, f) is not None] + (["output_gate"] if spec.output_gate else [])
        if extra:
            return f"mamba1 mixers have no heads (each of inner_size channels has its own state); unset {extra}"
        return None

    @property
    def d_inner(self) -> int:
        return self.inner_size

    def conv_channels(self) -> int:
        """x."""
        return self.d_inner if self.conv_kernel else 0

    def gemm_params(self) -> int:
        h, d, N, R = self.hidden, self.d_inner, self.state_size, self.dt_rank
        return h * 2 * d + d * (R + 2 * N) + R * d + d * h

    def other_params(self) -> int:
        d, N, R = self.d_inner, self.state_size, self.dt_rank
        conv = self.conv_kernel * self.conv_channels()
        return conv + self.conv_channels() + d + d * N + d + ((R + 2 * N) if self.bc_norms else 0)

    def out_width(self) -> int:
        return self.d_inner

    def core_gemm_k(self) -> int:
        return max(self.state_size or 1, 1)

    def scan_flops(self) -> float:
        return self.conv_flops() + self.d_inner * (7.0 * self.state_size + 3.0)

    def state_elems(self) -> int:
        return self.d_inner * self.state_size + self.conv_tail()

    def stored_io(self) -> tuple[float, float]:
        d, N, R = self.d_inner, self.state_size, self.dt_rank
        return self.conv_channels() + d + d + d + R + 2 * N + ((R + 2 * N) if self.bc_norms else 0), d

    def rules(self) -> tuple[Rule, ...]:
        return (Rule("tp", "inner_size", self.d_inner), Rule("tp·cp", "inner_size", self.d_inner))
