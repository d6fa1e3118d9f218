"""The gated delta rule: Gated DeltaNet (GDN) and Kimi Delta Attention (KDA).

GDN: Yang, Kautz & Hatamizadeh 2024, arXiv 2412.06464 (FLA ``GatedDeltaNet``; Qwen3-Next
``Qwen3NextGatedDeltaNet``): H_k query/key heads, H_v value heads, a per-head decay and β. KDA: Kimi Linear,
arXiv 2510.26692 (FLA ``KimiDeltaAttention``): the gated delta rule with a per-channel (not per-head) forget gate
from low-rank gate projections.

Parameters. GDN (Qwen3-Next in_proj_qkvz + in_proj_ba): q, k h·H_k·d_k each; v h·H_v·d_v; output gate h·H_v·d_v;
decay and β h·H_v each; o H_v·d_v·h; other: A_log and dt_bias H_v each, output norm d_v. KDA: q, k, v h·H·d
each; forget gate h·r + r·H·d and output gate h·r + r·H·d (rank r, default d); β h·H; o H·d·h; other: A_log H,
dt_bias H·d_k, output-gate bias H·d_v, output norm d_v. Both: the short convolution K·channels on q, k, v
(2·H_k·d_k + H_v·d_v channels).

Chunked form (GDN paper sec. 3.3; Kimi Linear sec. 3 uses the same with a per-channel decay; the WY/UT
representation as FLA's ``chunk_gated_delta_rule`` computes it), forward FLOPs per token and value head (FLA
broadcasts q and k over the value heads): the lower-triangular K·K^T 2·(C/2)·d_k, its triangular inverse C²/3
(C³/3 per chunk), W = T·K and U = T·V 2·(C/2)·(d_k + d_v), the intra-chunk Q·K^T and scores·(U − W·S)
2·(C/2)·(d_k + d_v), and three d_k x d_v products with the state (W·S, Q·S, the update K^T·(U − W·S)) 6·d_k·d_v.
State: H_v·d_k·d_v + the last K − 1 convolution inputs. Stored: the conv input, q, k, v, the gates and β; the
scan output H_v·d_v. TP and all-to-all CP split both the key and the value heads (Megatron-Core
``GatedDeltaNet``: heads % (tp·cp) == 0).

Symbols: h hidden, H (H_k) query/key heads, H_v value heads, d_k / d_v head dims, r gate rank, K conv width,
C chunk length.
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.blocks._base import Rule
from autopar.blocks._recurrent import _HEADS_NOTE, HeadMixer, LowRankGated


@dataclass(frozen=True)
class _DeltaRule(HeadMixer):
    value_heads: int = 0     # 0: as many as heads (KDA, and GDN without num_value_heads)

    @property
    def v_heads(self) -> int:
        return self.value_heads or self.heads

    @classmethod
    def from_spec(cls, model, mixer) -> "_DeltaRule":
        return super().from_spec(model, mixer, value_heads=mixer.num_value_heads or mixer.num_heads)

    def conv_channels(self) -> int:
        return 2 * self.heads * self.dk + self.v_heads * self.dv if self.conv_kernel else 0

    def out_width(self) -> int:
        return self.v_heads * self.dv

    def scan_flops(self) -> float:
        C, dk, dv = float(self.chunk_size), self.dk, self.dv
        per_head = 2 * (C / 2) * dk + C * C / 3 + 2 * (C / 2) * (dk + dv) + 2 * (C / 2) * (dk + dv) + 6 * dk * dv
        return self.conv_flops() + self.v_heads * per_head

    def state_elems(self) -> int:
        return self.v_heads * self.dk * self.dv + self.conv_tail()


@dataclass(frozen=True)
class GatedDeltaNet(_DeltaRule):
    kind = "gated_deltanet"
    title = "Gated DeltaNet"
    source = "arXiv 2412.06464 sec. 3.3; FLA GatedDeltaNet"
    own_fields = ("num_value_heads",)

    @classmethod
    def _shape_problem(cls, spec) -> str | None:
        v = spec.num_value_heads or spec.num_heads
        if v % spec.num_heads:
            return (f"gated_deltanet: num_value_heads ({v}) must be a multiple of num_heads "
                    f"({spec.num_heads})")
        return None

    def gemm_params(self) -> int:
        h, H, Hv, dk, dv = self.hidden, self.heads, self.v_heads, self.dk, self.dv
        return (2 * h * H * dk + h * Hv * dv + (h * Hv * dv if self.output_gate else 0) + 2 * h * Hv
                + Hv * dv * h)

    def other_params(self) -> int:
        return self.conv_kernel * self.conv_channels() + 2 * self.v_heads + self.dv

    def stored_io(self) -> tuple[float, float]:
        H, Hv, dk, dv = self.heads, self.v_heads, self.dk, self.dv
        return (self.conv_channels() + 2 * H * dk + Hv * dv + 2 * Hv + (Hv * dv if self.output_gate else 0),
                Hv * dv)

    def rules(self) -> tuple[Rule, ...]:
        v = self.v_heads
        return (Rule("tp", "num_heads", self.heads), Rule("tp", "num_value_heads", v),
                Rule("tp·cp", "num_heads", self.heads, note=_HEADS_NOTE), Rule("tp·cp", "num_value_heads", v))


@dataclass(frozen=True)
class KDA(LowRankGated, _DeltaRule):
    kind = "kda"
    title = "Kimi Delta Attention (KDA)"
    source = "Kimi Linear arXiv 2510.26692; FLA KimiDeltaAttention"

    def gemm_params(self) -> int:
        h, H, dk, dv = self.hidden, self.heads, self.dk, self.dv
        r = self.gate_low_rank or dv
        return 3 * h * H * dk + (h * r + r * H * dk) + (h * r + r * H * dv) + h * H + H * dv * h

    def other_params(self) -> int:
        H = self.heads
        return self.conv_kernel * self.conv_channels() + H + H * self.dk + H * self.dv + self.dv

    def stored_io(self) -> tuple[float, float]:
        """q, k, v, the per-channel gate, β, the output gate."""
        H, dk, dv = self.heads, self.dk, self.dv
        return self.conv_channels() + 3 * H * dk + H * dk + H + H * dv, H * dv
