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

    def scan_bytes(self) -> tuple[float, float]:
        """(forward, backward) HBM traffic per token of the kernels Megatron-Core's training path runs around the
        SSD scan, in 2-byte units (bf16 tensors 1 per element, fp32 2), tensor by tensor from what each kernel
        reads and writes once: ``MambaMixer._ssm_training`` (NVIDIA/Megatron-LM@00bebb45
        megatron/core/ssm/mamba_mixer.py) calls ``mamba_split_conv1d_scan_combined`` without its norm (the z gate
        is applied inside the scan), then its grouped RMSNorm; the kernels are state-spaces/mamba@e9594ce1
        mamba_ssm/ops/triton/ssd_combined.py ``MambaSplitConv1dScanCombinedFn`` and
        ``_mamba_chunk_scan_combined_fwd/_bwd`` (ssd_chunk_state.py, ssd_state_passing.py, ssd_bmm.py,
        ssd_chunk_scan.py), causal_conv1d's ``causal_conv1d_fwd/bwd``.

        Per token: d = H·P (x, z, y), g = G·N (B or C), xbc = d + 2g (the conv channels), H (dt, dA_cumsum, one
        each per head), S = H·P·N / C (the chunk states: one H x P x N state per chunk of C tokens), Q = G·C (the
        chunk's C·B^T scores per group).

        Forward: conv1d reads and writes xbc (2·xbc); _chunk_cumsum_fwd reads dt, writes dA_cumsum and dt fp32
        (5H); _chunk_state_fwd reads B, x, dt, dA_cumsum, writes the states in fp32 (g + d + 4H + 2S);
        _state_passing_fwd reads them and writes bf16 (3S); _bmm_chunk_fwd reads C, B, writes CB fp32 (2g + 2Q);
        _chunk_scan_fwd reads CB, x, dt, dA_cumsum, C, states, z and writes the gated and ungated outputs
        (2Q + 4d + g + 4H + S); the RMSNorm reads and writes y (2d).
        = 2·xbc + 7d + 4g + 13H + 6S + 4Q.

        Backward: the RMSNorm's (read y, dy, write dy: 3d); conv1d re-run (2·xbc); the scan's backward first
        re-runs cumsum, CB, the chunk states and state passing (2H + 5H, 2g + 2Q, g + d + 4H + 2S, 3S); then
        _chunk_scan_bwd_dz (x, z, out, dout in; dz, dout out: 6d), _chunk_scan_bwd_dstates (g + 2H + d + S),
        _state_passing_bwd (states and dstates in and out: 4S), _chunk_scan_chunk_state_bwd_dx (3d + g + 6H + 2Q
        + S), _chunk_state_bwd_db (d + 6H + S + 3g: dB in fp32, one split at training sizes), _chunk_scan_bwd_dC
        (S + 4H + d + 3g), _chunk_scan_bwd_dcb (2d + 4H + 2Q), two _bmm_chunk_bwd (8g + 4Q), the reverse cumsum of
        ddA (6H), _chunk_scan_bwd_ddAcs_stable (2d + 6H + 2Q), _chunk_cumsum_bwd (7H); conv1d's backward (3·xbc).
        = 5·xbc + 20d + 19g + 52H + 13S + 12Q.

        Not counted here: the layout copies around the call (:meth:`membound`'s ``batch_major``), the per-chunk
        final states
        and D/dt_bias reductions (per sequence, not per token). An approximation on the fast side: the kernels
        are priced at the hardware's memory-bound rate, and the PyTorch blog "Accelerating Mamba2 with Kernel
        Fusion" (pytorch.org, 2025) finds the unfused SSD "mostly bottlenecked by memory bandwidth and latency"."""
        H, G, N, P, C = self.heads, self.n_groups, self.state_size, self.head_dim, self.chunk_size
        d, g = H * P, G * N
        xbc, S, Q = d + 2 * g, H * P * N / C, G * C
        fwd = 2 * xbc + 7 * d + 4 * g + 13 * H + 6 * S + 4 * Q
        bwd = 5 * xbc + 20 * d + 19 * g + 52 * H + 13 * S + 12 * Q
        return float(fwd), float(bwd)

    def membound(self) -> dict[str, tuple[float, float]]:
        """The recurrent sub-block's own (norm, residual, scan) and ``batch_major``: ``MambaMixer._ssm_training``
        turns the projection output from Megatron's sequence-major [s, b, ·] into batch-major [b, s, ·] and the
        scan's output back (``rearrange(...).contiguous()``), each a read and a write of in_width and d_in
        elements, and autograd copies their gradients back the same way; with one sequence per micro-batch the
        two layouts are the same memory and nothing is copied (autopar.cost.compute prices it for b > 1 only)."""
        out = super().membound()
        copy = 2.0 * (self.in_width() + self.d_inner)
        out["batch_major"] = (copy, copy)
        return out

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
