"""Training sequences: key value records scattered among filler, then questions.

A sequence is BOS, then `context - 1` tokens of random filler words holding `records`
records (" key", " value") at uniformly random non-overlapping places, then `queries` questions that repeat the key
of a record in the context and its value. The loss is on the values of the questions
only. Random gaps put records on every residue, and the first question sits at position
`context`, where `kvphase sweep` puts its query, so a sweep asks the model exactly what
it was trained on (the task file `prompts/pairs.toml`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from kvphase.errors import PlanError
from kvphase.sweep.tasks import Task, load_task
from kvphase.train.config import COPY_RUN, TrainConfig
from kvphase.train.vocab import WordVocab


class CopyBatch(NamedTuple):
    """The induction warm-up's sequences: a run of words, then the same run again."""

    tokens: np.ndarray  # (n_seq, n_positions) int32
    loss_rows: np.ndarray  # (n_seq, n_positions - 1) float32: 1 where row t's next token (t + 1) is scored


class Batch(NamedTuple):
    tokens: np.ndarray  # (n_seq, n_positions) int32: context then questions
    key_positions: np.ndarray  # (n_seq, queries) position of each asked record's key in the context
    answers: np.ndarray  # (n_seq, queries) the value token each question must produce


def task_vocab(task: Task) -> WordVocab:
    """Every word a sequence of this task can hold, one token each."""
    return WordVocab.of_words([*task.keys, *task.values, *task.filler.split()])


@dataclass(frozen=True)
class PairData:
    """Draws training and evaluation sequences for one configuration."""

    config: TrainConfig
    vocab: WordVocab
    keys: np.ndarray  # (n_keys,) token ids
    values: np.ndarray  # (n_values,) token ids
    filler: np.ndarray  # (n_filler,) token ids

    @classmethod
    def of(cls, config: TrainConfig) -> PairData:
        task = load_task(config.task)
        if task.record != (" {key}", " {value}") or task.query != (" {key}",) or task.answer != (" {value}",):
            raise PlanError(f"task {task.name!r} is not a key value pair task; kvphase train learns 'pairs'-like tasks")
        vocab = task_vocab(task)
        data = cls(
            config,
            vocab,
            np.array([vocab.word_id(w) for w in task.keys]),
            np.array([vocab.word_id(w) for w in task.values]),
            np.array([vocab.word_id(w) for w in task.filler.split()]),
        )
        if config.records > min(len(data.keys), len(data.values)):
            raise PlanError(
                f"--records {config.records} needs as many distinct keys and values, but task {task.name!r} has only "
                f"{min(len(data.keys), len(data.values))}"
            )
        return data

    def background(self, rng: np.random.Generator) -> np.ndarray:
        """BOS, then random filler words over every position (n_positions,), for records or copies to overwrite."""
        tokens = self.filler[rng.integers(len(self.filler), size=self.config.n_positions)]  # (n_positions,)
        tokens[0] = self.vocab.bos_id
        return tokens

    def sequence(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One sequence: tokens (n_positions,), the asked keys' positions and values (queries,) each."""
        c = self.config
        tokens = self.background(rng)  # (n_positions,)
        keys = rng.permutation(self.keys)  # (n_keys,)
        values = rng.permutation(self.values)  # (n_values,)
        # n sorted draws from the free slots, each shifted past the records before it: every
        # non-overlapping placement is equally likely, so records land on every residue alike
        free = c.context - 1 - c.records
        starts = 1 + np.sort(rng.choice(free, size=c.records, replace=False)) + np.arange(c.records)  # (records,)
        tokens[starts] = keys[: len(starts)]
        tokens[starts + 1] = values[: len(starts)]
        asked = rng.choice(len(starts), size=c.queries, replace=False)  # (queries,)
        rows = c.query_rows  # (queries,)
        tokens[rows] = keys[asked]
        tokens[rows + 1] = values[asked]
        return tokens, starts[asked], values[asked]

    def copy_sequence(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """BOS and filler holding a run of COPY_RUN random words (keys, values, filler alike) in
        the context and the same run again anywhere after it, up to the question rows; scored on
        the repeat's words after its first, which only an induction circuit predicts (find the
        current word's earlier copy, read the word after it). The random places and distance
        leave no fixed offset to attend to; the run in the context and the repeat reaching into
        the question rows put the copying where the pairs ask for it, as in the experiment that
        first carried over (a repeat 0-3 words after a run placed anywhere did worse: first
        question 30-32% against 33-45% at 3 seeds, 16 tokens, reports/README.md)."""
        c, n = self.config, COPY_RUN
        tokens = self.background(rng)  # (n_positions,)
        words = np.concatenate([self.keys, self.values, self.filler])  # (n_words,)
        run = words[rng.integers(len(words), size=n)]  # (n,)
        first = 1 + rng.integers(min(c.context, c.n_positions - n) - n)
        repeat = first + n + rng.integers(c.n_positions - n - (first + n) + 1)
        tokens[first : first + n] = run
        tokens[repeat : repeat + n] = run
        loss_rows = np.zeros(c.n_positions - 1, np.float32)  # (n_positions - 1,)
        loss_rows[repeat : repeat + n - 1] = 1.0
        return tokens, loss_rows

    def copy_batch(self, step: int) -> CopyBatch:
        """The warm-up batch of one step, a function of (seed, step) alone like `training_batch`."""
        rng = np.random.default_rng([self.config.seed, 5, step])
        parts = [self.copy_sequence(rng) for _ in range(self.config.batch)]
        return CopyBatch(np.stack([p[0] for p in parts]).astype(np.int32), np.stack([p[1] for p in parts]))

    def batch(self, rng: np.random.Generator, n_seq: int) -> Batch:
        parts = [self.sequence(rng) for _ in range(n_seq)]
        return Batch(*(np.stack([p[i] for p in parts]).astype(np.int32) for i in range(3)))

    def training_batch(self, step: int) -> Batch:
        """The batch of one step: a function of (seed, step) alone, so a resumed run sees the same data."""
        return self.batch(np.random.default_rng([self.config.seed, 1, step]), self.config.batch)

    def evaluation_batch(self) -> Batch:
        """Held-out sequences, the same at every evaluation."""
        return self.batch(np.random.default_rng([self.config.seed, 2]), self.config.eval_sequences)
