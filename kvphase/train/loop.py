"""The training loop: jitted AdamW steps, evaluations by residue, checkpoints that resume.

Everything a step uses is a function of (seed, step): the batch, the random window
offsets. A run interrupted at any point and resumed from its last checkpoint therefore
reaches the same weights as an uninterrupted one (tested).
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

from kvphase.errors import KvphaseError, PlanError, RunFolderError, out_of_memory
from kvphase.runfolder import save_atomic
from kvphase.train.config import TrainConfig
from kvphase.train.data import Batch, PairData

AUX_WEIGHT = 1.0  # weight of kpool's indexer distillation loss


class TrainingExtraMissing(KvphaseError):
    """JAX or optax is not installed."""


def require_jax():
    """Import jax and optax, or say in one line how to get them; then keep XLA's compilations."""
    from kvphase.engines.memory import training_address_space_error

    if too_little := training_address_space_error():
        raise KvphaseError(too_little)
    try:
        import jax
        import optax  # noqa: F401
    except ImportError as exc:
        if out_of_memory(exc):
            raise  # the command line names memory
        raise TrainingExtraMissing(
            f"training needs the optional extra: pip install 'kvphase[train]' ({exc.name} is missing)"
        ) from None
    _keep_compilations(jax)
    # Run each computation inline: with asynchronous dispatch on CPU, a step whose lightning indexer
    # is a pure_callback hung for good at times (the main thread waiting on the step's result, every
    # XLA worker idle; seen 3 times in 3 attempts on one 512-token run; jax issues 24255 and 25861).
    # Read when the CPU client is made, so before anything runs.
    jax.config.update("jax_cpu_enable_async_dispatch", False)


def strongly_typed(params: dict) -> dict:
    """`params` with no weakly typed array. An init such as jnp.full(n, 4.0) is weakly typed and the
    first update returns it strongly typed, so the step would be traced and compiled twice (measured:
    a 10-step csa-disjoint run compiled its step in 2.4 s, then again)."""
    import jax
    import jax.numpy as jnp

    return jax.tree.map(lambda a: jnp.asarray(a, a.dtype), params)


def compile_cache_dir() -> Path:
    """Where XLA's compiled steps are kept between runs: $XDG_CACHE_HOME/kvphase/jax."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvphase" / "jax"


def _keep_compilations(jax) -> None:
    """JAX's persistent compilation cache, unless the user chose one (JAX_COMPILATION_CACHE_DIR):
    compiling the step and the evaluation is most of a short run's time on one core (measured: a
    160-step run 22.5 s cold, 9.2 s warm), and a resumed or repeated run compiles nothing again.
    The cache is keyed by the computation, so a hit never changes a number. A folder that cannot
    be made leaves the cache off. Every computation is kept, not only those that took JAX's default
    second to compile: the evaluation and the small ones cost a run about 1 s each time it starts
    (measured: a 10-step csa-disjoint run 4.5 s warm with the default, 3.6 s with every one kept)."""
    if jax.config.jax_compilation_cache_dir:
        return
    try:
        folder = compile_cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
    except (OSError, RuntimeError):  # RuntimeError: no home directory
        return
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)


class StepMetrics(NamedTuple):
    step: int  # steps done
    loss: float  # value cross-entropy of this step's batch
    accuracy: float  # share of this step's questions answered right (argmax)
    steps_per_s: float


class Evaluation(NamedTuple):
    """The held-out questions at one step, each with its residue."""

    step: int
    key_positions: np.ndarray  # (n,) position of the asked record's key
    correct: np.ndarray  # (n,) bool
    logprob: np.ndarray  # (n,) log-probability of the right value


@dataclass
class Trainer:
    config: TrainConfig
    data: PairData
    params: dict
    opt_state: object
    step: int = 0
    saved_step: int | None = None  # the step of the checkpoint last saved or loaded

    @classmethod
    def new(cls, config: TrainConfig) -> Trainer:
        require_jax()
        data = PairData.of(config)
        params = strongly_typed(model_of(config).init_params(config, len(data.vocab), config.seed))
        return cls(config, data, params, optimizer(config).init(params))

    # -- one step ---------------------------------------------------------------------

    def train_step(self) -> tuple[float, float]:
        from kvphase.train.model import draw_starts

        starts = draw_starts(self.config, np.random.default_rng([self.config.seed, 3, self.step]), self.config.batch)
        copy = self.step < self.config.copy_steps
        if copy:
            batch = self.data.copy_batch(self.step)
            tokens, targets = batch.tokens, batch.loss_rows
        else:
            batch = self.data.training_batch(self.step)
            tokens, targets = batch.tokens, batch.answers
        step = _jitted_step(self.config, self.sparse, copy, self.config.stage(self.step))
        self.params, self.opt_state, loss, accuracy = step(self.params, self.opt_state, tokens, starts, targets)
        self.step += 1
        return float(loss), float(accuracy)

    def run(
        self,
        until: int,
        on_step: Callable[[StepMetrics], None] = lambda m: None,
        on_eval: Callable[[Evaluation], None] = lambda e: None,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> None:
        """Train to step `until`, evaluating (and calling `on_eval`, which checkpoints) every
        eval_every steps; returns early, between two steps, once `should_stop()`."""
        t0, done0 = time.perf_counter(), self.step
        while self.step < until and not should_stop():
            loss, accuracy = self.train_step()
            rate = (self.step - done0) / max(time.perf_counter() - t0, 1e-9)
            on_step(StepMetrics(self.step, loss, accuracy, rate))
            if self.step % self.config.eval_every == 0 or self.step == until:
                on_eval(self.evaluate())

    @property
    def sparse(self) -> bool:
        """Whether this step's attention reads only what the indexer selects (`TrainConfig.dense_first`)."""
        return not self.config.dense_first or self.step >= self.config.dense_steps

    # -- evaluation -------------------------------------------------------------------

    def evaluate(self, batch: Batch | None = None, chunk: int = 64) -> Evaluation:
        """Every held-out question: right or wrong, and the log-probability of its value."""
        from kvphase.train.model import draw_starts

        batch = batch if batch is not None else self.data.evaluation_batch()
        rng = np.random.default_rng([self.config.seed, 4])
        correct, logprob = [], []
        for lo in range(0, len(batch.tokens), chunk):
            tokens = batch.tokens[lo : lo + chunk]  # (n, T)
            starts = draw_starts(self.config, rng, len(tokens))  # (n, layers, heads)
            ok, lp = _jitted_eval(self.config.stage(self.step))(self.params, tokens, starts, batch.answers[lo : lo + chunk])
            correct.append(np.asarray(ok))
            logprob.append(np.asarray(lp))
        return Evaluation(self.step, batch.key_positions.ravel(), np.concatenate(correct).ravel(), np.concatenate(logprob).ravel())

    # -- checkpoints ------------------------------------------------------------------

    def save(self, path: Path) -> None:
        """Weights, optimiser state and step, written atomically (a kill never leaves half a file)."""
        import jax

        leaves = jax.tree_util.tree_leaves((self.params, self.opt_state))

        def write(tmp: Path) -> None:
            with open(tmp, "wb") as f:
                np.savez(f, step=np.int64(self.step), **{f"leaf{i}": np.asarray(x) for i, x in enumerate(leaves)})

        save_atomic(path, write)
        self.saved_step = self.step

    def load(self, path: Path) -> None:
        """The state `save` wrote; RunFolderError naming the problem when the file is not one
        this configuration saved (damaged, another model's shapes, a step outside the run)."""
        import jax

        step, leaves = self._saved_state(path, "is damaged", "delete it to start over")
        if not 0 <= step <= self.config.steps:
            raise RunFolderError(f"checkpoint {path} is damaged (step {step}, expected a whole number from 0 to "
                                 f"{self.config.steps}); delete it to start over")
        treedef = jax.tree_util.tree_structure((self.params, self.opt_state))
        self.params, self.opt_state = jax.tree_util.tree_unflatten(treedef, [jax.numpy.asarray(x) for x in leaves])
        self.step = self.saved_step = int(step)

    def start_from(self, path: Path, source: TrainConfig) -> None:
        """The weights of `source`'s checkpoint (`--init`), with this run's fresh optimiser and schedule.
        A source trained with every entry read may start a run with the lightning indexer (`--top-k`):
        the indexer's weights then start as this run's own, and its `dense_steps` distil them from the
        attention before it reads sparsely. That is how DeepSeek-V3.2-Exp added its indexer to a dense
        model (its technical report, section 2.1: a dense warm-up, then sparse training; its warm-up
        froze the rest of the model, which here keeps training). PlanError for any other weight that
        does not fit."""
        import jax

        from kvphase.train.csa import INDEXER_PREFIX

        remedy = "--init takes a run of the same design and sizes"
        shapes = source_state(source, len(self.data.vocab))  # (params, opt_state) as the source saved them
        _, leaves = self._saved_state(path, "cannot start this run", remedy, PlanError,
                                      jax.tree_util.tree_leaves(shapes))
        names = [jax.tree_util.keystr(key) for key, _ in jax.tree_util.tree_flatten_with_path(shapes[0])[0]]
        saved = dict(zip(names, leaves))  # the params lead the saved leaves
        flat, treedef = jax.tree_util.tree_flatten_with_path(self.params)
        started = []
        for key, own in flat:
            name = jax.tree_util.keystr(key)
            if name not in saved and not (fresh_indexer(self.config, source) and INDEXER_PREFIX in name):
                raise PlanError(f"checkpoint {path} cannot start this run (it has no weight {name}); {remedy}")
            leaf = saved.pop(name, None)
            if leaf is not None and leaf.shape != own.shape:
                raise PlanError(f"checkpoint {path} cannot start this run (array {name}: {leaf.dtype}{list(leaf.shape)}, "
                                f"expected {own.dtype}{list(own.shape)}); {remedy}")
            started.append(own if leaf is None else jax.numpy.asarray(leaf))
        if saved:
            extra = next(iter(saved))
            hint = ", the source's lightning indexer: give --top-k to keep one" if INDEXER_PREFIX in extra else ""
            raise PlanError(f"checkpoint {path} cannot start this run (this model has no weight {extra}{hint}); {remedy}")
        self.params = jax.tree_util.tree_unflatten(treedef, started)

    def _saved_state(self, path: Path, problem: str, remedy: str, error: type[KvphaseError] = RunFolderError,
                     expected: list | None = None) -> tuple[int, list]:
        """(step, leaves) of a checkpoint `save` wrote, each leaf checked against `expected` (this
        configuration's own leaves when not given)."""
        import zipfile

        import jax

        if expected is None:
            expected = jax.tree_util.tree_leaves((self.params, self.opt_state))
        names = ["step", *(f"leaf{i}" for i in range(len(expected)))]
        try:
            with np.load(path, allow_pickle=False) as saved:
                if sorted(saved.files) != sorted(names):
                    raise ValueError(f"it holds {len(saved.files)} arrays, this configuration saves {len(names)}")
                step, leaves = saved["step"], [saved[name] for name in names[1:]]
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise error(f"checkpoint {path} {problem} ({str(exc).splitlines()[0][:120]}); {remedy}") from None
        if step.shape != () or step.dtype.kind not in "iu":
            raise error(f"checkpoint {path} {problem} (step {step.tolist()!r}, expected a whole number); {remedy}")
        for i, (leaf, want) in enumerate(zip(leaves, expected)):
            if leaf.shape != want.shape or leaf.dtype != want.dtype or not np.isfinite(leaf).all():
                found = "non-finite values" if leaf.shape == want.shape and leaf.dtype == want.dtype else (
                    f"{leaf.dtype}{list(leaf.shape)}, expected {want.dtype}{list(want.shape)}")
                raise error(f"checkpoint {path} {problem} (array {i}: {found}); {remedy}")
        return int(step), leaves


def source_state(config: TrainConfig, n_vocab: int) -> tuple:
    """(params, opt_state) of a fresh model of `config`: the shapes its checkpoint holds."""
    params = model_of(config).init_params(config, n_vocab, config.seed)
    return params, optimizer(config).init(params)


def fresh_indexer(config: TrainConfig, source: TrainConfig) -> bool:
    """Whether `--init` from `source` adds the lightning indexer: this run selects the top-k, the
    source read every entry."""
    return config.indexer_top_k > 0 and source.indexer_top_k == 0


def model_of(config: TrainConfig):
    """The JAX module of the config's layout: `csa` (deepseek4's own) or `model` (gpt2 + kvphase's gate)."""
    if config.layout == "deepseek4":
        from kvphase.train import csa

        return csa
    if config.layout == "glm5-next":
        from kvphase.train import glm5

        return glm5
    from kvphase.train import model

    return model


def optimizer(config: TrainConfig):
    """AdamW, clipped, at the rate of `learning_rate`."""
    import optax

    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(learning_rate(config), weight_decay=0.01))


def learning_rate(config: TrainConfig):
    """A linear warm-up and cosine decay over the pairs steps. A first stage (the induction
    warm-up, `copy_steps`, or meanpool's gated start, `gate_steps`) runs before them at the peak
    rate after its own linear warm-up; the rest then warms up from zero again, as the measured
    recipes did (a fresh optimiser after the first stage)."""
    import optax

    def warmup(steps: int) -> int:
        return max(1, min(100, steps // 10))

    first = config.first_stage_steps
    n_pairs = config.steps - first
    pairs = optax.warmup_cosine_decay_schedule(0.0, config.lr, warmup(n_pairs), max(n_pairs, warmup(n_pairs) + 1), config.lr * 0.1)
    if not first:
        return pairs
    return optax.join_schedules([optax.linear_schedule(0.0, config.lr, warmup(first)), pairs], [first])


def _target_stats(params, tokens, starts, rows, targets, config: TrainConfig, sparse: bool = True):
    """Log-probability of each target token at its row, whether it is the argmax (B, R) each, and the
    auxiliary loss."""
    import jax
    import jax.numpy as jnp

    extra = {"sparse": sparse} if config.layout != "gpt2" else {}
    logits, aux = model_of(config).query_logits(params, tokens, jnp.asarray(starts), rows, config, **extra)  # (B, R, V)
    logp = jax.nn.log_softmax(logits, axis=-1)  # (B, R, V)
    target_logp = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]  # (B, R)
    return target_logp, logits.argmax(-1) == targets, aux


def _answer_stats(params, tokens, starts, answers, config: TrainConfig, sparse: bool = True):
    return _target_stats(params, tokens, starts, config.query_rows, answers, config, sparse)


def copy_stats(params, tokens, starts, loss_rows, config: TrainConfig, sparse: bool = True):
    """The induction warm-up's next-word cross-entropy and accuracy over the scored rows
    (row t predicts token t + 1), and the auxiliary loss."""
    rows = np.arange(config.n_positions - 1)
    next_logp, correct, aux = _target_stats(params, tokens, starts, rows, tokens[:, 1:], config, sparse)  # (B, T - 1) x2
    scored = loss_rows.sum()
    return -(next_logp * loss_rows).sum() / scored, (correct * loss_rows).sum() / scored, aux


@functools.lru_cache(maxsize=16)
def _jitted_step(config: TrainConfig, sparse: bool = True, copy: bool = False, forward_config: TrainConfig | None = None):
    """One optimisation step on the pairs (targets: the answers) or, with `copy`, on the induction
    warm-up (targets: the scored rows); the model runs as `forward_config` (the step's stage,
    `TrainConfig.stage`), the optimiser follows the whole run's `config`."""
    import jax
    import optax

    opt = optimizer(config)
    forward_config = forward_config or config

    def loss_fn(params, tokens, starts, targets):
        if copy:
            nll, accuracy, aux = copy_stats(params, tokens, starts, targets, forward_config, sparse)
        else:
            answer_logp, correct, aux = _answer_stats(params, tokens, starts, targets, forward_config, sparse)
            nll, accuracy = -answer_logp.mean(), correct.mean()
        return nll + AUX_WEIGHT * aux, (nll, accuracy)

    def step(params, opt_state, tokens, starts, targets):
        (_, (nll, accuracy)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, tokens, starts, targets)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, nll, accuracy

    return jax.jit(step)


@functools.lru_cache(maxsize=8)
def _jitted_eval(config: TrainConfig):
    import jax

    def evaluate(params, tokens, starts, answers):
        answer_logp, correct, _ = _answer_stats(params, tokens, starts, answers, config)
        return correct, answer_logp

    return jax.jit(evaluate)
