"""`reference.rounding`: activations rounded to 8-bit blocks as ggml-cpu's quantize_row_q8_0/q8_1 do.

Expected values are worked by hand: d = amax / 127 stored as fp16, q = rint(x / d) with ties
to even, the dequantized value q * fp16(d), and Q8_1's block-sum error fp16(d * sum q) - fp16(d) * sum q.
"""

from __future__ import annotations

import numpy as np

from kvphase.reference.rounding import quantize_q8


def test_q8_blocks_round_a_known_vector():
    x = np.zeros((1, 64), np.float32)  # two blocks of 32; the second is all zeros
    x[0, :3] = [1.0, 0.5, -0.25]  # amax 1: d = 1/127, fp16(d) = 1032 * 2**-17 = 0.00787353515625
    dequantized, sum_error = quantize_q8(x)
    # q = rint(127, 63.5, -31.75) = 127, 64 (a tie, to even), -32
    fp16_d = 0.00787353515625
    expected = np.zeros((1, 64), np.float32)
    expected[0, :3] = [127 * fp16_d, 64 * fp16_d, -32 * fp16_d]  # 0.99993896484375, 0.50390625, -0.251953125
    np.testing.assert_array_equal(dequantized, expected)
    # sum q = 159: fp16(159 / 127) = fp16(1.2519685) = 1.251953125; fp16(d) * 159 = 1.25189208984375
    np.testing.assert_array_equal(sum_error, np.array([[2.0**-14, 0.0]], np.float32))


def test_q8_blocks_keep_values_a_power_of_two_scale_represents():
    x = np.zeros((1, 32), np.float32)
    x[0, :5] = [254.0, 3.0, 5.0, -1.0, -63.0]  # amax 254: d = 2 exactly, q = rint(127, 1.5, 2.5, -0.5, -31.5)
    dequantized, sum_error = quantize_q8(x)
    np.testing.assert_array_equal(dequantized[0, :5], [254.0, 4.0, 4.0, 0.0, -64.0])
    np.testing.assert_array_equal(sum_error, [[0.0]])  # d * sum q = 2 * 99 is exact in fp16
