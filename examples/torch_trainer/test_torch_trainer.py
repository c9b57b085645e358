"""Tests of the PyTorch trainer (``/usr/bin/python3 -m pytest examples/torch_trainer``); no weft
package needed.

What the C++ side defines is read from its sources (the tensor layout from examples/tiny_lm.cc,
the token ids from examples/arithmetic_task.h, the progress fields from examples/
example_trainer.cc), so a change there fails here. The model is checked against a literal
transcription of the C++ decoder's token-by-token step (``reference_logprobs``);
engine_agreement.py checks it against the C++ engine itself.
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import re
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import grpo
import model as tiny
import task as arithmetic
import train

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[2]
SMALL = tiny.TinyLmConfig(vocab=16, d_model=16, layers=2, heads=2, d_ff=24, max_seq=11)


# --- what the C++ sources say ---------------------------------------------------------------------


def cpp_layout(config: tiny.TinyLmConfig) -> list[tuple[str, tuple[int, ...], bool]]:
    """(name, shape, decays) of every tensor, as TinyLmLayout's constructor in tiny_lm.cc adds
    them."""
    source = (REPO / "examples/tiny_lm.cc").read_text()
    body = source[source.index("TinyLmLayout::TinyLmLayout("):]
    body = body[:body.index("\n}\n")]
    symbols = {s: getattr(config, field) for s, field in re.findall(r"(\w) = config\.(\w+)", body)}
    prefix = re.search(r'p = "([^"]*)" \+ std::to_string\(l\) \+ "([^"]*)"', body).groups()

    def dim(expression: str) -> int:
        return math.prod(int(f) if f.isdigit() else symbols[f]
                         for f in (x.strip() for x in expression.split("*")))

    before, per_layer, after = [], [], []
    for in_loop, name, shape, decays in re.findall(
            r'Add\((p \+ )?"([^"]+)", \{([^}]*)\}, (true|false)\)', body):
        entry = (name, tuple(dim(d) for d in shape.split(",")), decays == "true")
        (per_layer if in_loop else after if per_layer else before).append(entry)
    layers = [(f"{prefix[0]}{l}{prefix[1]}{name}", shape, decays)
              for l in range(config.layers) for name, shape, decays in per_layer]
    assert before and per_layer and after, "tiny_lm.cc's layout could not be read"
    return before + layers + after


def cpp_to_json_fields() -> tuple[list[str], list[str]]:
    """The top-level and per-step keys of TrainerSummary::ToJson, in order."""
    source = (REPO / "examples/example_trainer.cc").read_text()
    body = source[source.index("Json TrainerSummary::ToJson() const {"):]
    body = body[:body.index("\n}\n")]
    records, top = body.split("return Json{")
    return re.findall(r'\{"(\w+)", ', top), re.findall(r'\{"(\w+)", ', records)


# --- the model ------------------------------------------------------------------------------------


@pytest.mark.parametrize("config", [tiny.TinyLmConfig(max_seq=11), SMALL,
                                    tiny.TinyLmConfig(d_model=32, layers=5, heads=8, d_ff=7)])
def test_state_dict_is_the_cpp_layout(config: tiny.TinyLmConfig) -> None:
    model = tiny.TinyLm(config)
    expected = cpp_layout(config)
    assert [(name, tuple(t.shape)) for name, t in model.state_dict().items()] == \
        [(name, shape) for name, shape, _ in expected]
    assert [(i.name, i.shape, i.decays) for i in tiny.parameter_layout(config)] == expected
    assert all(t.dtype == torch.float32 for t in model.state_dict().values())


def test_default_model_has_the_documented_size() -> None:
    # docs/run.md: "about 340k parameters in the default config".
    model = tiny.TinyLm(tiny.TinyLmConfig(max_seq=arithmetic.ArithmeticTask(2).max_length()))
    assert sum(p.numel() for p in model.parameters()) == 336576


def test_initialization_scheme() -> None:
    config = tiny.TinyLmConfig(d_model=64, layers=4, heads=4, d_ff=256, max_seq=16)
    model = tiny.TinyLm(config, torch.Generator().manual_seed(3))
    residual = 0.02 / math.sqrt(2 * config.layers)
    for name, t in model.state_dict().items():
        if name.endswith("norm"):
            assert torch.all(t == 1.0), name
            continue
        std = residual if name.endswith(("attn.out", "mlp.down")) else 0.02
        assert abs(float(t.std()) - std) < 0.1 * std, name
        assert abs(float(t.mean())) < 0.1 * std, name
    again = tiny.TinyLm(config, torch.Generator().manual_seed(3))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 again.state_dict().values()))


def rms_norm_reference(x: np.ndarray, gain: np.ndarray) -> np.ndarray:
    return gain * x / np.sqrt(np.mean(x * x) + 1e-5)


def reference_logprobs(weights: dict[str, np.ndarray], config: tiny.TinyLmConfig,
                       tokens: list[int]) -> np.ndarray:
    """Run::Step of examples/tiny_lm.cc transcribed: one token at a time with a key/value cache,
    each head's scores and softmax written out; [len(tokens), vocab] log-softmax in float64."""
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    d, heads = config.d_model, config.heads
    dh = d // heads
    scale = 1.0 / math.sqrt(dh)
    keys = [np.zeros((config.max_seq, d)) for _ in range(config.layers)]
    values = [np.zeros((config.max_seq, d)) for _ in range(config.layers)]
    out = []
    for p, token in enumerate(tokens):
        x = w["embed.tokens"][token] + w["embed.positions"][p]
        for l in range(config.layers):
            b = f"blocks.{l}."
            h = rms_norm_reference(x, w[b + "attn_norm"])
            qkv = h @ w[b + "attn.qkv"]
            keys[l][p] = qkv[d:2 * d]
            values[l][p] = qkv[2 * d:]
            att = np.zeros(d)
            for head in range(heads):
                cols = slice(head * dh, (head + 1) * dh)
                scores = np.array([qkv[cols] @ keys[l][j, cols] * scale for j in range(p + 1)])
                probs = np.exp(scores - scores.max())
                probs /= probs.sum()
                att[cols] = sum(probs[j] * values[l][j, cols] for j in range(p + 1))
            x = x + att @ w[b + "attn.out"]
            h = rms_norm_reference(x, w[b + "mlp_norm"])
            x = x + np.maximum(0.0, h @ w[b + "mlp.up"]) @ w[b + "mlp.down"]
        logits = rms_norm_reference(x, w["final_norm"]) @ w["unembed"]
        top = logits.max()
        out.append(logits - (top + math.log(np.exp(logits - top).sum())))
    return np.array(out)


def spread_weights(model: tiny.TinyLm, seed: int) -> None:
    """Weights large enough that attention, norms and the ReLU all matter (N(0, 0.02) makes the
    network nearly linear and its outputs nearly uniform)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.named_parameters():
            if name.endswith("norm"):
                t.copy_(0.5 + torch.rand(t.shape, generator=g))
            else:
                t.normal_(0.0, 0.4, generator=g)


@pytest.mark.parametrize("onednn", [True, False])
def test_forward_is_the_cpp_token_by_token_step(onednn: bool) -> None:
    model = tiny.TinyLm(SMALL, onednn=onednn)
    spread_weights(model, 5)
    weights = {k: v.numpy() for k, v in model.state_dict().items()}
    rng = random.Random(5)
    sequences = [[rng.randrange(SMALL.vocab) for _ in range(n)] for n in (1, 4, 11, 11)]
    for tokens in sequences:
        expected = reference_logprobs(weights, SMALL, tokens)
        got = model(torch.tensor([tokens]))[0].detach().double().numpy()
        assert np.abs(got - expected).max() < 1e-4, tokens
        assert expected.std() > 0.5  # far from uniform: the check means something
        if len(tokens) < 2:
            continue
        scored = model.logprobs(torch.tensor([tokens]))[0].detach().double().numpy()
        assert np.allclose(scored, [expected[p, tokens[p + 1]] for p in range(len(tokens) - 1)],
                           atol=1e-4)


def test_right_padding_changes_nothing_before_it() -> None:
    model = tiny.TinyLm(SMALL)
    spread_weights(model, 6)
    short, long = [13, 3, 7, 10, 5, 11], [13, 3, 7, 10, 5, 7, 11, 1, 2]
    padded = torch.tensor([short + [0] * (len(long) - len(short)), long])
    together = model(padded)
    alone = model(torch.tensor([short]))
    assert torch.allclose(together[0, :len(short)], alone[0], atol=1e-6)


def test_onednn_and_reference_products_agree_with_gradients() -> None:
    fast, ref = tiny.TinyLm(SMALL, onednn=True), tiny.TinyLm(SMALL, onednn=False)
    spread_weights(fast, 7)
    ref.load_state_dict(fast.state_dict())
    tokens = torch.tensor([[13, 1, 2, 10, 3, 4, 11, 5, 7, 12], [13, 9, 10, 9, 11, 1, 8, 12, 0, 0]])
    for m in (fast, ref):
        m.logprobs(tokens).sum().backward()
    for (name, a), b in zip(fast.named_parameters(), ref.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-5), name


def test_greedy_follows_argmax_and_stops() -> None:
    model = tiny.TinyLm(SMALL)
    spread_weights(model, 8)
    prompts = [[13, 3, 10, 4, 11], [13, 3, 7, 10, 5, 11], [13, 1, 10, 2, 11]]
    completions = model.greedy(prompts, max_tokens=4, stop_token=12)
    weights = {k: v.numpy() for k, v in model.state_dict().items()}
    for prompt, completion in zip(prompts, completions):
        sequence, expected = list(prompt), []
        for _ in range(min(4, SMALL.max_seq - len(prompt))):
            token = int(np.argmax(reference_logprobs(weights, SMALL, sequence)[-1]))
            expected.append(token)
            sequence.append(token)
            if token == 12:
                break
        assert completion == expected


def test_forward_refuses_bad_input() -> None:
    model = tiny.TinyLm(SMALL)
    with pytest.raises(ValueError, match="1 to 11 tokens"):
        model(torch.zeros(1, 12, dtype=torch.long))
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 16\)"):
        model(torch.tensor([[13, 16]]))
    with pytest.raises(ValueError, match="multiple of heads"):
        tiny.TinyLmConfig(d_model=10, heads=4)


# --- the task -------------------------------------------------------------------------------------


def test_token_ids_are_the_cpp_ones() -> None:
    header = (REPO / "examples/arithmetic_task.h").read_text()
    ids = re.search(r"kPlus = (\d+), kEquals = (\d+), kEnd = (\d+), kBegin = (\d+), "
                    r"kVocab = (\d+);", header)
    assert tuple(map(int, ids.groups())) == (arithmetic.PLUS, arithmetic.EQUALS, arithmetic.END,
                                             arithmetic.BEGIN, arithmetic.VOCAB)


def test_encode_answer_reward() -> None:
    t = arithmetic.ArithmeticTask(2)
    assert t.encode("37+5=") == [13, 3, 7, 10, 5, 11]
    assert t.answer("37+5=") == [4, 2, 12]
    assert t.answer("99+99=") == [1, 9, 8, 12]
    assert t.answer("0+0=") == [0, 12]
    assert t.answer("07+3=") == [1, 0, 12]  # leading zeros read as C++'s stoull does
    assert t.reward("37+5=", [4, 2, 12]) == 1.0
    assert t.reward("37+5=", [4, 2]) == 0.0  # no end token
    assert t.reward("37+5=", [4, 2, 12, 12]) == 0.0
    assert t.reward("37+5=", [0, 4, 2, 12]) == 0.0
    assert t.reward("375=", [4, 2, 12]) == 0.0  # malformed problem: no reward, no error
    assert t.random_policy_reward("37+5=") == 16.0 ** -3
    assert t.random_policy_reward("99+99=") == 16.0 ** -4
    assert t.decode([13, 3, 7, 10, 5, 11, 4, 2, 12, 14]) == "^37+5=42$?"
    assert (t.max_length(), t.max_prompt_tokens(), t.max_completion_tokens()) == (11, 7, 4)
    assert arithmetic.ArithmeticTask(3).max_length() == 14


@pytest.mark.parametrize("problem, message", [
    ("37+5", "not of the form A\\+B="), ("375=", "not of the form"), ("+5=", "'' is not a number"),
    ("37+=", "'' is not a number"), ("123+4=", "'123' is not a number of 1 to 2 digits"),
    ("1+2+3=", "'2\\+3' is not a number"), ("a+1=", "'a' is not a number"),
    ("1+²=", "'²' is not a number"), ("", "not of the form")])
def test_malformed_problems_are_refused(problem: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        arithmetic.ArithmeticTask(2).encode(problem)


def test_problems_cover_the_operand_range() -> None:
    t, rng = arithmetic.ArithmeticTask(2), random.Random(1)
    problems = [t.problem(rng) for _ in range(2000)]
    operands = [int(x) for p in problems for x in p[:-1].split("+")]
    assert min(operands) == 0 and max(operands) == 99
    assert all(len(t.encode(p)) <= t.max_prompt_tokens() for p in problems)
    assert all(len(t.encode(p)) + len(t.answer(p)) <= t.max_length() for p in problems)


# --- the learning rules ---------------------------------------------------------------------------


class RecordingOptimizer:
    """Records the gradients a step hands it instead of applying them."""

    def __init__(self, model: tiny.TinyLm) -> None:
        self.model = model
        self.gradients: list[dict[str, torch.Tensor]] = []

    def step(self) -> float:
        self.gradients.append({n: p.grad.clone() for n, p in self.model.named_parameters()})
        self.model.zero_grad(set_to_none=True)
        return 0.0


def expected_gradient(model: tiny.TinyLm, groups: list[grpo.Group],
                      token_weights: list[list[list[float]]]) -> dict[str, torch.Tensor]:
    """The gradient of -sum weight * logprob, one unpadded sequence at a time."""
    model.zero_grad(set_to_none=True)
    loss = torch.zeros(())
    for group, weights in zip(groups, token_weights):
        for sample, w in zip(group.samples, weights):
            sequence = torch.tensor([group.prompt + sample.tokens])
            logprobs = model.logprobs(sequence)[0, len(group.prompt) - 1:]
            loss = loss - (torch.tensor(w) * logprobs).sum()
    loss.backward()
    gradient = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return gradient


def current_logprobs(model: tiny.TinyLm, prompt: list[int], tokens: list[int]) -> list[float]:
    with torch.no_grad():
        return model.logprobs(torch.tensor([prompt + tokens]))[0, len(prompt) - 1:].tolist()


def test_group_advantages() -> None:
    assert grpo.group_advantages([1, 0, 0, 1], 1e-6) == [1, -1, -1, 1]
    adv = grpo.group_advantages([1, 0, 0, 0], 1e-6)
    assert adv == pytest.approx([math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3),
                                 -1 / math.sqrt(3)])
    assert grpo.group_advantages([1, 1, 1], 1e-6) is None
    assert grpo.group_advantages([0.5, 0.5 + 1e-9], 1e-6) is None


def test_policy_gradient_step_weights_truncation_and_skipped_groups() -> None:
    model = tiny.TinyLm(SMALL)
    spread_weights(model, 9)
    prompt = [13, 3, 7, 10, 5, 11]
    samples = []
    for tokens, reward, shift in (([4, 2, 12], 1.0, 0.0), ([4, 3, 12], 0.0, math.log(3.0)),
                                  ([1, 12], 0.0, -0.5), ([4, 2, 12], 1.0, math.log(1.5))):
        pi = current_logprobs(model, prompt, tokens)
        # Behaviour logprobs such that pi / mu = exp(shift) for every token.
        samples.append(grpo.Sample(tokens, [p - shift for p in pi], reward, [5] * len(tokens)))
    varied = grpo.Group(prompt, samples)
    constant = grpo.Group([13, 1, 10, 2, 11], [grpo.Sample([3, 12], [-1.0, -1.0], 1.0, [5, 5]),
                                               grpo.Sample([3, 12], [-1.0, -1.0], 1.0, [5, 5])])
    optimizer = RecordingOptimizer(model)
    stats = grpo.policy_gradient_step(model, optimizer, [constant, varied],
                                      grpo.PolicyGradientConfig(truncation=2.0, max_token_lag=2),
                                      trainer_version=6)
    assert stats.groups_used == 1
    assert stats.tokens == 11 and stats.masked_tokens == 0
    ratios = [1.0] * 3 + [3.0] * 3 + [math.exp(-0.5)] * 2 + [1.5] * 3
    assert stats.mean_ratio == pytest.approx(sum(ratios) / 11, rel=1e-5)
    assert stats.truncated == pytest.approx(3 / 11)
    assert stats.max_log_ratio == pytest.approx(math.log(3.0), rel=1e-5)
    advantages = [1.0, -1.0, -1.0, 1.0]
    weights = [[a * min(r, 2.0) / 11] * len(s.tokens)
               for a, r, s in zip(advantages, (1.0, 3.0, math.exp(-0.5), 1.5), samples)]
    expected = expected_gradient(model, [varied], [weights])
    (got,) = optimizer.gradients
    for name in expected:
        assert torch.allclose(got[name], expected[name], rtol=1e-4, atol=1e-6), name


def test_token_lag_mask() -> None:
    model = tiny.TinyLm(SMALL)
    spread_weights(model, 10)
    prompt = [13, 2, 10, 2, 11]
    tokens = [[4, 12], [5, 12], [4, 12], [3, 12]]
    versions = [[7, 8], [8, 8], [6, 7], [9, 10]]  # at trainer version 10 with max lag 2: 8 is kept
    samples = [grpo.Sample(t, current_logprobs(model, prompt, t), r, v)
               for t, r, v in zip(tokens, (1.0, 0.0, 1.0, 0.0), versions)]
    group = grpo.Group(prompt, samples)
    optimizer = RecordingOptimizer(model)
    stats = grpo.policy_gradient_step(model, optimizer, [group],
                                      grpo.PolicyGradientConfig(max_token_lag=2),
                                      trainer_version=10)
    assert (stats.tokens, stats.masked_tokens) == (8, 3)
    kept = [[0, 1], [1, 1], [0, 0], [1, 1]]
    weights = [[a * k / 5 for k in keep] for a, keep in zip((1.0, -1.0, 1.0, -1.0), kept)]
    expected = expected_gradient(model, [group], [weights])
    for name in expected:
        assert torch.allclose(optimizer.gradients[0][name], expected[name], rtol=1e-4,
                              atol=1e-6), name
    # Without the bound, nothing is masked.
    stats = grpo.policy_gradient_step(model, RecordingOptimizer(model), [group],
                                      grpo.PolicyGradientConfig(max_token_lag=None), 10)
    assert stats.masked_tokens == 0


def test_no_weighted_token_no_step() -> None:
    model = tiny.TinyLm(SMALL)
    prompt = [13, 2, 10, 2, 11]
    group = grpo.Group(prompt, [grpo.Sample([4, 12], [-1.0, -1.0], r, [1, 1]) for r in (0.0, 1.0)])
    optimizer = RecordingOptimizer(model)
    stats = grpo.policy_gradient_step(model, optimizer, [group],
                                      grpo.PolicyGradientConfig(max_token_lag=2), 10)
    assert (stats.groups_used, stats.tokens, stats.masked_tokens) == (1, 2 * 2, 4)
    flat = grpo.Group(prompt, [grpo.Sample([4, 12], [-1.0, -1.0], 1.0, [10, 10])] * 2)
    stats = grpo.policy_gradient_step(model, optimizer, [flat], grpo.PolicyGradientConfig(), 10)
    assert stats.groups_used == 0
    assert optimizer.gradients == []


@pytest.mark.parametrize("sample, message", [
    (grpo.Sample([4, 12], [-1.0], 1.0), "group 0 sample 1: 2 tokens but 1 logprobs"),
    (grpo.Sample([], [], 1.0), "group 0 sample 1: 0 tokens"),
    (grpo.Sample([4, 12], [-1.0, -1.0], 1.0, [3]), "2 tokens but 1 versions"),
    (grpo.Sample([1] * 7, [-1.0] * 7, 1.0), "do not fit the model's 11 positions")])
def test_malformed_samples_change_nothing(sample: grpo.Sample, message: str) -> None:
    model = tiny.TinyLm(SMALL)
    before = copy.deepcopy(model.state_dict())
    group = grpo.Group([13, 2, 10, 2, 11], [grpo.Sample([4, 12], [-1.0, -1.0], 0.0), sample])
    optimizer = grpo.Optimizer(model, grpo.OptimizerConfig())
    with pytest.raises(ValueError, match=message):
        grpo.policy_gradient_step(model, optimizer, [group], grpo.PolicyGradientConfig(), 0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_prompt_without_tokens_is_refused() -> None:
    model = tiny.TinyLm(SMALL)
    samples = [grpo.Sample([4, 12], [-1.0, -1.0], r) for r in (0.0, 1.0)]
    groups = [grpo.Group([13, 2, 10, 2, 11], samples), grpo.Group([], samples)]
    with pytest.raises(ValueError, match="group 1: the prompt has no tokens"):
        grpo.policy_gradient_step(model, RecordingOptimizer(model), groups,
                                  grpo.PolicyGradientConfig(), 0)


def test_optimizer_is_the_cpp_adamw() -> None:
    # AdamW::Step of tiny_lm.cc on one tensor by hand: a clipped gradient, bias-corrected moments.
    model = tiny.TinyLm(SMALL)
    config = grpo.OptimizerConfig(learning_rate=0.1, clip_norm=1.0)
    optimizer = grpo.Optimizer(model, config)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    model.unembed.grad[0, 0], model.unembed.grad[0, 1] = 3.0, 4.0
    assert optimizer.step() == pytest.approx(5.0)
    moved = model.unembed.detach() - start["unembed"]
    for (i, j), g in (((0, 0), 0.6), ((0, 1), 0.8)):
        m_hat, v_hat = g, g * g  # one step: the bias corrections undo the (1 - beta) factors
        assert float(moved[i, j]) == pytest.approx(-0.1 * m_hat / (math.sqrt(v_hat) + 1e-8),
                                                   rel=1e-5)
    assert torch.count_nonzero(moved) == 2
    assert optimizer.adamw.defaults["betas"] == (0.9, 0.95)
    assert optimizer.adamw.defaults["eps"] == 1e-8
    assert [g["weight_decay"] for g in optimizer.adamw.param_groups] == [0.0, 0.0]


def test_warm_up_lowers_the_loss() -> None:
    t = arithmetic.ArithmeticTask(2)
    model = tiny.TinyLm(tiny.TinyLmConfig(d_model=32, layers=1, heads=2, d_ff=64,
                                          max_seq=t.max_length()), torch.Generator().manual_seed(1))
    optimizer = grpo.Optimizer(model, grpo.OptimizerConfig(learning_rate=3e-3))
    rng = random.Random(1)
    losses = [grpo.supervised_step(model, optimizer, t, rng, 32) for _ in range(40)]
    assert losses[0] == pytest.approx(math.log(16), abs=0.1)  # a fresh model is near uniform
    assert sum(losses[-5:]) / 5 < losses[0] - 0.8


def test_greedy_accuracy_counts_exact_answers() -> None:
    t = arithmetic.ArithmeticTask(1)
    model = tiny.TinyLm(tiny.TinyLmConfig(d_model=16, layers=1, heads=2, d_ff=16,
                                          max_seq=t.max_length()))
    with torch.no_grad():  # a model that always answers "3$": right for 1+2= and 0+3= only
        model.unembed.zero_()
        for p in model.blocks.parameters():
            p.zero_()
        model.embed.tokens.zero_()
        model.embed.positions.fill_(1.0)
        model.unembed[:, 3] = 1.0
        model.embed.positions[5:] = -1.0  # after the first answer token, prefer the end token
        model.unembed[:, 12] = -1.0
    assert model.greedy([t.encode("1+2=")], 3, arithmetic.END) == [[3, 12]]
    assert grpo.greedy_accuracy(model, t, ["1+2=", "0+3=", "4+4=", "9+9="]) == 0.5


# --- the trainer ----------------------------------------------------------------------------------


def settings_document(**trainer: object) -> dict:
    base = {"seed": 3, "threads": 1, "warmup": {"steps": 4, "batch": 8, "learning_rate": 3e-3},
            "steps": 3, "prompts_per_step": 3, "samples_per_prompt": 4, "steps_ahead": 2,
            "learning_rate": 1e-3, "truncation": 2.0, "eval_problems": 10,
            "keyframe_interval": 50, "keyframe_budget": 0.5, "delta_mode": "context",
            "stall_after_s": 5.0, "min_step_time_s": 0.0}
    base.update(trainer)
    return {"run_id": "test-run", "max_staleness": 2, "serving": "bf16",
            "model": {"vocab": 16, "d_model": 16, "layers": 1, "heads": 2, "d_ff": 16,
                      "max_seq": 11},
            "task": {"kind": "arithmetic", "digits": 2}, "trainer": base}


def test_settings() -> None:
    s = train.parse_settings(settings_document())
    assert s.model == tiny.TinyLmConfig(vocab=16, d_model=16, layers=1, heads=2, d_ff=16,
                                        max_seq=11)
    assert (s.run_id, s.max_staleness, s.serving, s.digits) == ("test-run", 2, "bf16", 2)
    assert s.trainer.warmup == train.WarmupSettings(4, 8, 3e-3)
    assert s.trainer.keyframe_budget == 0.5 and s.trainer.stall_after_s == 5.0
    assert s.trainer.delta_mode == "context"
    document = settings_document()
    del document["trainer"]["min_step_time_s"]
    document["trainer"]["keyframe_budget"] = None
    s = train.parse_settings(document)
    assert s.trainer.min_step_time_s == 0.0 and s.trainer.keyframe_budget is None
    assert (s.kind, s.dataset) == ("arithmetic", None)
    # A model with more positions than the task needs (the run's model.context); none given: the
    # task's.
    document = settings_document()
    document["model"]["max_seq"] = 16
    assert train.parse_settings(document).model.max_seq == 16
    del document["model"]["max_seq"]
    assert train.parse_settings(document).model.max_seq == 11
    # A task at the text level: the model's positions are the workers' prompt plus completion.
    document = settings_document()
    document["task"] = {"kind": "http", "digits": 2, "dataset": "/data/prompts.jsonl",
                        "max_prompt_tokens": 16, "max_tokens": 8, "stop_token": 12}
    del document["model"]["max_seq"]
    s = train.parse_settings(document)
    assert (s.kind, s.dataset, s.digits, s.model.max_seq) == ("http", "/data/prompts.jsonl", 2, 24)


@pytest.mark.parametrize("change, message", [
    (lambda d: d["trainer"].update(samples_per_prompt=1), "trainer.samples_per_prompt must be at "
                                                          "least 2, not 1"),
    (lambda d: d["trainer"]["warmup"].update(steps="5"),
     'trainer.warmup.steps must be int, not "5"'),
    (lambda d: d["trainer"].update(steps=True), "trainer.steps must be int, not true"),
    (lambda d: d["trainer"].update(algorithm="rft"), "trainer.algorithm is 'rft'; this trainer "
     "has grpo only"),
    (lambda d: d["trainer"].update(optimizer="muon"), "trainer.optimizer is 'muon'; this trainer "
                                                      "has adamw only"),
    (lambda d: d["task"].update(kind="chess"), "task.kind is 'chess'"),
    (lambda d: d["task"].update(name="arithmetic"), "task.name is not read; the task's kind is "
                                                    "task.kind"),
    (lambda d: d["task"].update(kind="trainer"), "task.max_prompt_tokens and task.max_tokens are "
                                                 "needed for kind trainer"),
    (lambda d: d["task"].update(max_prompt_tokens=5, max_tokens=4),
     "the workers' sequences are 9 tokens"),
    (lambda d: d["task"].update(dataset=7), "task.dataset must be str"),
    (lambda d: d["model"].update(vocab=32), "model.vocab is 32"),
    (lambda d: d["model"].update(heads=3), "multiple of heads"),
    (lambda d: d["model"].update(max_seq=10),
     "model.max_seq is 10; the workers' sequences are up to 11 tokens"),
    (lambda d: d.pop("max_staleness"), "max_staleness is missing"),
    (lambda d: d.update(trainer=[]), "trainer must be an object")])
def test_bad_settings_are_named(change, message: str) -> None:
    document = settings_document()
    change(document)
    with pytest.raises(train.SettingsError, match=message):
        train.parse_settings(document)


def test_environment(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps(settings_document()))
    env = {"WEFT_SETTINGS": str(path), "WEFT_STORE": "dir", "WEFT_RUN_ID": "test-run",
           "WEFT_ORCHESTRATOR": "http://o", "WEFT_TRAINER_TOKEN": "t", "WEFT_MAX_STALENESS": "2",
           "WEFT_PROGRESS": str(tmp_path / "p.json")}
    settings, endpoints = train.load_settings(env)
    assert endpoints == train.Endpoints("dir", "http://o", "t", str(tmp_path / "p.json"))
    with pytest.raises(train.SettingsError, match="WEFT_MAX_STALENESS is '3'"):
        train.load_settings({**env, "WEFT_MAX_STALENESS": "3"})
    with pytest.raises(train.SettingsError, match="WEFT_ORCHESTRATOR is not set"):
        train.load_settings({k: v for k, v in env.items() if k != "WEFT_ORCHESTRATOR"})
    path.write_text("{")
    with pytest.raises(train.SettingsError, match="cannot read the settings file"):
        train.load_settings(env)


def test_progress_has_the_cpp_fields(tmp_path: Path) -> None:
    top, per_step = cpp_to_json_fields()
    summary = train.TrainerSummary(warmup_steps=5, steps_total=7)
    summary.steps.append(train.StepRecord(step=1, samples=8, reward=0.5))
    path = tmp_path / "trainer.json"
    train.write_progress(str(path), summary)
    written = json.loads(path.read_text())
    assert list(written) == top + ["trainer"]
    assert list(written["steps"][0]) == per_step
    assert written["trainer"] == "pytorch" and written["phase"] == "starting"
    assert os.listdir(tmp_path) == ["trainer.json"]  # no temporary file left


def test_reward_window_is_sample_weighted() -> None:
    summary = train.TrainerSummary(warmup_steps=0, steps_total=10)
    for i in range(7):
        summary.steps.append(train.StepRecord(step=i + 1, reward=i / 10, samples=10 + i))
    summary.update_rewards()
    first, last = summary.steps[:5], summary.steps[2:]
    assert summary.initial_reward == pytest.approx(
        sum(r.reward * r.samples for r in first) / sum(r.samples for r in first))
    assert summary.final_reward == pytest.approx(
        sum(r.reward * r.samples for r in last) / sum(r.samples for r in last))


class FakeWeft:
    """The weft API of the trainer's contract, in memory: workers that sample from the last
    announced version (FP32, so every importance ratio is 1)."""

    class Error(Exception):
        pass

    class Unavailable(Error):
        pass

    class Timeout(Error):
        pass

    def __init__(self, config: tiny.TinyLmConfig, digits: int, unavailable_adds: int = 0,
                 deliver: bool = True, rewards: bool = True,
                 dataset: list[dict] | None = None) -> None:
        self.config, self.task = config, arithmetic.ArithmeticTask(digits)
        self.published: list[dict[str, torch.Tensor]] = []
        self.announced: list[int] = []
        self.queue: list[tuple[object, object]] = []  # (prompt, metadata) of the jobs added
        self.unavailable_adds = unavailable_adds
        self.deliver = deliver
        self.rewards = rewards  # False: the workers' task leaves rewards to the trainer
        self.dataset = dataset or []
        self.datasets_read: list[str] = []
        self.acknowledged = False
        self.delivered = 0
        fake = self

        class Publisher:
            def __init__(self, store: str, run: str, **options: object) -> None:
                assert (store, run, options["serving"]) == ("memory", "test-run", "bf16")

            def _result(self, state: dict) -> types.SimpleNamespace:
                fake.published.append(copy.deepcopy(state))
                n = sum(t.numel() for t in state.values())
                return types.SimpleNamespace(version=len(fake.published) - 1, bytes_written=100,
                                             delta_bytes=60, keyframe_bytes=40,
                                             served_bytes=2 * n, changed_elements=n // 2,
                                             density=0.5, elements=n)

            start = publish = _result

        class Orchestrator:
            def __init__(self, url: str, token: str, deadline: float) -> None:
                pass

            def announce(self, version: int, publish_seconds: float | None = None) -> None:
                assert publish_seconds is None or publish_seconds >= 0
                fake.announced.append(version)

            def add_jobs(self, prompts: list, samples: int) -> list[int]:
                if fake.unavailable_adds:
                    fake.unavailable_adds -= 1
                    raise FakeWeft.Unavailable("orchestrator restarting")
                fake.queue += [(p["prompt"], p.get("metadata")) if isinstance(p, dict) else (p, None)
                               for p in prompts]
                return list(range(len(prompts)))

            def status(self) -> dict:
                return {"jobs": {"queued": len(fake.queue), "leased": 0},
                        "trajectories": {"buffered": 0}}

        class BatchClient:
            def __init__(self, url: str, token: str, max_staleness: int, deadline: float) -> None:
                self.staleness = {"stale_delivered": 0, "violations": 0}

            def next_batch(self, groups: int, trainer_version: int,
                           timeout: float) -> list[types.SimpleNamespace]:
                taken = [] if not fake.deliver else fake.queue[:groups]
                del fake.queue[:len(taken)]
                return [fake.sample_group(p, m, trainer_version) for p, m in taken]

            def acknowledge(self) -> None:
                fake.acknowledged = True

        self.Publisher, self.Orchestrator, self.BatchClient = Publisher, Orchestrator, BatchClient

    def read_dataset(self, path: str) -> list[types.SimpleNamespace]:
        """weft.read_dataset over the rows given to the constructor."""
        self.datasets_read.append(path)
        return [types.SimpleNamespace(job=lambda n, r=r: {"prompt": r["prompt"], "samples": n,
                                                          "metadata": r.get("metadata")})
                for r in self.dataset]

    def sample_group(self, prompt_json: object, metadata: object,
                     trainer_version: int) -> types.SimpleNamespace:
        version = self.announced[-1]
        policy = tiny.TinyLm(self.config)
        policy.load_state_dict(self.published[version])
        prompt = (arithmetic.tokenize_text(prompt_json) if isinstance(prompt_json, str)
                  else list(prompt_json))
        problem = self.task.decode(prompt[1:])
        samples = []
        for _ in range(4):
            tokens, logprobs = [], []
            with torch.no_grad():
                while len(tokens) < self.task.max_completion_tokens():
                    logp = policy(torch.tensor([prompt + tokens]))[0, -1]
                    token = int(torch.multinomial(logp.exp(), 1))
                    tokens.append(token)
                    logprobs.append(float(logp[token]))
                    if token == arithmetic.END:
                        break
            samples.append(types.SimpleNamespace(tokens=tokens, logprobs=logprobs,
                                                 reward=self.task.reward(problem, tokens),
                                                 versions=[version] * len(tokens)))
        # Every few groups one answer is made right, so that groups carry a learning signal.
        samples[0].tokens = self.task.answer(problem)
        samples[0].logprobs = current_logprobs(policy, prompt, samples[0].tokens)
        samples[0].versions = [version] * len(samples[0].tokens)
        samples[0].reward = 1.0
        if not self.rewards:
            for s in samples:
                s.reward = None
        self.delivered += 1
        return types.SimpleNamespace(job=self.delivered, prompt=prompt_json, metadata=metadata,
                                     version_start=version, version_end=version,
                                     segments=[(version, 0)], stale=False,
                                     lag=trainer_version - version, samples=samples)


def make_trainer(fake: FakeWeft, progress: list[dict], **trainer: object) -> train.Trainer:
    settings = train.parse_settings(settings_document(**trainer))
    endpoints = train.Endpoints("memory", "http://o", "t", "unused")
    return train.Trainer(settings, endpoints, fake, lambda s: progress.append(s.to_json()))


def test_training_loop_against_a_fake_weft() -> None:
    torch.manual_seed(0)
    settings = train.parse_settings(settings_document())
    fake = FakeWeft(settings.model, settings.digits, unavailable_adds=1)
    progress: list[dict] = []
    summary = make_trainer(fake, progress).run()
    assert [p["phase"] for p in progress] == ["starting", "warm-up", "rl", "rl", "rl", "done"]
    assert progress[1]["warmup_step"] == 4 and progress[1]["warmup_loss"] > 0
    assert fake.announced == [0, 1, 2, 3] and len(fake.published) == 4
    assert fake.acknowledged
    assert summary.versions_published == 4 and summary.bytes_published == 400
    assert summary.parameters == sum(t.numel() for t in fake.published[0].values())
    assert [r.version for r in summary.steps] == [1, 2, 3]
    for record in summary.steps:
        assert (record.groups, record.samples, record.max_lag, record.mean_lag) == (3, 12, 0, 0.0)
        assert record.mean_ratio == pytest.approx(1.0, abs=1e-4)  # on-policy, FP32
        assert (record.delta_bytes, record.keyframe_bytes, record.density) == (60, 40, 0.5)
        assert 0.25 <= record.reward <= 1.0
    assert summary.random_policy_reward > 0
    assert not torch.equal(fake.published[0]["unembed"], fake.published[3]["unembed"])


def test_training_from_a_dataset_with_rewards_left_to_the_trainer() -> None:
    """Prompts from the dataset in order, cycling, with their metadata; the workers send no
    reward, and the trainer scores every sample with its task."""
    torch.manual_seed(0)
    document = settings_document()
    document["task"] = {"kind": "trainer", "digits": 2, "dataset": "prompts.jsonl",
                        "max_prompt_tokens": 7, "max_tokens": 4}
    settings = train.parse_settings(document)
    rows = [{"prompt": "12+34=", "metadata": {"answer": "46"}}, {"prompt": "5+5="},
            {"prompt": [13, 9, 10, 9, 11], "metadata": {"answer": "18"}}]
    fake = FakeWeft(settings.model, settings.digits, rewards=False, dataset=rows)
    queued: list = []
    add_jobs = fake.Orchestrator.add_jobs
    fake.Orchestrator.add_jobs = lambda self, prompts, samples: (queued.extend(prompts),
                                                                 add_jobs(self, prompts, samples))[1]
    endpoints = train.Endpoints("memory", "http://o", "t", "unused")
    summary = train.Trainer(settings, endpoints, fake, lambda s: None).run()
    assert fake.datasets_read == ["prompts.jsonl"]
    assert [q["prompt"] for q in queued] == [rows[i % 3]["prompt"] for i in range(len(queued))]
    assert [q["metadata"] for q in queued][:3] == [{"answer": "46"}, None, {"answer": "18"}]
    assert all(q["samples"] == 4 for q in queued)
    groups = sum(r.groups for r in summary.steps)
    assert summary.rewards_computed == 4 * groups  # every sample, scored by the trainer
    assert summary.groups_with_metadata == sum(1 for q in queued[:groups] if q["metadata"])
    for record in summary.steps:
        assert 0.25 <= record.reward <= 1.0  # the fake's right answers, scored here


def test_training_gives_up_after_stall() -> None:
    settings = train.parse_settings(settings_document())
    fake = FakeWeft(settings.model, settings.digits, deliver=False)
    trainer = make_trainer(fake, [], stall_after_s=0.0)
    with pytest.raises(RuntimeError, match="no trajectories for 0 s at step 1"):
        trainer.run()


def test_malformed_groups_are_refused_by_name() -> None:
    t = arithmetic.ArithmeticTask(2)
    good = types.SimpleNamespace(tokens=[3, 12], logprobs=[-1.0, -1.0], reward=0.0, versions=[0, 0])
    for prompt, samples, message in (
            ([13, 16], [good], "job 7: the prompt must be text or token ids below 16, not "
                               "\\[13, 16\\]"),
            ({"text": "1+2="}, [good], "job 7: the prompt must be text or token ids"),
            ("1+x=", [good], "job 7: the prompt's character 'x' at offset 2 is not in the "
                             "embedded engine's vocabulary"),
            ("1+2=", [types.SimpleNamespace(tokens=[3, 12], logprobs=[-1.0], reward=0.0,
                                            versions=[0, 0])],
             "job 7 sample 0: 2 tokens, 1 logprobs"),
            ("1+2=", [types.SimpleNamespace(tokens=[3, 16], logprobs=[-1.0, -1.0], reward=0.0,
                                            versions=[0, 0])], "outside \\[0, 16\\)")):
        with pytest.raises(ValueError, match=message):
            train.to_group(types.SimpleNamespace(job=7, prompt=prompt, samples=samples), t)
    group = train.to_group(types.SimpleNamespace(job=7, prompt="1+2=", samples=[good]), t)
    assert group.prompt == [13, 1, 10, 2, 11] and group.samples[0].versions == [0, 0]
    # Token-id prompts as the engine got them; samples without a reward scored with the task.
    unscored = [types.SimpleNamespace(tokens=[3, 12], logprobs=[-1.0, -1.0], reward=None,
                                      versions=[0, 0]),
                types.SimpleNamespace(tokens=[4, 12], logprobs=[-1.0, -1.0], reward=None,
                                      versions=[0, 0])]
    group = train.to_group(types.SimpleNamespace(job=7, prompt=[13, 1, 10, 2, 11],
                                                 samples=unscored), t)
    assert group.prompt == [13, 1, 10, 2, 11]
    assert [s.reward for s in group.samples] == [1.0, 0.0]
    # Text that is no problem tokenises all the same, and earns nothing.
    group = train.to_group(types.SimpleNamespace(job=7, prompt="1+2", samples=unscored[:1]), t)
    assert group.prompt == [13, 1, 10, 2] and group.samples[0].reward == 0.0


def test_text_prompts_are_tokenised_as_the_engine_does() -> None:
    t = arithmetic.ArithmeticTask(2)
    rng = random.Random(3)
    for _ in range(50):
        problem = t.problem(rng)
        assert arithmetic.tokenize_text(problem) == t.encode(problem)
    assert arithmetic.tokenize_text("1+=") == [arithmetic.BEGIN, 1, arithmetic.PLUS,
                                               arithmetic.EQUALS]
    with pytest.raises(ValueError, match="character ' ' at offset 2"):
        arithmetic.tokenize_text("12 + 3=")
    with pytest.raises(ValueError, match="empty"):
        arithmetic.tokenize_text("")


def test_local_torch_config_is_local_yaml_with_the_pytorch_trainer() -> None:
    def lines(name: str) -> list[str]:
        text = (REPO / "configs" / name).read_text()
        stripped = (re.sub(r"\s+#.*$", "", line).rstrip() for line in text.splitlines())
        return [line for line in stripped if line and not line.lstrip().startswith("#")]

    def shifted(line: str) -> str:
        line = re.sub(r"127\.0\.0\.1:(\d+)", lambda m: f"127.0.0.1:{int(m.group(1)) + 100}", line)
        return line.replace("id: local", "id: local-torch").replace("runs/local",
                                                                    "runs/local-torch")

    expected = [shifted(line) for line in lines("local.yaml")]
    trainer = expected.index("trainer:") + 1
    expected[trainer:trainer] = [
        "  command: [/usr/bin/python3, examples/torch_trainer/train.py]",
        "  env: {PYTHONPATH: build/python}"]
    # The one setting that differs: a longer warm-up (the config says why).
    warmup = expected.index("  warmup: {steps: 500, batch: 64, learning_rate: 3e-3}")
    expected[warmup] = "  warmup: {steps: 800, batch: 64, learning_rate: 3e-3}"
    assert lines("local-torch.yaml") == expected
