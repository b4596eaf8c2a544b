"""Counted work is the same whatever kernels ran it (predict/work_count.py).

Attention runs other kernels by device and backend (a fused kernel, products and a
softmax, transformers' eager matmuls), so it is counted whole, by what it computes:
here eager and sdpa attention, and sdpa's math and fused CPU backends, must count the
same FLOPs and bytes to the last unit in both phases, while their operator calls differ.
Exact, not within a tolerance: every figure is a sum of integers (FLOPs of the formula,
element bytes) far below 2**53, so nothing rounds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from pytest_llmenergy.llm import LoadedModel, load_model
from pytest_llmenergy.predict.features import ATTENTION
from pytest_llmenergy.predict.work_count import ATTENTION_CALL, attended_pairs, count_work
from pytest_llmenergy.results import DECODE, PREFILL, CountedWork

IN, OUT = 12, 9  # nine tokens: decode steps 5 to 6 derived, not counted
FLASH = "aten::_scaled_dot_product_flash_attention_for_cpu"
Backend = tuple[str, Callable[[], AbstractContextManager[Any]]]
BACKENDS: tuple[Backend, ...] = (
    ("sdpa", lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)),
    ("sdpa", lambda: sdpa_kernel(SDPBackend.MATH)),
    ("eager", nullcontext),
)


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-mistral"])
def model(request: pytest.FixtureRequest, tiny_cache: Path) -> Iterator[LoadedModel]:
    """tiny-llama (as many key/value heads as query heads) and tiny-mistral (grouped:
    two key/value heads for four query heads, repeated by eager, not by sdpa)."""
    lm = load_model(request.param, cache_dir=tiny_cache)
    yield lm
    lm.model.set_attn_implementation("sdpa")


def counted(lm: LoadedModel, backend: Backend, *, sample: bool = True) -> CountedWork:
    implementation, kernels = backend
    lm.model.set_attn_implementation(implementation)
    ids = lm.prompt_ids(IN)
    with kernels():
        lm.generate(ids, 2)  # a case is counted after its trials, never first
        return count_work(lambda: lm.generate(ids, OUT), sample=sample)


def test_eager_sdpa_math_and_flash_attention_count_the_same_flops_and_bytes(
    model: LoadedModel,
) -> None:
    flash, math_, eager = (counted(model, b) for b in BACKENDS)
    for phase in (PREFILL, DECODE):
        for attr in ("flops", "bytes"):
            assert flash.total(attr, phase) == math_.total(attr, phase) == eager.total(attr, phase)
    # the work is the same, the kernels are not: the fused kernel, the math path's
    # products and softmax, eager's products; and the calls differ
    names = [{o.name for o in w.ops() if o.op_class == ATTENTION} for w in (flash, math_, eager)]
    assert FLASH in names[0] and FLASH not in names[1] | names[2]
    assert "aten::bmm" in names[1] and "aten::_softmax" in names[2]
    calls = [w.total("calls") for w in (flash, math_, eager)]
    assert calls[0] < calls[1] < calls[2]
    assert all(w.derived_steps == 2 and not w.full_because for w in (flash, math_, eager))
    assert not any(w.estimated for w in (flash, math_, eager))


def test_attention_counts_the_products_over_the_attended_pairs(model: LoadedModel) -> None:
    """Prefill: causal, a query attends the keys up to its own; decode step k: the one
    query attends all IN + k keys.  2 (d_k + d_v) FLOPs a pair and query head; bytes:
    Q, K and V as given (K and V at their own heads) and the output."""
    config = model.model.config
    layers, heads, groups = (
        config.num_hidden_layers,
        config.num_attention_heads,
        config.num_key_value_heads,
    )
    d = config.hidden_size // heads
    for backend in BACKENDS:
        work = counted(model, backend)
        rows = {p: [o for o in work.ops(p) if o.name == ATTENTION_CALL] for p in (PREFILL, DECODE)}
        assert all(len(r) == 1 and r[0].calls == 0 for r in rows.values())
        prefill, decode = rows[PREFILL][0], rows[DECODE][0]
        assert prefill.flops == layers * heads * 4 * d * IN * (IN + 1) // 2
        keys = range(IN + 1, IN + OUT)  # the first output token's step is the prefill's
        assert decode.flops == layers * heads * 4 * d * sum(keys)
        assert prefill.bytes == layers * 4 * d * (2 * heads * IN + 2 * groups * IN)
        assert decode.bytes == layers * 4 * d * sum(2 * heads + 2 * groups * k for k in keys)


def test_with_the_kernels_of_eager_attention_derived_decode_steps_stay_exact(
    model: LoadedModel,
) -> None:
    """Eager attention's mask is read to find its pairs: they grow by one key a step,
    so the sampled steps still derive the skipped ones exactly."""
    derived = counted(model, BACKENDS[2])
    full = counted(model, BACKENDS[2], sample=False)
    assert derived.derived_steps and not full.derived_steps
    assert derived.prefill == full.prefill and derived.decode == full.decode


def sdpa_work(grad: Callable[[], Any], backend: SDPBackend, **kwargs: Any) -> CountedWork:
    """Grouped-query attention: four query heads, two key/value heads."""
    q = torch.randn(2, 4, 8, 16)
    k, v = torch.randn(2, 2, 8, 16), torch.randn(2, 2, 8, 16)
    with grad(), sdpa_kernel(backend):
        return count_work(
            lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)
        )


@pytest.mark.parametrize("grad", [torch.no_grad, torch.inference_mode])
def test_a_plain_sdpa_call_counts_its_pairs_however_the_mask_is_given(
    grad: Callable[[], Any],
) -> None:
    """Under no_grad the dispatcher splits the call before any dispatch mode sees it,
    under inference_mode it does not: the call is taken at the torch function level."""
    causal = torch.ones(8, 8, dtype=torch.bool).tril()
    additive = torch.zeros(8, 8).masked_fill(~causal, -math.inf)
    pairs = 2 * 4 * 8 * 9 // 2  # batches x query heads x the causal pairs of 8 queries
    bytes_ = 4 * 16 * (2 * 4 * 8 + 2 * 2 * 8 * 2 + 2 * 4 * 8)  # Q, K and V, the output
    runs = [
        (SDPBackend.MATH, {"is_causal": True}),
        (SDPBackend.MATH, {"attn_mask": causal}),
        (SDPBackend.MATH, {"attn_mask": additive}),
        (SDPBackend.FLASH_ATTENTION, {"is_causal": True}),
    ]
    for backend, kwargs in runs:
        work = sdpa_work(grad, backend, **kwargs)
        assert work.total("flops") == work.total("flops", op_class=ATTENTION) == 2 * pairs * 32
        assert work.total("bytes") == bytes_
    assert sdpa_work(grad, SDPBackend.MATH).total("flops") == 2 * (2 * 4 * 8 * 8) * 32


def test_the_pairs_follow_the_mask_and_the_top_left_causal_rule() -> None:
    q = torch.empty(1, 2, 3, 4)
    assert attended_pairs(q, 5, None, False) == (2 * 3 * 5, False)
    assert attended_pairs(q, 5, None, True) == (2 * (1 + 2 + 3), False)
    assert attended_pairs(torch.empty(1, 1, 4, 2), 2, None, True) == (1 + 2 + 2 + 2, False)
    window = torch.ones(3, 5, dtype=torch.bool).tril(2).triu(1)  # each query: 2 keys
    assert attended_pairs(q, 5, window, True) == (2 * 3 * 2, False)  # the mask decides
    lowest = torch.finfo(torch.float16).min
    additive = torch.where(window, torch.tensor(-3.0), torch.tensor(lowest)).half()
    assert attended_pairs(q, 5, additive, False) == (2 * 3 * 2, False)
    # a mask that does not fit the call is not read: the rule without one, and a guess
    assert attended_pairs(q, 5, torch.ones(7, 7, dtype=torch.bool), True) == (12, True)


def test_a_copy_between_devices_is_a_call_without_bytes() -> None:
    x = torch.randn(16, 16)
    moved = count_work(lambda: x.to("meta"))  # a real device boundary, on any machine
    assert moved.total("calls") == 1 and moved.total("bytes") == 0
    cast = count_work(lambda: x.to(torch.float64))  # a copy on the device: its bytes
    assert cast.total("bytes") == 16 * 16 * (4 + 8)


def test_rms_norm_counts_its_tensors_whole_not_its_cpu_decomposition() -> None:
    """One fused kernel on CUDA, five elementwise operators on the CPU: the same bytes."""
    x, weight = torch.randn(8, 64), torch.randn(64)
    with torch.inference_mode():
        work = count_work(lambda: F.rms_norm(x, (64,), weight, 1e-6))
    assert work.total("bytes") == 4 * (8 * 64 + 64 + 8 * 64)
    assert work.total("calls") > 1  # the CPU's kernels, counted as calls
    assert [o.name for o in work.prefill if o.bytes] == ["aten::rms_norm"]


def test_counting_leaves_transformers_attention_interfaces_as_they_were(
    model: LoadedModel,
) -> None:
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    before = (AttentionInterface.get_interface, "__getitem__" in vars(AttentionMaskInterface))
    counted(model, BACKENDS[0])
    assert (AttentionInterface.get_interface, "__getitem__" in vars(AttentionMaskInterface)) == (
        before
    )
