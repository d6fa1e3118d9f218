"""Context-parallel communication: ring attention's KV exchange (Liu et al. 2023, arXiv 2310.01889;
Megatron-Core context parallelism with the load-balanced zig-zag split).

Each GPU holds s/cp tokens. Per layer and micro-batch the forward pass passes K and V around the ring in
cp − 1 steps; the backward pass passes K, V and their gradients (2x): 3(cp − 1) transfers of

    KV = b · (s/cp) · 2 · g_local · d · e bytes,   g_local = max(g/tp, 1) KV heads per TP rank
    (MLA: Megatron exchanges the up-projected K and V of the local heads: a/tp · (d_qk + d_v)),

as point-to-point sends between neighbours tp ranks apart; full recomputation adds one forward pass.
Ring attention overlaps each transfer with the attention block it feeds (``training.cp_comm_overlap``; Liu et al.
2023 sec. 3: "overlapping the communication of key-value blocks with the computation of blockwise attention"):
at each of the cp − 1 ring steps the next KV block travels while the current one is computed, so per layer and
pass only what one block's attention math cannot cover is exposed,

    T_cp = Σ_passes (cp − 1) · max(0, t_xfer − T_attention_pass / cp)     (overlap on; all of T_comm otherwise)

with t_xfer one step's transfer (KV forward, KV and dKV backward: 2 x) and T_attention_pass the flash-attention
core's time of that pass from :mod:`autopar.cost.kernels` at the ring's block span s/cp, split evenly over the
cp blocks (the zig-zag split balances them; an approximation, the stage's attention layers taken alike).

PyTorch's ring attention (``training.cp_ring = 'torch_allgather'``: torch.distributed.tensor.experimental
context_parallel, as torchtitan runs it; read at pytorch/pytorch@0123248a torch/distributed/tensor/experimental/
_attention.py, the structure of the 2024-12 torch 1963fc8 the torchtitan tables ran ASSUMED the same; an
earlier stored version of the file (typing.List annotations, no cuDNN handler, ``_RotateMethod.PRE_ALL_GATHER``)
has the same forward and backward loops line for line; torchtitan @9dec370 config_manager.py:
``--experimental.context_parallel_rotate_method`` defaults to 'allgather') is other software with the same FLOPs
(round-robin load balancing: step 0 a causal call on the two local chunks, every other step a full call on half
the q or half the kv, 2c² score blocks each, c = s/(2cp)) but another exchange and extra HBM traffic.

The ring's work is balanced over the CP ranks, so no slowest-rank factor is priced: ``_ContextParallelOptions.
enable_load_balance`` defaults to True in both versions, ``_context_parallel_buffers`` then shards the inputs
round-robin (rank r holds chunks r and 2cp − 1 − r), and torchtitan@9dec370 (utils.py create_context_parallel_ctx,
train.py) never changes it; ``_is_causal_behavior`` then never skips a step (without it rank cp − 1 would run
cp − 1 full (s/cp)² blocks and rank 0 none: (2cp − 1)/cp of the balanced work, 1.75 at CP 4). Each step is one
aten._scaled_dot_product_flash_attention call (is_causal only at step 0) and one flash backward call on the
merged out and logsumexp (the ring's forward is not re-run); at torchtitan's 32K tokens per GPU the calls are
2c x 2c causal and c x 2c or 2c x c full (c = 16K), where FA2 is saturated (FA3 paper Fig. 5(b), 5(e), 6(b):
within 1.3% from 8K to 16K). Open residual (checked 2026-11-26 on the torchtitan 2024-12 Table 2/6 rows): the
step time each further ring step adds (measured minus measured CP 1, over what this module and the attention
core price for it) is 1.48x at CP 4 and 1.49x at CP 8 for Llama 3.1 8B, 1.52x, 1.32x, 1.41x at CP 2, 4, 8 for
405B, but 0.86x at CP 2 for 8B; nothing in the source above accounts for it, so it stays unpriced, not fitted.
Read per off-diagonal step position (measured minus predicted step time, over cp - 1): 8B +2.37 s at CP 4 and +2.39 s
at CP 8 (0.51x the 4.69 s of priced attention one such position adds, the same at both: each step's blocks have the
same shape at every CP, c = 16K), -0.79 s at CP 2; 405B +9.3, +5.6, +8.0 s at CP 2, 4, 8. Also ruled out (checked
2026-11-26, sources as cited): (a) another kernel: torchtitan@9dec370 torchtitan/utils.py get_train_context pins
SDPA to the flash and memory-efficient backends under CP; flash comes first in SDPA's priority and its conditions
hold (bf16, head dim 128, q and k of one length at the causal call), and the ring then calls
aten._scaled_dot_product_flash_attention at every step, the FA2 kernel the CP 1 row (within 1%) runs; (b) step coupling:
the forward's steps are uncoupled (one all-gather per layer), the backward's are coupled by the dK/dV all-to-all,
so each backward step waits for the slower of its two variants (q half x kv whole on ranks r < i, q whole x kv half
on r >= i, equal FLOPs) at every CP >= 2, CP 2 included; (c) memory pressure: the 8B rows print 83.9, 84.2, 84.0,
84.5 GiB at CP 1, 2, 4, 8, so the allocator runs alike where the model fits (CP 1, 2) and where it does not; (d) FSDP:
it shards over dp_shard x cp = 8 GPUs in every 8B CP row (parallelize_llama.py@9dec370 mesh 'dp_shard_cp'), the same
traffic at every CP; (e) the merges and the fp32 dK/dV path: priced at 1.4 s in all at 8B CP 8 (44.8 GB of HBM traffic
per layer backward, ~5.6 GB per step), so even twice that is 1.4 s of the 16.8 s gap. What distinguishes 8B CP 2
from CP 4 and 8 is not found; it needs a per-step GPU trace.

The exchange and the HBM traffic PyTorch's ring adds:

  * the K and V it passes are what SDPA receives: torchtitan@9dec370 models/llama/model.py (lines 201-209) repeats
    the KV heads to every query head before F.scaled_dot_product_attention (repeat_kv), so a/tp · (d_qk + d_v)
    elements per token, not Megatron's g/tp · 2d (4x for Llama 3 8B, 16x for 405B);
  * K and V are all-gathered once per layer and pass (``_AllGatherRotater``), issued before step 0 and waited at
    step 1: only step 0's block can hide it, exposed max(0, AG − T_block), AG over cp ranks of cp·KV bytes;
  * the backward all-gathers K and V again (same exposure) and passes the dK, dV accumulators around the ring
    in fp32 (``convert_to_f32``; ``_AllToAllRotater``): cp sends of 2·KV bytes (2 x: fp32), each after one step's
    flash backward and waited after the next, the last one after the loop: (cp − 1)·max(0, t_dkv − T_block)
    + t_dkv;
  * the merges are PyTorch elementwise kernels through HBM (``_SDPAMerger``, ``_partial_update``), counted for the
    rank that runs every step on its whole q (rank cp − 1, the ring waits for it), per element of the local
    output O (b·s/cp·a/tp·d_v), query Q (…·d_qk) and K or V (b·s/cp·a/tp·d, repeated as above). Eager
    (``training.elementwise = 'eager'``), one kernel per op:
      forward: 6 B (block output to fp32) + (cp − 1) x 38 B (out − block_out: 12; x sigmoid(Δlse): 8;
        out − that: 12; to fp32: 6) + 6 B (result to bf16) per O element, and (cp − 1) x 4 B per K and V
        element (torch.cat of K and V before each exchange);
      backward: fp32 zeros for dQ, dK, dV (4 B per element), per step dQ += (10 B per Q element), dK and dV
        added into half of the fp32 accumulator and re-concatenated (13 B) then concatenated for the send (8 B)
        per K and V element, K and V concatenated (4 B), and the casts back to bf16 (6 B per element).
    Compiled: torchtitan compiles each block with fullgraph=True (parallelize_llama.py@9dec370 line 303), so the
    ring, reached through DTensor's op dispatch inside the block, is traced into the block's graph (a graph break
    would abort) and Inductor fuses each merge into one pass: ASSUMED read out (4) and the block output (2),
    write out (4) = 10 B per O element and step; dK/dV's add and both concatenations one pass, read 4 + 2,
    write 4 = 10 B, plus the K/V concatenation (4 B), per K and V element and step; the rest as eager.
    With full recomputation the forward's merges run twice (the forward is re-run). Memory-bound at the file's
    HBM rate.

Both rings run the cp − 1 off-diagonal steps as full (non-causal) blocks, which flash kernels run faster than
causal ones (the diagonal tiles' masking and the uneven row lengths are gone): :func:`ring_full_share` of the
attention FLOPs is priced at the hardware file's ``attention_full_ratio`` (:mod:`autopar.cost.kernels`).

Linear-attention and SSM layers (autopar.blocks) keep no KV: each CP rank scans its own s/cp tokens from
a zero state, and the ranks then pass the d_k x d_v state along the sequence, rank r adding its chunk's
contribution to what rank r − 1 hands over (LASP, Sun et al. 2024, arXiv 2404.02882, sec. 3: the ring of
KV-states instead of keys and values; the same for Mamba-2's SSD states, arXiv 2405.21060 sec. 8). Per layer
and micro-batch that is cp − 1 sequential sends of the state forward and cp − 1 of its gradient backward
(+1 pass with full recompute), each

    STATE = b · state_elems / tp · e bytes    (state_elems: H·d_k·d_v, Mamba-2 H·P·N; heads split by TP),

and it cannot hide behind the scan that needs it (counted fully exposed, an upper bound: LASP overlaps the
intra-chunk part with it). That is ``training.linear_cp = 'state_pass'``. autopar's runner passes the states
another way: one all-gather of every chunk's (transition, zero-state final state) summary, 2x (decay kinds) to 4x
(delta rule, Mamba-1) these bytes in one collective instead of cp − 1 dependent hops; the estimate keeps the ring.

Megatron-Core runs these layers' CP differently (``training.linear_cp = 'all_to_all'``, the default:
megatron/core/ssm/mamba_context_parallel.py, gated_delta_net/gdn.py): an all-to-all swaps the sequence split for
a head split before the convolution and scan, and another swaps back after, so each rank scans the whole
sequence for H/(tp·cp) heads (as DeepSpeed-Ulysses does for attention, Jacobs et al. 2023, arXiv 2309.14509).
Per layer and micro-batch: 2 all-to-alls forward and 2 backward (+2 with full recompute), each of

    A2A = b · (s/cp) · (in_width + out_width) / tp · e bytes   over cp ranks tp apart,

with in_width the input projections' output (q, k, v, gates; Mamba's z, x, B, C, dt) and out_width the scan's
output; on the critical path (counted exposed).
"""

from __future__ import annotations

from autopar.cost.collectives import Network
from autopar.cost.kernels import Kernels
from autopar.cost.layer_sums import ModelProfile
from autopar.cost.stage import Stage
from autopar.specs.hardware import HardwareSpec
from autopar.specs.layout import Layout
from autopar.specs.training import TrainingSpec


def _ring_step(prof: ModelProfile, L: Layout, tr: TrainingSpec, net: Network) -> float:
    """Seconds of one ring step's KV transfer (KV above) between neighbours tp ranks apart."""
    m = prof.model
    per_token = m.attention_block.ring_elems(L.tp)
    kv_bytes = L.micro_batch * (tr.seq_len / L.cp) * per_token * tr.activation_bytes
    return net.time("send_recv", kv_bytes, 2, L.tp)


def cp_ring_seconds(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec, net: Network,
                    passes: int = 3) -> float:
    """The attention ring's transfers of one micro-batch, none hidden: ``passes`` KV volumes per layer and ring
    step (3: forward KV, backward KV and dKV, whatever the recompute policy). PyTorch's ring
    (``cp_ring = 'torch_allgather'``): a KV all-gather forward and backward and cp fp32 dKV sends per layer."""
    if L.cp == 1:
        return 0.0
    if tr.cp_ring == "torch_allgather":
        ag, dkv = _torch_ring_transfers(prof, L, tr, net)
        return st.sum(prof, "attn_layers") * (2 * ag + L.cp * dkv)
    return st.sum(prof, "attn_layers") * passes * (L.cp - 1) * _ring_step(prof, L, tr, net)


def _torch_ring_transfers(prof: ModelProfile, L: Layout, tr: TrainingSpec, net: Network):
    """(one KV all-gather, one fp32 dK/dV send) of PyTorch's ring, seconds (module docstring)."""
    kv_bytes = L.micro_batch * (tr.seq_len / L.cp) * torch_ring_kv_elems(prof, L) * tr.activation_bytes
    return (net.time("all_gather", L.cp * kv_bytes, L.cp, L.tp),
            net.time("send_recv", 2 * kv_bytes, 2, L.tp))     # fp32 accumulators: twice the bf16 bytes


def ring_full_share(cp: int, window: float, seq_len: float) -> float:
    """Share of a causal layer's attention FLOPs a load-balanced ring runs as full (non-causal) blocks: step 0 is
    the causal block of the rank's own two chunks, each of the cp − 1 other steps a full block of the same 2c²
    scores (Megatron-Core's zig-zag and PyTorch's round-robin split alike): (cp − 1)/cp. Sliding-window layers
    are left causal (0)."""
    if cp <= 1 or window < seq_len:
        return 0.0
    return (cp - 1) / cp


# PyTorch ring attention's elementwise merges (module docstring): HBM bytes per element of the local output O,
# query Q and K or V, forward and backward (torch/distributed/tensor/experimental/_attention.py @0123248a).
TORCH_RING_FWD_FIRST_LAST_B = 6.0 + 6.0     # the first block output to fp32, the merged result back to bf16
TORCH_RING_KV_CAT_B = 4.0                   # torch.cat of K and V before an exchange: read 2, write 2
TORCH_RING_BWD_Q_B = 4.0 + 6.0              # fp32 zeros for dQ, the cast back to bf16
TORCH_RING_BWD_Q_STEP_B = 10.0              # per step: dQ (fp32) += the block's dQ (bf16)
TORCH_RING_BWD_KV_B = 4.0 + 6.0             # fp32 zeros for dK / dV, the cast back to bf16
# per further step, by elementwise mode: (forward merge per O element, dK/dV add + concatenations per K/V element)
TORCH_RING_STEP_B = {
    # forward: to fp32 6, out − block 12, x sigmoid 8, out − x 12; dK/dV: partial add + re-cat 13, send cat 8
    "eager": (38.0, 13.0 + 8.0),
    "compiled": (10.0, 10.0),      # one fused pass each (ASSUMED, docstring): read 4 + 2, write 4
}


def torch_ring_kv_elems(prof: ModelProfile, L: Layout) -> float:
    """K and V elements per token PyTorch's ring passes: every local query head's (repeat_kv before SDPA)."""
    m = prof.model
    return m.num_attention_heads / L.tp * (m.qk_head_dim + m.v_head_dim)


def ring_q_o_elems(prof: ModelProfile, L: Layout, tr: TrainingSpec):
    """(Q, O) elements of one attention layer a CP rank holds for one micro-batch: T·(a/tp)·d_qk and T·(a/tp)·d_v,
    T = b·s/cp its tokens. ``L.micro_batch`` may be a numpy array."""
    m = prof.model
    tokens_heads = L.micro_batch * tr.seq_len / L.cp * m.num_attention_heads / L.tp
    return tokens_heads * m.qk_head_dim, tokens_heads * m.v_head_dim


def torch_ring_merge_bytes(prof: ModelProfile, L: Layout, tr: TrainingSpec) -> tuple[float, float]:
    """HBM bytes of PyTorch ring attention's merges in one attention layer for one micro-batch: (forward pass,
    backward pass); module docstring."""
    q, o = ring_q_o_elems(prof, L, tr)
    kv = L.micro_batch * tr.seq_len / L.cp * torch_ring_kv_elems(prof, L)   # K and V elements together
    steps = L.cp - 1
    merge, kv_step = TORCH_RING_STEP_B["eager" if tr.elementwise == "eager" else "compiled"]
    fwd = o * (TORCH_RING_FWD_FIRST_LAST_B + steps * merge) + kv * steps * TORCH_RING_KV_CAT_B
    bwd = (q * (TORCH_RING_BWD_Q_B + L.cp * TORCH_RING_BWD_Q_STEP_B)
           + kv * (TORCH_RING_BWD_KV_B + L.cp * (kv_step + TORCH_RING_KV_CAT_B)))
    return fwd, bwd


def _torch_ring(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec, net: Network, kern: Kernels,
                f_blk: float, b_blk: float) -> float:
    """Exposed seconds of PyTorch's all-gather ring attention for the stage's attention layers, one micro-batch
    (module docstring): KV all-gathers hidden only behind step 0, the fp32 dKV ring, the merges."""
    ag, dkv = _torch_ring_transfers(prof, L, tr, net)
    fwd_passes = 2 if L.recompute == "full" else 1
    per_layer = (fwd_passes * max(0.0, ag - f_blk) + max(0.0, ag - b_blk)
                 + (L.cp - 1) * max(0.0, dkv - b_blk) + dkv)
    fb, bb = torch_ring_merge_bytes(prof, L, tr)
    per_layer += kern.stream(fwd_passes * fb + bb)
    return st.sum(prof, "attn_layers") * per_layer


def cp_time_per_microbatch(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec, hw: HardwareSpec,
                           net: Network, kern: Kernels) -> float:
    """Exposed CP seconds of one micro-batch on stage ``st`` (:func:`cp_times`)."""
    return cp_times(prof, st, L, tr, hw, net, kern)[0]


def cp_times(prof: ModelProfile, st: Stage, L: Layout, tr: TrainingSpec, hw: HardwareSpec, net: Network,
             kern: Kernels) -> tuple[float, float]:
    """(exposed, none hidden) CP seconds of one micro-batch on stage ``st``: the attention ring less what its
    blocks hide where ``tr.cp_comm_overlap`` is on, and the same ring with nothing hidden (what the estimator
    prices the hidden part's overlap cost from), each with the state layers' exchange (never hidden)."""
    if L.cp == 1:
        return 0.0, 0.0
    m = prof.model
    passes = 4 if L.recompute == "full" else 3
    n_attn = st.sum(prof, "attn_layers")
    t = t_all = 0.0
    if n_attn:
        torch_ring = tr.cp_ring == "torch_allgather"
        if torch_ring:
            t_all = _torch_ring(prof, st, L, tr, net, kern, 0.0, 0.0)
        else:
            step = _ring_step(prof, L, tr, net)
            t_all = n_attn * passes * (L.cp - 1) * step
        t = t_all
        if tr.cp_comm_overlap:
            tokens = L.micro_batch * tr.seq_len / (L.tp * L.cp)
            fwd, bwd = kern.attention(st.sum(prof, "attn_core_flops") * tokens, tr.seq_len / L.cp, m.qk_head_dim,
                                      ring_full_share(L.cp, tr.seq_len, tr.seq_len))
            f_blk, b_blk = fwd / (n_attn * L.cp), bwd / (n_attn * L.cp)   # one layer's, one ring step's block
            if torch_ring:
                t = _torch_ring(prof, st, L, tr, net, kern, f_blk, b_blk)
            else:
                per_layer = max(0.0, step - f_blk) + max(0.0, 2 * step - b_blk)
                if L.recompute == "full":
                    per_layer += max(0.0, step - f_blk)
                t = n_attn * (L.cp - 1) * per_layer
    state = 0.0
    n_state = st.sum(prof, "state_layers")
    if n_state and tr.linear_cp == "all_to_all":
        a2a_bytes = L.micro_batch * (tr.seq_len / L.cp) * st.sum(prof, "mixer_a2a_elems") / L.tp * tr.activation_bytes
        c, t0 = net.coefficients("all_to_all", L.cp, L.tp)
        # 2 per pass; each layer's latency counted once per all-to-all
        state = 2 * (passes - 1) * (a2a_bytes * c + n_state * t0)
    elif n_state:
        # all state layers of the stage; the per-layer latency is counted once per layer and pass
        state_bytes = L.micro_batch * st.sum(prof, "mixer_state_elems") / L.tp * tr.activation_bytes
        c, t0 = net.coefficients("send_recv", 2, L.tp)
        state = (passes - 1) * (L.cp - 1) * (state_bytes * c + n_state * t0)
    return t + state, t_all + state
