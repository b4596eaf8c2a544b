"""The ``llm_workload`` fixture as users run it: a served workload against a server, each
request's joules in the run file and the session's table, and one more request's
marginal joules beside its attributed share (issue 63)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.fakes.fake_openai_server import Behaviour, FakeServer
from tests.test_serving import ROOT

WORKLOAD_TEST = """
def test_served(llm_workload):
    llm_workload("alpaca:rate=40,requests=24,scale=0.1,seed=2")
    found = llm_workload.marginal(40, 8, "alpaca:rate=40,requests=8,scale=0.1,seed=3", pairs=4)
    assert found.marginal.pairs == 4 and found.marginal.low <= found.marginal.high
"""


@pytest.fixture
def project(pytester: pytest.Pytester, tiny_cache: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LLMENERGY_CACHE", str(tiny_cache))
    monkeypatch.setenv("PYTHONPATH", str(ROOT), prepend=os.pathsep)
    pytester.makepyfile(test_workload=WORKLOAD_TEST)
    return pytester


def test_a_served_workload_and_a_marginal_request_as_users_run_them(
    project: pytest.Pytester,
) -> None:
    with FakeServer(Behaviour(model="tiny")) as server:
        result = project.runpytest_subprocess(
            f"--llm-endpoint={server.url}",
            "--llm-model=tiny-llama",
            "--energy-backend=estimate",
            "--energy-max-background=off",
            "--energy-json=run.json",
            "-p",
            "no:randomly",
        )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*llmenergy: each request's joules (served workload)*",
            "*marginal: the window's joules above idle with the request minus without it*",
        ]
    )
    [case] = json.loads((project.path / "run.json").read_text())["cases"]
    [trial] = case["trials"]
    requests = trial["requests"]
    assert len(requests) == 24
    assert all("prefill_j" in q and "decode_j" in q and "sent_s" in q for q in requests)
    assert trial["power"] and trial["power"][0]["start_s"] == 0.0
