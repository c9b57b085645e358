"""JSONL prompt datasets (docs/formats.md, "Prompt datasets"): one JSON object per line,
``{"prompt": text or [token ids], "samples": n, "metadata": any JSON}``, ``samples`` and
``metadata`` optional, blank lines ignored. The same format and checks as the C++ reader
(trainer_adapter/dataset.h): a bad line fails before any job is queued, naming the file and line.

    prompts = weft.read_dataset("prompts.jsonl")
    orchestrator.add_jobs([p.job(samples=8) for p in prompts[:64]])
"""

from __future__ import annotations

import dataclasses
import os
import json
from typing import Any, Dict, List, Optional

from .errors import InvalidArgument, NotFound
from .orchestrator import _json_text

_MAX_METADATA_BYTES = 64 << 10  # as JSON text, as the orchestrator takes it
_MAX_TOKEN_ID = 2**31 - 1
# A line becomes one job of a POST /v1/jobs body, {"prompts": [<line>]}, whose nesting the
# orchestrator bounds at 64 counted from the body's top: a line may nest 62 deep.
_MAX_LINE_DEPTH = 62


@dataclasses.dataclass(frozen=True)
class DatasetPrompt:
    """One line of a dataset."""

    prompt: Any  # a non-empty str, or a non-empty list of token ids
    samples: Optional[int]  # 1 to 4096; None: the trainer's own number
    metadata: Any  # None: none
    line: int  # its line in the file, from 1
    id: Any = None  # a non-empty str or a non-negative int (weft generate needs one); None: none

    def job(self, samples: int = 1) -> Dict[str, Any]:
        """The line as an entry of :meth:`weft.Orchestrator.add_jobs`, with ``samples`` when the
        line gives none."""
        return {"prompt": self.prompt,
                "samples": samples if self.samples is None else self.samples,
                "metadata": self.metadata}


def _no_repeats(pairs: List[Any]) -> Dict[str, Any]:
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise ValueError(f"a key repeated: {json.dumps(key)}")
        seen.add(key)
    return dict(pairs)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _depth(value: Any) -> int:
    """How many arrays and objects deep ``value`` nests (0 for a scalar)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_line(text: str, where: str) -> DatasetPrompt:
    try:
        row = json.loads(text, object_pairs_hook=_no_repeats, parse_constant=_no_constant)
    except (ValueError, RecursionError) as error:
        raise InvalidArgument(f"{where}: not valid JSON: {error}") from None
    if not isinstance(row, dict):
        raise InvalidArgument(f'{where}: a line is a JSON object {{"prompt": ...}}, not '
                              f"{type(row).__name__}")
    if _depth(row) > _MAX_LINE_DEPTH:
        raise InvalidArgument(f"{where}: not valid JSON: nested more than {_MAX_LINE_DEPTH} deep")
    unknown = sorted(set(row) - {"prompt", "samples", "metadata", "id"})
    if unknown:
        raise InvalidArgument(f"{where}: the line has an unknown field '{unknown[0]}'")
    if "prompt" not in row:
        raise InvalidArgument(f"{where}: the line lacks the field 'prompt'")
    prompt = row["prompt"]
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidArgument(f"{where}: the prompt is empty")
    elif isinstance(prompt, list) and prompt:
        for i, token in enumerate(prompt):
            if not _is_int(token) or not 0 <= token <= _MAX_TOKEN_ID:
                raise InvalidArgument(f"{where}: prompt[{i}] is not a token id (an integer from 0 "
                                      f"to {_MAX_TOKEN_ID})")
    else:
        raise InvalidArgument(f"{where}: prompt must be text (a non-empty string) or token ids (a "
                              "non-empty array of non-negative integers), not "
                              f"{type(prompt).__name__}")
    samples = row.get("samples")
    if "samples" in row and (not _is_int(samples) or not 1 <= samples <= 4096):
        raise InvalidArgument(f"{where}: samples must be an integer from 1 to 4096, not "
                              f"{json.dumps(samples)}")
    metadata = row.get("metadata")
    if metadata is not None:
        size = len(_json_text(metadata, f"{where}: metadata"))
        if size > _MAX_METADATA_BYTES:
            raise InvalidArgument(f"{where}: metadata is {size} bytes of JSON text; at most "
                                  f"{_MAX_METADATA_BYTES} (64 KiB)")
    prompt_id = row.get("id")
    if "id" in row and not ((isinstance(prompt_id, str) and 0 < len(prompt_id.encode()) <= 1024)
                            or (_is_int(prompt_id) and prompt_id >= 0)):
        raise InvalidArgument(f"{where}: id must be a non-empty string (at most 1024 bytes) or a "
                              f"non-negative integer, not {json.dumps(prompt_id)}")
    return DatasetPrompt(prompt=prompt, samples=samples, metadata=metadata, line=0, id=prompt_id)


MAX_LINE_BYTES = 4 << 20
MAX_DATASET_BYTES = 4 << 30


def _bounded_lines(path: str, max_line_bytes: int, max_bytes: int):
    """The lines of the file at ``path`` (without their ``\\n``), read a line at a time: a line
    longer than ``max_line_bytes`` or a file longer than ``max_bytes`` raises
    :class:`weft.InvalidArgument` having read no further."""
    try:
        f = open(path, "rb")
    except OSError as error:
        raise NotFound(f"cannot read the prompt dataset {path}: {error.strerror}") from None
    with f:
        total = 0
        number = 0
        while True:
            try:
                raw = f.readline(max_line_bytes + 2)
            except OSError as error:
                raise NotFound(f"cannot read the prompt dataset {path}: {error.strerror}") \
                    from None
            if not raw:
                return
            number += 1
            total += len(raw)
            if total > max_bytes:
                raise InvalidArgument(f"{path}: more than {max_bytes} bytes, the limit for the "
                                      f"prompt dataset")
            line = raw[:-1] if raw.endswith(b"\n") else raw
            if len(line) > max_line_bytes:
                raise InvalidArgument(f"{path}:{number}: a line longer than {max_line_bytes} "
                                      f"bytes, the limit for the prompt dataset")
            yield number, line


def read_dataset(path: str, max_line_bytes: int = MAX_LINE_BYTES,
                 max_bytes: int = MAX_DATASET_BYTES) -> List[DatasetPrompt]:
    """The prompts of the JSONL file at ``path``, in order. :class:`weft.NotFound` when it cannot
    be read; :class:`weft.InvalidArgument` naming the file and line for a line that is not such an
    object (not JSON or not UTF-8, a key repeated, an unknown key, a prompt that is neither text
    nor token ids, samples out of range, metadata over 64 KiB as text), for a file without a
    prompt, and for a line longer than ``max_line_bytes`` (4 MiB) or a file longer than
    ``max_bytes`` (4 GiB), found having read no further."""
    for what, value in (("max_line_bytes", max_line_bytes), ("max_bytes", max_bytes)):
        if not _is_int(value) or value < 1:
            raise InvalidArgument(f"{what} must be a positive integer, not {value!r}")
    prompts: List[DatasetPrompt] = []
    for number, raw in _bounded_lines(os.fspath(path), max_line_bytes, max_bytes):
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        raw = raw[:-1] if raw.endswith(b"\r") else raw
        where = f"{path}:{number}"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InvalidArgument(f"{where}: not valid JSON: not UTF-8 at byte {error.start}") \
                from None
        if not text.strip(" \t"):
            continue
        prompts.append(dataclasses.replace(_parse_line(text, where), line=number))
    if not prompts:
        raise InvalidArgument(f"{path}: the prompt dataset holds no prompt")
    return prompts
