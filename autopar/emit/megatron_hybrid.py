"""Megatron-Core hybrid models (Mamba-2 / Gated DeltaNet / attention / MLP / MoE layers): the layer pattern, the mixer
shape flags, and why a model cannot be expressed.

Source: NVIDIA/Megatron-LM d98e8a64ddf3 (Megatron-Core 0.20.0, the commit :mod:`autopar.emit.megatron` targets).

- ``pretrain_hybrid.py`` trains ``HybridModel``; ``pretrain_mamba.py`` is only a deprecated wrapper that runs it
  (pretrain_mamba.py: "Deprecated. Use pretrain_hybrid.py instead.").
- ``--hybrid-layer-pattern`` names every Megatron layer with one symbol (megatron/core/models/hybrid/
  hybrid_layer_allocation.py, ``Symbols``): M = Mamba-2 (``MambaMixer``), G = Gated DeltaNet, * = attention,
  + = MLA, D = DeepSeek sparse attention, - = MLP, E = MoE; ``|`` separates pipeline segments, ``/`` MTP depths.
  ``--hybrid-override-pattern`` is its deprecated alias (megatron/training/arguments.py validate_args forwards it
  and warns), so it is not emitted. A Megatron layer is one pre-norm residual block: an autopar layer with a token
  mixer and a channel mixer is two symbols, mixer first ("*-", "GE"); one with either alone is one symbol.
- Pipeline stages come from ``|``: segment v·pp + i is virtual stage v of pipeline rank i
  (``select_pipeline_segment``), and VPP is derived from the segment count. validate_args forbids
  ``--num-layers-per-virtual-pipeline-stage``, ``--num-virtual-stages-per-pipeline-rank`` and
  ``--pipeline-model-parallel-layout`` with the pattern, and the pipe-free form with PP > 1 is deprecated and
  even-or-first/last only, so with PP > 1 the pattern always carries autopar's own stage split (its
  cost-balanced ``stage_layers``). ``--num-layers`` is derived from the pattern.
- ``hybrid_builders.py`` refuses to build without ``--spec``; the stock spec is
  ``megatron.core.models.hybrid.hybrid_layer_specs hybrid_stack_spec`` (as examples/mamba/train.sh passes it).
- Mamba-2 shape (TransformerConfig fields, flags generated from them): ``--mamba-num-heads`` H,
  ``--mamba-head-dim`` P, ``--mamba-state-dim`` N, ``--mamba-num-groups`` G. Written always: Megatron's default
  heads are hidden·2/P (mamba_mixer.py), which is not every model's H. The short convolution (d_conv) and the SSD
  chunk (chunk_size) are ``MambaMixer`` constructor defaults, 4 and 128, that the stock spec does not change: a
  kernel other than 4 cannot be expressed; a chunk other than 128 gets a note (the kernel's block length changes,
  not the result).
- Gated DeltaNet shape (megatron/core/ssm/gated_delta_net): ``--linear-num-key-heads`` H_k,
  ``--linear-num-value-heads`` H_v, ``--linear-key-head-dim`` d_k, ``--linear-value-head-dim`` d_v,
  ``--linear-conv-kernel-dim`` K. Its input projection always includes the output gate (common.py:
  ``in_proj_qkvg_dim = 2·qk_dim + 2·v_dim``), so an ungated or convolution-free gated_deltanet is refused;
  TransformerConfig asserts H_k and H_v divisible by TP·CP.
- Attention: ``--attention-output-gate`` when the model's attention layers carry Qwen3-Next's output gate. The
  flag is model-wide, so attention layers that differ in it are refused.

Cannot be expressed (AutoparInputError naming the layer and what Megatron-Core lacks): GLA, KDA, Lightning and
Mamba-1 mixers (HybridStack builds only the symbols above; MambaMixer is Mamba-2's SSD), parallel mixers such as
Falcon-H1's ``attention+mamba`` (a pattern symbol is one mixer per residual block; HybridStack has no layer that
sums two mixers), attention layers with their own window, chunk or sinks (the hybrid stack's attention layer takes
the model-wide attention config; autopar maps no per-layer option onto it), mixers of one kind with different
shapes (the shape flags are model-wide), and MTP on a hybrid model (the MTP depth's own pattern after ``/`` is not
in autopar's ModelSpec).
"""

from __future__ import annotations

from autopar.blocks import MIXERS
from autopar.emit._common import virtual_chunks
from autopar.errors import AutoparInputError
from autopar.specs.layout import Layout
from autopar.specs.mixers import MixerSpec
from autopar.specs.model import ModelSpec

__all__ = ["HYBRID_SCRIPT", "HYBRID_SPEC", "hybrid_layer_pattern", "hybrid_mixer_args", "hybrid_notes",
           "hybrid_refusal", "hybrid_symbols"]

HYBRID_SCRIPT = "pretrain_hybrid.py"
HYBRID_SPEC = ["megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec"]

_CHANNEL = {"dense": "-", "moe": "E", "none": ""}
_MEGATRON_D_CONV = 4       # MambaMixer(d_conv=4), megatron/core/ssm/mamba_mixer.py
_MEGATRON_CHUNK = 128      # MambaMixer(chunk_size=128), same file
# The autopar mixer kinds HybridStack builds, with their pattern symbols (hybrid_layer_allocation.py ``Symbols``;
# attention is "+" on an MLA model). Every other kind of the catalogue (autopar.blocks) is refused by its title.
_SYMBOLS = {"attention": "*", "mamba2": "M", "gated_deltanet": "G"}
_LACK_NOTES = {"mamba1": " (its MambaMixer is Mamba-2's SSD)"}


def _shape(mx: MixerSpec) -> dict:
    return mx.model_dump()


def hybrid_refusal(model: ModelSpec) -> str | None:
    """Why Megatron-Core 0.20's HybridModel cannot train ``model`` (None: it can). Only for hybrid models."""
    mamba, gdn, gates = {}, {}, set()
    for i in range(model.num_layers):
        parts = model.mixers_of(i)
        name = model.mixer_name(i)
        if len(parts) > 1:
            return (f"layer {i} runs parallel mixers '{name}' (Falcon-H1 style); a Megatron-Core hybrid layer "
                    "(pretrain_hybrid.py, --hybrid-layer-pattern) is one mixer per residual block and HybridStack has "
                    "no layer that sums two mixers")
        if not parts:
            continue
        mx = parts[0]
        if mx.kind not in _SYMBOLS:
            return (f"layer {i} uses mixer '{name}' ({mx.kind}): Megatron-Core 0.20's HybridStack has "
                    f"no {MIXERS[mx.kind].title} layer{_LACK_NOTES.get(mx.kind, '')}; its pattern symbols are M "
                    "(Mamba-2), G (Gated DeltaNet), "
                    "* / + / D (attention, MLA, DSA), - (MLP) and E (MoE)")
        if mx.kind == "attention":
            if mx.window or mx.chunk or mx.sinks:
                return (f"layer {i}: attention mixer '{name}' has its own window/chunk/sinks; the hybrid stack's "
                        "attention layers share the model-wide attention config, and autopar maps no per-layer "
                        "attention option onto Megatron's hybrid pattern")
            gates.add(mx.output_gate)
        elif mx.kind == "mamba2":
            if mx.conv_kernel != _MEGATRON_D_CONV:
                return (f"layer {i}: mamba2 mixer '{name}' has a convolution of {mx.conv_kernel}; Megatron-Core's "
                        f"MambaMixer uses d_conv={_MEGATRON_D_CONV} (a constructor default, no flag)")
            mamba[name] = mx
        elif mx.kind == "gated_deltanet":
            if not mx.output_gate or not mx.conv_kernel:
                return (f"layer {i}: gated_deltanet mixer '{name}' has output_gate={mx.output_gate}, "
                        f"conv_kernel={mx.conv_kernel}; Megatron-Core's GatedDeltaNet always has the output gate and "
                        "the short convolution")
            gdn[name] = mx
    for kind, found in (("mamba2", mamba), ("gated_deltanet", gdn)):
        if len({str(_shape(m)) for m in found.values()}) > 1:
            return (f"{kind} mixers {sorted(found)} differ in shape; Megatron-Core's shape flags are model-wide")
    if len(gates) > 1:
        return "attention layers differ in output_gate; Megatron's --attention-output-gate is model-wide"
    if model.mtp_layers and model.mtp_layer_pattern is None:
        return (f"{model.name} has {model.mtp_layers} MTP layer(s); a hybrid MTP depth needs its own layer pattern "
                "after '/' in --hybrid-layer-pattern: give the model's mtp_layer_pattern and mtp_mlp_pattern")
    return None


def _mtp_symbols(model: ModelSpec) -> str:
    """One MTP depth in Megatron's pattern symbols (Nemotron 3: '*E'), from mtp_layer_pattern / mtp_mlp_pattern."""
    out = ""
    for name, channel in zip(model.mtp_layer_pattern or (), model.mtp_mlp_pattern or ()):
        kind = "none" if name == "none" else model.mixers[name].kind if name in model.mixers else "attention"
        out += ("" if kind == "none" else "+" if kind == "attention" and model.mla else _SYMBOLS[kind]) \
            + _CHANNEL[channel]
    return out


def hybrid_symbols(model: ModelSpec, i: int) -> str:
    """Megatron pattern symbols of autopar layer i: its token mixer's, then its channel mixer's."""
    parts = model.mixers_of(i)
    text = ""
    if parts:
        kind = parts[0].kind
        text = "+" if kind == "attention" and model.mla else _SYMBOLS[kind]
    return text + _CHANNEL[model.channel_of(i)]


def hybrid_layer_pattern(layout: Layout, model: ModelSpec) -> str:
    """``--hybrid-layer-pattern`` value: the layers' symbols, with ``|`` between the virtual stages of
    :func:`autopar.emit._common.virtual_chunks` when PP > 1."""
    layers = [hybrid_symbols(model, i) for i in range(model.num_layers)]
    # MTP depths follow the decoder after '/', one per MTP layer (Megatron-LM@d98e8a64ddf3
    # tests/functional_tests/test_cases/nemotron/nemotron3_super_release_gb200/model_config.yaml: "...E/*E/*E" with
    # --mtp-num-layers 2)
    mtp = ("/" + _mtp_symbols(model)) * model.mtp_layers if model.mtp_layer_pattern is not None else ""
    if layout.pp == 1:
        return "".join(layers) + mtp
    segments, start = [], 0
    for n in virtual_chunks(layout, model.num_layers):
        segments.append("".join(layers[start:start + n]))
        start += n
    return "|".join(segments) + mtp


def hybrid_mixer_args(layout: Layout, model: ModelSpec) -> list[str]:
    """The shape flags of the model's Mamba-2, Gated DeltaNet and attention-gate mixers (refused models raise)."""
    why = hybrid_refusal(model)
    if why:
        raise AutoparInputError(f"Megatron-LM cannot train {model.name}: {why}")
    kinds = {mx.kind: mx for i in range(model.num_layers) for mx in model.mixers_of(i)}
    args: list[str] = []
    if "mamba2" in kinds:
        m = kinds["mamba2"]
        args += ["--mamba-num-heads", str(m.num_heads), "--mamba-head-dim", str(m.head_dim),
                 "--mamba-state-dim", str(m.state_size), "--mamba-num-groups", str(m.n_groups)]
    if "gated_deltanet" in kinds:
        g = kinds["gated_deltanet"]
        tp_cp = layout.tp * layout.cp
        if g.num_heads % tp_cp or g.v_heads % tp_cp:
            raise AutoparInputError(
                f"Megatron-Core's GatedDeltaNet needs its key heads ({g.num_heads}) and value heads ({g.v_heads}) "
                f"divisible by tp·cp = {layout.tp}·{layout.cp} = {tp_cp} (TransformerConfig.__post_init__)")
        args += ["--linear-num-key-heads", str(g.num_heads), "--linear-num-value-heads", str(g.v_heads),
                 "--linear-key-head-dim", str(g.dk), "--linear-value-head-dim", str(g.dv),
                 "--linear-conv-kernel-dim", str(g.conv_kernel)]
    if "attention" in kinds and kinds["attention"].output_gate:
        args.append("--attention-output-gate")
    if model.mtp_layers and model.mtp_layer_pattern is not None:
        args += ["--mtp-num-layers", str(model.mtp_layers)]
    return args


def hybrid_notes(model: ModelSpec) -> list[str]:
    """Where Megatron-Core runs the model slightly differently from what autopar priced."""
    notes = []
    chunks = sorted({mx.chunk_size for i in range(model.num_layers) for mx in model.mixers_of(i)
                     if mx.kind == "mamba2"})
    if chunks and chunks != [_MEGATRON_CHUNK]:
        notes.append(f"Megatron-Core's Mamba-2 kernel uses chunks of {_MEGATRON_CHUNK} tokens (MambaMixer default, "
                     f"no flag); autopar counted the SSD FLOPs for {chunks[0]}")
    return notes
