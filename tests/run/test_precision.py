"""precision.py in one process: the optimizer's fp32 main weights and its memory terms, the LR warm-up."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from autopar.run.precision import MainParamOptimizer, describe, warmup_lr, weight_dtype  # noqa: E402


def _linear(dtype):
    lin = torch.nn.Linear(16, 8, bias=False, dtype=dtype)
    torch.nn.init.normal_(lin.weight, generator=torch.Generator().manual_seed(0))
    return lin


def test_bf16_weights_train_through_fp32_main_copies_and_count_2_2_12_bytes():
    lin = _linear(torch.bfloat16)
    opt = MainParamOptimizer(lin.parameters(), lr=1e-2)
    n = lin.weight.numel()
    lin(torch.randn(4, 16, dtype=torch.bfloat16)).float().square().sum().backward()
    assert (opt.weight_bytes(), opt.grad_bytes()) == (2 * n, 2 * n)
    opt.step()
    main = opt.pairs[0][1]
    assert main.dtype == torch.float32 and opt.optimizer_bytes() == 4 * n + 8 * n     # main + 2 Adam moments
    assert torch.equal(lin.weight.detach(), main.detach().to(torch.bfloat16))         # weights = bf16(main)
    opt.zero_grad()
    assert lin.weight.grad is None and main.grad is None and opt.grad_bytes() == 0


def test_fp32_weights_are_their_own_main_copy():
    lin = _linear(torch.float32)
    opt = MainParamOptimizer(lin.parameters(), lr=1e-2)
    before = lin.weight.detach().clone()
    lin(torch.randn(4, 16)).square().sum().backward()
    opt.step()
    n = lin.weight.numel()
    assert opt.pairs[0][1] is None and opt.optimizer_bytes() == 8 * n and not torch.equal(before, lin.weight)


def test_the_update_matches_adamw_on_fp32_up_to_bf16_rounding():
    ref, low = _linear(torch.float32), _linear(torch.bfloat16)
    low.weight.data.copy_(ref.weight.data)          # same start (ref rounded to bf16 below)
    ref.weight.data.copy_(low.weight.data.float())
    o_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    o_low = MainParamOptimizer(low.parameters(), lr=1e-2)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(3))
    for _ in range(3):
        ref(x).square().sum().backward()
        low(x.to(torch.bfloat16)).float().square().sum().backward()
        o_ref.step()
        o_ref.zero_grad()
        o_low.step()
        o_low.zero_grad()
    torch.testing.assert_close(low.weight.float(), ref.weight, rtol=2e-2, atol=2e-2)


def test_warmup_is_linear_then_constant():
    assert [warmup_lr(s, 1.0, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup_lr(0, 3e-4, 0) == 3e-4


def test_weight_dtype_and_the_stated_scheme():
    assert weight_dtype("auto", "bf16", cuda=True) == torch.bfloat16
    assert weight_dtype("auto", "bf16", cuda=False) == torch.float32
    assert weight_dtype("bf16", "fp32", cuda=False) == torch.bfloat16
    with pytest.raises(ValueError, match="dtype must be"):
        weight_dtype("fp8", "bf16", cuda=True)
    gpu = describe(torch.bfloat16, "bf16", fsdp_wrapped=False, zero_stage=0, cuda=True)
    assert gpu.startswith("weights bf16, grads bf16, fp32 main weights") and "CPU" not in gpu
    cpu = describe(torch.float32, "bf16", fsdp_wrapped=True, zero_stage=3, cuda=False, moe=True)
    assert "CPU: fp32" in cpu and "ZeRO-3" in cpu and "routed experts" in cpu


def test_formats_the_runner_does_not_apply_are_noted():
    from autopar.run.worker import precision_notes
    from autopar.specs import TrainingSpec
    assert precision_notes(TrainingSpec(), torch.bfloat16) == []
    assert precision_notes(TrainingSpec(precision="fp8"), torch.bfloat16) == [
        "precision fp8 not applied: the GEMMs run in bfloat16"]
    assert precision_notes(TrainingSpec(precision="fp16", weight_dtype="fp16"), torch.float16) == [
        "fp16 weights without loss scaling"]
