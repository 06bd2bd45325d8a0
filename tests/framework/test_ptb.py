"""Penn Treebank data (Dictionary, Corpus, batchify, get_batch) and the offline grammar corpus.

Oracles: files the tests write with hand-computed ids; the real PTB text (where
../shared/data/ptb exists) re-tokenised with plain Python; hand-derived entropy rates of tiny
grammars; a Monte Carlo estimate of the default grammar's entropy rate from its own samples.
"""

import math
import shutil

import numpy as np
import pytest
from conftest import DEVICES, SHARED_DATA

import needle as ndl
from companion.data.grammar import (
    StochasticGrammar,
    default_grammar,
    grammar_entropy_rate,
    write_grammar_corpus,
)
from needle import backend_ndarray as nd
from needle.data import Corpus, Dictionary, batchify, get_batch

pytestmark = pytest.mark.data

PTB = SHARED_DATA / "ptb"


def write(dirpath, train, test):
    (dirpath / "train.txt").write_text(train)
    (dirpath / "test.txt").write_text(test)
    return str(dirpath)


# ---- Dictionary and Corpus ---------------------------------------------------------------------
@pytest.mark.hw4_ptb_corpus
def test_dictionary_assigns_ids_in_order_of_first_sight():
    d = Dictionary()
    assert [d.add_word(w) for w in ["b", "a", "b", "c", "a"]] == [0, 1, 0, 2, 1]
    assert d.idx2word == ["b", "a", "c"] and d.word2idx == {"b": 0, "a": 1, "c": 2}
    assert len(d) == 3


@pytest.mark.hw4_ptb_corpus
def test_corpus_tokenises_like_the_course(tmp_path):
    base = write(tmp_path, " a b  c \n\nb a\n", "c d\nd\n")
    c = Corpus(base)
    # train: a b c <eos> | <eos> (blank line) | b a <eos>;  test: c d <eos> d <eos>
    assert c.dictionary.idx2word == ["a", "b", "c", "<eos>", "d"]
    assert c.train == [0, 1, 2, 3, 3, 1, 0, 3]
    assert c.test == [2, 4, 3, 4, 3]
    c1 = Corpus(base, max_lines=1)
    assert c1.train == [0, 1, 2, 3] and c1.test == [2, 4, 3]
    assert Corpus(base, max_lines=0).train == []


@pytest.mark.parametrize(
    "text",
    [
        b"a b\nc\r\nd\re\n\nf",
        b"x\r",
        b"x\r\n\r\ny z",
        b"a\rb\r\rc\n",
        b"",
        "na\u00efve caf\u00e9\n".encode(),
    ],
)
def test_corpus_lines_are_those_open_reads(tmp_path, text):
    """Line ends as Python's text mode reads them (\\n, \\r\\n and a lone \\r all end a line)."""
    (tmp_path / "train.txt").write_bytes(text)
    (tmp_path / "test.txt").write_bytes(b"")
    c = Corpus(str(tmp_path))
    with open(tmp_path / "train.txt", encoding="utf-8") as f:
        words = [w for line in f for w in line.split() + ["<eos>"]]
    assert [c.dictionary.idx2word[i] for i in c.train] == words


def test_corpus_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such directory"):
        Corpus(str(tmp_path / "missing"))
    (tmp_path / "train.txt").write_text("a\n")
    with pytest.raises(FileNotFoundError, match="test.txt"):
        Corpus(str(tmp_path))
    (tmp_path / "test.txt").write_text("a\n")
    with pytest.raises(ValueError, match="max_lines"):
        Corpus(str(tmp_path), max_lines=-1)


# ---- batchify and get_batch --------------------------------------------------------------------
ALPHABET = list(range(26))  # a=0 … z=25


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw4_batchify
def test_batchify_columns_are_contiguous_runs(device):
    b = batchify(ALPHABET[:24], 4, device=device, dtype="float32")
    assert isinstance(b, np.ndarray) and b.shape == (6, 4) and b.dtype == np.float32
    np.testing.assert_array_equal(b[:, 0], range(0, 6))  # a … f
    np.testing.assert_array_equal(b[:, 3], range(18, 24))  # s … x
    b = batchify(ALPHABET, 4, device=device, dtype="float32")  # y, z dropped
    assert b.shape == (6, 4) and b.max() == 23
    with pytest.raises(ValueError, match="batch_size"):
        batchify(ALPHABET, 0, device=device, dtype="float32")
    with pytest.raises(ValueError, match="fewer than batch_size"):
        batchify(ALPHABET[:3], 4, device=device, dtype="float32")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.hw4_batchify
def test_get_batch_targets_are_the_next_rows(device):
    b = batchify(ALPHABET[:24], 4, device=device, dtype="float32")
    X, y = get_batch(b, 0, 2, device=device, dtype="float32")
    assert isinstance(X, ndl.Tensor) and X.shape == (2, 4) and y.shape == (8,)
    assert X.device == device and X.dtype == "float32" and not X.requires_grad
    np.testing.assert_array_equal(X.numpy(), [[0, 6, 12, 18], [1, 7, 13, 19]])  # a g m s / b h n t
    np.testing.assert_array_equal(y.numpy(), [1, 7, 13, 19, 2, 8, 14, 20])  # b h n t c i o u
    X, y = get_batch(b, 4, 3, device=device)  # only one row (f l r x as targets) is left
    assert X.shape == (1, 4) and y.shape == (4,)
    np.testing.assert_array_equal(y.numpy(), [5, 11, 17, 23])
    with pytest.raises(IndexError, match="out of range"):
        get_batch(b, 5, 2, device=device)
    with pytest.raises(ValueError, match="bptt"):
        get_batch(b, 0, 0, device=device)


# ---- the real Penn Treebank text ---------------------------------------------------------------
needs_ptb = pytest.mark.skipif(
    not (PTB / "valid.txt").exists() or not (PTB / "test.txt").exists(),
    reason="../shared/data/ptb (valid.txt, test.txt) not present",
)


def plain_tokens(path, max_lines=None):
    words = []
    with open(path) as f:
        for n, line in enumerate(f):
            if max_lines is not None and n >= max_lines:
                break
            words += line.split() + ["<eos>"]
    return words


@needs_ptb
@pytest.mark.parametrize("max_lines", [None, 500])
def test_real_ptb_vocabulary_and_token_counts(tmp_path, max_lines):
    shutil.copy(PTB / "valid.txt", tmp_path / "train.txt")
    shutil.copy(PTB / "test.txt", tmp_path / "test.txt")
    corpus = Corpus(str(tmp_path), max_lines=max_lines)
    train = plain_tokens(PTB / "valid.txt", max_lines)
    test = plain_tokens(PTB / "test.txt", max_lines)
    vocab = list(dict.fromkeys(train + test))  # first-sight order, train first
    assert len(corpus.train) == len(train) and len(corpus.test) == len(test)
    assert len(corpus.dictionary) == len(vocab)
    assert corpus.dictionary.idx2word == vocab
    assert [corpus.dictionary.idx2word[i] for i in corpus.test] == test
    if max_lines is None:
        # the public PTB split: 73,760 valid and 82,430 test tokens with <eos>; 10k-word vocab
        assert (len(train), len(test)) == (73760, 82430)
        assert len(vocab) <= 10000 and "<unk>" in vocab and "N" in vocab


@needs_ptb
@pytest.mark.parametrize("device", DEVICES)
def test_real_ptb_batches(tmp_path, device):
    shutil.copy(PTB / "valid.txt", tmp_path / "train.txt")
    shutil.copy(PTB / "test.txt", tmp_path / "test.txt")
    corpus = Corpus(str(tmp_path))
    data = batchify(corpus.train, 16, device=device, dtype="float32")
    assert data.shape == (len(corpus.train) // 16, 16)
    X, y = get_batch(data, 7, 35, device=device, dtype="float32")
    assert X.shape == (35, 16) and y.shape == (35 * 16,)
    if ndl.BACKEND == "nd":
        assert isinstance(X.cached_data, nd.NDArray)
    # column 0 is the stream's first tokens; targets are the following tokens
    np.testing.assert_array_equal(X.numpy()[:, 0], corpus.train[7:42])
    np.testing.assert_array_equal(y.numpy().reshape(35, 16)[:, 0], corpus.train[8:43])


# ---- the offline grammar corpus ----------------------------------------------------------------
def test_tiny_grammars_have_hand_derived_entropy_rates():
    words = {"AB": ["a", "b"], "X": ["x"], "Y": ["y"], "EOS": ["<eos>"]}
    # one state choosing uniformly among a, b, <eos>... : a, b each 1/4, <eos> 1/2
    g = StochasticGrammar({"S": [("AB", 0.5, "S"), ("EOS", 0.5, "S")]}, words)
    assert g.entropy_rate() == pytest.approx(0.5 * math.log(4) + 0.5 * math.log(2), abs=1e-12)
    # S: x (1/2) → T, <eos> (1/2) → S;  T: y → S.  π = (2/3, 1/3); only S is uncertain.
    g = StochasticGrammar(
        {"S": [("X", 0.5, "T"), ("EOS", 0.5, "S")], "T": [("Y", 1.0, "S")]}, words
    )
    np.testing.assert_allclose(g.stationary(), [2 / 3, 1 / 3], atol=1e-12)
    assert g.entropy_rate() == pytest.approx(2 / 3 * math.log(2), abs=1e-12)
    lines = g.sample_lines(5, seed=0)
    assert all(line == ["x", "y"] * (len(line) // 2) for line in lines)


def test_grammar_validation():
    words = {"A": ["a"], "AB": ["a", "b"], "EOS": ["<eos>"]}
    with pytest.raises(ValueError, match="sum to"):
        StochasticGrammar({"S": [("A", 0.5, "S")]}, words)
    with pytest.raises(ValueError, match="unifilar"):
        StochasticGrammar({"S": [("A", 0.5, "S"), ("AB", 0.5, "S")]}, words)
    with pytest.raises(ValueError, match="unknown state"):
        StochasticGrammar({"S": [("A", 1.0, "Q")]}, words)


def test_default_grammar_entropy_rate_matches_its_samples():
    g = default_grammar()
    H = grammar_entropy_rate()
    assert len(g.vocab) == 69 and len(g.states) == 27
    assert 2.0 < H < 2.6  # the floor exp(H) ≈ 9.9 sits far below the 69-word vocabulary
    lines = g.sample_lines(6000, seed=123)
    tokens = [w for line in lines for w in line + ["<eos>"]]
    nll = -g.log_prob(tokens) / len(tokens)  # finite: every sample is grammatical
    assert abs(nll - H) < 0.03, (nll, H)


VERBS_SG = {
    "sees",
    "likes",
    "follows",
    "helps",
    "chases",
    "finds",
    "runs",
    "sleeps",
    "sings",
    "waits",
}
VERBS_PL = {"see", "like", "follow", "help", "chase", "find", "run", "sleep", "sing", "wait"}
NOUNS_PL = {
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
}


def test_default_grammar_needs_memory_for_agreement():
    """In 'N1 that ... N2 V2 V1', the main verb V1 agrees with N1, not with the nearer N2."""
    agree = {True: set(), False: set()}  # subject plural? → main verbs seen
    mismatched_neighbours = 0
    for line in default_grammar().sample_lines(3000, seed=1):
        if "that" not in line:
            continue
        i = line.index("that")
        verbs = [k for k in range(i + 1, len(line)) if line[k] in VERBS_SG | VERBS_PL]
        rel, main = verbs[0], verbs[1]
        subject_pl = line[i - 1] in NOUNS_PL
        agree[subject_pl].add(line[main])
        mismatched_neighbours += (line[rel - 1] in NOUNS_PL) != subject_pl
    assert agree[False] and agree[True]
    assert agree[False] <= VERBS_SG and agree[True] <= VERBS_PL
    assert mismatched_neighbours > 100  # the nearest noun often has the other number


def test_write_grammar_corpus_is_deterministic(tmp_path):
    a = write_grammar_corpus(str(tmp_path / "a"), train_lines=50, test_lines=10, seed=3)
    write_grammar_corpus(str(tmp_path / "b"), train_lines=50, test_lines=10, seed=3)
    write_grammar_corpus(str(tmp_path / "c"), train_lines=50, test_lines=10, seed=4)
    for name in ("train.txt", "test.txt"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    train_a = (tmp_path / "a" / "train.txt").read_bytes()
    assert train_a != (tmp_path / "c" / "train.txt").read_bytes()
    corpus = Corpus(a)
    assert len((tmp_path / "a" / "train.txt").read_text().splitlines()) == 50
    assert corpus.train.count(corpus.dictionary.word2idx["<eos>"]) == 50
    assert corpus.test.count(corpus.dictionary.word2idx["<eos>"]) == 10
    assert set(corpus.dictionary.idx2word) <= set(default_grammar().vocab)
    with pytest.raises(ValueError, match="train_lines"):
        write_grammar_corpus(str(tmp_path / "d"), train_lines=0)
