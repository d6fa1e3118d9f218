"""What to try next: the single-step neighbours of a layout, estimated, and advice sentences with numbers.

A *neighbour* changes one knob of the layout: doubles or halves one of tp, pp, cp, ep, vpp, micro_batch;
switches the recompute policy; switches the ZeRO stage; or toggles sequence parallelism. Only neighbours
that pass :func:`autopar.specs.layout.check_layout` (topology rules included, as ``solve`` applies them) are
kept, and each is predicted with the same :class:`~autopar.cost.Estimator` as the layout itself, so every
number in an advice sentence is a number ``autopar estimate`` would print for that layout.

Ordering (most useful first):
  1. changes that make a layout that does not fit fit (only when the layout itself does not fit);
  2. faster layouts that fit, fastest first;
  3. large memory savings (at least 1 GiB and 5 % of the layout's memory), by GiB freed / (1 + % slower);
  4. near misses: faster layouts that do not fit, closest to fitting first;
then one hint about the bottleneck term. Ties are broken by the change's label, so the output is
deterministic. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.cost.estimator import Estimator
from autopar.cost.pipeline import bubble_fraction
from autopar.cost.result import Estimate
from autopar.specs.layout import RECOMPUTE_POLICIES, Layout, balanced_stage_layers, check_layout

__all__ = ["Advice", "advise", "bottleneck_hint", "neighbours", "rank_advice"]

# Relative step-time change below which two layouts count as equally fast.
SAME_SPEED = 1e-3
# A memory saving worth mentioning frees at least this many GiB and this share of the layout's memory.
MIN_SAVING_GIB = 1.0
MIN_SAVING_SHARE = 0.05

_MEM_TERMS = {"weights": "weights", "grads": "grads", "optimizer": "optimizer", "activations": "act",
              "buffers": "buffers", "reserve": "reserve"}
CATEGORIES = ("fits", "faster", "saves memory", "near miss", "other")


@dataclass(frozen=True)
class Advice:
    """One valid single-step neighbour of a layout, predicted.

    ``delta_step`` is the relative step-time change (new − base) / base: −0.042 means 4.2 % faster.
    ``delta_mem`` is the change of per-GPU peak memory in GiB (new − base): negative frees memory."""

    change: str           # what changes, e.g. "adding CP=2 (DP 8→4)"
    knob: str             # tp | pp | cp | ep | vpp | micro_batch | recompute | zero | sp
    layout: Layout        # the neighbour, resolved (dp, grad_accum, stage_layers filled in)
    estimate: Estimate    # its prediction, from the same Estimator as the base layout
    base: Estimate        # the layout it is a neighbour of
    delta_step: float     # relative step-time change, (new − base) / base
    delta_mem: float      # GiB per GPU, new − base
    category: str         # one of CATEGORIES
    text: str             # the advice sentence

    @property
    def delta_step_s(self) -> float:
        return self.estimate.step_time_s - self.base.step_time_s


# ---- neighbour generation -------------------------------------------------------------------------------

def _axis_label(name: str, old: int, new: int, also: str = "") -> str:
    """'adding CP=2 (DP 8→4)', 'dropping CP (CP 2→1, DP 4→8)', 'TP 4→2 (DP 2→4)'."""
    ax = name.upper()
    if old == 1:
        return f"adding {ax}={new}" + (f" ({also})" if also else "")
    if new == 1:
        return f"dropping {ax} ({ax} {old}→1" + (f", {also})" if also else ")")
    return f"{ax} {old}→{new}" + (f" ({also})" if also else "")


def _zero_name(z: int) -> str:
    return "FSDP (ZeRO-3)" if z == 3 else ("plain DDP (ZeRO-0)" if z == 0 else f"ZeRO-{z}")


def _candidates(est: Estimator, L: Layout) -> list[tuple[str, str, dict]]:
    """(knob, label, field updates) of every single-step change; validity is checked afterwards."""
    n_layers = est.model.num_layers
    out: list[tuple[str, str, dict]] = []

    def sp_for(tp: int) -> bool | None:
        # keep sequence parallelism as it was where it can be (None = on exactly when tp > 1)
        return None if tp == 1 else (None if L.sp else False)

    for name in ("tp", "pp", "cp", "ep", "vpp"):
        old = getattr(L, name)
        for new in (old * 2, old // 2):
            if new < 1 or new == old:
                continue
            upd: dict = {name: new}
            if name == "tp":
                upd["sequence_parallel"] = sp_for(new)
            if name in ("pp", "vpp"):
                pp = new if name == "pp" else L.pp
                vpp = new if name == "vpp" else L.vpp
                if pp == 1:
                    vpp = 1
                    upd["vpp"] = 1
                upd["stage_layers"] = balanced_stage_layers(n_layers, pp, vpp)
            if name == "vpp":
                label = f"{'interleaving' if old == 1 else 'VPP'} {old}→{new} virtual stages"
            else:
                also = ""
                if name in ("tp", "pp", "cp"):
                    dp = est.gpus // (upd.get("tp", L.tp) * upd.get("cp", L.cp) * upd.get("pp", L.pp))
                    ga = est.training.global_batch // max(1, dp * L.micro_batch)   # as resolve_layout fills it
                    also = ", ".join(([f"DP {L.dp}→{dp}"] if dp != L.dp else [])
                                     + ([f"GA {L.grad_accum}→{ga}"] if dp != L.dp and ga != L.grad_accum else []))
                label = _axis_label(name, old, new, also)
            out.append((name, label, upd))
    for new in (L.micro_batch * 2, L.micro_batch // 2):
        if new >= 1 and new != L.micro_batch:
            out.append(("micro_batch", f"micro-batch {L.micro_batch}→{new}", {"micro_batch": new}))
    for rc in RECOMPUTE_POLICIES:
        if rc != L.recompute:
            label = "no recompute" if rc == "none" else f"{rc} recompute"
            out.append(("recompute", f"{label} (instead of {L.recompute})", {"recompute": rc}))
    for z in (0, 1, 2, 3):
        if z != L.zero_stage:
            out.append(("zero", f"{_zero_name(z)} instead of {_zero_name(L.zero_stage)}",
                        {"zero_stage": z, "fsdp": z == 3, "hsdp_shard": L.hsdp_shard if z == 3 else None}))
    if L.tp > 1:
        out.append(("sp", "turning sequence parallelism off" if L.sp else "turning sequence parallelism on",
                    {"sequence_parallel": not L.sp}))
    return out


def _category(base: Estimate, new: Estimate, d_step: float, d_mem: float) -> str:
    if new.fits and not base.fits:
        return "fits"
    if new.fits and d_step < -SAME_SPEED:
        return "faster"
    if new.fits and -d_mem >= max(MIN_SAVING_GIB, MIN_SAVING_SHARE * base.memory_gib.total):
        return "saves memory"
    if not new.fits and d_step < -SAME_SPEED:
        return "near miss"
    return "other"


def _largest_memory_change(base: Estimate, new: Estimate) -> str:
    """'act 24.1→12.0' for the memory term that moved the most."""
    b, n = base.memory_gib.to_dict(), new.memory_gib.to_dict()
    term = max(_MEM_TERMS, key=lambda k: (abs(n[k] - b[k]), k))
    return f"{_MEM_TERMS[term]} {b[term]:.1f}→{n[term]:.1f}"


def _margin_note(new: Estimate, margin: float) -> str:
    """Where a neighbour fits HBM but not the memory margin ``solve`` keeps free, say so: that is why it was not
    chosen, and a run at it risks the memory the published runs' errors say the model can miss."""
    mem, hbm = new.memory_gib.total, new.hbm_gib
    if margin > 0 and mem <= hbm and mem > hbm * (1.0 - margin):
        return f", but leaves {hbm - mem:.1f} GiB free, inside the {margin:.1%} memory margin solve keeps"
    return ""


def _sentence(a_change: str, knob: str, category: str, base: Estimate, new: Estimate, d_step: float,
              d_mem: float, margin: float = 0.0) -> str:
    mem, hbm = new.memory_gib.total, new.hbm_gib
    speed = f"{-d_step:.1%} faster" if d_step < 0 else f"{d_step:.1%} slower"
    step = f"{base.step_time_s:.3f}→{new.step_time_s:.3f} s/step"
    if category == "fits":
        return (f"{a_change} would fit: {mem:.1f} GiB of {hbm:.1f} HBM (from {base.memory_gib.total:.1f}), "
                f"{speed} ({step})" + _margin_note(new, margin))
    if category == "faster":
        return (f"{a_change} would be {speed} ({step}, {new.tokens_per_s_per_gpu:,.0f} tok/s/GPU, "
                f"MFU {new.mfu:.1%}) and fits in {mem:.1f} of {hbm:.1f} GiB" + _margin_note(new, margin))
    if category == "saves memory":
        text = (f"{a_change} would free {-d_mem:.1f} GiB ({_largest_memory_change(base, new)}; "
                f"{mem:.1f} GiB total) at {d_step:+.1%} step time")
        if knob == "recompute":
            text += " — use it if you need room for a longer sequence or a larger micro-batch"
        return text
    if category == "near miss":
        return (f"{a_change} would be {speed} ({step}) but needs {mem:.1f} GiB (> {hbm:.1f} HBM, "
                f"{mem - hbm:.1f} GiB over)")
    return (f"{a_change}: {speed} ({step}), {mem:.1f} GiB "
            f"({'fits' if new.fits else f'> {hbm:.1f} HBM'}, {d_mem:+.1f} GiB)")


def neighbours(est: Estimator, plan_estimate: Estimate, *, allow_cross_domain: bool = False,
               memory_margin: float = 0.0) -> list[Advice]:
    """Every valid single-step neighbour of ``plan_estimate.layout``, predicted, in generation order
    (tp, pp, cp, ep, vpp doubled then halved; micro-batch; recompute; ZeRO; SP). Layouts that break a rule
    of :func:`check_layout` — with the NVLink-domain rules unless ``allow_cross_domain`` — are left out."""
    base = plan_estimate
    L = base.layout
    fields = L.model_dump()
    seen: set[str] = set()
    out: list[Advice] = []
    for knob, label, upd in _candidates(est, L):
        try:
            cand = Layout(**{**fields, **upd, "dp": None, "grad_accum": None})
        except ValueError:
            continue
        if check_layout(cand, est.model, est.training, est.gpus, est.hardware,
                        allow_cross_domain_tp=allow_cross_domain):
            continue
        resolved = est.resolve(cand, allow_cross_domain_tp=allow_cross_domain)
        key = resolved.model_dump_json()
        if key in seen or key == L.model_dump_json():
            continue
        seen.add(key)
        new = est.estimate(resolved, resolved=True)
        d_step = (new.step_time_s - base.step_time_s) / base.step_time_s
        d_mem = new.memory_gib.total - base.memory_gib.total
        cat = _category(base, new, d_step, d_mem)
        out.append(Advice(label, knob, resolved, new, base, d_step, d_mem, cat,
                          _sentence(label, knob, cat, base, new, d_step, d_mem, memory_margin)))
    return out


def rank_advice(items: list[Advice]) -> list[Advice]:
    """The useful neighbours (category other than 'other'), most useful first (see the module docstring)."""
    def key(a: Advice) -> tuple:
        cat = CATEGORIES.index(a.category)
        if a.category == "fits":
            k: tuple = (a.estimate.step_time_s,)
        elif a.category == "faster":
            k = (a.delta_step, a.delta_mem)
        elif a.category == "saves memory":
            # GiB freed per (1 + percent slower): big savings first, discounted by what they cost
            k = (a.delta_mem / (1.0 + 100.0 * max(a.delta_step, 0.0)), a.delta_step)
        else:
            k = (a.estimate.memory_gib.total - a.estimate.hbm_gib, a.delta_step)
        return (cat, *(round(x, 9) for x in k), a.change)
    return sorted((a for a in items if a.category != "other"), key=key)


RING = {True: "hides behind each block's attention where that is long enough", False: "is not overlapped"}


def bottleneck_hint(est: Estimator, plan_estimate: Estimate, items: list[Advice] | None = None) -> str:
    """One sentence on the largest step-time term, with its seconds and share, and what usually helps."""
    e, L, hw, tr = plan_estimate, plan_estimate.layout, est.hardware, est.training
    ts = e.time_s
    name = e.bottleneck
    secs = getattr(ts, name)
    share = secs / e.step_time_s
    head = f"bottleneck is {name}: {secs:.3f} s of the {e.step_time_s:.3f} s step ({share:.0%})"
    items = items or []

    def best_of(knob: str) -> Advice | None:
        cands = [a for a in items if a.knob == knob and a.estimate.fits]
        return min(cands, key=lambda a: (getattr(a.estimate.time_s, name), a.change)) if cands else None

    if name == "compute":
        text = f"{head}, MFU {e.mfu:.1%}"
        if L.recompute != "none":
            no_rc = next((a for a in items if a.knob == "recompute" and a.layout.recompute == "none"), None)
            if no_rc is not None:
                saved = ts.compute - no_rc.estimate.time_s.compute
                text += f"; recompute ({L.recompute}) costs {saved:.3f} s of it"
                if no_rc.estimate.fits:
                    text += (f" and without it the layout still fits ({no_rc.estimate.memory_gib.total:.1f} of "
                             f"{hw.hbm_gib:.1f} GiB): drop it")
                else:
                    text += (f", but without it the layout needs {no_rc.estimate.memory_gib.total:.1f} GiB "
                             f"(> {hw.hbm_gib:.1f} HBM)")
        else:
            text += "; the layout is compute-bound: further gains come from faster kernels, not from the layout"
        return text
    if name == "dp":
        text = f"exposed DP communication is {secs:.3f} s ({share:.0%} of the step)"
        if L.zero_stage == 3:
            text += (": FSDP gathers the weights for every micro-batch — a larger micro-batch (fewer gathers, "
                     f"GA {L.grad_accum}) or ZeRO-1 instead of FSDP moves less")
        else:
            text += (f": the gradient reduce over DP·CP = {L.dp * L.cp} ranks is not hidden — more work per step "
                     "to hide it behind (a larger micro-batch count) or fewer DP ranks (more TP/PP) help")
        alt = best_of("zero") or best_of("micro_batch")
        if alt is not None:
            text += f"; e.g. {alt.change}: dp {ts.dp:.3f}→{alt.estimate.time_s.dp:.3f} s, {alt.delta_step:+.1%} step"
        return text
    if name == "tp":
        text = f"exposed TP communication is {secs:.3f} s ({share:.0%} of the step) at TP={L.tp}"
        if L.tp > hw.nvlink_domain_size:
            text += f", which spans NVLink domains ({hw.nvlink_domain_size} GPUs)"
        text += (": a smaller TP (with PP or CP to keep the memory) or TP communication overlap "
                 f"({'on: what the GEMMs cannot cover is left' if tr.tp_comm_overlap else 'off'}) help")
        return text
    if name == "cp":
        return (f"exposed context-parallel exchange is {secs:.3f} s ({share:.0%} of the step) at CP={L.cp}: "
                f"the attention KV ring {RING[tr.cp_comm_overlap]} (a "
                "linear/SSM layer's all-to-all or state pass is not); a smaller CP (memory from recompute or PP "
                "instead) helps")
    if name == "ep":
        return (f"exposed expert all-to-all is {secs:.3f} s ({share:.0%} of the step) at EP·ETP = {L.ep * L.etp} "
                f"(NVLink domain {hw.nvlink_domain_size}): a smaller EP (fewer domains for each token to reach), "
                "or overlap dispatch/combine with another micro-batch's compute (Megatron's combined 1F1B: "
                "no full recompute, VPP when PP > 1)")
    if name == "pp_bubble":
        frac = bubble_fraction(L.pp, L.vpp, L.grad_accum)
        return (f"the pipeline bubble is {secs:.3f} s ({share:.0%} of the step) = (PP−1)/(VPP·M+PP−1) = "
                f"({L.pp}−1)/({L.vpp}·{L.grad_accum}+{L.pp}−1) = {frac:.1%} of the pipelined time: more virtual "
                "stages (VPP), more micro-batches (a smaller micro-batch) or fewer stages shrink it")
    if name == "pp_p2p":
        return (f"exposed pipeline send/recv is {secs:.3f} s ({share:.0%} of the step) over PP={L.pp}: fewer "
                "stages or a larger micro-batch (fewer, larger sends) help")
    if name == "offload":
        return (f"exposed activation-offload copies are {secs:.3f} s ({share:.0%} of the step) over a "
                f"{hw.host_link_gbps or 0:g} GB/s host link: they outrun the compute they hide behind; recompute "
                "or more PP/CP instead of offloading, or a larger micro-batch per copy")
    return (f"the optimizer update is {secs:.3f} s ({share:.0%} of the step): it is HBM-bandwidth bound; "
            f"ZeRO-1 or higher shards it over DP (now ZeRO-{L.zero_stage})")


def advise(est: Estimator, plan_estimate: Estimate, *, max_items: int = 5,
           allow_cross_domain: bool = False, memory_margin: float = 0.0) -> list[str]:
    """Up to ``max_items`` advice sentences for ``plan_estimate``'s layout: the most useful single-step
    neighbours (see the module docstring for the order), then one hint about the bottleneck term."""
    if max_items <= 0:
        return []
    items = neighbours(est, plan_estimate, allow_cross_domain=allow_cross_domain, memory_margin=memory_margin)
    ranked = rank_advice(items)
    hint = bottleneck_hint(est, plan_estimate, items)
    return [a.text for a in ranked[:max_items - 1]] + [hint]
