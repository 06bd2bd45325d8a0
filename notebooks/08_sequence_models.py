# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 08 · Sequence models: RNNs, LSTMs and language modelling
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/needle-companion/needle-companion/blob/main/notebooks/08_sequence_models.ipynb)
#
# **Lecture:** 18, "Sequence Modeling and Recurrent Networks", and 19, "RNN Implementation"
#
# **Homework:** hw4 Q4 (`RNNCell`, `RNN`), Q5 (`LSTMCell`, `LSTM`), Q6 (the Penn Treebank
# `Corpus` and `batchify`/`get_batch`), Q7 (training a word-level language model)
#
# **Prerequisites:** notebook 03 (modules, detaching, the training loop); notebook 04
# (optimizers)
#
# **You will be able to:** write the RNN and LSTM recurrences and check needle's modules
# against them; explain truncated back-propagation through time and why the state is detached
# between chunks; say what gradient clipping does and when it acts; judge a language model's
# perplexity against a known floor and simple baselines, and test what its state remembers;
# sample text from it
#
# **Run time:** about 9 s of CPU time on a 2-core x86-64 machine
# **Student mode:** with `NEEDLE_IMPL=path/to/hw4/python` (your own needle), the cell marked
# companion-only is skipped: it checks that every tensor a chunk leaves alive is a graph node,
# which holds only for this needle's `backward()` (the course's keeps a gradient on every node).
#
# A sequence model reads inputs $x_1, x_2, \dots$ one step at a time and keeps a **hidden
# state** $h_t$ that summarises everything it has seen. This notebook
#
# 1. writes out the **RNN** recurrence and checks `nn.RNN` against it;
# 2. does the same for the **LSTM**, against a numpy reference of its gates, and measures how
#    gradients **vanish or explode** along a sequence in each;
# 3. explains **truncated back-propagation through time** and shows, by counting live tensors,
#    why the hidden state must be *detached* between chunks;
# 4. trains an LSTM **language model** (with gradient clipping) on a corpus whose best possible
#    perplexity is known, compares it with that floor and with simpler baselines, and measures
#    whether its state carries the number of a subject across a relative clause;
# 5. samples text from the trained model and checks it against the grammar that made the data.
#
# Every number stated in the text is asserted in the code cell that follows it.

# %% tags=["remove-cell"] cellView="form" jupyter={"source_hidden": true}
#@title Colab set-up: in Colab this installs needle (2-3 minutes); elsewhere it does nothing
import os, shlex, subprocess, sys, tempfile; repo = os.environ.get("NEEDLE_COLAB_REPO", "https://github.com/needle-companion/needle-companion")
if "google.colab" in sys.modules or os.environ.get("NEEDLE_COLAB_SIMULATE") == "1":  # companion/colab_setup.py
    py, src, q = sys.executable, os.path.join(tempfile.gettempdir(), "needle-companion"), shlex.quote
    done = subprocess.run(f"{q(py)} -m companion.colab_setup --status 2>/dev/null || {{ {{ test -d {q(src)} || git clone -q --depth=1 {q(repo)} {q(src)}; }} && cd {q(src)} && {q(py)} -m companion.colab_setup --install {q(repo)} --cwd {q(os.getcwd())}; }}", shell=True, capture_output=True, text=True); print(done.stdout + done.stderr[-3000:], end=""); assert done.returncode == 0, f"the set-up could not install this project from {repo} (what failed is above)"

# %%
import gc
import tempfile

import matplotlib.pyplot as plt
import numpy as np

import needle as ndl
from needle import autograd, nn
from companion.apps.language_model import LanguageModel
from companion.apps.ptb_training import detach_state, epoch_general_ptb, evaluate_ptb
from needle.data import Corpus, batchify, get_batch
from companion.data import default_grammar, write_grammar_corpus
from companion import lecture
from companion.viz import LiveCurves, save_figure

np.random.seed(0)
lecture.setup()  # with NEEDLE_IMPL: cells marked "# companion-only" print a skip line
# cuda() where a GPU is visible (Colab's GPU runtime), else the compiled CPU backend when it is
# built, else needle's numpy device
from companion.lecture import best_device  # noqa: E402
device = best_device()
print("backend:", ndl.BACKEND, "| device:", device)

# %% [markdown]
# **Parameters.** The committed outputs use an offline corpus that this notebook generates
# (section 4). After `make data`, set `DATASET = "ptb"` to train on the first lines of the real
# Penn Treebank instead (the grammar-specific checks are then skipped).

# %%
DATASET = "grammar"          # or "ptb" after `make data`
PTB_DIR = "../data/ptb"      # train.txt and test.txt, as `make data` writes them
PTB_MAX_LINES = 2000         # PTB is large: read this many lines of each file
EMBED, HIDDEN, SEQ_LEN, BATCH, EPOCHS, LR = 32, 64, 20, 16, 4, 0.01

# %% [markdown]
# ## 1. The RNN recurrence
#
# An Elman RNN updates its hidden state with one affine map of the input and the previous state,
# followed by a nonlinearity:
#
# $$h_t = \tanh\left(x_t W_{ih} + b_{ih} + h_{t-1} W_{hh} + b_{hh}\right), \qquad h_0 = 0 .$$
#
# needle stores vectors as rows, so $W_{ih}$ has shape (input_size, hidden_size): the transpose
# of PyTorch's `weight_ih`. Inputs are **time-major**: `X` has shape (seq_len, batch, input).
# The recurrence walks along time, and step $t$ multiplies the (batch, input) slice $X_t$ by
# $W_{ih}$; with time first that slice is one contiguous block of memory, where a batch-first
# (batch, seq_len, input) array would make it a strided gather to copy at every step.
# `nn.RNN` returns every $h_t$ of its last layer and the final state of every layer.
#
# Real sentences differ in length. A batch of them is **padded** to the longest, and the padded
# steps must change neither the state nor the loss: they are masked, or (PyTorch's packed
# sequences) the batch is sorted by length so that each step's product runs only over the
# sequences still going. The language model of section 4 avoids the question the course's way:
# it reads one token stream cut into equal chunks, where a sentence ends with an `<eos>` token.

# %%
T_, B_, I_, H_ = 5, 2, 3, 4
rnn = nn.RNN(I_, H_, device=device)
X = np.random.randn(T_, B_, I_).astype(np.float32)
out, h_n = rnn(ndl.Tensor(X, device=device))
print("output", out.shape, "| h_n", h_n.shape)


def rnn_numpy(X, cell):
    """The recurrence above, one time step at a time, in float64 numpy."""
    W_ih, W_hh, b_ih, b_hh = (getattr(cell, n).numpy().astype(np.float64)
                              for n in ("W_ih", "W_hh", "bias_ih", "bias_hh"))
    h, hs = np.zeros((X.shape[1], W_hh.shape[0])), []
    for x_t in X:
        h = np.tanh(x_t @ W_ih + b_ih + h @ W_hh + b_hh)
        hs.append(h)
    return np.stack(hs)


err = np.abs(out.numpy() - rnn_numpy(X, rnn.rnn_cells[0])).max()
print("max |needle - numpy|", "below 1e-6" if err < 1e-6 else f"= {err:.1e}")
assert out.shape == (5, 2, 4) and h_n.shape == (1, 2, 4)
assert err < 1e-5
assert np.array_equal(out.numpy()[-1], h_n.numpy()[0])  # the last output is the final state

# %% [markdown]
# ## 2. The LSTM
#
# Multiplying by $W_{hh}$ at every step makes gradients through long sequences shrink or
# explode. The LSTM adds a **cell state** $c_t$ that is updated *additively*, with gates deciding
# what to forget, what to write and what to expose. One matrix product gives all four gate
# pre-activations, packed in the order **i, f, g, o**:
#
# $$\begin{aligned}
# [z_i, z_f, z_g, z_o] &= x_t W_{ih} + b_{ih} + h_{t-1} W_{hh} + b_{hh}
#   \quad (W_{ih}: \text{input} \times 4\,\text{hidden})\\
# i = \sigma(z_i),\; f &= \sigma(z_f),\; g = \tanh(z_g),\; o = \sigma(z_o)\\
# c_t &= f \odot c_{t-1} + i \odot g, \qquad h_t = o \odot \tanh(c_t).
# \end{aligned}$$
#
# A numpy reference of exactly these lines checks a two-layer `nn.LSTM` (layer 2 reads layer 1's
# $h_t$). Both run **layer first**: the whole sequence through layer 1, then layer 1's outputs
# through layer 2. Going time step by time step through all layers gives the same numbers,
# since step $t$ of layer 2 needs only step $t$ of layer 1 and step $t-1$ of layer 2; layer
# first is simpler, and it lets a layer's input products for all steps be one matrix product.

# %%
def lstm_numpy(X, cells, h0=None, c0=None):
    """Stacked LSTM in float64 numpy: X (T, B, I) → (output (T, B, H), h_n, c_n)."""
    sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    hs_n, cs_n = [], []
    for cell in cells:
        W_ih, W_hh, b_ih, b_hh = (getattr(cell, n).numpy().astype(np.float64)
                                  for n in ("W_ih", "W_hh", "bias_ih", "bias_hh"))
        H = W_hh.shape[0]
        h, c, outs = np.zeros((X.shape[1], H)), np.zeros((X.shape[1], H)), []
        for x_t in X:
            z = x_t @ W_ih + b_ih + h @ W_hh + b_hh
            i, f = sig(z[:, :H]), sig(z[:, H:2 * H])
            g, o = np.tanh(z[:, 2 * H:3 * H]), sig(z[:, 3 * H:])
            c = f * c + i * g
            h = o * np.tanh(c)
            outs.append(h)
        X = np.stack(outs)
        hs_n.append(h)
        cs_n.append(c)
    return X, np.stack(hs_n), np.stack(cs_n)


lstm = nn.LSTM(I_, H_, num_layers=2, device=device)
out, (h_n, c_n) = lstm(ndl.Tensor(X, device=device))
ref = lstm_numpy(X, lstm.lstm_cells)
errs = [np.abs(a.numpy() - b).max() for a, b in zip((out, h_n, c_n), ref)]
print("W_ih", lstm.lstm_cells[0].W_ih.shape, "| W_hh", lstm.lstm_cells[0].W_hh.shape)
print("max |needle - numpy| for output, h_n, c_n:",
      ", ".join("below 1e-6" if e < 1e-6 else f"{e:.1e}" for e in errs))
assert lstm.lstm_cells[0].W_ih.shape == (3, 16) and lstm.lstm_cells[1].W_ih.shape == (4, 16)
assert max(errs) < 1e-5

# %% [markdown]
# **Vanishing and exploding gradients, measured.** How much does the state at step 0 still
# matter at step $T$? The cell below runs a cell for $T$ steps on random inputs from a zero
# state and measures $\lVert \partial (u \cdot h_T) / \partial h_0 \rVert$ (for the LSTM, the
# gradient with respect to $h_0$ and $c_0$ together), for a fixed random direction $u$. The
# tanh RNN gets $W_{hh}$ = a random orthogonal matrix times a scale: every step multiplies the
# gradient by $\mathrm{diag}(1 - h_t^2)\, W_{hh}^\top$. The LSTM is shown at needle's
# initialisation and with its forget gate's bias raised by 3 (so that $f$ starts near
# $\sigma(3) \approx 0.95$), a common initialisation: along the cell state each step multiplies the gradient by
# $f$, not by a matrix.

# %% tags=["nbval-ignore-output"]
def state_gradient_norm(cell, T, hidden, lstm=False, seed=0):
    """|d (u · h_T) / d (initial state)| after T steps of ``cell`` on random inputs, batch 1."""
    rng = np.random.RandomState(seed)
    h0, c0 = (ndl.Tensor(np.zeros((1, hidden), np.float32), device=device) for _ in range(2))
    h, c = h0, c0
    for x in rng.randn(T, 1, hidden).astype(np.float32):
        x = ndl.Tensor(x, device=device, requires_grad=False)
        if lstm:
            h, c = cell(x, (h, c))
        else:
            h = cell(x, h)
    u = ndl.Tensor(rng.randn(1, hidden).astype(np.float32), device=device, requires_grad=False)
    (h * u).sum().backward()
    grads = [h0.grad.numpy()] + ([c0.grad.numpy()] if lstm else [])
    return float(np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads)))


HID, STEPS = 16, (1, 5, 10, 20, 40)
Q_orth = np.linalg.qr(np.random.RandomState(0).randn(HID, HID))[0].astype(np.float32)
cells = {}
for scale in (0.5, 4.0):
    np.random.seed(1)
    cells[f"tanh RNN, W_hh = {scale} x orthogonal"] = (nn.RNNCell(HID, HID, device=device), False)
    cells[f"tanh RNN, W_hh = {scale} x orthogonal"][0].W_hh = nn.Parameter(
        ndl.Tensor(scale * Q_orth, device=device))
np.random.seed(1)
cells["LSTM, needle's initialisation"] = (nn.LSTMCell(HID, HID, device=device), True)
np.random.seed(1)
forget_biased = nn.LSTMCell(HID, HID, device=device)
bias = forget_biased.bias_ih.numpy().copy()
bias[HID:2 * HID] += 3.0                       # the f block of the packed i, f, g, o gates
forget_biased.bias_ih = nn.Parameter(ndl.Tensor(bias, device=device))
cells["LSTM, forget bias + 3"] = (forget_biased, True)
norms = {name: [state_gradient_norm(cell, T, HID, lstm) for T in STEPS]
         for name, (cell, lstm) in cells.items()}
trends = {}
print(f"{'T =':36s}" + "".join(f"{T:>10d}" for T in STEPS))
for name, values in norms.items():
    trends[name] = ("explodes" if values[-1] > 100 * values[0] else "vanishes"
                    if values[-1] < 1e-3 * values[0] else "survives")
    print(f"{name:36s}" + "".join(f"{v:10.1e}" for v in values) + f"   {trends[name]}")
assert list(trends.values()) == ["vanishes", "explodes", "vanishes", "survives"]

# %% [markdown]
# The last column is computed from the first and the last value of each row (and asserted).
# A tanh RNN whose $W_{hh}$ shrinks vectors forgets the start geometrically; one whose $W_{hh}$
# stretches them amplifies it geometrically, so a long chunk can produce a gradient far larger
# than an ordinary one: the *exploding gradient* that gradient clipping (section 5) guards
# against. The LSTM at needle's initialisation forgets too: its forget gate starts near
# $\sigma(0) = 0.5$, and the cell path loses about half per step. What the LSTM changes is
# that this factor is a gate the model learns rather than a fixed matrix, and with the gate
# near 1 (the raised bias) the gradient survives the whole span.

# %% [markdown]
# ## 3. Truncated back-propagation through time
#
# A language model reads one long token stream. Back-propagating through *all* of it would keep
# the whole history's graph in memory. **Truncated BPTT** cuts the stream into chunks of
# `seq_len` steps: each chunk starts from the previous chunk's final hidden state (so the model
# still *sees* the past), but the gradient stops at the chunk boundary. In needle that is
# `h = h.detach()` (for an LSTM, both `h` and `c`): `detach_state` in `companion.apps`.
#
# What happens without it? The new chunk's graph hangs on to the old one through `h`, so the
# graph grows with every chunk. `autograd.TENSOR_COUNTER` counts live tensors; we run 6 chunks
# of a small LSTM language model both ways and count, after each chunk, the tensors alive beyond
# those that existed before the model was built.

# %%
def live_tensors_per_chunk(detach: bool, n_chunks: int = 6) -> tuple:
    """(live tensors beyond the start, nodes in the graph behind the state), after each chunk."""
    gc.collect()
    start = autograd.TENSOR_COUNTER
    np.random.seed(0)
    model = LanguageModel(8, 20, 16, seq_model="lstm", device=device)
    stream = np.random.randint(0, 20, (n_chunks * 10 + 1, 4)).astype(np.float32)
    h, counts, graph = None, [], []
    for k in range(n_chunks):
        x, y = get_batch(stream, 10 * k, 10, device=device)
        out, h = model(x, h)
        nn.SoftmaxLoss()(out, y).backward()
        if detach:
            h = detach_state(h)
        for p in model.parameters():
            p.grad = None
        del x, y, out
        gc.collect()
        counts.append(autograd.TENSOR_COUNTER - start)
        graph.append(len(autograd.find_topo_sort(list(h))))
    del model, h
    gc.collect()
    return counts, graph


(attached, attached_graph), (detached, _) = (live_tensors_per_chunk(False),
                                             live_tensors_per_chunk(True))
print("not detached:", attached)
print("detached:    ", detached)

# %% [markdown]
# Without detaching, every chunk leaves more tensors alive: the nodes its forward pass added to
# the graph behind the state stay reachable through $h$, so memory grows linearly with the
# length of the stream, and each `backward()` walks back through every earlier chunk too. With
# `detach`, only the 7 parameters and the 2 carried state tensors ($h$, $c$) survive a chunk:
# the count stays flat at 9.

# %%
growth = np.diff(attached)
graph_growth = np.diff(attached_graph)
print("extra tensors per chunk without detach:", sorted(set(growth.tolist())),
      "| nodes added to the graph behind the state per chunk:", sorted(set(graph_growth.tolist())))
assert len(set(graph_growth.tolist())) == 1 and min(growth) >= graph_growth[0] > 9
assert detached == [9] * 6

# %% [markdown]
# How many nodes a chunk adds depends on how the LSTM cell is written: here section 3 ran
# needle's `nn.LSTM`, a loop of per-step cells like the course's, whose ten steps add the
# number of nodes printed above; your own hw4 cell, written with other ops, adds its own number. On this
# needle the extra live tensors are *exactly* those graph nodes, because `backward()` keeps a
# gradient only on the leaves (the parameters, whose `.grad` the loop clears). The course's
# `backward()` leaves a `.grad` on every node of the graph, so on a course needle the gradients
# of the kept chunks stay alive as well and the count grows faster than the graph; the cell
# below, which checks the exact match, runs only on this needle.

# %%
# companion-only: this needle's backward() keeps no .grad on interior nodes (the course's does)
assert len(set(growth.tolist())) == 1 and growth[0] == graph_growth[0]
print(f"each chunk leaves exactly its {growth[0]} graph nodes alive")

# %% [markdown]
# ## 4. A corpus with a known best perplexity
#
# A language model is scored by its **perplexity** $\exp(\bar\ell)$, where $\bar\ell$ is the
# mean cross-entropy (in nats) of the next token. Guessing uniformly over a vocabulary of $V$
# words gives perplexity $V$. On real text nobody knows the best achievable value; so the
# default corpus here is *generated* by a small **probabilistic grammar** whose best value we can
# compute.
#
# The grammar (`needle.data.datasets.ptb_dataset`) is a finite-state machine over 27 states and
# 69 words: determiners, adjectives, singular and plural nouns and verbs, relative clauses
# (*"the dog that the cats see runs"*, where the main verb agrees with a noun several words
# back), prepositions, "and" and `<eos>`. Each state draws a word from its own distribution and
# the word fixes the next state, so the state is a function of the text so far. The entropy
# rate of the token stream is therefore exactly
#
# $$H = \sum_s \pi(s)\, H(\text{word} \mid s) = 2.289 \text{ nats per token},$$
#
# with $\pi$ the stationary distribution of the state chain, and no model can have an expected
# perplexity below $e^{H} = 9.86$.

# %%
grammar = default_grammar()
H_rate = grammar.entropy_rate()
floor = np.exp(H_rate)
print(f"{len(grammar.vocab)} words, {len(grammar.states)} states")
print(f"entropy rate H = {H_rate:.3f} nats/token, perplexity floor exp(H) = {floor:.2f}")
for line in grammar.sample_lines(4, seed=7):
    print("  ", " ".join(line))
assert len(grammar.vocab) == 69 and len(grammar.states) == 27
assert abs(H_rate - 2.289) < 5e-4 and abs(floor - 9.86) < 5e-3

# %% [markdown]
# `write_grammar_corpus` samples 1,500 training and 300 test sentences (fixed seeds) into
# `train.txt` / `test.txt`, one sentence per line, the layout of the Penn Treebank files, and
# `Corpus` reads them the way the course does: `line.split() + ['<eos>']`.

# %%
if DATASET == "grammar":
    data_dir = write_grammar_corpus(tempfile.mkdtemp(), train_lines=1500, test_lines=300, seed=0)
    corpus = Corpus(data_dir)
else:
    corpus = Corpus(PTB_DIR, max_lines=PTB_MAX_LINES)
V = len(corpus.dictionary)
print(f"vocabulary {V} | train tokens {len(corpus.train)} | test tokens {len(corpus.test)}")
if DATASET == "grammar":
    assert V == 69 and len(corpus.train) == 13535 and len(corpus.test) == 2658

# %% [markdown]
# Three reference points on the test text, computed by counting:
#
# * **uniform** over the vocabulary: perplexity $V = 69$;
# * **unigram** (word frequencies, no context): 49.93;
# * **bigram** (the next word given only the previous one, add-0.1 smoothing): 14.53;
# * the **true grammar** itself scores 9.73 on this particular test text: a finite sample lands
#   a little above or below the floor 9.86, which holds for the *expected* perplexity.

# %%
train_ids, test_ids = np.array(corpus.train), np.array(corpus.test)
unigram = np.bincount(train_ids, minlength=V) + 0.1
unigram /= unigram.sum()
bigram = np.full((V, V), 0.1)
np.add.at(bigram, (train_ids[:-1], train_ids[1:]), 1)
bigram /= bigram.sum(axis=1, keepdims=True)
ppl_unigram = np.exp(-np.log(unigram[test_ids]).mean())
ppl_bigram = np.exp(-np.log(bigram[test_ids[:-1], test_ids[1:]]).mean())
print(f"uniform {V}, unigram {ppl_unigram:.2f}, bigram {ppl_bigram:.2f}")
if DATASET == "grammar":
    words = [corpus.dictionary.idx2word[i] for i in corpus.test]
    ppl_true = np.exp(-grammar.log_prob(words) / len(words))
    print(f"true grammar on the test text {ppl_true:.2f}")
    assert abs(ppl_unigram - 49.93) < 5e-3 and abs(ppl_bigram - 14.53) < 5e-3
    assert abs(ppl_true - 9.73) < 5e-3

# %% [markdown]
# `batchify` lays the stream out in `BATCH` columns, each a contiguous run of text, and
# `get_batch(data, i, SEQ_LEN)` cuts rows `i … i+SEQ_LEN-1` as input and the same rows shifted by
# one as targets (flattened to match the model's (seq_len·batch, V) logits).

# %%
train_data = batchify(corpus.train, BATCH, device=device, dtype="float32")
test_data = batchify(corpus.test, BATCH, device=device, dtype="float32")
x, y = get_batch(train_data, 0, SEQ_LEN, device=device)
print("train", train_data.shape, "| test", test_data.shape, "| x", x.shape, "| y", y.shape)
col = [corpus.dictionary.idx2word[int(i)] for i in x.numpy()[:8, 0]]
nxt = [corpus.dictionary.idx2word[int(i)] for i in y.numpy().reshape(SEQ_LEN, BATCH)[:8, 0]]
print("input  column 0:", " ".join(col))
print("target column 0:", " ".join(nxt))
assert x.shape == (SEQ_LEN, BATCH) and y.shape == (SEQ_LEN * BATCH,)
assert nxt[:-1] == col[1:]

# %% [markdown]
# ## 5. Training an LSTM language model
#
# `LanguageModel` = `Embedding` (word id → vector) → `LSTM` → `Linear` to $V$ logits. Before
# training its perplexity is about the vocabulary size (≈ 69: it knows nothing). We train for
# `EPOCHS` passes of truncated BPTT with Adam, measuring the test perplexity after each.
#
# **Gradient clipping.** The gradient through a recurrence is a product of one Jacobian per
# time step, so on an unlucky chunk it can be many times larger than usual (the *exploding
# gradient* measured in section 2). With plain SGD the step is the learning rate times the
# gradient, so one such step can undo what training had reached. Clipping caps it: if the
# global norm $\lVert g \rVert$ of all gradients together exceeds a threshold $c$, every
# gradient is multiplied by $c / \lVert g \rVert$. The direction is kept; only the length is
# capped. The course's hw4 does it with `epoch_general_ptb(..., clip=c)`, which calls the
# optimizer's `clip_grad_norm(c)` between `backward()` and `step()`. Here the optimizer does
# it at the start of its own `step()`, in the few lines below, and records the norm it finds
# at every step, so that we can see how often it acts.

# %% [markdown]
# The model trains on needle's fast path: `lecture.fast_path(model)` calls
# `needle.fast.fuse(model)`, which runs each LSTM layer's loop over time as one fused op and the
# output layer as one node. The values are the course modules' to float32 rounding (the
# project's tests compare the two), at a fraction of the graph nodes; the LSTM of section 3 ran
# the course's cells. On your own needle (`NEEDLE_IMPL`) the call does nothing.

# %%
np.random.seed(0)
model = LanguageModel(EMBED, V, HIDDEN, seq_model="lstm", seq_len=SEQ_LEN, device=device)
lecture.fast_path(model)
_, loss0 = evaluate_ptb(model, test_data, seq_len=SEQ_LEN, device=device, progress=False)
print(f"untrained test perplexity {np.exp(loss0):.1f}")
if DATASET == "grammar":
    assert 0.5 * V < np.exp(loss0) < 2 * V

# %% tags=["nbval-ignore-output"]
def global_norm(params):
    """The L2 norm of all the parameters' gradients together."""
    return float(np.sqrt(sum((p.grad.numpy().astype(np.float64) ** 2).sum()
                             for p in params if p.grad is not None)))


class Clipping:
    """Mixin for an optimizer: step() first records the global gradient norm (``norms``) and,
    above ``max_norm`` (None: never), scales every gradient by max_norm / norm."""

    def __init__(self, params, max_norm=None, **kwargs):
        super().__init__(params, **kwargs)
        self.max_norm, self.norms = max_norm, []

    def step(self):
        norm = global_norm(self.params)
        self.norms.append(norm)
        if self.max_norm is not None and norm > self.max_norm:
            for p in self.params:
                if p.grad is not None:
                    p.grad = p.grad.detach() * (self.max_norm / norm)
        super().step()


class ClippedAdam(Clipping, ndl.optim.Adam):
    pass


class ClippedSGD(Clipping, ndl.optim.SGD):
    pass


CLIP = 5.0
opt = ClippedAdam(model.parameters(), max_norm=CLIP, lr=LR)
history = {"train": [], "test": [], "clipped": []}
with LiveCurves({"perplexity": ["train (during the epoch)", "test"]}, logy=["perplexity"],
                title="while it trains") as live:
    for epoch in range(EPOCHS):
        steps_before = len(opt.norms)
        _, train_loss = epoch_general_ptb(train_data, model, seq_len=SEQ_LEN, opt=opt,
                                          device=device, progress=False)
        _, test_loss = evaluate_ptb(model, test_data, seq_len=SEQ_LEN, device=device,
                                    progress=False)
        norms = np.array(opt.norms[steps_before:])
        history["train"].append(np.exp(train_loss))
        history["test"].append(np.exp(test_loss))
        history["clipped"].append(int((norms > CLIP).sum()))
        live.add(epoch + 1, {"train (during the epoch)": history["train"][-1],
                             "test": history["test"][-1]})
        print(f"epoch {epoch + 1}: train perplexity {history['train'][-1]:.2f}, "
              f"test perplexity {history['test'][-1]:.2f} | gradient norm median "
              f"{np.median(norms):.2f}, max {norms.max():.2f}, clipped in {history['clipped'][-1]} "
              f"of {len(norms)} steps")
print(f"clipping at {CLIP} acted in {sum(history['clipped'])} of {len(opt.norms)} steps; the "
      f"largest gradient norm was {max(opt.norms) / CLIP:.2f} of the threshold")

# %% [markdown]
# (The exact digits above depend on floating-point details of the machine, so nbval does not
# compare them; the cell below asserts what matters.) The test perplexity falls from epoch to
# epoch and ends within 15% of the floor: far below the untrained model's ≈ 69 and below the
# bigram model's 14.53. The last columns show what clipping did: the typical gradient norm, the
# largest, and how many steps of each epoch found a norm above 5 and were shortened; the line
# below them says how often it acted in the whole run. A threshold well above the typical
# norm is insurance against a rare spike and leaves ordinary steps alone.
#
# **Clipping under Adam is not a smaller learning rate.** With SGD, a threshold below the
# typical norm (the course's `clip_grad_norm` defaults to 0.25) shortens most steps, which
# acts like a smaller learning rate. Adam's step is
# $\mathrm{lr} \cdot \hat m / (\sqrt{\hat v} + \epsilon)$: multiply every gradient by the
# same constant and $\hat m$ and $\sqrt{\hat v}$ both scale with it, so the step does not
# change. Clipping under Adam scales each step's
# gradient by its own factor, so what it changes is how much each step's gradient weighs in
# the running averages, not the length of the steps. The cell below checks the invariance:
# one step of each optimizer from the same small model, with its gradients as computed and
# scaled by 0.1.

# %%
def step_length(optimizer_class, scale, **kwargs):
    """The length of one optimizer step from a fresh small LSTM LM, its gradients x scale."""
    np.random.seed(0)
    m = LanguageModel(8, V, 16, seq_model="lstm", device=device)
    x, y = get_batch(train_data, 0, SEQ_LEN, device=device)
    nn.SoftmaxLoss()(m(x)[0], y).backward()
    for p in m.parameters():
        p.grad = p.grad.detach() * scale
    before = [p.numpy().astype(np.float64) for p in m.parameters()]
    optimizer_class(m.parameters(), **kwargs).step()
    return np.sqrt(sum(((p.numpy() - b) ** 2).sum() for p, b in zip(m.parameters(), before)))


ratios = {}
for name, cls, kwargs in (("SGD", ndl.optim.SGD, dict(lr=1.0)),
                          ("Adam", ndl.optim.Adam, dict(lr=LR))):
    ratios[name] = step_length(cls, 0.1, **kwargs) / step_length(cls, 1.0, **kwargs)
    print(f"{name:4s}: gradients x 0.1 -> step length x {ratios[name]:.2f}")
assert abs(ratios["SGD"] - 0.1) < 1e-3 and abs(ratios["Adam"] - 1) < 1e-2

# %% [markdown]
# So with Adam the threshold matters only relative to the *spread* of the norms. With the
# course's hw4 setting, `SGD(lr=4.0)`, it is different. The cell below trains the same model
# for two epochs with SGD at that rate, once without clipping and once clipped at the course's
# default 0.25, and prints how often the clip acted and where each run ends.

# %% tags=["nbval-ignore-output"]
def sgd_run(max_norm, epochs=2):
    """(test perplexity, gradient norm of every step) of the LSTM LM after ``epochs`` of
    SGD(lr=4.0), its gradients clipped at ``max_norm`` (None: not clipped)."""
    np.random.seed(0)
    m = LanguageModel(EMBED, V, HIDDEN, seq_model="lstm", seq_len=SEQ_LEN, device=device)
    lecture.fast_path(m)
    sgd = ClippedSGD(m.parameters(), max_norm=max_norm, lr=4.0)
    for _ in range(epochs):
        epoch_general_ptb(train_data, m, seq_len=SEQ_LEN, opt=sgd, device=device, progress=False)
    _, loss = evaluate_ptb(m, test_data, seq_len=SEQ_LEN, device=device, progress=False)
    return float(np.exp(loss)), np.array(sgd.norms)


sgd_results = {clip: sgd_run(clip) for clip in (None, 0.25)}
for clip, (ppl, norms) in sgd_results.items():
    acted = 0 if clip is None else int((norms > clip).sum())
    print(f"SGD lr 4.0, {'not clipped' if clip is None else f'clipped at {clip}':15s}: "
          f"test perplexity {ppl:7.2f} | gradient norm median {np.median(norms):.2f}, "
          f"max {norms.max():.2f} | clip acted in {acted} of {len(norms)} steps")
(ppl_free, _), (ppl_clip, _) = sgd_results[None], sgd_results[0.25]
print("with SGD(lr=4.0), clipping at 0.25 " + ("helps" if ppl_clip < ppl_free else "hurts")
      + f": test perplexity {ppl_clip:.2f} against {ppl_free:.2f} without clipping")

# %% [markdown]
# Under SGD the threshold acts on the step itself: a clipped step moves the parameters by at
# most $4.0 \times 0.25 = 1$ in norm, so whenever the gradient norm exceeds 0.25 (the count
# printed above) the effective learning rate is lower than 4.0. Whether that helps at this
# rate on this corpus is the last printed line; the point is that the same threshold would do
# nothing of the kind under Adam.

# %% tags=["nbval-ignore-output"]
final = history["test"][-1]
print(f"final test perplexity {final:.1f} (bigram {ppl_bigram:.2f}"
      + (f", floor {floor:.2f})" if DATASET == "grammar" else ")"))
assert final < 0.25 * np.exp(loss0)
if DATASET == "grammar":
    assert all(b < 1.01 * a for a, b in zip(history["test"], history["test"][1:]))
    assert ppl_true < final < 1.15 * floor and final < ppl_bigram

# %%
fig, ax = plt.subplots(figsize=(6, 3.8))
epochs = np.arange(1, EPOCHS + 1)
ax.plot(epochs, history["train"], "o-", label="LSTM, train (during the epoch)")
ax.plot(epochs, history["test"], "s-", label="LSTM, test")
ax.axhline(np.exp(loss0), color="gray", ls=":", label=f"untrained ({np.exp(loss0):.0f})")
ax.axhline(ppl_bigram, color="C2", ls="--", label=f"bigram counts ({ppl_bigram:.1f})")
if DATASET == "grammar":
    ax.axhline(floor, color="k", ls="--", label=f"floor exp(H) ({floor:.2f})")
ax.set_yscale("log")
ax.set_yticks([10, 15, 20, 30, 50, 70])
ax.yaxis.set_major_formatter(plt.ScalarFormatter())
ax.yaxis.set_minor_formatter(plt.NullFormatter())
ax.set_xticks(epochs)
ax.set_xlabel("epoch")
ax.set_ylabel("perplexity (log scale)")
ax.set_title("The LSTM approaches the grammar's floor and beats the bigram")
ax.legend(fontsize=8)
save_figure(fig, "lstm_perplexity")

# %% [markdown]
# **Does the state carry the subject's number?** In *"the dog that the cats see runs"* the main
# verb must be singular because of "dog", five positions back (four words lie between them),
# while the word just before it ("see") is plural because of "cats". The grammar makes this measurable: walking its state
# machine along the test text finds every position where the next word is the main verb after
# a relative clause (state `NPR.sg` or `NPR.pl`), and which number that verb must have. At each
# such position we add up the probability the model gives to all singular main verbs and to all
# plural ones; it *agrees* when the correct number gets more. The hard cases are those with an
# **attractor**, where the noun inside the clause has the other number. The bigram model sees
# only the verb of the clause, so it has no access to the subject; the grammar itself always
# agrees.

# %% tags=["nbval-ignore-output"]
def next_token_probabilities(model, ids, seq_len):
    """The model's next-token distribution (len(ids), V) along one token stream, read in chunks
    of seq_len with the state carried (batch 1, detached between chunks)."""
    model.eval()
    h, out = None, []
    for i in range(0, len(ids), seq_len):
        x = ndl.Tensor(np.asarray(ids[i:i + seq_len], np.float32)[:, None], device=device)
        logits, h = model(x, h)
        h = detach_state(h)
        z = logits.numpy().astype(np.float64)
        p = np.exp(z - z.max(axis=1, keepdims=True))
        out.append(p / p.sum(axis=1, keepdims=True))
    return np.concatenate(out)


if DATASET == "grammar":
    word_id = {w: i for i, w in enumerate(corpus.dictionary.idx2word)}
    g_word = {w: k for k, w in enumerate(grammar.vocab)}
    state = grammar.states.index(grammar.start)
    path = []                                  # the grammar's state after each test word
    for w in words:
        state = grammar.next_state[state, g_word[w]]
        path.append(grammar.states[state])
    verbs = {n: [word_id[w] for w in grammar.vocab
                 if grammar.emit[grammar.states.index(f"NPR.{n}"), g_word[w]] > 0]
             for n in ("sg", "pl")}
    p_lstm = next_token_probabilities(model, test_ids, SEQ_LEN)
    cases = []                                 # (position, number m, attractor?)
    for t in range(1, len(words) - 1):
        if path[t].startswith("NPR."):
            m, n = path[t][4:], path[t - 1].rsplit(".", 1)[1]   # path[t - 1] is RN.m.n
            cases.append((t, m, n != m))
    other = {"sg": "pl", "pl": "sg"}
    for name, probs_at in (("LSTM", lambda t: p_lstm[t]),
                           ("bigram", lambda t: bigram[test_ids[t]])):
        ok = np.array([probs_at(t)[verbs[m]].sum() > probs_at(t)[verbs[other[m]]].sum()
                       for t, m, _ in cases])
        attract = np.array([a for _, _, a in cases])
        print(f"{name:7s} agrees at {ok.mean():6.1%} of {len(ok)} main verbs after a relative "
              f"clause; with an attractor {ok[attract].mean():6.1%} of {attract.sum()}, "
              f"without {ok[~attract].mean():6.1%} of {(~attract).sum()}")
        if name == "LSTM":
            agree_lstm, agree_lstm_attractor = ok.mean(), ok[attract].mean()
        else:
            agree_bigram = ok.mean()
    assert all(test_ids[t + 1] in verbs[m] for t, m, _ in cases)  # the text's own verb agrees
    assert agree_lstm > 0.9 and agree_lstm_attractor > 0.8 and agree_bigram < 0.6

# %% [markdown]
# The printed lines answer the question for this run (the asserts hold it to above 90%
# overall and 80% with an attractor, and the bigram below 60%): the LSTM puts most of its
# probability on the verb form that agrees with the subject, also when the noun right before
# the verb has the other number, while the bigram model, which sees only the previous word,
# does no better than a coin. So the LSTM's state does carry the number of the subject across
# the relative clause, one of the things a bigram cannot do.
#
# ## 6. Sampling text
#
# A language model is a generator: feed it `<eos>` (a sentence start), sample the next word from
# its softmax, feed that word back in with the carried hidden state, and repeat. Since the
# grammar is known, we can check each sampled sentence: `grammar.log_prob` is $-\infty$ for a
# sentence the grammar cannot produce.

# %% tags=["nbval-ignore-output"]
def sample_sentences(model, n: int, seed: int = 0, max_len: int = 40) -> list:
    rng = np.random.RandomState(seed)
    eos = corpus.dictionary.word2idx["<eos>"]
    model.eval()
    sentences, words, h, token = [], [], None, eos
    while len(sentences) < n:
        x = ndl.Tensor(np.array([[token]], dtype=np.float32), device=device, requires_grad=False)
        logits, h = model(x, h)
        h = detach_state(h)
        z = logits.numpy()[0].astype(np.float64)
        p = np.exp(z - z.max())
        token = int(rng.choice(V, p=p / p.sum()))
        if token == eos or len(words) == max_len:
            sentences.append(words)
            words = []
        else:
            words.append(corpus.dictionary.idx2word[token])
    return sentences


samples = sample_sentences(model, 40)
for s in samples[:6]:
    print("  ", " ".join(s))

# %% [markdown]
# How many of the 40 sampled sentences could the grammar have produced?

# %% tags=["nbval-ignore-output"]
if DATASET == "grammar":
    ok = [np.isfinite(grammar.log_prob(s + ["<eos>"])) for s in samples]
    print(f"{sum(ok)} of {len(ok)} sampled sentences are grammatical")
    assert sum(ok) >= 0.6 * len(ok)

# %% [markdown]
# The sentences above (their exact words depend on the trained weights, so nbval does not compare
# them) mostly follow the grammar, agreement included; the remaining errors are the rarer
# constructions that four short epochs did not pin down.
#
# **Takeaways.** An RNN is one affine map and a nonlinearity applied along the sequence; the
# LSTM's gated, additive cell state is what lets gradients survive longer spans. Training on a
# stream uses truncated BPTT, where `detach` keeps the graph (and memory) bounded per chunk. On
# text with a known entropy rate, a small LSTM gets within 15% of the best possible perplexity.
#
# Lecture 18 also sketches models beyond one left-to-right stack, which this notebook does not
# build. A **sequence-to-sequence** model (translation) runs an encoder RNN over the source
# sentence and starts a decoder RNN from its final state; the decoder generates the target one
# word at a time, as the sampler above does. A **bidirectional** RNN runs a second RNN from
# right to left and gives each position both states; it needs the whole input in advance, so
# it suits tagging or encoding, not a language model, which must not see the next word.
# Notebook 09 replaces the recurrence with attention.

# %% [markdown]
# ## Exercises
#
# Each exercise has a cell to fill in (it starts as `raise NotImplementedError`) and a check
# cell that says whether your answer is right: "not answered yet", "correct", or "not yet"
# with what differs. The first cell below gathers everything the exercises use, so this
# section also runs on its own after a kernel restart. Reference answers are in
# `notebooks/solutions/08_sequence_models.py`; try first.

# %% tags=["exercise-setup"]
import numpy as np

import needle as ndl
from needle import nn
from companion.check.exercises import check_exercise

rng = np.random.default_rng(0)
np.random.seed(0)
cell_ex = nn.RNNCell(3, 4)
x_ex = rng.standard_normal((2, 3)).astype(np.float32)
h_ex = rng.standard_normal((2, 4)).astype(np.float32)
params_ex = {name: getattr(cell_ex, name).numpy() for name in ("W_ih", "W_hh", "bias_ih",
                                                               "bias_hh")}
tokens_ex = list(range(26))          # a, b, c, ... as ids


def lstm_cell_size(input_size, hidden_size):
    """The number of numbers in nn.LSTMCell(input_size, hidden_size)'s parameters."""
    return sum(int(np.prod(p.shape)) for p in nn.LSTMCell(input_size, hidden_size).parameters())


# %% [markdown]
# **Exercise 8.1 (the recurrence).** Write one step of the tanh RNN of section 1 in numpy:
# $h' = \tanh(x W_{ih} + b_{ih} + h W_{hh} + b_{hh})$, with the weights as needle stores them
# (`W_ih` is (input, hidden), the biases (hidden,)). The check runs `nn.RNNCell` with the
# same parameters.

# %% tags=["exercise-stub"]
def rnn_step(x, h, W_ih, W_hh, bias_ih, bias_hh):
    """The next hidden state (batch, hidden) of a tanh RNN cell."""
    raise NotImplementedError


# %% tags=["exercise-check"]
check_exercise("8.1 rnn_step", lambda: rnn_step(x_ex, h_ex, **params_ex),
               cell_ex(ndl.Tensor(x_ex), ndl.Tensor(h_ex)).numpy(), rtol=1e-5, atol=1e-6)

# %% [markdown]
# **Exercise 8.2 (count before you build).** How many numbers does an LSTM cell learn, for
# input size $n$ and hidden size $h$ (four gates, each with its input and hidden weights and
# two biases)? The check counts `nn.LSTMCell`'s parameters.

# %% tags=["exercise-stub"]
def lstm_parameter_count(input_size, hidden_size):
    """The number of learned numbers in an LSTM cell."""
    raise NotImplementedError


# %% tags=["exercise-check"]
check_exercise("8.2 lstm_parameter_count",
               lambda: [lstm_parameter_count(n, h) for n, h in ((3, 4), (100, 256))],
               [lstm_cell_size(n, h) for n, h in ((3, 4), (100, 256))])

# %% [markdown]
# **Exercise 8.3 (batches for truncated BPTT).** `batchify(data, batch_size)` cuts the token
# stream into `batch_size` contiguous runs, one per column, dropping the tail that does not
# fill a row. Write it in numpy (shape (nbatch, batch_size)); the check compares with
# `ndl.data.batchify`.

# %% tags=["exercise-stub"]
def batchify_np(data, batch_size):
    """(len(data) // batch_size, batch_size) array whose columns are contiguous runs."""
    raise NotImplementedError


# %% tags=["exercise-check"]
check_exercise("8.3 batchify_np", lambda: [batchify_np(tokens_ex, 4), batchify_np(tokens_ex, 5)],
               [ndl.data.batchify(tokens_ex, b, device=None, dtype="float32") for b in (4, 5)])
