"""ClusterSpec: a cluster as its users describe it: nodes x GPUs per node, and the scale-out fabric.

``rail`` (rail-optimised, full bisection): every GPU's NIC reaches every other node at the hardware file's
``scaleout_gbps``. ``oversubscribed`` with ratio R (R:1 leaf-to-spine oversubscription): the cost model is given
``scaleout_gbps / R``, i.e. every scale-out collective is assumed to cross the oversubscribed tier at 1/R of the NIC
bandwidth. That is an approximation (collectives that stay under one leaf switch are slowed too); it is stated in the
notes of every run that uses it.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from autopar.errors import AutoparInputError
from autopar.specs._base import Spec
from autopar.specs.hardware import HardwareSpec

__all__ = ["ClusterSpec", "parse_cluster"]


class ClusterSpec(Spec):
    """Nodes, GPUs per node and the scale-out fabric."""

    nodes: int = Field(gt=0, description="Servers in the job.")
    gpus_per_node: int = Field(gt=0, description="GPUs per server.")
    fabric: Literal["rail", "oversubscribed"] = Field(
        default="rail", description="rail = rail-optimised, full bisection; oversubscribed = R:1 leaf-to-spine.")
    oversubscription: float = Field(default=1.0, ge=1.0, le=64.0,
                                    description="R of an R:1 oversubscribed fabric (1 for rail-optimised).")

    @model_validator(mode="after")
    def _rail_is_not_oversubscribed(self) -> "ClusterSpec":
        if self.fabric == "rail" and self.oversubscription != 1.0:
            raise ValueError("a rail-optimised fabric has oversubscription 1")
        return self

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def apply(self, hardware: HardwareSpec) -> tuple[HardwareSpec, list[str]]:
        """The hardware as this cluster runs it, and notes saying what changed."""
        if self.gpus_per_node != hardware.gpus_per_node:
            raise AutoparInputError(f"--cluster: {self.gpus_per_node} GPUs per node, but {hardware.name} servers have "
                                    f"{hardware.gpus_per_node} (gpus_per_node in its hardware file)")
        if self.fabric == "rail":
            return hardware, [f"cluster: {self.nodes} nodes x {self.gpus_per_node} GPUs, rail-optimised scale-out at "
                              f"{hardware.scaleout_gbps:g} GB/s per GPU"]
        bw = hardware.scaleout_gbps / self.oversubscription
        return (hardware.model_copy(update={"scaleout_gbps": bw}),
                [f"cluster: {self.nodes} nodes x {self.gpus_per_node} GPUs, {self.oversubscription:g}:1 oversubscribed "
                 f"scale-out: {hardware.scaleout_gbps:g} -> {bw:.3g} GB/s per GPU for every inter-node collective "
                 "(approximation: traffic that stays under one leaf switch is slowed too)"])


def parse_cluster(text: str) -> ClusterSpec:
    """'32x8', '32x8:rail', '32x8:oversubscribed=2' or '32x8:2:1' -> ClusterSpec; AutoparInputError names --cluster."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*(?::\s*(rail|oversubscribed\s*=\s*([0-9.]+)|([0-9.]+)\s*:\s*1))?\s*",
                     text)
    if not m:
        raise AutoparInputError(f"--cluster: expected NODESxGPUS[:rail|:oversubscribed=R|:R:1] (e.g. 32x8:rail or "
                                f"32x8:2:1), got '{text}'")
    ratio = m.group(4) or m.group(5)
    try:
        return ClusterSpec(nodes=int(m.group(1)), gpus_per_node=int(m.group(2)),
                           fabric="oversubscribed" if ratio else "rail",
                           oversubscription=float(ratio) if ratio else 1.0)
    except ValueError as err:   # pydantic's ValidationError is a ValueError
        first = err.errors()[0] if hasattr(err, "errors") else {"loc": (), "msg": str(err)}
        raise AutoparInputError(f"--cluster: {'.'.join(map(str, first['loc']))} {first['msg']} (got '{text}')") \
            from None
