"""The MoE dispatch all-to-all: flat inside one NVLink domain, hierarchical across domains (issue 12 item 4)."""

from __future__ import annotations

import math

import pytest

from autopar.cost.collectives import Network
from autopar.specs.loaders import load_hardware

H100 = load_hardware("h100_sxm")


def test_inside_one_domain_it_runs_at_the_dispatch_kernels_measured_rate():
    """H100 SXM's file carries DeepEP's measured intranode rate (received bytes, own share included, per second /
    nvlink_gbps): all S = tokens·k bytes at that rate plus one NVLink latency, slower than NCCL's all-to-all."""
    net = Network(H100)
    assert H100.kernel_model.nvlink_a2a == pytest.approx(0.78)
    want = 8e8 / (H100.nvlink_gbps * 1e9 * 0.78) + H100.nvlink_latency_us * 1e-6
    assert net.moe_dispatch_time(1e8, 8, 256, 8, 1) == pytest.approx(want)
    assert net.moe_dispatch_time(1e8, 8, 256, 8, 1) > net.time("all_to_all", 8e8, 8, 1)


def test_inside_one_domain_without_a_measured_rate_it_is_the_plain_all_to_all():
    a100 = load_hardware("a100_80gb")
    assert a100.kernel_model.nvlink_a2a is None
    net = Network(a100)
    assert net.moe_dispatch_time(1e8, 8, 256, 8, 1) == pytest.approx(net.time("all_to_all", 8e8, 8, 1))


def test_across_domains_each_token_crosses_the_network_once_per_destination_domain():
    """DeepSeek-V3 at EP 32 on 8-GPU nodes: 4 domains, 64 experts each; hand count of the NIC bytes."""
    net = Network(H100)
    token_bytes = 1e9
    miss = math.comb(192, 8) / math.comb(256, 8)          # P(a token sends no copy to a given domain)
    remote = 3 * (1 - miss)                                # expected other domains reached, ~2.71
    assert remote == pytest.approx(2.711, abs=0.001)
    nvl = token_bytes * 8 * (7 / 32 + 24 / 32 * 7 / 8)
    # one latency per link crossed: every send is posted at once
    want = max(nvl / net.b_nvl, token_bytes * remote / net.b_net) + net.a_nvl + net.a_net
    assert net.moe_dispatch_time(token_bytes, 8, 256, 32, 1) == pytest.approx(want)
    # and the network share is what dominates on HGX: cheaper than the flat all-to-all's 6 copies per token
    flat = net.time("all_to_all", token_bytes * 8, 32, 1)
    assert net.moe_dispatch_time(token_bytes, 8, 256, 32, 1) < flat * 0.5


def test_more_domains_never_make_a_dispatch_cheaper():
    net = Network(H100)
    times = [net.moe_dispatch_time(1e9, 8, 256, n, 1) for n in (16, 32, 64, 128, 256)]
    assert times == sorted(times)
