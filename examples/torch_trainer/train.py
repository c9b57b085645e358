"""The PyTorch trainer of a weft run: examples/example_trainer.cc's loop, driving weft from Python.

``weft run`` starts it as the run's trainer command (configs/local-torch.yaml), in the directory
the run was started in, with:

- ``WEFT_SETTINGS``: a JSON file of the run's settings: ``{"run_id", "max_staleness", "serving",
  "model": {"vocab", "d_model", "layers", "heads", "d_ff", "max_seq"}, "task": {"kind",
  "digits", "dataset", "max_prompt_tokens", "max_tokens", "stop_token"}, "trainer": {"seed",
  "threads", "warmup": {"steps", "batch", "learning_rate"},
  "steps", "prompts_per_step", "samples_per_prompt", "steps_ahead", "optimizer",
  "learning_rate", "truncation", "eval_problems", "keyframe_interval", "keyframe_budget",
  "delta_mode", "stall_after_s", "min_step_time_s"}}``. A missing trainer key takes docs/run.md's default.
- ``WEFT_STORE`` (the store it publishes to), ``WEFT_RUN_ID``, ``WEFT_ORCHESTRATOR`` (URL),
  ``WEFT_TRAINER_TOKEN``, ``WEFT_MAX_STALENESS`` and ``WEFT_PROGRESS`` (the progress file).
  ``weft.Publisher`` reads ``WEFT_STORE_TOKEN`` itself, for a store server's writes.

What it does, as the C++ example trainer:

1. A supervised warm-up of TinyLm (model.py) on the arithmetic task (task.py), locally.
2. Version 0 = that policy, published (``weft.Publisher``, the run's serving format) and announced.
3. RL steps: keep ``steps_ahead`` steps of prompts queued, leased or buffered at the orchestrator
   (jobs of ``samples_per_prompt`` samples): generated problems, or the prompts of the JSONL
   dataset ``task.dataset`` (``weft.read_dataset``) in order, cycling, with their metadata; take
   ``prompts_per_step`` groups within the staleness bound (``weft.BatchClient``), scoring with the
   arithmetic task the samples that came without a reward (``kind: trainer``); apply a GRPO step
   (grpo.py) against the workers' behaviour logprobs, masking tokens older than ``max_staleness``
   allows; publish and announce the next version.
4. Greedy accuracy on ``eval_problems`` held-out problems before the RL phase and after it.

The task's kind may be ``arithmetic``, ``http`` or ``trainer``: the trainer's own task is the
arithmetic one of ``digits`` digits whatever the workers score with. The model's ``max_seq`` is the
settings' ``model.max_seq`` (the run's ``model.context``), which must cover the workers' task's
longest prompt plus completion (``max_prompt_tokens + max_tokens``; for the arithmetic kind
without them, the problem and answer of ``digits`` digits) and is that where it is absent: the
workers' engine sizes its position table the same way, and the published tensors must have the
shapes the engine expects (the C++ trainer does the same).

The progress file (written atomically after every warm-up report and RL step) has the fields of
``TrainerSummary::ToJson`` (examples/example_trainer.cc: with ``warmup_steps`` and
``steps_total``), in its order, and ``"trainer": "pytorch"``. Exit status 0 when the training
finished; otherwise 1 with the reason on stderr (2 for bad settings or environment).
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Any, Callable, Mapping, Sequence

# torch's OpenMP threads busy-wait after every parallel operation, taking cores from the
# publisher's encoding threads and from the rollout workers on the same machine: let them sleep.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from grpo import (Group, Optimizer, OptimizerConfig, PolicyGradientConfig, Sample,
                  greedy_accuracy, policy_gradient_step, supervised_step)
from model import TinyLm, TinyLmConfig
from task import BEGIN, VOCAB, ArithmeticTask, tokenize_text

TASK_KINDS = ("arithmetic", "http", "trainer")  # the workers' task kinds this trainer runs with

REWARD_WINDOW = 5  # initial_reward / final_reward: the first / last this many steps
WARMUP_REPORT_EVERY = 25  # warm-up steps between progress reports
BATCH_TIMEOUT_S = 2.0  # one next_batch call's wait
ORCHESTRATOR_DEADLINE_S = 120.0  # per orchestrator call, retries included


class SettingsError(ValueError):
    """The settings file or the environment is missing something or holds a bad value."""


@dataclass(frozen=True)
class WarmupSettings:
    steps: int = 500
    batch: int = 64
    learning_rate: float = 3e-3


@dataclass(frozen=True)
class TrainerSettings:
    seed: int = 1
    threads: int = 1
    warmup: WarmupSettings = WarmupSettings()
    steps: int = 80
    prompts_per_step: int = 32
    samples_per_prompt: int = 8
    steps_ahead: int = 2
    optimizer: str = "adamw"  # the only one this trainer has (the built-in one also has muon)
    learning_rate: float = 2e-5
    truncation: float = 2.0
    eval_problems: int = 500
    keyframe_interval: int = 50
    keyframe_budget: float | None = None  # None: the publisher's default
    delta_mode: str = "plain"  # or "context" (weft.Publisher)
    stall_after_s: float = 300.0
    min_step_time_s: float = 0.0


@dataclass(frozen=True)
class Settings:
    run_id: str
    max_staleness: int
    serving: str
    model: TinyLmConfig  # max_seq already set from the task
    digits: int
    trainer: TrainerSettings
    kind: str = "arithmetic"  # the workers' task
    dataset: str | None = None  # a JSONL prompt dataset; None: generated problems


@dataclass(frozen=True)
class Endpoints:
    store: str
    orchestrator: str
    trainer_token: str
    progress: str


def _read(section: Mapping[str, Any], key: str, kind: type, where: str, default: Any = None,
          minimum: float | None = None, nullable: bool = False) -> Any:
    """``section[key]`` checked to be a ``kind`` (an int is a float too; a bool is neither) at
    least ``minimum``; ``default`` when absent (an error if None)."""
    path = f"{where}.{key}" if where else key
    if key not in section:
        if default is None and not nullable:
            raise SettingsError(f"settings: {path} is missing")
        return default
    value = section[key]
    if value is None and nullable:
        return None
    accepted = (int, float) if kind is float else kind
    if isinstance(value, bool) or not isinstance(value, accepted):
        raise SettingsError(f"settings: {path} must be {kind.__name__}, not {json.dumps(value)}")
    if minimum is not None and value < minimum:
        raise SettingsError(f"settings: {path} must be at least {minimum}, not {value}")
    return float(value) if kind is float else value


def _section(parent: Mapping[str, Any], key: str, where: str = "") -> Mapping[str, Any]:
    value = parent.get(key, {})
    if not isinstance(value, dict):
        raise SettingsError(f"settings: {where + '.' if where else ''}{key} must be an object")
    return value


def parse_settings(document: Any) -> Settings:
    """Settings from the parsed ``WEFT_SETTINGS`` JSON; SettingsError names the bad key."""
    if not isinstance(document, dict):
        raise SettingsError("settings: the document must be a JSON object")
    task = _section(document, "task")
    if "name" in task:
        raise SettingsError("settings: task.name is not read; the task's kind is task.kind")
    kind = _read(task, "kind", str, "task", default="arithmetic")
    if kind not in TASK_KINDS:
        raise SettingsError(f"settings: task.kind is '{kind}'; this trainer runs with "
                            f"{', '.join(TASK_KINDS)}")
    digits = _read(task, "digits", int, "task", default=2, minimum=1)
    dataset = _read(task, "dataset", str, "task", nullable=True)
    prompt_tokens = _read(task, "max_prompt_tokens", int, "task", minimum=1, nullable=True)
    completion_tokens = _read(task, "max_tokens", int, "task", minimum=1, nullable=True)
    max_seq = ArithmeticTask(digits).max_length()
    if prompt_tokens is not None and completion_tokens is not None:
        max_seq = prompt_tokens + completion_tokens
    elif kind != "arithmetic":
        raise SettingsError(f"settings: task.max_prompt_tokens and task.max_tokens are needed for "
                            f"kind {kind}")
    if max_seq < ArithmeticTask(digits).max_length():
        raise SettingsError(
            f"settings: the workers' sequences are {max_seq} tokens (task.max_prompt_tokens + "
            f"task.max_tokens); this trainer's problems of {digits} digits with their answers "
            f"need {ArithmeticTask(digits).max_length()}")
    m = _section(document, "model")
    sequence = max_seq
    max_seq = _read(m, "max_seq", int, "model", default=sequence)
    if max_seq < sequence:
        raise SettingsError(f"settings: model.max_seq is {max_seq}; the workers' sequences are "
                            f"up to {sequence} tokens")
    vocab = _read(m, "vocab", int, "model", default=VOCAB)
    if vocab != VOCAB:
        raise SettingsError(f"settings: model.vocab is {vocab}; the arithmetic task needs {VOCAB}")
    defaults = TinyLmConfig()
    try:
        model = TinyLmConfig(
            vocab=VOCAB,
            d_model=_read(m, "d_model", int, "model", default=defaults.d_model, minimum=1),
            layers=_read(m, "layers", int, "model", default=defaults.layers, minimum=1),
            heads=_read(m, "heads", int, "model", default=defaults.heads, minimum=1),
            d_ff=_read(m, "d_ff", int, "model", default=defaults.d_ff, minimum=1),
            max_seq=max_seq)
    except ValueError as e:
        raise SettingsError(f"settings: model: {e}") from e
    t = _section(document, "trainer")
    optimizer = _read(t, "optimizer", str, "trainer", default=TrainerSettings.optimizer)
    if optimizer != "adamw":
        raise SettingsError(f"settings: trainer.optimizer is '{optimizer}'; this trainer has adamw "
                            f"only")
    algorithm = _read(t, "algorithm", str, "trainer", default="grpo")
    if algorithm != "grpo":
        raise SettingsError(f"settings: trainer.algorithm is '{algorithm}'; this trainer has grpo "
                            f"only (the built-in trainer also has rft and distill)")
    delta_mode = _read(t, "delta_mode", str, "trainer", default=TrainerSettings.delta_mode)
    if delta_mode not in ("plain", "context"):
        raise SettingsError(f"settings: trainer.delta_mode is '{delta_mode}', not plain or context")
    w = _section(t, "warmup", "trainer")
    base, base_warmup = TrainerSettings(), WarmupSettings()
    warmup = WarmupSettings(
        steps=_read(w, "steps", int, "trainer.warmup", default=base_warmup.steps, minimum=0),
        batch=_read(w, "batch", int, "trainer.warmup", default=base_warmup.batch, minimum=1),
        learning_rate=_read(w, "learning_rate", float, "trainer.warmup",
                            default=base_warmup.learning_rate, minimum=0))
    trainer = TrainerSettings(
        seed=_read(t, "seed", int, "trainer", default=base.seed, minimum=0),
        threads=_read(t, "threads", int, "trainer", default=base.threads, minimum=1),
        warmup=warmup,
        steps=_read(t, "steps", int, "trainer", default=base.steps, minimum=1),
        prompts_per_step=_read(t, "prompts_per_step", int, "trainer",
                               default=base.prompts_per_step, minimum=1),
        samples_per_prompt=_read(t, "samples_per_prompt", int, "trainer",
                                 default=base.samples_per_prompt, minimum=2),
        steps_ahead=_read(t, "steps_ahead", int, "trainer", default=base.steps_ahead, minimum=1),
        optimizer=optimizer,
        learning_rate=_read(t, "learning_rate", float, "trainer", default=base.learning_rate,
                            minimum=0),
        truncation=_read(t, "truncation", float, "trainer", default=base.truncation, minimum=0),
        eval_problems=_read(t, "eval_problems", int, "trainer", default=base.eval_problems,
                            minimum=1),
        keyframe_interval=_read(t, "keyframe_interval", int, "trainer",
                                default=base.keyframe_interval, minimum=1),
        keyframe_budget=_read(t, "keyframe_budget", float, "trainer", minimum=0, nullable=True),
        delta_mode=delta_mode,
        stall_after_s=_read(t, "stall_after_s", float, "trainer", default=base.stall_after_s,
                            minimum=0),
        min_step_time_s=_read(t, "min_step_time_s", float, "trainer",
                              default=base.min_step_time_s, minimum=0))
    return Settings(run_id=_read(document, "run_id", str, ""),
                    max_staleness=_read(document, "max_staleness", int, "", minimum=0),
                    serving=_read(document, "serving", str, "", default="bf16"),
                    model=model, digits=digits, trainer=trainer, kind=kind, dataset=dataset)


def load_settings(environ: Mapping[str, str]) -> tuple[Settings, Endpoints]:
    """The settings file named by ``WEFT_SETTINGS`` and the endpoints from ``environ``. The
    environment's run id and staleness bound must agree with the file's."""

    def need(name: str) -> str:
        value = environ.get(name, "")
        if not value:
            raise SettingsError(f"the environment variable {name} is not set")
        return value

    path = need("WEFT_SETTINGS")
    try:
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise SettingsError(f"cannot read the settings file {path}: {e}") from e
    settings = parse_settings(document)
    if environ.get("WEFT_RUN_ID", settings.run_id) != settings.run_id:
        raise SettingsError(f"WEFT_RUN_ID is '{environ['WEFT_RUN_ID']}' but {path} says run_id "
                            f"'{settings.run_id}'")
    staleness = environ.get("WEFT_MAX_STALENESS", str(settings.max_staleness))
    if staleness != str(settings.max_staleness):
        raise SettingsError(f"WEFT_MAX_STALENESS is '{staleness}' but {path} says max_staleness "
                            f"{settings.max_staleness}")
    endpoints = Endpoints(store=need("WEFT_STORE"), orchestrator=need("WEFT_ORCHESTRATOR"),
                          trainer_token=need("WEFT_TRAINER_TOKEN"), progress=need("WEFT_PROGRESS"))
    return settings, endpoints


@dataclass
class StepRecord:
    step: int = 0
    version: int = 0  # published after this step
    reward: float = 0.0  # the batch's mean reward
    groups: int = 0
    samples: int = 0
    mean_lag: float = 0.0  # trainer version - version_start, over the batch's groups
    max_lag: int = 0
    delta_bytes: int = 0  # this version's delta blob
    keyframe_bytes: int = 0  # ... and its keyframe, if it has one
    changed_elements: int = 0
    density: float = 0.0  # changed served elements / all served elements
    mean_ratio: float = 0.0  # importance ratio pi/mu over the batch's tokens
    truncated: float = 0.0  # fraction of tokens whose ratio was truncated
    seconds: float = 0.0  # since the RL phase began
    wait_seconds: float = 0.0  # in next_batch, waiting for the step's trajectories
    survivors: float = 0.0  # rejection sampling's (this trainer has GRPO only)
    reverse_kl: float = 0.0  # distillation's (this trainer has GRPO only)


@dataclass
class TrainerSummary:
    """What the progress file holds (TrainerSummary in examples/example_trainer.h)."""

    warmup_steps: int
    steps_total: int
    phase: str = "starting"  # starting, warm-up, rl, done
    warmup_step: int = 0
    warmup_loss: float = 0.0
    eval_accuracy_before: float = 0.0
    eval_accuracy_after: float = 0.0
    random_policy_reward: float = 0.0
    steps: list[StepRecord] = field(default_factory=list)
    versions_published: int = 0
    served_bytes: int = 0
    parameters: int = 0
    bytes_published: int = 0
    groups_stale_delivered: int = 0
    staleness_violations: int = 0
    groups_with_metadata: int = 0  # groups that came back with their job's metadata
    rewards_computed: int = 0  # samples that came without a reward, scored here
    initial_reward: float = 0.0
    final_reward: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """TrainerSummary::ToJson's fields in its order, then ``"trainer": "pytorch"``."""
        return {"phase": self.phase,
                "warmup_step": self.warmup_step,
                "warmup_loss": self.warmup_loss,
                "warmup_steps": self.warmup_steps,
                "steps_total": self.steps_total,
                "eval_accuracy_before": self.eval_accuracy_before,
                "eval_accuracy_after": self.eval_accuracy_after,
                "random_policy_reward": self.random_policy_reward,
                "initial_reward": self.initial_reward,
                "final_reward": self.final_reward,
                "versions_published": self.versions_published,
                "served_bytes": self.served_bytes,
                "parameters": self.parameters,
                "bytes_published": self.bytes_published,
                "groups_stale_delivered": self.groups_stale_delivered,
                "staleness_violations": self.staleness_violations,
                "groups_with_metadata": self.groups_with_metadata,
                "rewards_computed": self.rewards_computed,
                "algorithm": "grpo",
                "teacher_accuracy": None,
                "groups_scored": 0,
                "steps": [asdict(r) for r in self.steps],
                "trainer": "pytorch"}

    def update_rewards(self) -> None:
        """initial_reward / final_reward: the sample-weighted mean reward of the first / last
        REWARD_WINDOW steps."""
        window = min(REWARD_WINDOW, len(self.steps))
        self.initial_reward = mean_reward(self.steps[:window])
        self.final_reward = mean_reward(self.steps[len(self.steps) - window:])


def mean_reward(records: Sequence[StepRecord]) -> float:
    samples = sum(r.samples for r in records)
    return sum(r.reward * r.samples for r in records) / samples if samples else 0.0


def write_progress(path: str, summary: TrainerSummary) -> None:
    """Replaces ``path`` with the summary's JSON atomically (a temporary file, then a rename);
    a failure is reported on stderr and does not stop the training."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        with tempfile.NamedTemporaryFile("w", dir=directory, prefix=".trainer-", suffix=".json",
                                         delete=False, encoding="utf-8") as f:
            json.dump(summary.to_json(), f)
            temporary = f.name
        os.replace(temporary, path)
    except OSError as e:
        log(f"warning: cannot write {path}: {e}")


def log(message: str) -> None:
    print(f"torch trainer: {message}", file=sys.stderr, flush=True)


def to_group(received: Any, task: ArithmeticTask, max_seq: int | None = None) -> Group:
    """A weft.Group as grpo.Group (prompt tokenised, per-token versions kept); ValueError names the
    job and what is wrong. The prompt is text, tokenised as the embedded engine tokenises it, or
    token ids as the engine got them. A sample without a reward (``None``: the workers' task left
    it to the trainer) is scored with ``task`` on the prompt's text. Prompt plus completion must
    fit ``max_seq`` (default: the task's longest problem and answer)."""
    where = f"job {received.job}"
    limit = task.max_length() if max_seq is None else max_seq
    if isinstance(received.prompt, str):
        try:
            prompt = tokenize_text(received.prompt)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from e
        problem = received.prompt
    elif (isinstance(received.prompt, list) and received.prompt
          and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < VOCAB
                  for t in received.prompt)):
        prompt = list(received.prompt)
        problem = task.decode(prompt[1:] if prompt[0] == BEGIN else prompt)
    else:
        raise ValueError(f"{where}: the prompt must be text or token ids below {VOCAB}, not "
                         f"{json.dumps(received.prompt)}")
    group = Group(prompt=prompt)
    for i, s in enumerate(received.samples):
        tokens, logprobs, versions = list(s.tokens), list(s.logprobs), list(s.versions)
        if not tokens or len(tokens) != len(logprobs) or len(versions) != len(tokens):
            raise ValueError(f"{where} sample {i}: {len(tokens)} tokens, {len(logprobs)} logprobs "
                             f"and {len(versions)} versions (as many of each, at least one)")
        if not all(0 <= t < VOCAB for t in tokens):
            raise ValueError(f"{where} sample {i}: token ids outside [0, {VOCAB}): {tokens}")
        if len(prompt) + len(tokens) > limit:
            raise ValueError(f"{where} sample {i}: {len(tokens)} tokens after a prompt of "
                             f"{len(prompt)} are more than the model's {limit}")
        reward = task.reward(problem, tokens) if s.reward is None else float(s.reward)
        group.samples.append(Sample(tokens, logprobs, reward, versions))
    return group


class Trainer:
    """The training loop over injected weft bindings (the ``weft`` module in production; tests
    pass stand-ins with the same API)."""

    def __init__(self, settings: Settings, endpoints: Endpoints, weft: ModuleType,
                 progress: Callable[[TrainerSummary], None]) -> None:
        self.settings = settings
        self.endpoints = endpoints
        self.weft = weft
        self.progress = progress
        self.task = ArithmeticTask(settings.digits)
        t = settings.trainer
        self.rng = random.Random(t.seed)
        self.model = TinyLm(settings.model, torch.Generator().manual_seed(t.seed))
        eval_rng = random.Random(t.seed ^ 0xE7A1)
        self.eval_problems = [self.task.problem(eval_rng) for _ in range(t.eval_problems)]
        self.summary = TrainerSummary(warmup_steps=t.warmup.steps, steps_total=t.steps)
        self.waited = 0.0  # the current step's time in next_batch
        self.summary.parameters = sum(p.numel() for p in self.model.parameters())
        self.summary.random_policy_reward = sum(
            self.task.random_policy_reward(p) for p in self.eval_problems) / len(self.eval_problems)
        self.orchestrator: Any = None
        # The dataset is read before anything else, so that a bad line fails the run at once.
        self.dataset = [] if settings.dataset is None else weft.read_dataset(settings.dataset)
        self.next_prompt = 0  # the dataset's next row

    def run(self) -> TrainerSummary:
        t = self.settings.trainer
        self.progress(self.summary)
        self.warm_up()
        self.summary.eval_accuracy_before = greedy_accuracy(self.model, self.task,
                                                            self.eval_problems)
        log(f"warm-up done: loss {self.summary.warmup_loss:.4f}, greedy accuracy "
            f"{self.summary.eval_accuracy_before:.3f}")

        try:
            publisher = self.weft.Publisher(
                self.endpoints.store, self.settings.run_id, serving=self.settings.serving,
                keyframe_interval=t.keyframe_interval, keyframe_budget=t.keyframe_budget,
                delta_mode=t.delta_mode,
                threads=t.threads)
            first = publisher.start(self.model.state_dict())
        except self.weft.Error as e:
            raise RuntimeError(f"publishing version 0 to {self.endpoints.store}: {e}") from e
        self.summary.served_bytes = first.served_bytes
        self.summary.bytes_published += first.bytes_written
        self.summary.versions_published = 1
        version = first.version
        self.orchestrator = self.weft.Orchestrator(self.endpoints.orchestrator,
                                                   self.endpoints.trainer_token,
                                                   deadline=ORCHESTRATOR_DEADLINE_S)
        self.announce(version)
        batches = self.weft.BatchClient(self.endpoints.orchestrator, self.endpoints.trainer_token,
                                        max_staleness=self.settings.max_staleness,
                                        deadline=ORCHESTRATOR_DEADLINE_S)

        self.summary.phase = "rl"
        optimizer = Optimizer(self.model, OptimizerConfig(learning_rate=t.learning_rate))
        rules = PolicyGradientConfig(truncation=t.truncation,
                                     max_token_lag=self.settings.max_staleness)
        started = time.monotonic()
        for step in range(1, t.steps + 1):
            step_started = time.monotonic()
            self.top_up(t.prompts_per_step * min(t.steps_ahead, t.steps - step + 1))
            groups, lags = self.take_groups(batches, version, step)
            record = StepRecord(step=step, groups=len(groups),
                                samples=sum(len(g.samples) for g in groups),
                                max_lag=max(lags), mean_lag=sum(lags) / len(lags),
                                wait_seconds=self.waited)
            rewards = sum(s.reward for g in groups for s in g.samples)
            record.reward = rewards / record.samples if record.samples else 0.0
            stats = policy_gradient_step(self.model, optimizer, groups, rules, version)
            record.mean_ratio, record.truncated = stats.mean_ratio, stats.truncated
            if stats.masked_tokens:
                log(f"step {step}: {stats.masked_tokens} of {stats.tokens} tokens older than "
                    f"version {version - self.settings.max_staleness} got no weight")
            publishing = time.monotonic()
            try:
                published = publisher.publish(self.model.state_dict())
            except self.weft.Error as e:
                raise RuntimeError(f"publishing the version after step {step}: {e}") from e
            version = published.version
            record.version = version
            record.delta_bytes, record.keyframe_bytes = (published.delta_bytes,
                                                         published.keyframe_bytes)
            record.changed_elements, record.density = (published.changed_elements,
                                                       published.density)
            self.summary.bytes_published += published.bytes_written
            self.summary.versions_published += 1
            self.announce(version, time.monotonic() - publishing)
            record.seconds = time.monotonic() - started
            self.summary.steps.append(record)
            staleness = batches.staleness
            self.summary.groups_stale_delivered = staleness["stale_delivered"]
            self.summary.staleness_violations = staleness["violations"]
            self.summary.update_rewards()
            self.progress(self.summary)
            time.sleep(max(0.0, step_started + t.min_step_time_s - time.monotonic()))
        batches.acknowledge()
        self.summary.eval_accuracy_after = greedy_accuracy(self.model, self.task,
                                                           self.eval_problems)
        self.summary.phase = "done"
        self.progress(self.summary)
        return self.summary

    def warm_up(self) -> None:
        """The supervised warm-up, before version 0."""
        t = self.settings.trainer
        self.summary.phase = "warm-up"
        optimizer = Optimizer(self.model, OptimizerConfig(learning_rate=t.warmup.learning_rate))
        for step in range(1, t.warmup.steps + 1):
            self.summary.warmup_loss = supervised_step(self.model, optimizer, self.task, self.rng,
                                                       t.warmup.batch)
            self.summary.warmup_step = step
            if step % WARMUP_REPORT_EVERY == 0 or step == t.warmup.steps:
                self.progress(self.summary)

    def announce(self, version: int, publish_seconds: float | None = None) -> None:
        try:
            self.orchestrator.announce(version, publish_seconds)
        except self.weft.Error as e:
            raise RuntimeError(f"announcing version {version}: {e}") from e

    def top_up(self, want: int) -> None:
        """Queues prompts until ``want`` jobs are queued, leased or buffered at the orchestrator.
        An unavailable orchestrator (or a timeout) when adding is not fatal: the request may or
        may not have arrived, and the next top-up counts again and queues only what is missing."""
        try:
            status = self.orchestrator.status()
        except self.weft.Error as e:
            raise RuntimeError(f"asking the orchestrator's status: {e}") from e
        pending = (status["jobs"]["queued"] + status["jobs"]["leased"]
                   + status["trajectories"]["buffered"])
        if pending >= want:
            return
        samples = self.settings.trainer.samples_per_prompt
        if self.dataset:
            # The dataset's prompts in order, starting over at its end, each with its metadata.
            prompts = []
            for _ in range(want - pending):
                prompts.append(self.dataset[self.next_prompt].job(samples))
                self.next_prompt = (self.next_prompt + 1) % len(self.dataset)
        else:
            prompts = [self.task.problem(self.rng) for _ in range(want - pending)]
        try:
            self.orchestrator.add_jobs(prompts, samples=samples)
        except (self.weft.Unavailable, self.weft.Timeout) as e:
            log(f"warning: queueing prompts: {e}; will count again")
        except self.weft.Error as e:
            raise RuntimeError(f"queueing prompts: {e}") from e

    def take_groups(self, batches: Any, version: int, step: int) -> tuple[list[Group], list[int]]:
        """``prompts_per_step`` groups for this step and the lag of each; gives up (RuntimeError)
        after ``stall_after_s`` without a trajectory."""
        t = self.settings.trainer
        groups: list[Group] = []
        lags: list[int] = []
        last_arrival = time.monotonic()
        self.waited = 0.0
        while len(groups) < t.prompts_per_step:
            asked = time.monotonic()
            try:
                received = batches.next_batch(groups=t.prompts_per_step - len(groups),
                                              trainer_version=version, timeout=BATCH_TIMEOUT_S)
            except self.weft.Error as e:
                raise RuntimeError(f"taking a batch at step {step}: {e}") from e
            finally:
                self.waited += time.monotonic() - asked
            if received:
                last_arrival = time.monotonic()
            else:
                # Nothing came: the work for this step may have been dropped as stale. Queue what
                # is missing.
                self.top_up(t.prompts_per_step - len(groups))
            for r in received:
                try:
                    groups.append(to_group(r, self.task, self.settings.model.max_seq))
                except ValueError as e:
                    log(f"skipping a malformed trajectory group: {e}")
                    continue
                lags.append(r.lag)
                self.summary.rewards_computed += sum(1 for s in r.samples if s.reward is None)
                self.summary.groups_with_metadata += r.metadata is not None
            if time.monotonic() - last_arrival > t.stall_after_s:
                raise RuntimeError(f"no trajectories for {t.stall_after_s:g} s at step {step} (are "
                                   "any workers ready?)")
        return groups, lags


def main() -> int:
    try:
        settings, endpoints = load_settings(os.environ)
    except SettingsError as e:
        log(str(e))
        return 2
    try:
        import weft  # built into build/python; configs/local-torch.yaml puts it on PYTHONPATH
    except ImportError as e:
        log(f"cannot import the weft package ({e}); is PYTHONPATH set to build/python?")
        return 2
    torch.set_num_threads(settings.trainer.threads)
    torch.manual_seed(settings.trainer.seed)
    log(f"run {settings.run_id}: TinyLm {settings.model}, {settings.trainer.steps} RL steps of "
        f"{settings.trainer.prompts_per_step} x {settings.trainer.samples_per_prompt} samples, "
        f"max_staleness {settings.max_staleness}")
    try:
        trainer = Trainer(settings, endpoints, weft,
                          lambda s: write_progress(endpoints.progress, s))
        summary = trainer.run()
    except (RuntimeError, ValueError, weft.Error) as e:
        log(f"failed: {e}")
        return 1
    print(f"trained {len(summary.steps)} steps: reward {summary.initial_reward:.3f} -> "
          f"{summary.final_reward:.3f}, greedy accuracy {summary.eval_accuracy_before:.3f} -> "
          f"{summary.eval_accuracy_after:.3f} (random policy {summary.random_policy_reward:.5f}); "
          f"{summary.versions_published} versions published", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
