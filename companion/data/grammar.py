"""The offline stand-in for Penn Treebank: a corpus with a known entropy rate.

:class:`StochasticGrammar` is a small probabilistic finite-state grammar of English-like
sentences, and :func:`write_grammar_corpus` samples it deterministically into
``train.txt``/``test.txt`` (read by ``needle.data.Corpus``), so every notebook runs with no
download. Because the grammar is *unifilar* (the current state and the emitted word fix the next
state), the state is a function of the text seen so far, and the entropy rate of the token
stream is exactly H = Σ_s π(s) H(word | s) (π the stationary distribution of the state chain).
No model can beat the perplexity exp(H) on this text; :func:`grammar_entropy_rate` returns H in
nats. Plain numpy: it needs nothing from needle.
"""

from __future__ import annotations

import math
import os
from typing import Dict, List, Sequence

import numpy as np

__all__ = ["StochasticGrammar", "default_grammar", "grammar_entropy_rate", "write_grammar_corpus"]


_WORDS = {
    "DSG": ["a", "every", "one", "this"],
    "DPL": ["some", "many", "two", "these"],
    "THE": ["the"],
    "ADJ": ["big", "small", "red", "old", "young", "happy", "quiet", "clever", "green", "tall"],
    "NSG": [
        "dog",
        "cat",
        "bird",
        "child",
        "teacher",
        "farmer",
        "robot",
        "horse",
        "student",
        "doctor",
    ],
    "NPL": [
        "dogs",
        "cats",
        "birds",
        "children",
        "teachers",
        "farmers",
        "robots",
        "horses",
        "students",
        "doctors",
    ],
    "VSG": ["sees", "likes", "follows", "helps", "chases", "finds"],
    "VPL": ["see", "like", "follow", "help", "chase", "find"],
    "ISG": ["runs", "sleeps", "sings", "waits"],
    "IPL": ["run", "sleep", "sing", "wait"],
    "ADV": ["today", "quickly", "again", "there"],
    "PREP": ["near", "with", "behind"],
    "THAT": ["that"],
    "AND": ["and"],
    "EOS": ["<eos>"],
}


def _np_rules(prefix: str, number: str, then) -> Dict[str, list]:
    """Determiner, optional adjectives and a noun agreeing with the determiner.

    ``prefix`` names the states; ``then(n)`` is the state after a noun of number n. Three
    determiner states remember sg / pl / either ("the").
    """
    rules = {
        f"{prefix}": [
            ("DSG", 0.35, f"{prefix}.sg"),
            ("DPL", 0.30, f"{prefix}.pl"),
            ("THE", 0.35, f"{prefix}.any"),
        ],
        f"{prefix}.sg": [("ADJ", 0.30, f"{prefix}.sg"), ("NSG", 0.70, then("sg"))],
        f"{prefix}.pl": [("ADJ", 0.30, f"{prefix}.pl"), ("NPL", 0.70, then("pl"))],
        f"{prefix}.any": [
            ("ADJ", 0.30, f"{prefix}.any"),
            ("NSG", 0.35, then("sg")),
            ("NPL", 0.35, then("pl")),
        ],
    }
    return rules


def _grammar_rules() -> Dict[str, list]:
    """state → [(word class, probability, next state)]. Sentences look like
    'the old dog that the cats see runs quickly <eos>': the main verb agrees with the subject
    across an object relative clause, so predicting it needs memory beyond the last word."""
    V = {"sg": ("VSG", "ISG"), "pl": ("VPL", "IPL")}
    rules: Dict[str, list] = {}
    rules.update(_np_rules("S", "", lambda n: f"NP.{n}"))
    for m in ("sg", "pl"):
        vt, vi = V[m]
        # After the subject: a relative clause, or the main verb.
        rules[f"NP.{m}"] = [("THAT", 0.25, f"R.{m}"), (vt, 0.45, "O"), (vi, 0.30, "END")]
        # Relative clause 'that DET ADJ* N V': its verb agrees with its own subject n ...
        rules.update(_np_rules(f"R.{m}", "", lambda n, m=m: f"RN.{m}.{n}"))
        for n in ("sg", "pl"):
            rules[f"RN.{m}.{n}"] = [(V[n][0], 1.0, f"NPR.{m}")]
        # ... and the main verb then agrees with the remembered subject number m.
        rules[f"NPR.{m}"] = [(vt, 0.60, "O"), (vi, 0.40, "END")]
    rules.update(_np_rules("O", "", lambda n: "OE"))
    rules["OE"] = [("PREP", 0.20, "O"), ("AND", 0.10, "S"), ("EOS", 0.70, "S")]
    rules["END"] = [("ADV", 0.40, "END2"), ("AND", 0.10, "S"), ("EOS", 0.50, "S")]
    rules["END2"] = [("AND", 0.15, "S"), ("EOS", 0.85, "S")]
    return rules


class StochasticGrammar:
    """A unifilar probabilistic finite-state grammar over words.

    ``rules[state]`` lists (word class, probability, next state); a class's words are equally
    likely. Each state's classes must be disjoint, so (state, word) fixes the next state.
    Generation starts in ``start``; '<eos>' ends a line.
    """

    def __init__(self, rules: Dict[str, list], words: Dict[str, List[str]], start: str = "S"):
        self.states = sorted(rules)
        self.start = start
        index = {s: k for k, s in enumerate(self.states)}
        vocab = sorted({w for ws in words.values() for w in ws})
        self.vocab = vocab
        wid = {w: k for k, w in enumerate(vocab)}
        S, V = len(self.states), len(vocab)
        self.emit = np.zeros((S, V))  # p(word | state)
        self.next_state = -np.ones((S, V), dtype=np.int64)
        for s, alts in rules.items():
            total = sum(p for _, p, _ in alts)
            if abs(total - 1.0) > 1e-9:
                raise ValueError(f"grammar state {s!r}: probabilities sum to {total}, not 1")
            for cls, p, nxt in alts:
                if nxt not in index:
                    raise ValueError(f"grammar state {s!r} leads to unknown state {nxt!r}")
                for w in words[cls]:
                    if self.next_state[index[s], wid[w]] >= 0:
                        raise ValueError(f"grammar state {s!r} emits {w!r} twice: not unifilar")
                    self.emit[index[s], wid[w]] = p / len(words[cls])
                    self.next_state[index[s], wid[w]] = index[nxt]

    def stationary(self) -> np.ndarray:
        """π over ``states``: the left eigenvector πP = π of the state chain, Σπ = 1."""
        S = len(self.states)
        P = np.zeros((S, S))
        for s in range(S):
            for w in np.nonzero(self.emit[s])[0]:
                P[s, self.next_state[s, w]] += self.emit[s, w]
        A = np.vstack([P.T - np.eye(S), np.ones((1, S))])
        b = np.zeros(S + 1)
        b[-1] = 1.0
        return np.linalg.lstsq(A, b, rcond=None)[0]

    def entropy_rate(self) -> float:
        """Σ_s π(s) H(word | s), in nats per token ('<eos>' counts as a token)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            h = -np.where(self.emit > 0, self.emit * np.log(self.emit), 0.0).sum(axis=1)
        return float(self.stationary() @ h)

    def sample_lines(self, n_lines: int, seed: int = 0) -> List[List[str]]:
        """``n_lines`` sentences (lists of words, '<eos>' omitted), from ``RandomState(seed)``."""
        rng = np.random.RandomState(seed)
        cum = np.cumsum(self.emit, axis=1)
        eos = self.vocab.index("<eos>")
        state = self.states.index(self.start)
        lines, line = [], []
        while len(lines) < n_lines:
            u = rng.random_sample(4096)
            for x in u:
                w = min(int(np.searchsorted(cum[state], x, side="right")), len(self.vocab) - 1)
                while self.emit[state, w] == 0:  # guard against round-off at the top end
                    w -= 1
                state = self.next_state[state, w]
                if w == eos:
                    lines.append(line)
                    line = []
                    if len(lines) == n_lines:
                        break
                else:
                    line.append(self.vocab[w])
        return lines

    def log_prob(self, tokens: Sequence[str]) -> float:
        """log p(tokens) in nats for a token stream starting in ``start`` (words incl. '<eos>')."""
        wid = {w: k for k, w in enumerate(self.vocab)}
        state, total = self.states.index(self.start), 0.0
        for t in tokens:
            if t not in wid or self.emit[state, wid[t]] == 0:
                return -math.inf
            total += math.log(self.emit[state, wid[t]])
            state = self.next_state[state, wid[t]]
        return total


def default_grammar() -> StochasticGrammar:
    """The grammar behind the offline corpus: 69 words, 27 states (see ``_grammar_rules``)."""
    return StochasticGrammar(_grammar_rules(), _WORDS)


def grammar_entropy_rate() -> float:
    """Entropy rate of the default grammar in nats per token; exp of it is the best perplexity."""
    return default_grammar().entropy_rate()


def write_grammar_corpus(
    base_dir: str, train_lines: int = 4000, test_lines: int = 400, seed: int = 0
) -> str:
    """Writes ``train.txt`` (seed) and ``test.txt`` (seed + 1) sampled from the default grammar
    into ``base_dir`` (created if needed), one sentence per line; returns ``base_dir``.

    Same arguments, same bytes: ``Corpus(base_dir)`` then gives a reproducible offline corpus.
    """
    for name, n in (("train_lines", train_lines), ("test_lines", test_lines)):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"{name} must be a positive integer, got {n!r}")
    os.makedirs(base_dir, exist_ok=True)
    g = default_grammar()
    for fname, n, s in (("train.txt", train_lines, seed), ("test.txt", test_lines, seed + 1)):
        with open(os.path.join(base_dir, fname), "w", encoding="utf-8") as f:
            for line in g.sample_lines(n, seed=s):
                f.write(" ".join(line) + "\n")
    return base_dir
