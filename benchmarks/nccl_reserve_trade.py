"""What would a per-communicator NCCL memory term do? This is a what-if, not a model. (autopar/cost/memory.py
docstring, 'NCCL's own buffers'; README 'Accuracy', the published peaks.)

NCCL's channel buffers are real HBM and grow with the process groups a rank uses (NVIDIA/nccl#864, #986, #1685). The
model keeps them inside the flat ``hardware.reserve_gib``. This script adds ``X`` GiB to each stage's reserve for
every process group beyond the first. It counts the groups from the layout: TP, CP, DP, EP when their degree is above
1, and one per pipeline peer (1 at PP 2, 2 above; see process_groups). Then it runs ``autopar validate`` in this
process. X is the argument, not a measured figure: NCCL's per-group memory depends on channels, NVLS and
connected peers, and the published peaks cannot see it (torchtitan prints the caching allocator's reserved peak;
NCCL allocates outside it, nccl@v2.21.5-1 src/include/alloc.h). It shows the trade of pricing it: the
published-peak ratios, and the in-sample and held-out errors.

    python benchmarks/nccl_reserve_trade.py 0.25 1.0           # validate --memory, then --fit --cv, per X
    python benchmarks/nccl_reserve_trade.py --memory-only 1.0

About 1-2 minutes per X for --fit --cv. On 2026-11-26 (main at 18b497c): X = 0.25 and X = 1.0 both took in-sample
error 7.90% -> 8.02% and l3paper held out 15.3% -> 21.3% (l3paper-405b-h100-16384 falls from VPP 8 to VPP 1).
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import autopar.cost.estimator as estimator_module
from autopar.cli.main import main as autopar_main
from autopar.cost.memory import stage_memory
from autopar.specs.layout import Layout


def process_groups(L: Layout) -> int:
    """Process groups a rank of layout ``L`` sends on, at least 1: TP, CP, DP, EP above degree 1, and one per
    pipeline peer. ProcessGroupNCCL opens a 2-rank communicator per pair for a lone send/recv. For
    ``batch_isend_irecv``, which torch.distributed.pipelining's schedules use, it connects the peers on the PP
    group's communicator instead (``pointToPoint``: ``batchP2P`` takes the device key). Each peer then adds P2P
    channel buffers, not a communicator, so the count is approximate."""
    peers = 0 if L.pp == 1 else (1 if L.pp == 2 else 2)
    return max(1, int(L.tp > 1) + int(L.cp > 1) + int((L.dp or 1) > 1) + int(L.ep > 1) + peers)


def with_groups_priced(gib_per_group: float):
    """``stage_memory`` with ``gib_per_group`` GiB more reserve per process group beyond the first."""
    def priced(prof, st, L, tr, hw):
        mem = stage_memory(prof, st, L, tr, hw)
        return replace(mem, reserve=mem.reserve + gib_per_group * (process_groups(L) - 1))
    return priced


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gib_per_group", type=float, nargs="+", help="GiB added per process group beyond the first")
    ap.add_argument("--memory-only", action="store_true", help="only validate --memory (seconds)")
    args = ap.parse_args()
    for x in [0.0, *args.gib_per_group]:
        estimator_module.stage_memory = with_groups_priced(x)
        print(f"\n=== {x:g} GiB per process group beyond the first" + (" (the model as it is)" if x == 0 else ""),
              flush=True)
        autopar_main(["validate", "--memory"])
        if not args.memory_only:
            autopar_main(["validate", "--fit", "--cv"])
    estimator_module.stage_memory = stage_memory


if __name__ == "__main__":
    main()
