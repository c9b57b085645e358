"""TinyLm in PyTorch: the example policy of examples/tiny_lm.{h,cc}, tensor for tensor.

The rollout workers run the C++ ``Decoder`` on the served (BF16) copy of the weights this module
publishes, so the two must compute the same function. What the C++ model is, and this module with
it:

- Token ids below ``vocab``; the input of position p is ``embed.tokens[token] +
  embed.positions[p]`` (learned absolute positions, ``max_seq`` of them).
- ``layers`` pre-norm blocks, each
  ``x += attn.out(attention(attn.qkv(rms_norm(x, attn_norm))))`` then
  ``x += mlp.down(relu(mlp.up(rms_norm(x, mlp_norm))))``.
- RMSNorm without a bias: ``gain * x / sqrt(mean(x^2) + 1e-5)``.
- Causal multi-head self-attention without biases: ``attn.qkv`` maps ``d_model`` to
  ``[q | k | v]`` (each ``d_model`` wide, head h using columns ``h*dh .. (h+1)*dh`` of each, with
  ``dh = d_model / heads``), scores ``q.k / sqrt(dh)``, softmax over positions up to the current.
- The output: ``rms_norm(x, final_norm)`` times ``unembed`` (untied from the embedding), then a
  log-softmax over the vocabulary.
- Every matrix is stored ``[in][out]`` and applied as ``y = x @ W`` (not ``nn.Linear``'s
  ``[out][in]``), which is the layout the C++ flat buffer has and the store holds.

``state_dict()`` holds exactly ``TinyLmLayout``'s tensors, by name, shape and order
(``parameter_layout``), so it can be published as it is and a worker's engine finds every tensor
it looks up. Initialisation follows ``TinyLmLayout::Initialize``: N(0, 0.02) matrices, the output
projections of the residual branches (``attn.out``, ``mlp.down``) at 0.02 / sqrt(2 * layers), unit
norm gains; the random numbers themselves differ (torch's generator, not ``std::mt19937_64``).

The C++ decoder runs token by token with a key/value cache; ``TinyLm.forward`` runs whole
sequences with a causal mask, which is the same function. Sequences of one batch may have
different lengths: right-pad them (a position never sees those after it, so padding changes
nothing before it).

The dense products go through oneDNN (``matmul_onednn``) when torch has it: Debian's torch does
them with the reference BLAS, several times slower on these shapes. ``matmul_reference`` (plain
``@``) is the definition; the tests check the two against each other, gradients included.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn

NORM_EPSILON = 1e-5  # kNormEpsilon in examples/tiny_lm.cc
INIT_STD = 0.02

Matmul = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # x [..., in] @ w [in, out]


@dataclass(frozen=True)
class TinyLmConfig:
    """The shape of the model (TinyLmConfig in examples/tiny_lm.h, same defaults)."""

    vocab: int = 16
    d_model: int = 96
    layers: int = 3
    heads: int = 4
    d_ff: int = 384
    max_seq: int = 24

    def __post_init__(self) -> None:
        for name in ("vocab", "d_model", "layers", "heads", "d_ff", "max_seq"):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"TinyLmConfig.{name} must be at least 1, not {getattr(self, name)}")
        if self.d_model % self.heads != 0:
            raise ValueError(
                f"TinyLmConfig.d_model ({self.d_model}) must be a multiple of heads ({self.heads})")


@dataclass(frozen=True)
class ParameterInfo:
    """One tensor of the layout: its name, shape and whether weight decay applies to it."""

    name: str
    shape: tuple[int, ...]
    decays: bool


def parameter_layout(config: TinyLmConfig) -> list[ParameterInfo]:
    """The tensors of ``TinyLmLayout`` (examples/tiny_lm.cc), in its order."""
    d, f, v, t = config.d_model, config.d_ff, config.vocab, config.max_seq
    layout = [ParameterInfo("embed.tokens", (v, d), True),
              ParameterInfo("embed.positions", (t, d), True)]
    for layer in range(config.layers):
        p = f"blocks.{layer}."
        layout += [ParameterInfo(p + "attn_norm", (d,), False),
                   ParameterInfo(p + "attn.qkv", (d, 3 * d), True),
                   ParameterInfo(p + "attn.out", (d, d), True),
                   ParameterInfo(p + "mlp_norm", (d,), False),
                   ParameterInfo(p + "mlp.up", (d, f), True),
                   ParameterInfo(p + "mlp.down", (f, d), True)]
    layout += [ParameterInfo("final_norm", (d,), False),
               ParameterInfo("unembed", (d, v), True)]
    return layout


def rms_norm(x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    """``gain * x / sqrt(mean(x^2) + 1e-5)`` over the last dimension."""
    return gain * x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + NORM_EPSILON)


def matmul_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w``: x [..., in], w [in, out]."""
    return x @ w


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` for 2-D tensors, computed by oneDNN."""
    return torch._C._nn.mkldnn_linear(x.contiguous().to_mkldnn(),
                                      weight.contiguous().to_mkldnn()).to_dense()


class _OneDnnMatmul(torch.autograd.Function):
    """``x @ w`` (2-D) with the forward and both backward products in oneDNN."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return _onednn_linear(x, w.t())

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        x, w = ctx.saved_tensors
        dx = _onednn_linear(dy, w) if ctx.needs_input_grad[0] else None
        dw = _onednn_linear(x.t(), dy.t()) if ctx.needs_input_grad[1] else None
        return dx, dw


def matmul_onednn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``matmul_reference`` through oneDNN: Debian's torch does its dense products with the
    reference BLAS, about 10 times slower on this model's shapes; oneDNN (built in) is not."""
    return _OneDnnMatmul.apply(x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], w.shape[1])


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch._C._nn, "mkldnn_linear")


def _matrix(rows: int, columns: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(rows, columns))


class Embeddings(nn.Module):
    def __init__(self, config: TinyLmConfig) -> None:
        super().__init__()
        self.tokens = _matrix(config.vocab, config.d_model)
        self.positions = _matrix(config.max_seq, config.d_model)


class Attention(nn.Module):
    def __init__(self, config: TinyLmConfig, matmul: Matmul) -> None:
        super().__init__()
        self.heads = config.heads
        self.matmul = matmul
        self.qkv = _matrix(config.d_model, 3 * config.d_model)
        self.out = _matrix(config.d_model, config.d_model)

    def forward(self, h: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
        batch, length, d = h.shape
        dh = d // self.heads
        q, k, v = self.matmul(h, self.qkv).split(d, dim=-1)
        # [batch, length, d] -> [batch, heads, length, dh]: head i is columns i*dh .. (i+1)*dh.
        q, k, v = (a.view(batch, length, self.heads, dh).transpose(1, 2) for a in (q, k, v))
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(dh))
        probs = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        att = (probs @ v).transpose(1, 2).reshape(batch, length, d)
        return self.matmul(att, self.out)


class Mlp(nn.Module):
    def __init__(self, config: TinyLmConfig, matmul: Matmul) -> None:
        super().__init__()
        self.matmul = matmul
        self.up = _matrix(config.d_model, config.d_ff)
        self.down = _matrix(config.d_ff, config.d_model)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.matmul(torch.relu(self.matmul(h, self.up)), self.down)


class Block(nn.Module):
    def __init__(self, config: TinyLmConfig, matmul: Matmul) -> None:
        super().__init__()
        self.attn_norm = nn.Parameter(torch.empty(config.d_model))
        self.attn = Attention(config, matmul)
        self.mlp_norm = nn.Parameter(torch.empty(config.d_model))
        self.mlp = Mlp(config, matmul)

    def forward(self, x: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(rms_norm(x, self.attn_norm), causal)
        return x + self.mlp(rms_norm(x, self.mlp_norm))


class TinyLm(nn.Module):
    """The policy. ``forward(tokens)`` gives the log-softmax over the next token at every
    position; ``logprobs(tokens)`` the log-probability of each token given those before it.
    Its dense products go through oneDNN when torch has it (``onednn=False``: plain ``@``)."""

    def __init__(self, config: TinyLmConfig, generator: torch.Generator | None = None,
                 onednn: bool = True) -> None:
        super().__init__()
        self.config = config
        self.matmul = matmul_onednn if onednn and onednn_available() else matmul_reference
        self.embed = Embeddings(config)
        self.blocks = nn.ModuleList(Block(config, self.matmul) for _ in range(config.layers))
        self.final_norm = nn.Parameter(torch.empty(config.d_model))
        self.unembed = _matrix(config.d_model, config.vocab)
        self.layout = parameter_layout(config)
        self.initialize(generator)

    @torch.no_grad()
    def initialize(self, generator: torch.Generator | None = None) -> None:
        """Fresh weights as ``TinyLmLayout::Initialize`` draws them (from ``generator``)."""
        residual_scale = 1.0 / math.sqrt(2.0 * self.config.layers)
        parameters = dict(self.named_parameters())
        for info in self.layout:
            tensor = parameters[info.name]
            if not info.decays:
                tensor.fill_(1.0)  # norm gains
                continue
            residual = info.name.endswith("attn.out") or info.name.endswith("mlp.down")
            tensor.normal_(0.0, INIT_STD * (residual_scale if residual else 1.0),
                           generator=generator)

    def state_dict(self, *, destination: OrderedDict | None = None, prefix: str = "",
                   keep_vars: bool = False) -> OrderedDict:
        """The tensors by name, in ``TinyLmLayout``'s order (PyTorch alone would list each
        module's own tensors, such as the norm gains, before its children's)."""
        destination = super().state_dict(destination=destination, prefix=prefix,
                                         keep_vars=keep_vars)
        for info in self.layout:
            destination.move_to_end(prefix + info.name)
        return destination

    def parameter_groups(self, weight_decay: float) -> list[dict]:
        """Optimizer groups: weight decay on the matrices and embeddings, never on norm gains
        (``ParameterInfo::decays``)."""
        parameters = dict(self.named_parameters())
        decaying = [parameters[i.name] for i in self.layout if i.decays]
        gains = [parameters[i.name] for i in self.layout if not i.decays]
        return [{"params": decaying, "weight_decay": weight_decay},
                {"params": gains, "weight_decay": 0.0}]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens`` [batch, length] (int64) -> log-softmax over the next token, [batch, length,
        vocab]: entry [b, p] is the distribution of the token after position p."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be [batch, length], not of shape {list(tokens.shape)}")
        length = tokens.shape[1]
        if not 1 <= length <= self.config.max_seq:
            raise ValueError(f"sequences must have 1 to {self.config.max_seq} tokens, not {length}")
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= self.config.vocab):
            raise ValueError(f"token ids must be in [0, {self.config.vocab}), got "
                             f"{int(tokens.min())} .. {int(tokens.max())}")
        x = self.embed.tokens[tokens] + self.embed.positions[:length]
        causal = torch.ones(length, length, dtype=torch.bool, device=tokens.device).tril()
        for block in self.blocks:
            x = block(x, causal)
        return self.matmul(rms_norm(x, self.final_norm), self.unembed).log_softmax(dim=-1)

    def logprobs(self, tokens: torch.Tensor) -> torch.Tensor:
        """Log-probability of each token after the first given those before it (teacher
        forcing, as ``Decoder::Score``): [batch, length] -> [batch, length - 1]."""
        logp = self(tokens[:, :-1])
        return logp.gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)

    @torch.no_grad()
    def greedy(self, prompts: Sequence[Sequence[int]], max_tokens: int,
               stop_token: int) -> list[list[int]]:
        """Greedy continuations (``Sampling.temperature = 0`` in the C++ decoder): up to
        ``max_tokens`` tokens (cut so that prompt plus continuation fit ``max_seq``), ending at
        ``stop_token`` (kept) when it comes. Ties go to the lowest token id, as in C++."""
        completions: list[list[int]] = [[] for _ in prompts]
        by_length: dict[int, list[int]] = {}
        for i, prompt in enumerate(prompts):
            if not 1 <= len(prompt) < self.config.max_seq:
                raise ValueError(f"prompt {i}: needs 1 to {self.config.max_seq - 1} tokens, "
                                 f"has {len(prompt)}")
            by_length.setdefault(len(prompt), []).append(i)
        # Prompts of one length decode together, so every sequence is at the same position.
        for length, members in by_length.items():
            budget = min(max_tokens, self.config.max_seq - length)
            sequences = torch.tensor([list(prompts[i]) for i in members], dtype=torch.long)
            running = torch.ones(len(members), dtype=torch.bool)
            for _ in range(budget):
                next_tokens = self(sequences)[:, -1].argmax(dim=-1)
                for row, member in enumerate(members):
                    if running[row]:
                        completions[member].append(int(next_tokens[row]))
                running &= next_tokens != stop_token
                if not running.any():
                    break
                sequences = torch.cat([sequences, next_tokens.unsqueeze(1)], dim=1)
        return completions

