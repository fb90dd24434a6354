"""Plant known bugs in a copy of kvphase, one at a time, and see whether the tests catch them.

Each mutation is a text substitution in one file (statistics, placement, scoring, resume,
validate) and names the tests that should fail with it. The copy lives in a temporary
folder; the working tree is never touched. A mutation whose text no longer appears is
reported as stale, so the list cannot silently rot.

    python scripts/mutation_check.py            # all mutations
    python scripts/mutation_check.py --fast     # skip the ones whose tests run a real model
    python scripts/mutation_check.py --only wilson-90,chunk-restart
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COPIED = ["kvphase", "tests", "prompts", "pyproject.toml", "setup.py"]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # relative to the repository root
    old: str  # must occur exactly once
    new: str
    tests: tuple[str, ...]  # pytest node ids or files that should fail
    slow: bool = False  # its tests run a real model through llama.cpp


STATS, STRAT = "kvphase/sweep/analysis.py", "kvphase/statistics/stratified.py"
CONFORM_PATHS = "kvphase/conform/paths.py"
T_GENERATION_START = ("tests/engines/test_engine_paths.py::test_answers_spoiled_where_generation_starts_fail_token_by_"
                      "token_naming_the_answer_residue")
STAT_POWER, STAT_INTERVALS = "kvphase/statistics/power.py", "kvphase/statistics/intervals.py"
POSITIONS, LAYOUT, RUN = "kvphase/sweep/positions.py", "kvphase/sweep/layout.py", "kvphase/sweep/run.py"
LLAMA, BASE = "kvphase/backends/llamacpp.py", "kvphase/backends/base.py"
VREPORT, VCLI, VOPTIONS = "kvphase/validate/report.py", "kvphase/cli/validate_cmd.py", "kvphase/validate/options.py"
T_ANALYSIS, T_STRAT, T_CONTEXTS = "tests/statistics/test_analysis.py", "tests/statistics/test_stratified.py", "tests/sweep/test_contexts.py"
T_DESIGN, T_RUN, T_SCORING = "tests/statistics/test_design_statistics.py", "tests/sweep/test_run.py", "tests/backends/test_scoring.py"
T_VERDICT, T_COMPARE = "tests/validate/test_validate_verdict.py", "tests/sweep/test_compare.py"
KNOCKOUT, TAPS = "kvphase/probes/knockout_hooks.py", "kvphase/engines/taps.py"
CSA_EXPORT, T_CSA = "kvphase/train/export_deepseek4.py", "tests/train/test_train_csa.py"
T_GLM = "tests/train/test_train_glm5.py"
REFERENCE = "kvphase/backends/reference.py"
PROBE_FOLDER, RUN_FOLDER = "kvphase/probes/folder.py", "kvphase/runfolder/files.py"
T_PROBE_DAMAGE = "tests/probes/test_probe_gates.py::test_report_refuses_a_damaged_probe_folder_in_one_line"
T_IN_TURN = "tests/reference/test_reference_model.py::test_contexts_scored_in_turn_equal_each_scored_afresh"
T_GAPS = "tests/sweep/test_contexts.py::test_in_sequence_gaps_before_distractors_are_uniform_over_0_to_m_minus_1"
TRANSPORT, FLEET = "kvphase/backends/transport.py", "kvphase/backends/fleet.py"
T_SERVER = "tests/backends/test_server.py"
TRAIN_RUN, TRAIN_LOOP = "kvphase/train/run.py", "kvphase/train/loop.py"
T_SIGNALS = "tests/train/test_train.py::test_signals_during_training_each_keep_a_valid_checkpoint_and_the_run_ends_as_if_never_stopped"
T_TRAIN_FOLDERS = "tests/train/test_train_folders.py"
T_CACHE = "tests/train/test_train.py::test_training_keeps_its_compilations_where_the_user_wants_them"
T_CACHE_FILLED = "tests/train/test_train.py::test_a_training_run_fills_the_compilation_cache"
T_TAP = "tests/engines/test_knockout_llamacpp.py::test_head_outputs_of_a_multi_token_query_are_read_and_written_as_the_reference_computes_them"
T_SLOT_TAP = "tests/engines/test_knockout_llamacpp.py::test_a_slot_held_at_one_equals_a_gate_bias_that_picks_that_phase"
T_SLOT_MEANS = "tests/engines/test_knockout_llamacpp.py::test_recorded_gate_means_equal_the_pooling_kvphase_validate_proves"

CALIBRATE = "kvphase/sweep/calibrate.py"

MUTATIONS = [
    # training folders and signals
    Mutation("training-sigterm-unhandled", TRAIN_RUN, "for signum in (signal.SIGINT, signal.SIGTERM)}",
             "for signum in (signal.SIGINT,)}", (T_SIGNALS,), slow=True),
    Mutation("training-signal-raises-mid-step", TRAIN_RUN, "        if received:\n            raise KeyboardInterrupt\n",
             "        raise KeyboardInterrupt\n", (T_SIGNALS,), slow=True),
    Mutation("train-checkpoint-shapes-unchecked", TRAIN_LOOP,
             "if leaf.shape != want.shape or leaf.dtype != want.dtype or not np.isfinite(leaf).all():", "if False:",
             (T_TRAIN_FOLDERS,), slow=True),
    Mutation("train-table-values-unchecked", TRAIN_RUN,
             'frame[column] = numbers_in(path, frame, column, whole=column == "step")',
             'frame[column] = pd.to_numeric(frame[column], errors="coerce")', (T_TRAIN_FOLDERS,), slow=True),
    Mutation("train-rows-past-the-checkpoint-kept", TRAIN_RUN, "kept = frame[frame[\"step\"] <= step][columns]",
             "kept = frame[columns]", (T_TRAIN_FOLDERS,), slow=True),
    Mutation("train-output-files-unchecked", TRAIN_RUN, "    check_writable(out, FOLDER_FILES)\n", "", (T_TRAIN_FOLDERS,),
             slow=True),
    # the server backend's bounds on waiting
    Mutation("server-deadline-not-capping-a-request", TRANSPORT, "timeout = min(limit, left)", "timeout = limit",
             (T_SERVER,)),
    Mutation("server-no-watchdog", TRANSPORT, "patience, self.alive)\n        watch.start()\n", "patience, self.alive)\n",
             (T_SERVER,)),
    Mutation("server-timeout-named-as-other", TRANSPORT, "problem = _describe(exc) if not isinstance(exc, TimeoutError)",
             "problem = _describe(exc) if True", (T_SERVER,)),
    Mutation("server-first-contact-waits-the-whole-timeout", TRANSPORT,
             "limit = self._retry.request_timeout if self._answered else min(self._retry.request_timeout, FIRST_CONTACT_S)",
             "limit = self._retry.request_timeout", (T_SERVER,)),
    # issue 56: a silent server, the fleet's failover, rows against the plan, nearest values
    Mutation("server-silent-taken-for-alive", TRANSPORT, "            return True\n        except (OSError, http.client",
             "            return True\n        except ZeroDivisionError:  # (OSError, http.client", (T_SERVER,)),
    Mutation("server-alive-taken-for-silent", TRANSPORT, "            connection.getresponse()\n            return True",
             "            connection.getresponse()\n            return False",
             (T_SERVER + "::test_a_busy_server_that_answers_health_is_waited_for",)),
    Mutation("server-pace-never-measured", TRANSPORT, "            self.pace.record(time.monotonic() - started)\n", "",
             (T_SERVER + "::test_a_busy_server_that_answers_health_is_waited_for",)),
    Mutation("server-context-handed-back-twice", FLEET, "                todo.put((index, job))\n",
             "                todo.put((index, job))\n                todo.put((index, job))\n",
             (T_SERVER + "::test_every_context_of_a_lost_server_is_scored_exactly_once_by_the_others",)),
    Mutation("server-context-never-handed-back", FLEET, "                todo.put((index, job))\n", "",
             (T_SERVER + "::test_every_context_of_a_lost_server_is_scored_exactly_once_by_the_others",)),
    Mutation("server-later-calls-send-to-a-lost-server", FLEET,
             "workers = [worker for worker in self.workers if worker[0].http.url not in self._lost_urls()]",
             "workers = list(self.workers)", (T_SERVER + "::test_later_calls_skip_a_lost_server",)),
    Mutation("server-no-reserve-worker", FLEET, "                    if reserve:\n", "                    if False:\n",
             (T_SERVER + "::test_one_context_on_a_server_that_dies_goes_to_a_worker_not_yet_started",)),
    Mutation("server-down-at-start-refuses-the-fleet", FLEET, "                if len(self.engines) == 1:\n",
             "                if True:\n", (T_SERVER + "::test_a_server_down_at_the_start_leaves_as_one_lost_mid_run",)),
    Mutation("server-same-url-twice", FLEET, "        if one.http.url in seen:", "        if False:",
             (T_SERVER + "::test_cli_the_same_server_twice_is_one_line",)),
    Mutation("rows-residue-unchecked", "kvphase/runfolder/rows.py", '("residue", rows["residue"].to_numpy() != position',
             '("residue", 0 * rows["residue"].to_numpy() != 0 * position', ("tests/sweep/test_planned_rows.py",)),
    Mutation("rows-counts-unchecked", "kvphase/runfolder/rows.py", "seen >= plan.per_residue,", "seen > plan.per_residue,",
             ("tests/sweep/test_planned_rows.py",)),
    Mutation("matched-means-tolerance-doubled", POSITIONS, "MEAN_TOLERANCE = 0.5 ", "MEAN_TOLERANCE = 1.0 ",
             ("tests/gguf/test_odd_inputs.py",)),
    Mutation("matched-means-small-groups-bound-doubled", POSITIONS, "bound = modulus / 2 if n < modulus",
             "bound = modulus if n < modulus", ("tests/gguf/test_odd_inputs.py",)),
    Mutation("smallest-context-one-short", LAYOUT, "return first + m - 1 + below_highest",
             "return first + m - 2 + below_highest", ("tests/sweep/test_nearest_values.py",)),
    Mutation("smallest-detect-too-small", "kvphase/sweep/plan.py", "smallest = smallest if fits(smallest) else high",
             "smallest = low", ("tests/sweep/test_nearest_values.py",)),
    Mutation("special-token-last-id-refused", "kvphase/gguf/limits.py", "not 0 <= value < n_vocab)",
             "not 0 <= value < n_vocab - 1)", ("tests/gguf/test_odd_inputs.py",)),
    # statistics
    Mutation("report-intervals-90", STATS, "low, high = wilson_interval(hits, n)",
             "low, high = wilson_interval(hits, n, z=1.6448536269514722)", (T_ANALYSIS,)),
    Mutation("wilson-z-90", STAT_INTERVALS, "Z_95 = 1.959963984540054", "Z_95 = 1.6448536269514722", (T_ANALYSIS,)),
    Mutation("gap-best-minus-mean", STATS, "gap=round(float(acc.max() - acc.min()), 2)",
             "gap=round(float(acc.max() - acc.mean()), 2)", (T_ANALYSIS, T_COMPARE)),
    Mutation("periodicity-next-residue", STATS, "abs(acc[r] - acc[r + stride])", "abs(acc[r] - acc[r + 1])",
             (T_ANALYSIS, T_COMPARE)),
    Mutation("control-headline-dropped", STATS, "            if self.control:", "            if False:",
             (T_ANALYSIS,)),
    Mutation("cmh-overall-mean", STRAT, "excess = (in_group.T @ y.T).T - means @ table",
             "excess = (in_group.T @ y.T).T - y.mean(axis=1, keepdims=True) * table.sum(axis=0)", (T_STRAT,)),
    Mutation("cmh-variance-over-n", STRAT, "squares / np.maximum(size - 1, 1)", "squares / np.maximum(size, 1)",
             (T_STRAT,)),
    Mutation("singletons-not-pooled", STRAT, "pooled = np.where(sizes[cell_codes.ravel()] == 1, -1, cells[1])",
             "pooled = cells[1]", (T_STRAT,)),
    Mutation("permute-across-contexts", STRAT, "order = np.argsort(strata, kind=\"stable\")  # (N,) targets grouped",
             "order = np.arange(len(strata)); strata = np.zeros_like(strata)  # (N,) targets grouped", (T_STRAT,)),
    Mutation("permute-rows-assumed-in-context-order", STRAT,
             "slots = order[starts[sizes == size][:, None] + np.arange(size)]",
             "slots = starts[sizes == size][:, None] + np.arange(size)", (T_STRAT,)),
    Mutation("permutation-p-without-floor", STRAT, "return (sum(counts) + 1) / (permutations + 1)",
             "return sum(counts) / permutations", (T_STRAT,)),
    Mutation("permutation-p-one-shuffle-for-all", STRAT, "np.random.SeedSequence(seed).spawn(len(sizes))",
             "[np.random.SeedSequence(seed)] * len(sizes)", (T_STRAT,)),
    Mutation("chi-square-at-small-counts", STRAT, "MIN_EXPECTED = 5 ", "MIN_EXPECTED = 0 ", (T_STRAT,)),
    Mutation("chi-square-checks-successes-only", STRAT,
             "return float(min(successes.min(), (table.sum(axis=0) - successes).min()))",
             "return float(successes.min())", (T_STRAT,)),
    Mutation("expected-counts-from-the-pooled-rate", STRAT,
             "rate = np.bincount(stratification.strata, weights=correct) / table.sum(axis=1)  # (H,)",
             "rate = np.full(len(table), correct.mean())  # (H,)", (T_STRAT,)),
    Mutation("balanced-asks-every-residue-of-every-context", STRAT,
             "return bool(all(len(set(row[row > 0])) == 1 for row in table))",
             "return bool(all(len(set(row)) == 1 for row in table))", (T_STRAT,)),
    Mutation("power-50-percent", STAT_POWER, "POWER = 0.80", "POWER = 0.50", (T_STRAT, T_ANALYSIS)),
    Mutation("sample-size-not-balanced", STAT_POWER, "return -(-high // step) * step", "return high", (T_STRAT,)),
    Mutation("interval-90-percent", STAT_INTERVALS, "def percentile_interval(samples: np.ndarray, level: float = 0.95)",
             "def percentile_interval(samples: np.ndarray, level: float = 0.90)", (T_STRAT, T_ANALYSIS)),
    Mutation("bootstrap-unseeded", STAT_INTERVALS, "draws = np.random.default_rng(seed)", "draws = np.random.default_rng()",
             (T_STRAT,)),
    # placement
    # residue r's positions stretched about their mean by r / 480 (in steps of M, so residues
    # and means stay exact): SDs 1.7% apart, inside the planner's own 2% check
    Mutation("sd-drift", POSITIONS, "slots[r] = anchors + r - modulus * shifted  # (n,)",
             "slots[r] = anchors + r - modulus * shifted + modulus * np.round((anchors - anchors.mean()) * r / "
             "(480 * modulus)).astype(int)", (T_CONTEXTS,)),
    Mutation("no-residue-rotation", POSITIONS, "residue = (lane + c) % modulus", "residue = lane % modulus",
             (T_CONTEXTS, T_DESIGN)),
    Mutation("rounds-not-multiples-of-m", POSITIONS, "t = t // modulus * modulus if t >= modulus else t",
             "t = t", (T_CONTEXTS,)),
    Mutation("phase-mod-m", LAYOUT, "Target(first_target_id + i, index, p, p % m, p % s,",
             "Target(first_target_id + i, index, p, p % m, p % m,", (T_CONTEXTS,)),
    Mutation("in-sequence-gaps-short-of-m-minus-1", LAYOUT, "gap = int(rng.integers(self.settings.modulus))",
             "gap = int(rng.integers(self.settings.modulus - 1))", (T_GAPS,)),
    Mutation("in-sequence-gaps-never-0", LAYOUT, "gap = int(rng.integers(self.settings.modulus))",
             "gap = int(rng.integers(1, self.settings.modulus))", (T_GAPS,)),
    Mutation("mean-not-cancelled", POSITIONS, "slots[r] = anchors + r - modulus * shifted",
             "slots[r] = anchors + r", (T_CONTEXTS,)),
    # scoring
    Mutation("chunk-restart", LLAMA, "(t, start + i, CONTEXT_SEQ, False)", "(t, i, CONTEXT_SEQ, False)",
             (T_SCORING,), slow=True),
    Mutation("query-off-by-one", LLAMA, "(t, n_context + i, QUERY_SEQ,", "(t, n_context + i + 1, QUERY_SEQ,",
             (T_SCORING,), slow=True),
    Mutation("any-token-correct", BASE, "correct=bool(np.all(predicted == answer_arr))",
             "correct=bool(np.any(predicted == answer_arr))", (T_SCORING + "::test_teacher_forced_score_from_logits_by_hand",)),
    # resume
    Mutation("rescore-finished", RUN, "pending = [(c, [t for t in c.targets if t.target_id not in done]) for c in contexts]",
             "pending = [(c, list(c.targets)) for c in contexts]", (T_RUN,)),
    Mutation("keep-half-row", RUN_FOLDER, 'return data[: data.rfind(b"\\n") + 1]', "return data", (T_RUN,)),
    Mutation("foreign-rows-accepted", RUN,
             "if planned.get(int(row.target_id)) != (int(row.context), int(row.target_pos), str(row.key), str(row.answer)):",
             "if False:", (T_RUN,)),
    Mutation("other-plan-accepted", RUN, "if existing != plan.comparable():", "if False:", (T_RUN,)),
    Mutation("resume-other-model-of-same-size-accepted", RUN,
             'if recorded.get("size") != info.file_size or model_sha256(info.path) != recorded["sha256"]:',
             'if recorded.get("size") != info.file_size:', (T_RUN,)),
    Mutation("resume-other-contexts-accepted", RUN, "if recorded and recorded != fingerprint:", "if False:", (T_RUN,)),
    Mutation("resume-checks-position-and-key-only", RUN,
             "if planned.get(int(row.target_id)) != (int(row.context), int(row.target_pos), str(row.key), str(row.answer)):",
             "if (planned.get(int(row.target_id)) or (0, 0))[1:3] != (int(row.target_pos), str(row.key)):", (T_RUN,)),
    # probe folders under `kvphase report`
    Mutation("probe-table-without-rows-accepted", PROBE_FOLDER, "    if frame.empty:\n        raise RunFolderError(",
             "    if False:\n        raise RunFolderError(", (T_PROBE_DAMAGE,)),
    Mutation("probe-table-numbers-unchecked", PROBE_FOLDER, "            frame[column] = numbers_in(path, frame, column)",
             "            pass", (T_PROBE_DAMAGE,)),
    Mutation("probe-figure-in-the-way-unchecked", PROBE_FOLDER,
             '    check_writable(Path(run_dir), [SUMMARY_FILE, REPORT_FILE, FIGURES[config["probe"]]])\n', "",
             (T_PROBE_DAMAGE,)),
    Mutation("table-whole-numbers-unchecked", RUN_FOLDER, "        bad |= (values % 1 != 0) | (values < 0) | (values > WHOLE_LIMIT)",
             "        pass", (T_RUN,)),
    # the reference backend's prefix cache across contexts
    Mutation("reference-prefix-kept-across-offsets", REFERENCE,
             "same = self._policy_key is not None and key[0] is self._policy_key[0] and key[1] == self._policy_key[1]",
             "same = self._policy_key is not None and key[0] is self._policy_key[0]", (T_IN_TURN,), slow=True),
    Mutation("reference-common-prefix-unchecked", REFERENCE, "        if a[i] != b[i]:\n            return i",
             "        if False:\n            return i", (T_IN_TURN,), slow=True),
    Mutation("reference-cache-tail-kept", REFERENCE, "self._cache.truncate(min(keep, self._cache.n))",
             "self._cache.truncate(max(keep, self._cache.n))", (T_IN_TURN,), slow=True),
    # validate's per-layer verdicts
    Mutation("one-passing-layer-passes-the-model", VREPORT, "all(not layer.failures(self.tolerances) for layer in",
             "any(not layer.failures(self.tolerances) for layer in", (T_VERDICT,)),
    Mutation("empty-report-passes", VREPORT, "return bool(self.layers) and all(", "return all(", (T_VERDICT,)),
    Mutation("gate-logits-unchecked", VREPORT, "out += self.gates.excess(", "_ = self.gates.excess(", (T_VERDICT,)),
    Mutation("mask-mismatch-ignored", VREPORT, "        if self.mask_mismatch:\n", "        if False:\n", (T_VERDICT,)),
    Mutation("tie-read-back-not-required", VREPORT,
             'elif verdict == "tie" and (tokens_equal or not tie_needs_equal_tokens):', 'elif verdict == "tie":',
             (T_VERDICT,)),
    Mutation("attention-tolerance-absolute", VREPORT, "tol.attention_rel * max(self.attention_scale, 1e-30)",
             "tol.attention_rel", (T_VERDICT,)),
    # knockouts inside llama.cpp's graph
    Mutation("tap-writes-next-head", KNOCKOUT, "heads[:, self.head] = self.mean.astype(heads.dtype)",
             "heads[:, (self.head + 1) % heads.shape[1]] = self.mean.astype(heads.dtype)", (T_TAP,), slow=True),
    Mutation("tap-heads-token-major-misread", TAPS, "return array.reshape(n_tokens, n_head, -1)",
             "return array.reshape(n_head, n_tokens, -1).transpose(1, 0, 2)", (T_TAP,), slow=True),
    Mutation("tap-sees-the-context", LLAMA, "point.active = query or getattr(point.tap, \"every_decode\", False)",
             "point.active = True", (T_TAP,), slow=True),
    Mutation("slot-tap-holds-the-next-slot", KNOCKOUT,
             "held = (np.arange(windows.shape[2]) % self.stride == self.phase)[None, None, :]",
             "held = (np.arange(windows.shape[2]) % self.stride == (self.phase + 1) % self.stride)[None, None, :]",
             (T_SLOT_TAP,), slow=True),
    Mutation("slot-recorder-wrong-rows", KNOCKOUT,
             "done = windows[-n_new:] if self.gate.completed_last else windows[:n_new]",
             "done = windows[:n_new] if self.gate.completed_last else windows[-n_new:]", (T_SLOT_MEANS,), slow=True),
    Mutation("held-context-reused", LLAMA, "if context == self._context and context_tap is self._context_tap:",
             "if context == self._context:", (T_SLOT_TAP,), slow=True),
    # validate
    Mutation("validate-always-pass", VCLI,
             'console.print("[bold green]PASS[/bold green]" if report.passed else "[bold red]FAIL[/bold red]")',
             'console.print("[bold green]PASS[/bold green]")', (T_VERDICT,)),
    Mutation("scores-tolerance-100x", VOPTIONS, "scores_rel: float = 1e-4", "scores_rel: float = 1e-2", (T_VERDICT,)),
    Mutation("cli-scores-tolerance-100x", VCLI, 'scores_tol: float = typer.Option(Tolerances.scores_rel,',
             'scores_tol: float = typer.Option(Tolerances.scores_rel * 100,', (T_VERDICT,)),
    Mutation("keys-tolerance-100x", VOPTIONS, "keys_abs: float = 1e-5", "keys_abs: float = 1e-3", (T_VERDICT,)),
    Mutation("mismatched-sets-ignored", VREPORT, "        if self.mismatched:", "        if False:",
             ("tests/validate/test_validate.py::test_deepseek4_rolled_ape_fails",), slow=True),
    # the deepseek4-layout training (issue 18): export, the numpy reference, the probes' backend
    Mutation("csa-disjoint-rows-kept", CSA_EXPORT, "kv[:hd], gate[:hd], ape[:, :hd] = 0.0, 0.0, MASKED",
             "kv[:hd], gate[:hd] = 0.0, 0.0", (T_CSA + "::test_llamacpp_runs_the_trained_layout_as_trained",), slow=True),
    Mutation("csa-kv-untransposed", CSA_EXPORT, 'p + "attn_kv.weight": b["kv"].T,', 'p + "attn_kv.weight": b["kv"],',
             (T_CSA + "::test_llamacpp_runs_the_trained_layout_as_trained",), slow=True),
    Mutation("dsv4-reference-roped-forward", "kvphase/reference/deepseek4.py", "rope(out[:, h], -pos, c.n_rot",
             "rope(out[:, h], pos, c.n_rot", (T_CSA + "::test_the_numpy_reference_runs_the_exported_file_as_llamacpp_does",),
             slow=True),
    Mutation("probe-auto-reference-for-any-trained", "kvphase/probes/setup.py",
             'return "reference" if trained is not None and not trained.in_engine_layout else "llama.cpp"',
             'return "reference" if trained is not None else "llama.cpp"',
             (T_CSA + "::test_probes_take_llamacpp_for_a_deepseek4_file_and_the_reference_refuses_head_knockouts",),
             slow=True),
    # the glm5-next-layout training (issue 18 part 2): ties, the KDA layer, the MLA export
    Mutation("kpool-ties-by-lower-index", "kvphase/train/glm5.py",
             "np.put_along_axis(chosen, partial_sort_sets(flat, int(k)), True, axis=1)",
             "np.put_along_axis(chosen, np.argsort(-flat, axis=1, kind='stable')[:, : int(k)], True, axis=1)",
             (T_GLM + "::test_llamacpps_top_k_selects_the_pools_training_selected",), slow=True),
    Mutation("heap-child-choice-flipped", "kvphase/designs/windows.py",
             "second = np.where(right_smaller, second - 1, second)",
             "second = np.where(right_smaller, second, np.where(go, second - 1, second))",
             (T_GLM + "::test_the_tie_breaking_is_libstdcxx_partial_sort",)),
    Mutation("kda-conv-taps-reversed", "kvphase/train/glm5.py",
             "y = sum(padded[:, i : i + x.shape[1]] * taps[:, i] for i in range(k))",
             "y = sum(padded[:, i : i + x.shape[1]] * taps[:, k - 1 - i] for i in range(k))",
             (T_GLM + "::test_llamacpp_runs_the_trained_layout_as_trained",), slow=True),
    Mutation("glm-v-b-transposed-heads", "kvphase/train/export_glm5.py",
             'p + "attn_v_b.weight": b["v_b"],', 'p + "attn_v_b.weight": b["v_b"][::-1].copy(),',
             (T_GLM + "::test_llamacpp_runs_the_trained_layout_as_trained",), slow=True),
    # issue 22 item 6: threads for the CPUs granted, and training's compilation cache
    Mutation("threads-default-to-every-cpu-of-the-machine", "kvphase/defaults.py",
             "return len(os.sched_getaffinity(0))", "return os.cpu_count() or 1",
             ("tests/cli/test_cli.py::test_threads_default_to_the_cpus_the_process_may_use",), slow=True),
    Mutation("validate-threads-zero-read-as-the-default", "kvphase/validate/run.py",
             "threads = default_threads() if threads is None else threads", "threads = threads or default_threads()",
             ("tests/validate/test_validate.py::test_validate_refuses_a_thread_count_llama_cpp_cannot_run",), slow=True),
    Mutation("compilations-never-kept", TRAIN_LOOP, '    jax.config.update("jax_compilation_cache_dir", str(folder))\n',
             "", (T_CACHE, T_CACHE_FILLED), slow=True),
    Mutation("compile-cache-overrides-the-users-choice", TRAIN_LOOP,
             "    if jax.config.jax_compilation_cache_dir:\n        return\n", "", (T_CACHE,)),
    # --calibrate
    Mutation("pilot-scores-the-sweeps-own-contexts", CALIBRATE, "seed=plan.seed + PILOT_SEED_OFFSET)", "seed=plan.seed)",
             ("tests/sweep/test_calibrate.py::test_the_pilot_scores_no_context_the_sweep_scores",)),
    Mutation("pilot-budget-unchecked", CALIBRATE, "    if spent + tokens_of(pilot) > PILOT_BUDGET * sweep_tokens:",
             "    if False:", ("tests/sweep/test_calibrate.py::test_the_budget_stops_a_walk_whose_next_step_would_cost_more"
                               "_than_it_allows",)),
    Mutation("calibrated-folder-runs-a-second-pilot", CALIBRATE,
             'return held if held.calibration.get("requested") == _request(plan, band, knobs) else None',
             "return None", ("tests/sweep/test_calibrate.py::test_the_calibration_round_trips_through_config_json_and_a_"
                             "rerun_reuses_it",)),
    Mutation("walk-stops-at-the-bands-edge", CALIBRATE, "    low, high = band.middle\n    for level in levels:",
             "    low, high = band\n    for level in levels:",
             ("tests/sweep/test_calibrate.py::test_a_step_at_the_edge_of_the_band_walks_on_to_its_middle",)),
    Mutation("walk-goes-on-past-the-band", CALIBRATE, "        if step.accuracy <= high if above else step.accuracy >= low:",
             "        if low <= step.accuracy <= high:", ("tests/sweep/test_calibrate.py::test_a_walk_that_crosses_the_band_"
                                                        "takes_the_step_nearest_it_that_the_budget_allows",)),
    # conform moves where generation starts (issue 70)
    Mutation("conform-one-answer-residue", CONFORM_PATHS, "    return sorted({base + r for r in range(stride)} | set(extra))",
             "    return sorted({base} | set(extra))", (T_GENERATION_START,)),
    Mutation("conform-names-the-contexts-residue", CONFORM_PATHS, "    return (length + PROMPT_TOKENS) % stride",
             "    return length % stride", (T_GENERATION_START,)),
]


def run_tests(tree: Path, tests: tuple[str, ...], timeout: int, slow: bool = False) -> tuple[int, float]:
    """pytest's exit code on `tests` in `tree` (0: all passed) and the seconds it took; the
    fast tests only unless `slow`."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    started = time.time()
    select = [] if slow else ["-m", "not slow"]
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *select, *tests],
                              cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
        code = done.returncode
    except subprocess.TimeoutExpired:
        code = -1
    return code, time.time() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="skip mutations whose tests run a real model")
    parser.add_argument("--only", default="", help="comma-separated mutation names")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per pytest run")
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS if (not args.fast or not m.slow)
              and (not args.only or m.name in args.only.split(","))]
    with tempfile.TemporaryDirectory(prefix="kvphase-mutants-") as tmp:
        tree = Path(tmp)
        for name in COPIED:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
            elif source.exists():
                shutil.copy2(source, tree / name)
        baseline = sorted({t for m in chosen for t in m.tests})
        code, seconds = run_tests(tree, tuple(baseline), args.timeout, slow=any(m.slow for m in chosen))
        if code != 0:
            print(f"the unmutated tests fail (exit {code}); fix them first: {' '.join(baseline)}")
            return 2
        print(f"baseline: {len(baseline)} test targets pass ({seconds:.0f} s)")
        caught, missed, stale = [], [], []
        for m in chosen:
            path = tree / m.path
            original = path.read_text()
            if original.count(m.old) != 1:
                stale.append(m.name)
                print(f"STALE   {m.name}: {m.old!r} occurs {original.count(m.old)} times in {m.path}")
                continue
            path.write_text(original.replace(m.old, m.new))
            try:
                code, seconds = run_tests(tree, m.tests, args.timeout, slow=m.slow)
            finally:
                path.write_text(original)
            (caught if code != 0 else missed).append(m.name)
            print(f"{'caught' if code != 0 else 'MISSED':7} {m.name} ({m.path}, {seconds:.0f} s)")
        print(f"\n{len(caught)} of {len(caught) + len(missed)} planted bugs caught"
              + (f"; missed: {', '.join(missed)}" if missed else "") + (f"; stale: {', '.join(stale)}" if stale else ""))
        return 1 if missed or stale else 0


if __name__ == "__main__":
    sys.exit(main())
