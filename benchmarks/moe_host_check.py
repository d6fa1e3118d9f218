"""Can the routed experts' host launches be what ``moe_layer_overhead_us`` stands in for? (README 'Accuracy',
"Constants at a bound".)

Megatron-Core's dropless token dispatchers synchronise the host with the GPU once per MoE layer and forward pass
(Megatron-LM@d98e8a64 megatron/core/transformer/moe/token_dispatcher.py: ``_maybe_dtoh_and_synchronize``, HybridEP's
dispatch without ``moe_expert_rank_capacity_factor``); from then on the GPU runs the routed segment (permutation,
per-expert GEMMs, activation) no faster than the host issues it. For every MoE row of data/published_runs.csv and
data/published_runs_holdout.csv this prints, per MoE layer, the host time to issue the local experts' work at the
Grace rate measured in NVIDIA/TransformerEngine issue #2897 (2026-04-16, GB200, TE grouped MLP block, 64 experts,
GPU work nil: ~1.2 ms forward, ~2.1 ms backward) over the routed segment's GPU time as the cost model prices it,
forward and backward, worst rows first. A ratio below 1 means the launches hide behind the GPU work: nothing is
exposed. The backward pass has no sync, so its ratio is an upper figure. The host figures are the issue's, applied
to every chip (the slowest host measured: an x86 host is faster, TE issue #2053); the GPU times are the model's.
Nothing here is a measurement. About 20 s.

    python benchmarks/moe_host_check.py
"""

from __future__ import annotations

from autopar.cost import compute as C
from autopar.cost.estimator import Estimator
from autopar.measure.validation import DEFAULT_CSV, HOLDOUT_CSV, validate

GRACE_FWD_S = 1.2e-3 / 64   # host seconds per local expert, forward (TE issue #2897)
GRACE_BWD_S = 2.1e-3 / 64   # the same, backward
SHOW = 12


def main() -> None:
    rows = []
    for csv in (DEFAULT_CSV, HOLDOUT_CSV):
        for case in (r.case for r in validate(csv).rows):   # the layouts as validation fills them in
            if not case.model.is_moe:
                continue
            est = Estimator(case.model, case.hardware, case.training, case.gpus)
            L, tr, prof = case.layout, case.training, est.profile
            j, kind = next((j, k) for j, k in enumerate(prof.kinds) if k.is_moe)
            parts = C.layer_parts(est.kernels, kind, L, tr, C.gpu_tokens(L, tr), est.imbalance)
            g_f = sum(parts[p][0] for p in C.ROUTED_PARTS if p in parts)
            g_b = sum(parts[p][1] for p in C.ROUTED_PARTS if p in parts)
            e_loc = kind.num_experts / L.ep
            rows.append((e_loc * GRACE_FWD_S / g_f, e_loc * GRACE_BWD_S / g_b, case.row_id, case.hardware.name,
                         e_loc, g_f, g_b))
    rows.sort(reverse=True)
    print(f"{len(rows)} MoE rows; host time to issue the local experts / the routed segment's GPU time, per MoE layer")
    for fwd, bwd, rid, hw, e_loc, g_f, g_b in rows[:SHOW]:
        print(f"  fwd {fwd:4.2f}  bwd {bwd:4.2f}  {rid:44s} {hw:12s} E_loc {e_loc:3.0f}  "
              f"GPU fwd {g_f * 1e6:6.0f} us  bwd {g_b * 1e6:6.0f} us")
    print(f"rows where the host is slower than the GPU: forward {sum(r[0] > 1 for r in rows)}, "
          f"backward {sum(r[1] > 1 for r in rows)}; largest ratios {rows[0][0]:.2f} forward, "
          f"{max(r[1] for r in rows):.2f} backward")


if __name__ == "__main__":
    main()
