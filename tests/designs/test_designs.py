"""Hand-checkable tests of the design references (no llama.cpp, fast)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvphase.designs import DESIGNS, DSV4, MSA, BlockTopK, KPool, MeanPool, WindowLayout, attend
from kvphase.designs.dsv4 import Yarn, rms_norm, rope
from kvphase.designs.windows import ambiguous_top_k, tail_positions, top_k_indices

RNG = np.random.default_rng(1234)


def randn(*shape):
    return RNG.normal(size=shape).astype(np.float32)


def dense_attention(queries, keys, values):
    """Plain causal GQA attention, written independently of `attend`."""
    n, n_head, d = queries.shape
    group = n_head // keys.shape[1]
    out = np.zeros_like(queries)
    for t in range(n):
        for h in range(n_head):
            logits = keys[: t + 1, h // group] @ queries[t, h] / np.sqrt(d)
            w = np.exp(logits - logits.max())
            out[t, h] = (w / w.sum()) @ values[: t + 1, h // group]
    return out


# -- window layout ------------------------------------------------------------------------


def test_layout_stride_window_and_start_move_boundaries():
    assert WindowLayout(4, 4).members(2).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert WindowLayout(4, 2).members(3).tolist() == [[0, 1, 2, 3], [2, 3, 4, 5], [4, 5, 6, 7]]
    assert WindowLayout(4, 4, start=1).members(2).tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]]
    # 10 positions: windows [0,4) [4,8) complete, [8,12) not; with start 3: [3,7) only
    assert WindowLayout(4, 4).n_complete(10) == 2
    assert WindowLayout(4, 4, start=3).n_complete(10) == 1
    assert WindowLayout(4, 4, start=3).n_complete(11) == 2
    assert WindowLayout(4, 4, start=2).phase(np.arange(7)).tolist() == [-1, -1, 0, 1, 2, 3, 0]


def test_layout_window_becomes_visible_at_its_last_token():
    seen = WindowLayout(4, 4).window_visible(np.array([2, 3, 6, 7]), 2)
    assert seen.tolist() == [[False, False], [True, False], [True, False], [True, True]]


def test_tail_positions_follow_set_input_kpool():
    # kpool 4 from 0: p=5 has n_tail=(5+1)%4=2 -> [5, 4]; p=7 completes its pool -> no tail
    assert tail_positions(np.array([0, 5, 7, 8]), 4, 0).tolist() == [
        [0, -1, -1],
        [5, 4, -1],
        [-1, -1, -1],
        [8, -1, -1],
    ]


def test_top_k_orders_by_score_breaks_ties_by_index_and_flags_them():
    scores = np.array([[1.0, 3.0, 2.0, 3.0], [5.0, -np.inf, -np.inf, -np.inf]], np.float32)
    assert top_k_indices(scores, 2).tolist() == [[1, 3], [0, -1]]
    assert top_k_indices(scores, 3).tolist() == [[1, 3, 2], [0, -1, -1]]
    assert ambiguous_top_k(scores, 1).tolist() == [True, False]  # 3.0 == 3.0 at the boundary
    assert ambiguous_top_k(scores, 2).tolist() == [False, False]


# -- kpool --------------------------------------------------------------------------------


def test_kpool_uniform_gate_gives_plain_mean():
    kp = KPool(kpool=4, top_k=8, cache_dtype="f32")
    keys = randn(10, 6)
    pooled = kp.pool_keys(keys, np.zeros((10, 6), np.float32), np.zeros((4, 6), np.float32))
    np.testing.assert_allclose(pooled, [keys[0:4].mean(0), keys[4:8].mean(0)], rtol=1e-6, atol=1e-6)


def test_kpool_one_hot_phase_bias_keeps_exactly_that_phase_per_channel():
    kp = KPool(kpool=4, top_k=8, cache_dtype="f32")
    keys, gates = randn(8, 3), randn(8, 3)
    ape = np.zeros((4, 3), np.float32)
    ape[2, 0] = ape[0, 1] = ape[3, 2] = 1e4  # channel 0 keeps phase 2, channel 1 phase 0, channel 2 phase 3
    pooled = kp.pool_keys(keys, gates, ape)
    np.testing.assert_array_equal(pooled[1], [keys[6, 0], keys[4, 1], keys[7, 2]])


def test_kpool_start_offset_moves_pools_and_keeps_the_prefix():
    kp = KPool(kpool=4, top_k=4, start=2, cache_dtype="f32")
    keys = randn(11, 2)
    pooled = kp.pool_keys(keys, np.zeros((11, 2), np.float32), np.zeros((4, 2), np.float32))
    np.testing.assert_allclose(pooled, [keys[2:6].mean(0), keys[6:10].mean(0)], rtol=1e-6)
    result = kp.forward(randn(11, 1, 2), np.ones((11, 1), np.float32), keys, np.zeros((11, 2)), np.zeros((4, 2)))
    # position 1 is before start: it sees only the prefix {0, 1}; position 3 sees prefix + tail {2, 3}
    assert np.flatnonzero(result.visible[1]).tolist() == [0, 1]
    assert np.flatnonzero(result.visible[3]).tolist() == [0, 1, 2, 3]


def test_kpool_scores_use_relu_weights_and_the_llama_cpp_scale():
    kp = KPool(kpool=2, top_k=2)
    weights = kp.scale_weights(np.array([[2.0, -1.0]], np.float32), n_embd_indexer=8)
    np.testing.assert_allclose(weights, [[2.0 / 4.0, -1.0 / 4.0]])  # 1/sqrt(8*2) = 1/4
    queries = np.zeros((1, 2, 8), np.float32)
    queries[0, 0, 0], queries[0, 1, 0] = 3.0, -5.0  # head 1's dot product is negative: relu drops it
    pool_keys = np.zeros((1, 8), np.float32)
    pool_keys[0, 0] = 2.0
    score = kp.scores(queries, weights, pool_keys, np.array([1]))
    np.testing.assert_allclose(score, [[0.5 * 6.0]])


def test_kpool_query_never_sees_a_future_pool():
    kp = KPool(kpool=4, top_k=16)
    n = 16
    result = kp.forward(randn(n, 2, 4), np.abs(randn(n, 2)), randn(n, 4), randn(n, 4), randn(4, 4))
    for p in range(n):
        visible_pools = np.isfinite(result.scores[p])
        assert visible_pools.sum() == (p + 1) // 4
        assert not result.visible[p, p + 1 :].any()
        assert result.visible[p, : p + 1].all()  # top_k covers every pool, so all past tokens


def test_kpool_incomplete_tail_rule():
    kp = KPool(kpool=4, top_k=4)  # one pool per query
    n = 12
    queries = np.ones((n, 1, 2), np.float32)
    keys = np.zeros((n, 2), np.float32)
    keys[0:4] = 1.0  # pool 0 scores highest for every query; pools 1, 2 score 0
    result = kp.forward(queries, np.ones((n, 1), np.float32), keys, np.zeros((n, 2)), np.zeros((4, 2)))
    # p=6: pool 0 (complete) + tail {4, 5, 6}
    assert np.flatnonzero(result.visible[6]).tolist() == [0, 1, 2, 3, 4, 5, 6]
    # p=7 completes pool 1 but pool 0 wins the only slot: no tail, so 4..7 are not seen
    assert np.flatnonzero(result.visible[7]).tolist() == [0, 1, 2, 3]
    assert result.selected[7].tolist() == [0, 1, 2, 3, -1, -1, -1]
    no_tail = dataclasses.replace(kp, select_tail=False)
    result = no_tail.forward(queries, np.ones((n, 1), np.float32), keys, np.zeros((n, 2)), np.zeros((4, 2)))
    assert np.flatnonzero(result.visible[6]).tolist() == [0, 1, 2, 3]
    assert not result.visible[2].any()  # before the first complete pool nothing is visible


def test_kpool_top_k_picks_expected_pools_in_descending_order():
    kp = KPool(kpool=2, top_k=4)  # two pools
    pool_keys = np.eye(4, dtype=np.float32)
    queries = np.array([[[3.0, 1.0, 2.0, 0.5]]], np.float32)
    scores = kp.scores(queries, np.ones((1, 1), np.float32), pool_keys, np.array([7]))
    assert kp.top_pools(scores).tolist() == [[0, 2]]
    assert kp.selected_positions(kp.top_pools(scores), np.array([7])).tolist() == [[0, 1, 4, 5, -1]]


def test_kpool_f16_cache_rounds_keys_gates_and_pooled_keys():
    keys = np.full((4, 1), 1.0 + 2.0**-12, np.float32)  # between two float16 neighbours 1 and 1 + 2^-10
    zeros = np.zeros((4, 1), np.float32)
    f32 = KPool(kpool=4, top_k=4, cache_dtype="f32")
    f16 = KPool(kpool=4, top_k=4, cache_dtype="f16")
    assert f32.pool_keys(keys, zeros, zeros)[0, 0] == np.float32(1.0 + 2.0**-12)
    assert f16.pool_keys(keys, zeros, zeros)[0, 0] == 1.0  # the key was rounded before pooling
    pooled = np.array([[1.0 + 3 * 2.0**-12]], np.float32)
    assert f16.cached(pooled)[0, 0] == 1.0 + 2.0**-10  # rounds to the nearest float16
    assert f32.cached(pooled)[0, 0] == pooled[0, 0]
    # gates are rounded too: a gate difference below float16 resolution stops mattering
    gates = np.array([[1.0], [1.0 + 2.0**-12], [1.0], [1.0]], np.float32)
    varied = np.array([[0.0], [1.0], [2.0], [3.0]], np.float32)
    assert f16.pool_keys(varied, gates, zeros)[0, 0] == np.float32(1.5)
    assert f32.pool_keys(varied, gates, zeros)[0, 0] != np.float32(1.5)


def test_kpool_key_norm_is_layernorm_with_bias():
    x = np.array([[1.0, 2.0, 3.0, 6.0]], np.float32)  # mean 3, variance 3.5
    out = KPool.key_norm(x, np.full(4, 2.0), np.full(4, 0.5), eps=0.5)
    np.testing.assert_allclose(out, [(x[0] - 3.0) / 2.0 * 2.0 + 0.5], rtol=1e-6)


def test_kpool_flags_ambiguous_ties():
    kp = KPool(kpool=2, top_k=2)
    result = kp.forward(np.ones((6, 1, 1)), np.ones((6, 1)), np.ones((6, 1)), np.zeros((6, 1)), np.zeros((2, 1)))
    assert result.ambiguous[5]  # three identical pools compete for one slot
    assert not result.ambiguous[1]  # a single visible pool


# -- meanpool and blocktopk -----------------------------------------------------------------


def test_meanpool_with_unit_windows_equals_dense_attention():
    queries, keys, values = randn(9, 4, 5), randn(9, 2, 5), randn(9, 2, 5)
    out = attend(queries, MeanPool(window=1, stride=1).compress(queries, keys, values))
    np.testing.assert_allclose(out, dense_attention(queries, keys, values), rtol=1e-5, atol=1e-6)


def test_meanpool_entries_are_window_means_visible_once_complete():
    keys, values = randn(10, 1, 2), randn(10, 1, 2)
    cache = MeanPool(window=4, stride=2, local_window=1).compress(randn(10, 1, 2), keys, values)
    assert cache.first_position[:4].tolist() == [0, 2, 4, 6]
    np.testing.assert_allclose(cache.keys[1], keys[2:6].mean(0), rtol=1e-6)
    np.testing.assert_allclose(cache.values[3], values[6:10].mean(0), rtol=1e-6)
    # query at 6: windows ending at 3 and 5 are complete; plus the local token 6 itself
    seen = np.flatnonzero(cache.visible[6])
    assert seen.tolist() == [0, 1, 4 + 6]


def test_meanpool_start_offset_keeps_the_prefix_exact():
    cache = MeanPool(window=4, stride=4, start=3).compress(randn(10, 1, 2), randn(10, 1, 2), randn(10, 1, 2))
    assert cache.first_position[:1].tolist() == [3]
    n_windows = 1
    assert np.flatnonzero(cache.visible[9]).tolist() == [0, n_windows + 0, n_windows + 1, n_windows + 2]


def test_blocktopk_picks_the_blocks_whose_mean_key_matches_the_query():
    keys = np.zeros((12, 1, 2), np.float32)
    keys[4:8, 0, 0] = 1.0  # block 1 points along x
    keys[8:12, 0, 1] = 1.0  # block 2 points along y
    queries = np.zeros((12, 1, 2), np.float32)
    queries[:, 0, 1] = 1.0  # every query looks along y
    cache = BlockTopK(block_size=4, top_k=1, local_window=1).compress(queries, keys, keys)
    assert np.flatnonzero(cache.visible[11, 0]).tolist() == [8, 9, 10, 11]
    # at 10 block 2 is incomplete: blocks 0 and 1 tie at 0, the earlier wins; local token 10
    assert np.flatnonzero(cache.visible[10, 0]).tolist() == [0, 1, 2, 3, 10]


def test_blocktopk_with_every_block_and_a_full_local_window_is_dense():
    queries, keys, values = randn(8, 2, 3), randn(8, 1, 3), randn(8, 1, 3)
    cache = BlockTopK(block_size=2, top_k=4, local_window=2).compress(queries, keys, values)
    np.testing.assert_allclose(attend(queries, cache), dense_attention(queries, keys, values), rtol=1e-5, atol=1e-6)


# -- dsv4 ------------------------------------------------------------------------------------


def test_dsv4_hca_uniform_gate_gives_block_mean():
    hca = DSV4(ratio=128, n_swa=4)
    kv = randn(300, 3)
    pooled = hca.pool(kv, np.zeros_like(kv))
    np.testing.assert_allclose(pooled, [kv[0:128].mean(0), kv[128:256].mean(0)], rtol=1e-5, atol=1e-6)


def test_dsv4_overlapped_compressor_mixes_the_previous_block():
    csa = DSV4(ratio=4, n_swa=4)
    kv = randn(12, 4)  # d = 2: channels 0-1 feed the next block, channels 2-3 the own block
    pooled = csa.pool(kv, np.zeros_like(kv))
    # block 0 has no previous block: its -inf half gets no weight
    np.testing.assert_allclose(pooled[0], kv[0:4, 2:].mean(0), rtol=1e-6)
    # block 1 averages 8 rows: previous block's first half, own block's second half
    expected = np.concatenate([kv[0:4, :2], kv[4:8, 2:]]).mean(0)
    np.testing.assert_allclose(pooled[1], expected, rtol=1e-6)


def test_dsv4_one_hot_ape_keeps_one_phase():
    hca = DSV4(ratio=128, n_swa=4)
    kv = randn(128, 2)
    ape = np.zeros((128, 2), np.float32)
    ape[37] = 1e4
    logits = hca.gate_logits(np.zeros((128, 2), np.float32), ape)
    np.testing.assert_array_equal(hca.pool(kv, logits)[0], kv[37])


def test_dsv4_blocks_become_visible_at_their_last_token_and_indexer_keeps_top_k():
    csa = DSV4(ratio=4, n_swa=2, top_k=1)
    index_keys = np.eye(3, dtype=np.float32)  # three blocks, d_idx = 3
    queries = np.array([[[1.0, 5.0, 2.0]]] * 12, np.float32)  # (12, 1, 3)
    selection = csa.forward(12, queries=queries, weights=np.ones((12, 1)), index_keys=index_keys)
    assert np.isfinite(selection.scores).sum(1).tolist() == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3]
    assert np.flatnonzero(selection.block_visible[5]).tolist() == [0]
    assert np.flatnonzero(selection.block_visible[7]).tolist() == [1]  # 5 > 1
    assert np.flatnonzero(selection.raw_visible[7]).tolist() == [6, 7]  # sliding window of 2
    hca = DSV4(ratio=128, n_swa=3).forward(300)
    assert hca.block_visible[255].tolist() == [True, True] and hca.block_visible[254].tolist() == [True, False]


def test_dsv4_entries_round_to_the_cache_type():
    csa32 = DSV4(ratio=4, n_swa=2, cache_dtype="f32")
    csa16 = dataclasses.replace(csa32, cache_dtype="f16")
    args = (randn(8, 4), randn(8, 4), randn(4, 4), np.ones(2, np.float32), 1e-6)
    e32, e16 = csa32.entries(csa32.finished(*args)), csa16.entries(csa16.finished(*args))
    np.testing.assert_array_equal(e16, e32.astype(np.float16).astype(np.float32))
    assert not np.array_equal(e16, e32)


def test_rms_norm_and_rope_by_hand():
    np.testing.assert_allclose(rms_norm(np.array([[3.0, 4.0]]), np.ones(2), 0.0), [[3 / np.sqrt(12.5), 4 / np.sqrt(12.5)]])
    x = np.array([[9.0, 1.0, 0.0, 1.0, 0.0]], np.float32)  # channel 0 is "nope", 1-4 rotate
    out = rope(x, np.array([2]), n_rot=4, freq_base=100.0, offset=1)
    # pair (1, 2) turns by 2 rad, pair (3, 4) by 2 * 100^(-1/2) = 0.2 rad
    np.testing.assert_allclose(out, [[9.0, np.cos(2.0), np.sin(2.0), np.cos(0.2), np.sin(0.2)]], rtol=1e-5)


def test_yarn_correction_dims_and_ramp_by_hand():
    # dim(beta) = n_rot * ln(n_ctx_orig / (2 pi beta)) / (2 ln base); base e^2 makes the divisor 4
    yarn = Yarn(ext_factor=1.0, n_ctx_orig=4096, beta_fast=32.0, beta_slow=1.0)
    fast, slow = 16 * np.log(4096 / (64 * np.pi)) / 4, 16 * np.log(4096 / (2 * np.pi)) / 4  # 12.04, 25.9
    assert yarn.correction_dims(16, np.e**2) == (12.0, 15.0)  # floor(12.04); ceil(25.9) capped at n_rot - 1
    assert (np.floor(fast), np.ceil(slow)) == (12.0, 26.0)
    # base 10^4: dim(32) = 16 ln(4096 / 64 pi) / 2 ln 10^4 = 2.62, dim(1) = 5.63, so the ramp runs over
    # pairs 2..6: 1 - clip((i - 2) / 4, 0, 1), times ext_factor 0.5 (llama.cpp's rope_yarn_ramp)
    assert Yarn(ext_factor=0.5, n_ctx_orig=4096).correction_dims(16, 10000.0) == (2.0, 6.0)
    ramp = Yarn(ext_factor=0.5, n_ctx_orig=4096).ramp(8, 16, 10000.0)
    np.testing.assert_allclose(ramp, [0.5, 0.5, 0.5, 0.375, 0.25, 0.125, 0.0, 0.0], rtol=1e-6)
    assert ramp[0] == 0.5 and ramp[-1] == 0.0  # first pairs extrapolate (ext_factor of them), last interpolate


def test_rope_with_yarn_mixes_interpolated_and_extrapolated_angles():
    x = np.tile(np.array([[1.0, 0.0]], np.float32), (1, 4))  # four pairs, each starting at angle 0
    positions = np.array([40])
    plain = rope(x, positions, n_rot=8, freq_base=10000.0)
    scaled = rope(x, positions, n_rot=8, freq_base=10000.0, freq_scale=0.25)
    off = Yarn(ext_factor=0.0, n_ctx_orig=64)
    np.testing.assert_array_equal(rope(x, positions, n_rot=8, freq_base=10000.0, freq_scale=0.25, yarn=off), scaled)
    # ext_factor 1: the ramp weights the unscaled angle; attn_factor cancels the magnitude boost
    yarn = Yarn(ext_factor=1.0, n_ctx_orig=64, attn_factor=1 / (1 + 0.1 * np.log(4.0)))
    mix = yarn.ramp(4, 8, 10000.0)
    assert 0 < mix.max() and mix.min() < 1
    got = rope(x, positions, n_rot=8, freq_base=10000.0, freq_scale=0.25, yarn=yarn)
    unscaled = 40 * 10000.0 ** (-np.arange(4) / 4)  # pair i turns by pos * base^(-2i/n_rot)
    np.testing.assert_allclose(plain[0, ::2], np.cos(unscaled), atol=1e-5)
    angle = (1 - mix) * 0.25 * unscaled + mix * unscaled
    np.testing.assert_allclose(got[0, ::2], np.cos(angle), atol=1e-5)
    np.testing.assert_allclose(got[0, 1::2], np.sin(angle), atol=1e-5)
    boosted = rope(x, positions, n_rot=8, freq_base=10000.0, freq_scale=0.25, yarn=Yarn(1.0, 64))
    np.testing.assert_allclose(np.hypot(boosted[0, ::2], boosted[0, 1::2]), 1 + 0.1 * np.log(4.0), rtol=1e-6)


# -- msa -------------------------------------------------------------------------------------


def test_msa_block_score_is_the_max_and_local_blocks_always_win():
    msa = MSA(block_size=4, top_k=2, local_blocks=1, cache_dtype="f32")
    keys = np.zeros((16, 1), np.float32)
    keys[1, 0], keys[9, 0] = 5.0, 3.0  # block 0 peaks at 5, block 2 at 3, block 1 at 0
    queries = np.ones((16, 1, 1), np.float32)
    result = msa.forward(queries, keys)
    np.testing.assert_array_equal(result.block_scores[15, 0], [5.0, 0.0, 3.0, 0.0])
    # query 15 is in block 3 (forced), then the best other block is 0
    assert sorted(result.top_blocks[15, 0].tolist()) == [0, 3]
    assert np.flatnonzero(result.visible[15, 0]).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    # query 5: block 1 forced (only 4, 5 are causal), then block 0; block 2 is in the future
    assert np.flatnonzero(result.visible[5, 0]).tolist() == [0, 1, 2, 3, 4, 5]
    assert np.isneginf(result.block_scores[5, 0, 2])


def test_msa_each_head_group_selects_its_own_blocks():
    msa = MSA(block_size=2, top_k=2, local_blocks=1, cache_dtype="f32")
    keys = np.zeros((8, 2), np.float32)
    keys[0, 0], keys[2, 1] = 1.0, 1.0  # block 0 along x, block 1 along y
    queries = np.zeros((8, 2, 2), np.float32)
    queries[:, 0, 0], queries[:, 1, 1] = 1.0, 1.0  # head 0 looks along x, head 1 along y
    visible = msa.forward(queries, keys).visible
    assert np.flatnonzero(visible[7, 0]).tolist() == [0, 1, 6, 7]
    assert np.flatnonzero(visible[7, 1]).tolist() == [2, 3, 6, 7]


# -- gated pooling (kvphase's trained compressor) ----------------------------------------------


def _gated(ape_phase=None, **kw):
    from kvphase.designs import GatedPool

    ape = np.zeros((4, 1, 2), np.float32)
    if ape_phase is not None:
        ape[ape_phase] = 50.0  # softmax over the window puts (almost) all weight on this slot
    return GatedPool(window=4, stride=4, gate=np.zeros((1, 2, 2), np.float32), ape=ape, **kw)


def test_gated_pool_with_a_zero_gate_is_the_mean():
    keys = np.arange(16, dtype=np.float32).reshape(8, 1, 2)
    cache = _gated().compress(keys[:, :, :], keys, keys * 2)
    assert np.allclose(cache.keys[:2, 0], [[3.0, 4.0], [11.0, 12.0]])  # means of rows 0-3 and 4-7
    assert np.allclose(cache.values[:2, 0], [[6.0, 8.0], [22.0, 24.0]])


def test_gated_pool_with_a_one_hot_phase_bias_keeps_that_phase():
    keys = np.arange(16, dtype=np.float32).reshape(8, 1, 2)
    cache = _gated(ape_phase=2).compress(keys, keys, keys)
    assert np.allclose(cache.keys[:2, 0], [[4.0, 5.0], [12.0, 13.0]])  # rows 2 and 6: slot 2 of each window
    shifted = _gated(ape_phase=2, start=1).compress(keys, keys, keys)
    assert np.allclose(shifted.keys[0, 0], [6.0, 7.0])  # window 1..4, slot 2 is row 3


def test_gated_top_k_reads_the_best_window_token_by_token():
    from kvphase.designs import GatedTopK

    keys = np.zeros((12, 1, 2), np.float32)
    keys[4:8, 0, 0] = 1.0  # window 1 points along x
    queries = np.zeros((12, 1, 2), np.float32)
    queries[:, 0, 0] = 1.0
    design = GatedTopK(window=4, stride=4, local_window=1, top_k=1, gate=np.zeros((1, 2, 2), np.float32),
                       ape=np.zeros((4, 1, 2), np.float32))
    visible = design.compress(queries, keys, keys).visible
    assert np.flatnonzero(visible[11]).tolist() == [4, 5, 6, 7, 11]  # window 1 and the query itself
    assert np.flatnonzero(visible[6]).tolist() == [0, 1, 2, 3, 6]  # window 1 is incomplete: window 0 is the only choice


def test_gated_pool_needs_its_weights():
    from kvphase.designs import GatedPool

    with pytest.raises(ValueError, match="expected a gate and an ape"):
        GatedPool(window=4, stride=4)
    with pytest.raises(ValueError, match="ape of shape"):
        GatedPool(window=4, stride=4, gate=np.zeros((1, 2, 2)), ape=np.zeros((3, 1, 2)))


# -- registry and validation ----------------------------------------------------------------


def test_registry_lists_frozen_dataclasses_with_a_start():
    assert set(DESIGNS) == {"kpool", "dsv4", "msa", "meanpool", "blocktopk", "gatedpool", "gatedtopk", "cowindow"}
    for cls in (registered.cls for registered in DESIGNS.values()):
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
        # CoWA's heads share one partition: its boundaries move by per-head offsets, not one start
        assert {"start", "offsets"} & {f.name for f in dataclasses.fields(cls)}


def test_the_post_hoc_designs_take_the_sweeps_stride():
    """`for_stride`: a window or block of the stride, 16 blocks (or 16 pools of tokens) selected."""
    assert [name for name, registered in DESIGNS.items() if registered.post_hoc] == ["meanpool", "blocktopk", "kpool"]
    assert DESIGNS["meanpool"].for_stride(8) == {"window": 8, "stride": 8}
    assert DESIGNS["blocktopk"].for_stride(8) == {"block_size": 8, "top_k": 16}
    assert DESIGNS["kpool"].for_stride(8) == {"kpool": 8, "top_k": 128}
    assert DESIGNS["meanpool"].option_names == ("window", "stride", "local_window", "start")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: KPool(kpool=1, top_k=4), "kpool > 1"),
        (lambda: KPool(kpool=4, top_k=6), "multiple of kpool=4, got 6"),
        (lambda: KPool(kpool=4, top_k=8, cache_dtype="bf16"), "cache_dtype"),
        (lambda: KPool(kpool=4, top_k=8, start=-1), "start to be an integer >= 0, got -1"),
        (lambda: DSV4(ratio=1, n_swa=4), "ratio >= 2"),
        (lambda: DSV4(ratio=4, n_swa=0), "n_swa to be a positive integer, got 0"),
        (lambda: MSA(block_size=0, top_k=2, local_blocks=1), "block_size"),
        (lambda: MSA(block_size=4, top_k=2, local_blocks=-1), "local_blocks"),
        (lambda: MeanPool(window=0, stride=1), "window to be a positive integer, got 0"),
        (lambda: MeanPool(window=2, stride=2.5), "stride"),
        (lambda: BlockTopK(block_size=4, top_k=0), "top_k"),
        (lambda: WindowLayout(window=4, stride=0), "stride"),
    ],
)
def test_invalid_parameters_raise_value_error(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_shape_mismatch_names_what_was_expected():
    kp = KPool(kpool=4, top_k=4)
    with pytest.raises(ValueError, match=r"expected ape of shape \(4, 3\), got \(2, 3\)"):
        kp.pool_keys(randn(8, 3), randn(8, 3), randn(2, 3))


def test_start_offset_moves_dsv4_and_msa_blocks():
    hca = DSV4(ratio=128, n_swa=4, start=5)
    kv = randn(140, 1)
    np.testing.assert_allclose(hca.pool(kv, np.zeros_like(kv)), [kv[5:133].mean(0)], rtol=1e-5)
    ape = np.zeros((128, 1), np.float32)
    ape[0] = 1e4  # phase 0 is now position 5
    np.testing.assert_array_equal(hca.pool(kv, hca.gate_logits(np.zeros_like(kv), ape))[0], kv[5])
    msa = MSA(block_size=4, top_k=1, local_blocks=1, start=1, cache_dtype="f32")
    result = msa.forward(np.ones((9, 1, 1), np.float32), np.ones((9, 1), np.float32))
    # block 0 is now positions 1-4: query 4 sees the prefix {0} and its own block
    assert np.flatnonzero(result.visible[4, 0]).tolist() == [0, 1, 2, 3, 4]
    assert np.flatnonzero(result.visible[5, 0]).tolist() == [0, 5]
