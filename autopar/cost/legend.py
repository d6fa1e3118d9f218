"""What each term of the memory and step-time breakdowns counts, in words: one home for the legends that the
terminal tables (autopar/cli/render.py) and the Markdown report (autopar/report/) print beside the numbers."""

from __future__ import annotations

MEMORY_LEGEND = {
    "weights": "model weights of the stage (÷TP, experts ÷EP·ETP; ÷DP with ZeRO-3/FSDP)",
    "grads": "gradient buffers (÷DP with ZeRO-2/3)",
    "optimizer": "fp32 master weights + Adam moments (÷DP with ZeRO>=1)",
    "activations": "stored activations of the in-flight micro-batches (+ logits on the last stage)",
    "buffers": "communication / FSDP gather / FP8 weight-copy buffers (+ the optimizer step's fp32 gradient copy "
               "where it outgrows the activations)",
    "reserve": "CUDA context, NCCL, allocator fragmentation",
}
TIME_LEGEND = {
    "compute": "GEMMs + attention of all micro-batches, recompute included",
    "tp": "exposed tensor/sequence-parallel collectives (what the GEMMs do not hide), + the overlap's cost to the "
          "compute (async TP: chunked GEMMs, partial sums)",
    "cp": "exposed context-parallel exchange (attention KV ring; linear/SSM layers: all-to-all or state pass), "
          "+ the hidden part's cost to the compute",
    "ep": "exposed expert all-to-all (dispatch + combine; hidden only under Megatron's combined 1F1B), + the hidden "
          "part's cost to the compute",
    "dp": "exposed gradient reduce / ZeRO-FSDP gathers (first/last bucket or layer, what the window leaves), + the "
          "hidden part's cost to the compute",
    "pp_bubble": "pipeline fill + drain: (PP-1)/(VPP*M+PP-1) of the step",
    "pp_p2p": "exposed pipeline send/recv",
    "optimizer": "Adam update (HBM-bandwidth bound)",
    "offload": "exposed activation-offload copies to/from host memory",
}
APPROX_NOTE = ("Predictions are analytical (autopar/cost/, each formula cites its source) and approximate; "
               "see `autopar validate` for the error on published runs.")
