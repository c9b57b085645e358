"""The arithmetic task of examples/arithmetic_task.{h,cc}: adding two numbers written in digits.

A problem is text like ``"37+5="`` (operands of 1 to ``digits`` decimal digits); that text is the
prompt the trainer queues and the workers' task (``ArithmeticVerifier``) encodes and scores. The
answer is the sum's digits followed by the end token. Tokens: digits 0-9 are ids 0-9, ``+`` is 10,
``=`` is 11, the end token 12, and every prompt starts with the begin token 13 (vocabulary 16; 14
and 15 unused). The reward is 1 for exactly the answer's tokens, else 0.

Problems are drawn as in C++ (each operand uniform in [0, 10^digits)), from Python's generator
rather than ``std::mt19937_64``: the same distribution, other problems for a given seed.
"""

from __future__ import annotations

import random

PLUS, EQUALS, END, BEGIN, VOCAB = 10, 11, 12, 13, 16
_DIGITS = frozenset("0123456789")


class ArithmeticTask:
    def __init__(self, digits: int = 2) -> None:
        if digits < 1:
            raise ValueError(f"the arithmetic task needs operands of 1 digit or more, not {digits}")
        self.digits = digits

    def max_length(self) -> int:
        """The longest prompt plus answer, in tokens (the model's max_seq)."""
        return 1 + 2 * self.digits + 2 + (self.digits + 1) + 1

    def max_prompt_tokens(self) -> int:
        """The longest prompt: begin token, two operands, '+' and '=' (TaskLimits)."""
        return 2 * self.digits + 3

    def max_completion_tokens(self) -> int:
        """The longest answer: digits + 1 digits and the end token (TaskLimits)."""
        return self.digits + 2

    def problem(self, rng: random.Random) -> str:
        """A random problem, as text."""
        limit = 10 ** self.digits
        a, b = rng.randrange(limit), rng.randrange(limit)
        return f"{a}+{b}="

    def _operands(self, problem: str) -> tuple[int, int]:
        plus = problem.find("+")
        if plus < 0 or not problem.endswith("="):
            raise ValueError(f"problem '{problem}' is not of the form A+B=")

        def number(text: str) -> int:
            if not text or len(text) > self.digits or not set(text) <= _DIGITS:
                raise ValueError(f"problem '{problem}': '{text}' is not a number of 1 to "
                                 f"{self.digits} digits")
            return int(text)

        return number(problem[:plus]), number(problem[plus + 1:-1])

    def encode(self, problem: str) -> list[int]:
        """Text -> token ids, the begin token first. ValueError names what is wrong."""
        self._operands(problem)
        return [BEGIN] + [PLUS if c == "+" else EQUALS if c == "=" else int(c) for c in problem]

    def answer(self, problem: str) -> list[int]:
        """The correct answer's tokens: the sum's digits, then the end token."""
        a, b = self._operands(problem)
        return [int(c) for c in str(a + b)] + [END]

    def reward(self, problem: str, completion: list[int]) -> float:
        """1 when ``completion`` is exactly the answer's tokens, else 0 (also for a malformed
        problem)."""
        try:
            return 1.0 if self.answer(problem) == list(completion) else 0.0
        except ValueError:
            return 0.0

    @staticmethod
    def decode(tokens: list[int]) -> str:
        """Token ids -> text ('$' for the end token, '^' for begin, '?' for unused ids)."""
        special = {PLUS: "+", EQUALS: "=", END: "$", BEGIN: "^"}
        return "".join(str(t) if 0 <= t <= 9 else special.get(t, "?") for t in tokens)

    def random_policy_reward(self, problem: str) -> float:
        """The chance that a uniformly random policy answers ``problem`` right."""
        try:
            return (1.0 / VOCAB) ** len(self.answer(problem))
        except ValueError:
            return 0.0


def tokenize_text(text: str) -> list[int]:
    """Text -> token ids as the embedded engine tokenises a text prompt
    (``EmbeddedEngine::Tokenize`` in examples/embedded_engine.cc): the begin token, then one token
    per digit, ``+`` or ``=``; the same ids as ``ArithmeticTask.encode`` for a problem, for any text
    of those characters. ValueError names the first character outside them."""
    if not text:
        raise ValueError("the prompt is empty text")
    tokens = [BEGIN]
    for i, c in enumerate(text):
        if c in _DIGITS:
            tokens.append(int(c))
        elif c in "+=":
            tokens.append(PLUS if c == "+" else EQUALS)
        else:
            raise ValueError(f"the prompt's character {c!r} at offset {i} is not in the embedded "
                             "engine's vocabulary (the digits, '+' and '=')")
    return tokens
