"""Shared by the emitters: the resolved-layout precondition and the virtual-stage split."""

from __future__ import annotations

from autopar.errors import AutoparInputError
from autopar.specs.layout import Layout
from autopar.specs.model import ModelSpec


def require_resolved(layout: Layout, model: ModelSpec | None = None, gpus: int | None = None) -> None:
    """Raise AutoparInputError unless dp, grad_accum, sequence_parallel and stage_layers are filled in (and,
    when given, the layout spans ``gpus`` and its stages hold ``model``'s layers)."""
    missing = [name for name in ("dp", "grad_accum", "sequence_parallel", "stage_layers")
               if getattr(layout, name) is None]
    if missing:
        raise AutoparInputError(f"cannot emit an unresolved layout ({', '.join(missing)} not set): pass it through "
                                "autopar.specs.resolve_layout first")
    if gpus is not None and layout.world != gpus:
        raise AutoparInputError(f"layout spans dp·tp·cp·pp = {layout.dp}·{layout.tp}·{layout.cp}·{layout.pp} = "
                                f"{layout.world} GPUs, not {gpus}")
    if model is not None and sum(layout.stage_layers) != model.num_layers:
        raise AutoparInputError(f"stage_layers {list(layout.stage_layers)} sum to {sum(layout.stage_layers)}, "
                                f"{model.name} has {model.num_layers} layers")


def virtual_chunks(layout: Layout, num_layers: int) -> list[int]:
    """Layers of every virtual pipeline stage in model order: entry v·pp + i is virtual stage v of pipeline
    rank i (Megatron-LM's interleaved order, also torchtitan's for looped schedules).

    A stage whose layers do not divide by vpp gets chunks differing by one layer: the extra layers go to its
    earliest chunks, except on the first rank, where they go to its latest chunks so the chunk holding the
    embedding is the lighter one (the last rank's last chunk, holding the loss, is then lighter too)."""
    pp, vpp = layout.pp, layout.vpp
    stages = layout.layers_per_stage(num_layers)
    per_rank = []
    for i, s in enumerate(stages):
        base, extra = divmod(s, vpp)
        sizes = [base + (1 if j < extra else 0) for j in range(vpp)]
        per_rank.append(sizes[::-1] if i == 0 else sizes)
    return [per_rank[i][v] for v in range(vpp) for i in range(pp)]
