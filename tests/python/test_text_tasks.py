"""Prompts and rewards at the text level, from the Python side: JSONL prompt datasets
(weft.read_dataset) and groups whose samples come without a reward (the workers' task leaves it to
the trainer) or with the completion's text."""

from __future__ import annotations

import json
import pathlib
import re

import pytest

import weft


def write(tmp_path: pathlib.Path, text: str | bytes) -> pathlib.Path:
    path = tmp_path / "prompts.jsonl"
    if isinstance(text, str):
        text = text.encode()
    path.write_bytes(text)
    return path


# --- datasets --------------------------------------------------------------------------------

def test_a_dataset_is_read_in_order_with_samples_and_metadata(tmp_path):
    path = write(tmp_path, b'\xef\xbb\xbf{"prompt": "12+34=", "metadata": {"answer": "46"}}\n'
                           b"\n   \n"
                           b'{"prompt": [13, 1, 10, 2, 11], "samples": 3}\r\n'
                           b'{"samples": 1, "prompt": "5+5=", "metadata": null}\n'
                           b'{"prompt": "7+0=", "metadata": [1, "two", {"3": 4.5}]}')
    rows = weft.read_dataset(str(path))
    assert [(r.prompt, r.samples, r.metadata, r.line) for r in rows] == [
        ("12+34=", None, {"answer": "46"}, 1),
        ([13, 1, 10, 2, 11], 3, None, 4),
        ("5+5=", 1, None, 5),
        ("7+0=", None, [1, "two", {"3": 4.5}], 6)]
    assert rows[0].job(8) == {"prompt": "12+34=", "samples": 8, "metadata": {"answer": "46"}}
    assert rows[1].job(8)["samples"] == 3


def test_a_dataset_line_may_carry_an_id(tmp_path):
    path = write(tmp_path, '{"id": "a-1", "prompt": "1+1="}\n{"prompt": "2+2=", "id": 7}\n')
    assert [r.id for r in weft.read_dataset(str(path))] == ["a-1", 7]


@pytest.mark.parametrize("line, message", [
    ('{"prompt": "1+1="', "not valid JSON"),
    ('{"prompt": "1+1=", "prompt": "2+2="}', 'a key repeated: "prompt"'),
    ('{"prompt": "1+1=", "metadata": NaN}', "NaN is not JSON"),
    ('["1+1="]', r'a line is a JSON object \{"prompt": ...\}, not list'),
    ('{"samples": 2}', "the line lacks the field 'prompt'"),
    ('{"prompt": "1+1=", "answer": 2}', "the line has an unknown field 'answer'"),
    ('{"prompt": ""}', "the prompt is empty"),
    ('{"prompt": 12}', "prompt must be text .* not int"),
    ('{"prompt": []}', "prompt must be text .* not list"),
    ('{"prompt": [1, -2]}', r"prompt\[1\] is not a token id"),
    ('{"prompt": [1, 2.0]}', r"prompt\[1\] is not a token id"),
    ('{"prompt": [true]}', r"prompt\[0\] is not a token id"),
    ('{"prompt": "1+1=", "samples": 0}', "samples must be an integer from 1 to 4096, not 0"),
    ('{"prompt": "1+1=", "samples": "2"}', 'samples must be an integer from 1 to 4096, not "2"'),
    ('{"prompt": "1+1=", "metadata": "' + "x" * 70000 + '"}',
     r"metadata is 70002 bytes of JSON text; at most 65536 \(64 KiB\)"),
    ('{"prompt": "1+1=", "metadata": ' + "[" * 62 + "]" * 62 + "}", "nested more than 62 deep"),
    ('{"prompt": "1+1=", "id": ""}', 'id must be a non-empty string .* not ""'),
    ('{"prompt": "1+1=", "id": -3}', "id must be a non-empty string .* not -3"),
])
def test_a_bad_line_is_named_by_file_and_line(tmp_path, line, message):
    path = write(tmp_path, '{"prompt": "1+1="}\n\n' + line + "\n")
    with pytest.raises(weft.InvalidArgument, match=f"^{re.escape(str(path))}:3: .*{message}"):
        weft.read_dataset(str(path))


def test_bytes_that_are_not_utf8_and_files_without_prompts(tmp_path):
    path = write(tmp_path, b'{"prompt": "1+1="}\n{"prompt": "1+\xff="}\n')
    with pytest.raises(weft.InvalidArgument, match=f"^{re.escape(str(path))}:2: not valid JSON: not UTF-8"):
        weft.read_dataset(str(path))
    path = write(tmp_path, "\n  \n")
    with pytest.raises(weft.InvalidArgument, match="holds no prompt"):
        weft.read_dataset(str(path))
    with pytest.raises(weft.NotFound, match="cannot read the prompt dataset"):
        weft.read_dataset(str(tmp_path / "missing.jsonl"))


def test_datasets_are_read_within_bounds(tmp_path):
    # /dev/zero has no line end: refused at the line limit, not read without end.
    with pytest.raises(weft.InvalidArgument,
                       match="^/dev/zero:1: a line longer than 4194304 bytes"):
        weft.read_dataset("/dev/zero")
    line = '{"prompt": "' + "x" * 2000 + '"}\n'
    path = write(tmp_path, line * 3)
    assert len(weft.read_dataset(path)) == 3
    with pytest.raises(weft.InvalidArgument, match=":1: a line longer than 1500 bytes"):
        weft.read_dataset(path, max_line_bytes=1500)
    with pytest.raises(weft.InvalidArgument, match="more than 5000 bytes"):
        weft.read_dataset(path, max_bytes=5000)
    with pytest.raises(weft.InvalidArgument, match="max_bytes must be a positive integer"):
        weft.read_dataset(path, max_bytes=0)


# --- rewards left to the trainer -------------------------------------------------------------

def test_samples_without_a_reward_reach_the_trainer(orchestrator, tmp_path):
    """A worker whose task leaves rewards to the trainer submits samples without "reward" (and
    with the completion's text); the trainer gets reward None, fills it, then builds tensors."""
    o = orchestrator
    client = weft.Orchestrator(o.url, o.TOKENS["trainer"], deadline=10)
    client.announce(0)
    path = write(tmp_path, '{"prompt": "1+2=", "metadata": {"answer": "3"}}\n')
    (job,) = client.add_jobs([row.job(2) for row in weft.read_dataset(str(path))])
    token = o.call("POST", "/v1/clusters", {"cluster": "c1", "region": "r", "capacity": 1},
                   o.TOKENS["worker"])["cluster_token"]
    o.call("POST", "/v1/clusters/c1/heartbeat", {"ready_version": 0}, token)
    (lease,) = o.call("POST", "/v1/clusters/c1/leases", {"max": 1, "wait_ms": 2000},
                      token)["leases"]
    assert lease["job"] == job and lease["metadata"] == {"answer": "3"}
    samples = [{"tokens": [3, 12], "logprobs": [-0.5, -0.25], "text": "3"},
               {"tokens": [4, 12], "logprobs": [-1.0, -0.125], "reward": None, "text": "4"}]
    o.call("POST", "/v1/clusters/c1/submissions", {
        "job": job, "attempt": lease["attempt"], "cluster": "c1", "version_start": 0,
        "version_end": 0, "segments": [[0, 0]], "tokens": 4,
        "trajectories": {"prompt": json.loads(lease["prompt"]), "samples": samples}}, token)
    batches = weft.BatchClient(o.url, o.TOKENS["trainer"], deadline=10)
    (group,) = batches.next_batch(1, trainer_version=0, timeout=5)
    assert group.metadata == {"answer": "3"} and group.prompt == "1+2="
    assert [(s.reward, s.text, s.extra) for s in group.samples] == [(None, "3", {}),
                                                                    (None, "4", {})]
    with pytest.raises(weft.InvalidArgument, match=rf"group 0 \(job {job}\) sample 0 has no "
                                                   "reward: the workers' task leaves rewards to "
                                                   "the trainer"):
        weft.batch_tensors([group])
    for s in group.samples:
        s.reward = 1.0 if s.text == group.metadata["answer"] else 0.0
    assert weft.batch_tensors([group]).rewards.tolist() == [1.0, 0.0]
    batches.acknowledge()
