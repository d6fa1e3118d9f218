"""Time of one collective on a group of GPUs: alpha-beta model, hierarchical over NVLink domains, or the
measured bus-bandwidth tables of the hardware file.

Alpha-beta (Hockney 1994; ring algorithms as in Thakur, Rabenseifner & Gropp 2005, and the reference
tutorial's "ring all-reduce cost"): an all-reduce of S bytes over n ranks on a ring takes
``2(n-1)·alpha + 2(n-1)/n · S/beta``; all-gather and reduce-scatter (S = the full, gathered size) take half.

Placement: ranks are numbered TP innermost (Megatron order tp, cp, dp, pp; the expert mesh etp, ep, edp
inside each stage), so a group of n ranks whose consecutive members are ``stride`` apart has
``k = min(n, D // stride)`` members in each NVLink domain of D GPUs (k = 1 when stride >= D), spanning
``m = n / k`` domains. A hierarchical collective (NCCL's behaviour across nodes) runs the intra-domain part on
NVLink and the inter-domain part on the k NICs of the domain in parallel:
    all-reduce:  2(k-1)/k · S/B_nvl + 2(m-1)/m · S/(k·B_net)    + 2(k-1)·a_nvl + 2(m-1)·a_net
    all-gather / reduce-scatter: half of the bandwidth and latency terms.
    all-to-all:  each rank sends S·(k-1)/n over NVLink and S·(n-k)/n over the network, concurrently:
                 max(S(k-1)/(n·B_nvl), S(n-k)/(n·B_net)) + a_nvl + [m > 1]·a_net
                 The sends to all peers are posted at once (NCCL's all-to-all is a group of n − 1 send/recv pairs
                 between ncclGroupStart/End, as nccl-tests' alltoall.cu and torch.distributed.all_to_all_single
                 issue it), so one latency per link crossed, not Thakur et al.'s (n − 1)·alpha of a pairwise
                 exchange that waits step by step.
    send/recv:   S/B + a (NVLink when both ends share a domain).
    MoE dispatch/combine (:meth:`Network.moe_dispatch_time`): the all-to-all of routed tokens, priced
                 hierarchically as DeepEP-style dispatchers run it across domains (below).
B_nvl = nvlink_gbps · kernel_model.nvlink, B_net = scaleout_gbps · kernel_model.scaleout (GB/s = 1e9 B/s).

With a measured table (``measured_busbw_gbps``), time = S · factor(n) / busbw(n), where factor is the
nccl-tests bus-bandwidth factor: 2(n-1)/n for all-reduce, (n-1)/n for all-gather, reduce-scatter and
all-to-all, 1 for send/recv; busbw(n) is interpolated in log2(n) between measured group sizes; the
alpha-beta latency term above is added (the tables are measured at large messages, where latency vanishes).
"""

from __future__ import annotations

import math

from autopar.cost._select import maximum
from autopar.specs.hardware import HardwareSpec

_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "send_recv": lambda n: 1.0,
}


def _interp_log2(table: dict[int, float], n: int) -> float:
    keys = sorted(table)
    if n <= keys[0]:
        return table[keys[0]]
    if n >= keys[-1]:
        return table[keys[-1]]
    for lo, hi in zip(keys, keys[1:]):
        if lo <= n <= hi:
            t = (math.log2(n) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
            return table[lo] + t * (table[hi] - table[lo])
    return table[keys[-1]]  # pragma: no cover


class Network:
    """Collective-time oracle for one hardware spec. Results are cached per (op, n, stride)."""

    def __init__(self, hw: HardwareSpec):
        self.hw = hw
        self.domain = hw.nvlink_domain_size
        self.b_nvl = hw.nvlink_gbps * 1e9 * hw.kernel_model.nvlink
        self.b_net = hw.scaleout_gbps * 1e9 * hw.kernel_model.scaleout
        a2a = hw.kernel_model.nvlink_a2a
        self.b_moe = hw.nvlink_gbps * 1e9 * a2a if a2a else None   # MoE dispatch/combine in a domain (measured)
        self.a_nvl = hw.nvlink_latency_us * 1e-6
        self.a_net = hw.scaleout_latency_us * 1e-6
        self.measured = hw.measured_busbw_gbps
        self._coef: dict[tuple[str, int, int], tuple[float, float]] = {}
        self._link: dict[tuple[int, int], str] = {}

    def placement(self, n: int, stride: int) -> tuple[int, int]:
        """(k members per NVLink domain, m domains spanned) for a group of n ranks ``stride`` apart."""
        k = 1 if stride >= self.domain else max(1, min(n, self.domain // stride))
        return k, max(1, -(-n // k))

    def link(self, n: int, stride: int) -> str:
        """The link a group of n ranks ``stride`` apart runs its collectives on: 'network' when it spans NVLink
        domains, else 'nvlink'. Cached per (n, stride): it depends on nothing else of the group."""
        key = (n, stride)
        hit = self._link.get(key)
        if hit is None:
            hit = self._link[key] = "network" if self.placement(n, stride)[1] > 1 else "nvlink"
        return hit

    def coefficients(self, op: str, n: int, stride: int) -> tuple[float, float]:
        """(seconds per byte, fixed seconds) so that time(S) = S·c + t0. Zero for n = 1."""
        key = (op, n, stride)
        hit = self._coef.get(key)
        if hit is not None:
            return hit
        if n <= 1:
            res = (0.0, 0.0)
        else:
            table = getattr(self.measured, op, None) if self.measured else None
            if table:
                # measured bus bandwidth (large messages) + the alpha-beta latency of the same group, so that
                # small messages still pay their per-step latency
                res = (_FACTOR[op](n) / (_interp_log2(table, n) * 1e9), self._alpha_beta(op, n, stride)[1])
            else:
                res = self._alpha_beta(op, n, stride)
        self._coef[key] = res
        return res

    def _alpha_beta(self, op: str, n: int, stride: int) -> tuple[float, float]:
        k, m = self.placement(n, stride)
        bn, bx, an, ax = self.b_nvl, self.b_net, self.a_nvl, self.a_net
        if op == "send_recv":
            return (1.0 / bn, an) if stride < self.domain else (1.0 / bx, ax)
        if op == "all_to_all":
            per_byte = max((k - 1) / (n * bn), (n - k) / (n * bx))
            return per_byte, (an if k > 1 else 0.0) + (ax if m > 1 else 0.0)
        per_byte = (k - 1) / (k * bn) + (m - 1) / (m * k * bx)
        fixed = (k - 1) * an + (m - 1) * ax
        if op == "all_reduce":
            return 2.0 * per_byte, 2.0 * fixed
        return per_byte, fixed  # all_gather, reduce_scatter

    def moe_dispatch_time(self, token_bytes: float, top_k: int, num_experts: int, n: int, stride: int = 1) -> float:
        """Seconds for one MoE dispatch (or combine) of tokens of ``token_bytes`` in total per rank, each sent to
        ``top_k`` of ``num_experts`` experts spread evenly over n EP ranks ``stride`` apart.

        Inside one NVLink domain (m = 1) this is the plain all-to-all of S = token_bytes·top_k bytes, or, where the
        hardware file has the dispatch kernels' measured rate (``kernel_model.nvlink_a2a``: received bytes, own
        share included, per second / nvlink_gbps, as DeepEP's benchmarks count them),

            time = S / (nvlink_gbps · nvlink_a2a) + a_nvl

        (DeepEP-style kernels run on a few SMs and sustain less than NCCL's large-message busbw: DeepEP's H800 EP8
        153/158 GB/s of ~200, its SM100 EP8 643/675 GB/s of 900 at 24 SMs, against the all-to-all's
        nvlink·n/(n−1) = 0.93 and 0.87 of the link). Across
        m > 1 domains it is priced hierarchically, as DeepSeek-V3's dispatcher runs it (arXiv 2412.19437
        sec. 3.2.2: a token crosses the scale-out network once per destination domain, to the GPU of the same
        in-domain index, and is forwarded over NVLink to the GPUs holding its experts; DeepEP's internode
        kernels, github.com/deepseek-ai/DeepEP, README "normal kernels" with NVLink->RDMA forwarding):

            remote = (m − 1)·(1 − C(E − E/m, k)/C(E, k))      expected distinct other domains a token reaches
            net    = token_bytes · remote                      bytes per rank on its NIC
            nvl    = token_bytes · k · [(k_d − 1)/n + (n − k_d)/n · (k_d − 1)/k_d]
                     (copies for peers in the own domain + received remote copies forwarded inside the domain)
            time   = max(nvl / B_nvl, net / B_net) + a_nvl + a_net   (NVLink and NIC overlap; every peer's send is
                                                                       posted at once: one latency per link)

        with k_d ranks per domain (:meth:`placement`). Against the flat all-to-all (token_bytes·k·(n − k_d)/n on
        the NIC) this sends each token once per domain instead of once per expert copy: for DeepSeek-V3 at EP 32
        on 8-GPU nodes, 2.71 instead of 6 token copies per token. With a measured all-to-all table in the hardware
        file the measured bus bandwidth of the flat S-byte all-to-all is used (it measures whatever the library
        does)."""
        if n <= 1:
            return 0.0
        k_d, m = self.placement(n, stride)
        if self.measured and getattr(self.measured, "all_to_all", None):
            return self.time("all_to_all", token_bytes * top_k, n, stride)
        if m == 1:
            if self.b_moe is None:
                return self.time("all_to_all", token_bytes * top_k, n, stride)
            return token_bytes * top_k / self.b_moe + self.a_nvl
        per_domain = num_experts / m
        miss = math.comb(int(round(num_experts - per_domain)), top_k) / math.comb(num_experts, top_k)
        remote = (m - 1) * (1.0 - miss)
        net = token_bytes * remote
        nvl = token_bytes * top_k * ((k_d - 1) / n + (n - k_d) / n * (k_d - 1) / k_d)
        return maximum(nvl / self.b_nvl, net / self.b_net) + (self.a_nvl if k_d > 1 else 0.0) + self.a_net

    def time(self, op: str, nbytes: float, n: int, stride: int = 1) -> float:
        """Seconds for one ``op`` of ``nbytes`` (all-gather/reduce-scatter: the full gathered size) on n ranks."""
        c, t0 = self.coefficients(op, n, stride)
        return nbytes * c + t0 if c or t0 else 0.0
