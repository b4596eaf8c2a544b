"""Counted work (predict/work_count.py) on real torch, against truths computed by hand."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_llmenergy.llm import LoadedModel, load_model
from pytest_llmenergy.llm.loader import _streamer_class
from pytest_llmenergy.predict.features import ATTENTION, ELEMENTWISE, MATMUL
from pytest_llmenergy.predict.work_count import count_work, dispatch_class
from pytest_llmenergy.results import DECODE, PREFILL

IN, OUT = 16, 6


@pytest.fixture(scope="module")
def llama(tiny_cache: Path) -> LoadedModel:
    lm = load_model("tiny-llama", cache_dir=tiny_cache)
    lm.generate(lm.prompt_ids(8), 3)  # a case is counted after its trials, never first
    return lm


def linear_weights(model: Any) -> int:
    return sum(
        m.in_features * m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear)
    )


def test_a_linear_layer_counts_2mkn_flops_and_the_bytes_of_its_tensors() -> None:
    m, k, n = 3, 5, 7
    layer = torch.nn.Linear(k, n)
    x = torch.randn(m, k)
    with torch.no_grad():
        work = count_work(lambda: layer(x))
    assert work.total("flops") == 2 * m * k * n
    assert work.total("flops", op_class=MATMUL) == 2 * m * k * n
    # addmm reads the bias, the input and the weight (through t, a view: no bytes of its
    # own) and writes the output, 4 bytes an element
    assert work.total("bytes") == 4 * (n + m * k + k * n + m * n)
    assert {o.name: o.calls for o in work.prefill} == {"aten::t": 1, "aten::addmm": 1}
    assert not work.marked and not work.decode and not work.estimated


def test_a_batched_product_of_activations_is_attention_an_outer_product_elementwise() -> None:
    assert dispatch_class("aten::bmm", [[8, 16, 4], [8, 4, 16]]) == ATTENTION
    assert dispatch_class("aten::bmm", [[1, 8, 1], [1, 1, 5]]) == ELEMENTWISE  # rotary
    assert dispatch_class("aten::baddbmm", [[8, 16, 16], [8, 16, 4], [8, 4, 16]]) == ATTENTION
    assert dispatch_class("aten::mm", [[16, 64], [64, 64]]) == MATMUL


def test_the_same_case_counts_the_same_work_twice(llama: LoadedModel) -> None:
    ids = llama.prompt_ids(IN)
    first, second = (count_work(lambda: llama.generate(ids, OUT)) for _ in range(2))
    assert replace(first, seconds=0.0) == replace(second, seconds=0.0)
    assert first.marked and first.total("flops", DECODE) > 0 and first.total("calls") > 100


def test_decode_matmul_flops_per_output_token_are_twice_the_linear_weights(
    llama: LoadedModel,
) -> None:
    work = count_work(lambda: llama.generate(llama.prompt_ids(IN), OUT))
    weights = linear_weights(llama.model)
    # each decode step: one token through every linear layer, the LM head included
    assert work.total("flops", DECODE, MATMUL) / (OUT - 1) == 2 * weights
    # the prefill: every prompt token through the layers, the last alone through the head
    head = llama.model.lm_head
    layers = weights - head.in_features * head.out_features
    prefill = 2 * (IN * layers + head.in_features * head.out_features)
    assert work.total("flops", PREFILL, MATMUL) == prefill
    assert work.total("flops", DECODE, ATTENTION) > 0


def generate_without_cache(lm: LoadedModel, ids: torch.Tensor, n: int) -> None:
    """``lm.generate`` as a regression would make it: no KV cache, every step recomputes
    the whole sequence."""
    config = lm._generation_config(n)
    config.use_cache = False
    with torch.inference_mode():
        out = lm.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            generation_config=config,
            streamer=_streamer_class()(lm._synchronize, n),
        )
    assert out.shape[1] == ids.shape[1] + n


def test_without_the_kv_cache_decode_work_per_token_grows(llama: LoadedModel) -> None:
    ids = llama.prompt_ids(IN)
    cached = count_work(lambda: llama.generate(ids, OUT))
    uncached = count_work(lambda: generate_without_cache(llama, ids, OUT))
    assert uncached.marked
    # step i runs all IN + i tokens through the layers instead of one (the head: the last)
    head = llama.model.lm_head.in_features * llama.model.lm_head.out_features
    layers = linear_weights(llama.model) - head
    steps = sum(2 * ((IN + i) * layers + head) for i in range(1, OUT))
    assert uncached.total("flops", DECODE, MATMUL) == steps
    assert steps > 3 * cached.total("flops", DECODE, MATMUL)
    # and every query attends, not the last alone
    attention = uncached.total("flops", DECODE, ATTENTION)
    assert attention > 4 * cached.total("flops", DECODE, ATTENTION)
    assert uncached.total("flops", PREFILL, MATMUL) == cached.total("flops", PREFILL, MATMUL)
