"""Linear attention with a decay: gated linear attention (GLA) and Lightning attention.

GLA: Yang et al. 2023, arXiv 2312.06635 (FLA ``GatedLinearAttention``): a per-channel forget gate from a low-rank
projection. Lightning: Lightning Attention-2, Qin et al. 2024, arXiv 2401.04658 (MiniMax-01): a fixed per-head
decay.

Parameters. GLA: q, k h·H·d_k each; v h·H·d_v; output gate h·H·d_v; forget gate h·r + r·H·d_k (the low-rank
gk_proj; without r a full h·H·d_k); o H·d_v·h; other: the gk bias H·d_k (low-rank form) and the output norm d_v
(FLA's per-head gated RMSNorm, shared by heads). Lightning: q, k, v h·H·d each; output gate h·H·d; o H·d·h;
output norm H·d. Both: the short convolution K·channels on q, k, v (2·H·d_k + H·d_v channels).

Chunked form (GLA paper sec. 4, eq. 6-7, the "chunkwise parallel form"), forward FLOPs per token and head, causal
blocks counted for their unmasked half: intra-chunk scores Q·K^T and scores·V over C/2 keys on average,
2·(C/2)·d_k + 2·(C/2)·d_v; inter-chunk output Q·S (S the d_k x d_v state) 2·d_k·d_v; state update K^T·V
2·d_k·d_v. State: H·d_k·d_v + the last K − 1 convolution inputs. Stored (the FLA chunk kernels save their inputs
and recompute the chunk states backward): the conv input, q, k, v, the gate (H·d_k) and the output gate; the scan
output H·d_v. TP and all-to-all CP split heads.

Symbols: h hidden, H heads, d_k / d_v key / value head dims, r the gate's rank, K conv width, C chunk length.
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.blocks._recurrent import HeadMixer, LowRankGated


@dataclass(frozen=True)
class _DecayAttention(HeadMixer):
    def conv_channels(self) -> int:
        return 2 * self.heads * self.dk + self.heads * self.dv if self.conv_kernel else 0

    def out_width(self) -> int:
        return self.heads * self.dv

    def scan_flops(self) -> float:
        C, dk, dv, H = float(self.chunk_size), self.dk, self.dv, self.heads
        return self.conv_flops() + H * (2 * (C / 2) * (dk + dv) + 4 * dk * dv)

    def state_elems(self) -> int:
        return self.heads * self.dk * self.dv + self.conv_tail()


@dataclass(frozen=True)
class GLA(LowRankGated, _DecayAttention):
    kind = "gla"
    title = "gated linear attention (GLA)"
    source = "arXiv 2312.06635 sec. 4; FLA GatedLinearAttention"

    def gemm_params(self) -> int:
        h, H, dk, dv, r = self.hidden, self.heads, self.dk, self.dv, self.gate_low_rank
        gk = h * r + r * H * dk if r else h * H * dk
        return 2 * h * H * dk + h * H * dv + (h * H * dv if self.output_gate else 0) + gk + H * dv * h

    def other_params(self) -> int:
        conv = self.conv_kernel * self.conv_channels()
        return conv + (self.heads * self.dk if self.gate_low_rank else 0) + self.dv

    def stored_io(self) -> tuple[float, float]:
        H, dk, dv = self.heads, self.dk, self.dv
        return (self.conv_channels() + 2 * H * dk + H * dv + H * dk + (H * dv if self.output_gate else 0),
                H * dv)


@dataclass(frozen=True)
class Lightning(_DecayAttention):
    kind = "lightning"
    title = "Lightning attention"
    source = "Lightning Attention-2 arXiv 2401.04658; MiniMax-01"

    def gemm_params(self) -> int:
        h, H, dk = self.hidden, self.heads, self.dk
        return 3 * h * H * dk + (h * H * dk if self.output_gate else 0) + H * dk * h

    def other_params(self) -> int:
        return self.conv_kernel * self.conv_channels() + self.heads * self.dk

    def stored_io(self) -> tuple[float, float]:
        H, dk = self.heads, self.dk
        return self.conv_channels() + 3 * H * dk + (H * dk if self.output_gate else 0), H * dk
