"""The trainer's side of the orchestrator: versions, jobs, status, and trajectory batches."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from . import _weft
from .errors import InvalidArgument

_log = logging.getLogger("weft")


def _json_text(value: Any, what: str) -> str:
    try:
        # ASCII with escapes: text that is not valid Unicode (a lone surrogate) reaches the
        # orchestrator's checks as an escape, and is refused there by name.
        return json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as error:
        raise InvalidArgument(f"{what} is not JSON: {error}") from None


class Orchestrator:
    """A trainer's client of the orchestrator API (docs/api.md) at ``url`` with the trainer token.

    Every call has a deadline (``deadline`` seconds, retries included) and is retried with
    backoff where that is safe; errors are :class:`weft.Error` subclasses with the orchestrator's
    message.
    """

    def __init__(self, url: str, token: str, deadline: float = 120.0,
                 ca_file: Optional[str] = None):
        self._native = _weft.Orchestrator(url=url, token=token, deadline=float(deadline),
                                          ca_file=ca_file or "")

    def announce(self, version: int, publish_seconds: Optional[float] = None) -> None:
        """Announces a published version: workers move to it, and leases follow the bound.

        ``publish_seconds``, how long publishing it took, feeds the orchestrator's measurements
        (``weft_orchestrator_publish_seconds``).
        """
        self._native.announce(int(version),
                              None if publish_seconds is None else float(publish_seconds))

    def add_jobs(self, prompts: Sequence[Any], samples: int = 1,
                 metadata: Any = None) -> List[int]:
        """Queues one job per prompt and returns the job ids, in order.

        A prompt is any JSON value the workers' task understands (text, token ids), or a dict
        ``{"prompt": ..., "samples": n, "metadata": ...}`` that overrides ``samples`` and
        ``metadata`` for that job. Metadata is any JSON value (at most 64 KiB as text), kept by the
        orchestrator with the job and handed back with its trajectory group (``Group.metadata``).
        """
        jobs: List[Tuple[str, int, Optional[str]]] = []
        for i, entry in enumerate(prompts):
            where = f"prompts[{i}]"
            if isinstance(entry, dict):
                unknown = set(entry) - {"prompt", "samples", "metadata"}
                if "prompt" not in entry or unknown:
                    raise InvalidArgument(
                        f"{where}: a dict job has the keys prompt, samples and metadata"
                        + (f" (not {', '.join(sorted(unknown))})" if unknown else ""))
                prompt, count, meta = (entry["prompt"], entry.get("samples", samples),
                                       entry.get("metadata", metadata))
            else:
                prompt, count, meta = entry, samples, metadata
            if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 4096:
                raise InvalidArgument(f"{where}: samples must be an integer from 1 to 4096")
            jobs.append((_json_text(prompt, f"{where}'s prompt"), count,
                         None if meta is None else _json_text(meta, f"{where}'s metadata")))
        return list(self._native.add_jobs(jobs))

    def status(self) -> Dict[str, Any]:
        """``GET /v1/status`` as a dict."""
        return json.loads(self._native.status())


@dataclasses.dataclass
class Sample:
    """One sample of a group: the generated tokens (not the prompt), the behaviour log-probability
    of each, the reward, and the version that generated each token.

    ``reward`` is None when the workers' task leaves rewards to the trainer (the sample came
    without one): the trainer sets it before learning from the sample (``batch_tensors`` refuses
    a sample without one). ``text`` is the completion's text when the engine returned it."""

    tokens: List[int]
    logprobs: List[float]
    reward: Optional[float]
    versions: List[int]
    extra: Dict[str, Any]  # any other fields the worker sent
    text: Optional[str] = None

    @property
    def version_start(self) -> int:
        return min(self.versions) if self.versions else 0

    @property
    def version_end(self) -> int:
        return max(self.versions) if self.versions else 0


@dataclasses.dataclass
class Group:
    """The trajectory group of one job, as the trainer receives it."""

    job: int
    attempt: int
    cluster: str
    prompt: Any  # the "prompt" the worker sent back
    metadata: Any  # what add_jobs attached to the job (None: nothing)
    version_start: int  # the oldest version that generated a token of the group
    version_end: int  # the newest
    segments: List[Tuple[int, int]]  # (version, first token), tokens counted over all samples
    stale: bool  # over the staleness bound, delivered flagged (stale_policy deliver_flagged)
    lag: int  # trainer_version - version_start, when it was taken
    samples: List[Sample]


def _token_versions(segments: Sequence[Tuple[int, int]], total: int) -> List[int]:
    versions: List[int] = []
    for i, (version, first) in enumerate(segments):
        end = segments[i + 1][1] if i + 1 < len(segments) else total
        versions.extend([version] * (end - first))
    return versions


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _strict_object(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("a key appears twice in an object")
    return dict(pairs)


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


_MAX_TOKEN_ID = 2**31 - 1


def _parse_sample(s: Any, at: str) -> Sample:
    """One sample of the trajectories (docs/api.md, "Trajectories"), as the C++ decoder
    (orchestrator/wire.h, DecodeTrajectories) checks it, with the same messages."""
    if not isinstance(s, dict):
        raise InvalidArgument(f"{at}: not an object")
    tokens = s.get("tokens")
    if not isinstance(tokens, list) or not tokens:
        raise InvalidArgument(f"{at}: tokens must be an array of at least one token id")
    for t in tokens:
        if not _is_integer(t) or t < 0 or t > _MAX_TOKEN_ID:
            raise InvalidArgument(
                f"{at}: tokens must be integers from 0 to 2^31-1, not {json.dumps(t)}")
    logprobs = s.get("logprobs")
    if not isinstance(logprobs, list) or len(logprobs) != len(tokens) or not all(
            isinstance(p, (int, float)) and not isinstance(p, bool) for p in logprobs):
        raise InvalidArgument(f"{at}: {len(tokens)} tokens need as many numeric logprobs")
    reward = s.get("reward")
    if reward is not None and not _is_number(reward):
        raise InvalidArgument(f"{at}: reward must be a finite number, or absent (the trainer "
                              "computes it)")
    text = s.get("text")
    if text is not None and not isinstance(text, str):
        raise InvalidArgument(f"{at}: text must be a string")
    own = s.get("segments")
    if own is not None:
        bad = (f"{at}: segments must be [version, first token] pairs within its {len(tokens)} "
               "tokens, the first at 0, in order")
        if not isinstance(own, list):
            raise InvalidArgument(bad)
        previous = None
        for pair in own:
            if (not isinstance(pair, list) or len(pair) != 2 or not all(
                    _is_integer(x) and x >= 0 for x in pair)):
                raise InvalidArgument(bad)
            first = pair[1]
            if (first != 0 if previous is None else first < previous) or first >= len(tokens):
                raise InvalidArgument(bad)
            previous = first
    return Sample(tokens=tokens, logprobs=[float(p) for p in logprobs],
                  reward=None if reward is None else float(reward), versions=[],
                  extra={k: v for k, v in s.items()
                         if k not in ("tokens", "logprobs", "reward", "text")},
                  text=text)


def _parse_group(raw: Dict[str, Any], trainer_version: int) -> Group:
    """A delivered group checked against docs/api.md ("Trajectories") as the C++ trainer adapter
    (trainer_adapter/received_group.h) checks it, with the same messages; InvalidArgument says
    what is wrong and where."""
    where = f"job {raw['job']}"
    try:
        body = json.loads(raw["trajectories"], object_pairs_hook=_strict_object,
                          parse_constant=_not_json)
    except ValueError as error:
        raise InvalidArgument(
            f"{where}: the trajectories text is not valid JSON: {error}") from None
    if not isinstance(body, dict) or "prompt" not in body or not isinstance(
            body.get("samples"), list):
        raise InvalidArgument(f'{where}: the trajectories need a "prompt" and a "samples" array')
    samples = [_parse_sample(s, f"{where} sample {i}") for i, s in enumerate(body["samples"])]
    segments = [(int(v), int(f)) for v, f in raw["segments"]]
    total = raw["tokens"]
    if not segments or segments[0][1] != 0 or any(
            a[1] > b[1] for a, b in zip(segments, segments[1:])) or segments[-1][1] > total:
        raise InvalidArgument(f"{where}: the group's segments do not cover its {total} tokens")
    versions = _token_versions(segments, total)
    offset = 0
    for sample in samples:
        sample.versions = versions[offset:offset + len(sample.tokens)]
        offset += len(sample.tokens)
    if offset != total:
        raise InvalidArgument(f"{where}: the samples hold {offset} tokens, the group says {total}")
    metadata = None if raw["metadata"] is None else json.loads(raw["metadata"])
    return Group(job=raw["job"], attempt=raw["attempt"], cluster=raw["cluster"],
                 prompt=body["prompt"], metadata=metadata,
                 version_start=raw["version_start"], version_end=raw["version_end"],
                 segments=segments, stale=raw["stale"],
                 lag=max(0, trainer_version - raw["version_start"]), samples=samples)


class BatchClient:
    """Takes trajectory groups from the orchestrator for a trainer (docs/api.md, batches).

    Each group is returned once: a call acknowledges the batches the previous call received (and
    ``acknowledge()`` the last one, when the trainer is done); a new client, e.g. after the
    trainer restarted, receives unacknowledged groups again. The client keeps the staleness the
    trainer sees (``staleness``). ``max_staleness`` is the orchestrator's bound (read from its
    status when not given).
    """

    def __init__(self, url: str, token: str, max_staleness: Optional[int] = None,
                 deadline: float = 120.0, ca_file: Optional[str] = None):
        if max_staleness is None:
            max_staleness = Orchestrator(url, token, deadline, ca_file).status()["max_staleness"]
        self._native = _weft.BatchClient(url=url, token=token, max_staleness=int(max_staleness),
                                         deadline=float(deadline), ca_file=ca_file or "")
        self.rejected: List[Tuple[int, str]] = []  # (job, why) of groups not in the format

    def next_batch(self, groups: int, trainer_version: int, timeout: float = 30.0) -> List[Group]:
        """Up to ``groups`` groups: returns when that many have arrived or ``timeout`` seconds
        have passed (possibly with none). ``trainer_version`` is the version the trainer holds
        (each group's ``lag`` is counted from it). A group whose trajectories are not in the
        documented format is not returned: it is recorded in ``rejected`` with the reason, and
        logged (logger ``weft``); the others of the batch are returned all the same.

        Groups are acknowledged to the orchestrator by the client's next request for a batch: the
        next call's, and, when one request does not bring enough groups, the same call's later
        requests. A trainer that stops between receiving groups and learning from them can lose
        the groups of that call."""
        raw = self._native.next_groups(int(groups), int(trainer_version), float(timeout))
        out: List[Group] = []
        for r in raw:
            try:
                out.append(_parse_group(r, int(trainer_version)))
            except Exception as error:  # noqa: BLE001 - any malformed group is set aside
                reason = str(error) if isinstance(error, InvalidArgument) else \
                    f"job {r['job']}: {type(error).__name__}: {error}"
                self.rejected.append((r["job"], reason))
                _log.warning("weft: skipping a malformed trajectory group: %s", reason)
        return out

    def acknowledge(self) -> None:
        """Acknowledges the last batch received (call it once the trainer is done)."""
        self._native.acknowledge()

    @property
    def staleness(self) -> Dict[str, Any]:
        """groups, samples, stale_delivered, violations (over the bound and not flagged: should
        stay 0), max_lag, mean_lag, lag_histogram {lag: groups}, rejected."""
        stats = self._native.staleness()
        stats["rejected"] = len(self.rejected)
        return stats


@dataclasses.dataclass
class BatchTensors:
    """A batch as padded tensors, one row per sample (``S`` samples, ``T`` = the longest row).

    A row is the sample's generated tokens, or, when ``batch_tensors`` was given the prompts, its
    prompt followed by them (the model's input); logprobs, versions and the mask then sit at the
    generated tokens' positions."""

    tokens: Any  # [S, T] int64, padded with ``pad``
    logprobs: Any  # [S, T] float32, behaviour log-probabilities (0 elsewhere)
    versions: Any  # [S, T] int64, the version that generated each token (-1 elsewhere)
    mask: Any  # [S, T] bool, True on generated tokens (the loss mask)
    rewards: Any  # [S] float32
    group: Any  # [S] int64, the index in the batch of each sample's group
    lengths: Any  # [S] int64, the row's length (prompt included)
    prompt_lengths: Any  # [S] int64 (zeros without prompts)


def batch_tensors(groups: Sequence[Group], pad: int = 0,
                  prompt_tokens: Optional[Callable[[Group], Sequence[int]]] = None
                  ) -> BatchTensors:
    """The samples of ``groups`` as padded torch tensors (torch is imported on first use).

    ``prompt_tokens(group)``, when given, returns a group's prompt as token ids (the task's
    tokenizer applied to ``group.prompt``); each row then starts with them. Every sample needs a
    reward: InvalidArgument names the first without one (the workers' task left rewards to the
    trainer, which sets ``sample.reward`` first)."""
    for g, group in enumerate(groups):
        for i, s in enumerate(group.samples):
            if s.reward is None:
                raise InvalidArgument(
                    f"group {g} (job {group.job}) sample {i} has no reward: the workers' task "
                    "leaves rewards to the trainer; set sample.reward before batch_tensors")
    import torch

    rows = []
    for g, group in enumerate(groups):
        prompt = [] if prompt_tokens is None else [int(t) for t in prompt_tokens(group)]
        for s in group.samples:
            rows.append((g, prompt, s))
    count = len(rows)
    longest = max((len(p) + len(s.tokens) for _, p, s in rows), default=0)
    tokens = torch.full((count, longest), pad, dtype=torch.int64)
    logprobs = torch.zeros((count, longest), dtype=torch.float32)
    versions = torch.full((count, longest), -1, dtype=torch.int64)
    mask = torch.zeros((count, longest), dtype=torch.bool)
    for row, (_, prompt, s) in enumerate(rows):
        start, end = len(prompt), len(prompt) + len(s.tokens)
        if prompt:
            tokens[row, :start] = torch.tensor(prompt, dtype=torch.int64)
        if end > start:
            tokens[row, start:end] = torch.tensor(s.tokens, dtype=torch.int64)
            logprobs[row, start:end] = torch.tensor(s.logprobs, dtype=torch.float32)
            versions[row, start:end] = torch.tensor(s.versions, dtype=torch.int64)
            mask[row, start:end] = True
    return BatchTensors(
        tokens=tokens, logprobs=logprobs, versions=versions, mask=mask,
        rewards=torch.tensor([s.reward for _, _, s in rows], dtype=torch.float32),
        group=torch.tensor([g for g, _, _ in rows], dtype=torch.int64),
        lengths=torch.tensor([len(p) + len(s.tokens) for _, p, s in rows], dtype=torch.int64),
        prompt_lengths=torch.tensor([len(p) for _, p, _ in rows], dtype=torch.int64))
