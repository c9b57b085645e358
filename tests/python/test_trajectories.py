"""The package's trajectory parser held to the golden bodies the C++ trainer adapter is held to
(tests/data/trajectories.json): the same groups, the same errors."""

from __future__ import annotations

import json
import pathlib

import pytest

import weft
from weft.orchestrator import _parse_group

CASES = json.loads((pathlib.Path(__file__).resolve().parents[1] / "data" /
                    "trajectories.json").read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_golden_trajectories(case: dict) -> None:
    raw = dict(case["group"], trajectories=case["trajectories"])
    if case["error"] is not None:
        with pytest.raises(weft.InvalidArgument) as caught:
            _parse_group(raw, case["trainer_version"])
        assert str(caught.value).startswith(case["error"]), str(caught.value)
        return
    group = _parse_group(raw, case["trainer_version"])
    expect = case["expect"]
    assert group.prompt == expect["prompt"]
    assert group.metadata == expect["metadata"]
    assert group.lag == expect["lag"]
    assert (group.job, group.cluster) == (7, "c1")
    assert len(group.samples) == len(expect["samples"])
    for got, want in zip(group.samples, expect["samples"]):
        assert got.tokens == want["tokens"]
        assert got.logprobs == pytest.approx(want["logprobs"])
        assert got.versions == want["versions"]
        assert got.reward == want["reward"]
        assert got.text == want["text"]
        assert got.extra == want["extra"]
