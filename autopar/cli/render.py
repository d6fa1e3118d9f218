"""Terminal rendering shared by the commands (rich tables)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from autopar.cost.result import Estimate
from autopar.specs.hardware import HardwareSpec
from autopar.specs.model import ModelSpec
from autopar.specs.training import TrainingSpec

MEMORY_LEGEND = {
    "weights": "model weights of the stage (÷TP, experts ÷EP·ETP; ÷DP with ZeRO-3/FSDP)",
    "grads": "gradient buffers (÷DP with ZeRO-2/3)",
    "optimizer": "fp32 master weights + Adam moments (÷DP with ZeRO>=1)",
    "activations": "stored activations of the in-flight micro-batches (+ logits on the last stage)",
    "buffers": "communication / FSDP gather / FP8 weight-copy buffers",
    "reserve": "CUDA context, NCCL, allocator fragmentation",
}
TIME_LEGEND = {
    "compute": "GEMMs + attention of all micro-batches, recompute included",
    "tp": "exposed tensor/sequence-parallel collectives",
    "cp": "exposed ring-attention KV exchange",
    "ep": "exposed expert all-to-all (dispatch + combine)",
    "dp": "exposed gradient reduce / ZeRO-FSDP gathers",
    "pp_bubble": "pipeline fill + drain: (PP-1)/(VPP*M+PP-1) of the step",
    "pp_p2p": "exposed pipeline send/recv",
    "optimizer": "Adam update (HBM-bandwidth bound)",
    "offload": "exposed activation-offload copies to/from host memory",
}
APPROX_NOTE = ("Predictions are analytical (autopar/cost/, each formula cites its source) and approximate; "
               "see `autopar validate` for the error on published runs.")


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """stdout closed early (``| head``): let the CLI entry end quietly with status 141, as for print()."""
        raise BrokenPipeError


def console(stderr: bool = False) -> Console:
    return _Console(stderr=stderr, highlight=False, soft_wrap=False, width=170)


def header(model: ModelSpec, hw: HardwareSpec, tr: TrainingSpec, gpus: int) -> str:
    return (f"{model.summary()}\n{gpus} x {hw.name} ({hw.hbm_gib:.1f} GiB HBM, NVLink domain {hw.nvlink_domain_size}); "
            f"seq {tr.seq_len}, global batch {tr.global_batch} ({tr.tokens_per_step / 1e6:.2f}M tokens), "
            f"{tr.precision}")


def print_estimate(est: Estimate, model: ModelSpec, hw: HardwareSpec, tr: TrainingSpec, out: Console) -> None:
    L = est.layout
    out.print(header(model, hw, tr, est.gpus))
    out.print(f"[bold]Layout[/bold] {L.short()}   (EDP {L.edp}, min_gpus = PP·max(TP·CP, EP·ETP) = {L.min_gpus()})")
    mem = Table(title=f"Memory per GPU — pipeline stage {est.worst_stage} of {L.pp} (the fullest)",
                title_justify="left")
    mem.add_column("term")
    mem.add_column("GiB", justify="right")
    mem.add_column("what it counts")
    for k, v in est.memory_gib.to_dict().items():
        if k != "total":
            mem.add_row(k, f"{v:.2f}", MEMORY_LEGEND[k])
    used = est.memory_gib.total / est.hbm_gib
    verdict = "[green]fits[/green]" if est.fits else "[red]DOES NOT FIT[/red]"
    mem.add_row("[bold]total[/bold]", f"[bold]{est.memory_gib.total:.2f}[/bold]",
                f"of {est.hbm_gib:.1f} GiB HBM ({used:.0%}) — {verdict}")
    out.print(mem)
    tt = Table(title="Step time (critical path of the slowest stage)", title_justify="left")
    tt.add_column("term")
    tt.add_column("seconds", justify="right")
    tt.add_column("share", justify="right")
    tt.add_column("what it counts")
    step = est.step_time_s
    for k, v in est.time_s.to_dict().items():
        if k == "offload" and not est.layout.offload_activations:
            continue
        tt.add_row(k, f"{v:.4f}", f"{v / step:.1%}", TIME_LEGEND[k])
    tt.add_row("[bold]step[/bold]", f"[bold]{step:.4f}[/bold]", "100%", "")
    out.print(tt)
    out.print(f"Throughput: [bold]{est.tokens_per_s_per_gpu:,.0f} tokens/s/GPU[/bold], "
              f"{est.model_tflops_per_gpu:,.0f} model TFLOP/s/GPU, MFU {est.mfu:.1%} "
              f"(of the {tr.precision} dense peak {hw.peak_tflops(tr.precision):,.0f} TFLOP/s)")
    out.print(f"Bottleneck: [bold]{est.bottleneck}[/bold] ({TIME_LEGEND[est.bottleneck]})")
    if est.layout.offload_activations:
        out.print(f"Offloaded activations in host memory: {est.host_offload_gib:.1f} GiB per GPU")
    for n in est.notes:
        out.print(f"note: {n}")
    out.print(f"[dim]{APPROX_NOTE}[/dim]")
