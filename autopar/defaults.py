"""Defaults a user can rely on when they leave a setting out (stated in --help and in the output)."""

from __future__ import annotations

from autopar.specs.model import ModelSpec

DEFAULT_HARDWARE = "h100_sxm"
DEFAULT_STACK = "megatron_core"   # stacks/megatron_core.yaml: the stack every prediction assumed before stacks
DEFAULT_SEQ_LEN = 4096
DEFAULT_PRECISION = "bf16"

# Share of HBM `solve` keeps free beyond the memory model (``--memory-margin``), derived from measured memory errors:
# a run measured at M and predicted at P = M (1 + e) would have fitted under a plan that keeps the share -e of HBM
# free, so the margin is the largest under-prediction, max(0, -min e), over the measured runs
# (autopar.measure.published_memory.largest_under_prediction). A stack whose published runs print their peak memory
# (5 or more; today torchtitan's) gets its own, written to data/error_bars.yaml by
# `autopar validate --fit --cv --write-intervals` (autopar.measure.intervals.memory_margin). Every other stack gets
# this one: the largest under-prediction on 43 Megatron-LM + Transformer Engine bf16 runs of Llama 3 70B/405B and
# DeepSeek-V2/V3 slices on one 8 x B200 node (issue 20: peak memory under-predicted on 29 of them, by up to 8.4 % on
# the Llama 3 405B slices; mean error 2.7 %).
DEFAULT_MEMORY_MARGIN = 0.084
MEMORY_MARGIN_SOURCE = "the largest under-prediction of peak memory measured on 43 Megatron-LM + TE runs on 8 x B200 (8.4%)"

# The search space on an axis the user did not pin (``autopar solve`` and ``autopar tune``; their --help states these).
DEFAULT_MBS = (1, 2, 4)          # micro-batch sizes, sequences per DP rank
DEFAULT_VPP = (1, 2, 4, 8)       # virtual stages per pipeline rank (1 = not interleaved)
DEFAULT_ZERO = (0, 1, 2, 3)      # ZeRO stages (3 = FSDP)
MAX_CP = 32                      # context parallel: the divisors of the GPU count up to this
MAX_ETP = 8                      # expert tensor parallel (MoE models): the divisors up to this
TP_DOMAINS = 2                   # tensor parallel: the divisors up to this many NVLink domains (TP beyond one domain
                                 # is then refused by the topology rule, which says so when nothing else fits)
MAX_TP_CROSS_DOMAIN = 64         # with --allow-cross-domain: the divisors up to this, or one domain if larger


def default_global_batch(model: ModelSpec, seq_len: int) -> tuple[int, str]:
    """A global batch (sequences) sensible for the model, and the reason.

    Tokens per step follow the scaling of GPT-3's batch sizes (Brown et al. 2020, arXiv 2005.14165 Table 2.1:
    0.5M tokens at 125M parameters up to 3.2M at 175B), by *active* parameters, rounded to a power of two:
    < 1B: 2^19 (0.5M), < 5B: 2^20 (1M), < 50B: 2^21 (2M), else 2^22 (4M) tokens; then divided by the
    sequence length (at least 1 sequence)."""
    n = model.active_params
    tokens = 2 ** 19 if n < 1e9 else 2 ** 20 if n < 5e9 else 2 ** 21 if n < 50e9 else 2 ** 22
    gb = max(1, tokens // seq_len)
    return gb, (f"default global batch: {gb} sequences x {seq_len} = {gb * seq_len / 1e6:.1f}M tokens "
                f"({model.active_params / 1e9:.0f}B active params; GPT-3 Table 2.1 batch scaling)")
