#!/usr/bin/env python3
"""Golden vectors for the fake-quant operators Q_win / Q_kv / Q_idx (MODEL_SPEC 3.9).

An implementation independent of src/quant: all arithmetic in numpy float32, and every rounding
to a narrow format done by ml_dtypes' casts (float8_e4m3fn, float4_e2m1fn, float8_e8m0fnu).
It runs on the GPU machine (which has numpy and ml_dtypes); the C++ test golden_vectors_test.cpp
reads the files it writes. Usage: gen_vectors.py OUT_DIR

  Q_win (blocks of 32): A = max(max|x|, 1e-4); s = pow2ceil(A * f32(1/448));
                        x^ = e4m3(clip(x / s, -448, 448)) * s
  Q_kv  (blocks of 16): A = max(max|x|, 6*2^-9); s = e4m3(A / 6);
                        x^ = e2m1(clip(x / s, -6, 6)) * s
  Q_idx (blocks of 32): A = max(max|x|, 6*2^-126); s = pow2ceil(A * f32(1/6));
                        x^ = e2m1(clip(x / s, -6, 6)) * s
pow2ceil(t) = 2^ceil(log2 t), here from np.frexp (t = m * 2^e, m in [0.5, 1): k = e - 1 if m == 0.5
else e). Q_kv's scale stays below 464 (A < 2784), where ml_dtypes would return NaN instead of
saturating: the spec leaves that range undefined.

File format (little endian), one file per operator, q_win.bin / q_kv.bin / q_idx.bin:
  char magic[8] = "DS41QV01"; u32 op (0 win, 1 kv, 2 idx); u32 n (channels per row); u32 rows;
  u32 row_bytes; f32 x[rows*n]; u8 row[rows*row_bytes]; f32 xhat[rows*n]
Rows: Q_win: n E4M3 codes, then n/32 E8M0 exponents. Q_kv: n/2 bytes of E2M1 codes (low nibble =
even element), then n/16 E4M3 scales. Q_idx: n/2 bytes of E2M1 codes, then n/32 E8M0 exponents.
Scalar sweeps, e4m3_sweep.bin / e2m1_sweep.bin:
  char magic[8] = "DS41SV01"; u32 kind (0 e4m3, 1 e2m1); u32 count; f32 x[count]; u8 code[count]
"""
import struct
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

F32 = np.float32
E4M3 = ml_dtypes.float8_e4m3fn
E2M1 = ml_dtypes.float4_e2m1fn
E8M0 = ml_dtypes.float8_e8m0fnu

rng = np.random.default_rng(20261130)


def f32(v):
    return np.asarray(v, dtype=F32)


def e4m3_codes(v, allow_nan=False):
    c = f32(v).astype(E4M3)
    assert allow_nan or not np.isnan(c.astype(F32)).any(), "e4m3 cast produced NaN"
    return c.view(np.uint8), c.astype(F32)


def e2m1_codes(v):
    c = f32(v).astype(E2M1)
    codes = c.view(np.uint8)
    assert (codes < 16).all()
    return codes, c.astype(F32)


def pow2ceil(t):
    t = f32(t)
    assert (t > 0).all() and np.isfinite(t).all()
    m, e = np.frexp(t)
    k = np.where(m == F32(0.5), e - 1, e).astype(np.int32)
    s = np.ldexp(F32(1.0), k).astype(F32)
    assert (s >= t).all() and (s / F32(2) < t).all()
    return s


def e8m0_bytes(s):
    c = f32(s).astype(E8M0)
    assert (c.astype(F32) == s).all()
    return c.view(np.uint8)


def amax(x, floor):
    return np.maximum(np.abs(x).max(axis=1), F32(floor)).astype(F32)


def q_win(x):  # x: [blocks, 32]
    a = amax(x, F32(1e-4))
    s = pow2ceil(a * (F32(1.0) / F32(448.0)))
    y = np.clip(x / s[:, None], F32(-448), F32(448)).astype(F32)
    codes, vals = e4m3_codes(y)
    return codes, e8m0_bytes(s), (vals * s[:, None]).astype(F32)


def q_kv(x):  # x: [blocks, 16]
    a = amax(x, F32(6) * F32(2.0 ** -9))
    assert (a < F32(2784)).all()
    sc, s = e4m3_codes(a / F32(6))
    y = np.clip(x / s[:, None], F32(-6), F32(6)).astype(F32)
    codes, vals = e2m1_codes(y)
    return codes, sc, (vals * s[:, None]).astype(F32)


def q_idx(x):  # x: [blocks, 32]
    a = amax(x, F32(6) * F32(2.0 ** -126))
    s = pow2ceil(a * (F32(1.0) / F32(6.0)))
    y = np.clip(x / s[:, None], F32(-6), F32(6)).astype(F32)
    codes, vals = e2m1_codes(y)
    return codes, e8m0_bytes(s), (vals * s[:, None]).astype(F32)


def pack_nibbles(codes):  # [..., 2m] -> [..., m], low nibble = even element
    return (codes[..., 0::2] & 15) | ((codes[..., 1::2] & 15) << 4)


def nextafter(v, toward):
    return np.nextafter(f32(v), F32(toward))


E4M3_POS = np.arange(0, 0x7F, dtype=np.uint8).view(E4M3).astype(F32)  # 0 .. 448
E4M3_MIDS = ((E4M3_POS[:-1].astype(np.float64) + E4M3_POS[1:]) / 2).astype(F32)
assert (E4M3_MIDS.astype(np.float64) == (E4M3_POS[:-1].astype(np.float64) + E4M3_POS[1:]) / 2).all()
E2M1_MIDS = f32([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])


def random_normal_blocks(nb, bs, lo_exp, hi_exp):
    scale = (10.0 ** rng.uniform(lo_exp, hi_exp, size=(nb, 1))).astype(F32)
    return (rng.standard_normal((nb, bs)).astype(F32) * scale).astype(F32)


def random_bit_blocks(nb, bs, emin, emax):
    """Floats with random sign, exponent in [emin, emax] (biased, 0 = subnormal) and mantissa."""
    sign = rng.integers(0, 2, size=(nb, bs), dtype=np.uint32) << 31
    exp = rng.integers(emin, emax + 1, size=(nb, bs), dtype=np.uint32) << 23
    man = rng.integers(0, 1 << 23, size=(nb, bs), dtype=np.uint32)
    return (sign | exp | man).view(F32)


def special_blocks(bs, floor):
    out = []
    z = np.zeros(bs, F32)
    out.append(z.copy())
    out.append(-z)
    mix = z.copy()
    mix[1::2] = F32(-0.0)
    out.append(mix)
    for v in [floor, nextafter(floor, 0), nextafter(floor, 1), floor * F32(0.5), floor * F32(0.01)]:
        b = mix.copy()
        b[3] = v
        b[7] = -v * F32(0.3)
        out.append(b)
    one = z.copy()
    one[bs - 1] = F32(-1.0)
    out.append(one)
    return out


def win_cases():
    bs, blocks = 32, []
    blocks += special_blocks(bs, F32(1e-4))
    # Block maxima at and around the pow2ceil boundary: A * f32(1/448) near 2^k.
    for k in range(-22, 25, 3):
        for a in [F32(448 * 2.0 ** k), nextafter(448 * 2.0 ** k, 0), nextafter(448 * 2.0 ** k, np.inf),
                  F32(224 * 2.0 ** k), nextafter(224 * 2.0 ** k, np.inf)]:
            b = random_normal_blocks(1, bs, -1, 0)[0] * F32(a / 4)
            b[rng.integers(bs)] = a if rng.integers(2) else -a
            blocks.append(b.astype(F32))
    # Exact E4M3 midpoints after scaling: A = 400 * 2^k (s = 2^k); every midpoint, both signs,
    # including subnormal midpoints and the subnormal/normal boundary 7.5 * 2^-9.
    mids = np.concatenate([E4M3_MIDS, -E4M3_MIDS])
    for k in [-20, -7, 0, 5, 30]:
        for i in range(0, len(mids), bs - 1):
            b = np.zeros(bs, F32)
            chunk = mids[i:i + bs - 1]
            b[:len(chunk)] = chunk * F32(2.0 ** k)
            b[bs - 1] = F32(400 * 2.0 ** k)
            blocks.append(b)
    return blocks


def kv_cases():
    bs, blocks = 16, []
    blocks += special_blocks(bs, F32(6) * F32(2.0 ** -9))
    # Scales exactly on the E4M3 grid (A = 6 s) with E2M1 midpoints after scaling.
    for code in list(range(1, 0x7F, 3)) + [0x7E]:
        s = np.array([code], dtype=np.uint8).view(E4M3).astype(F32)[0]
        b = np.zeros(bs, F32)
        m = np.concatenate([E2M1_MIDS, -E2M1_MIDS])
        b[:14] = m * s
        b[14] = F32(6) * s
        b[15] = -F32(6) * s * F32(0.999)
        blocks.append(b)
    # A / 6 exactly at an E4M3 midpoint (scale ties) and one ulp either side. The ulp below is
    # where the spec's division differs from A * f32(1/6) (e.g. A = 7.1249995: A / 6 rounds below
    # the midpoint 1.1875, A * f32(1/6) onto it), so every midpoint is included.
    for mid in E4M3_MIDS:
        a = F32(6) * mid
        if a >= 2784 or a < F32(6) * F32(2.0 ** -9):
            continue
        for aa in [a, nextafter(a, 0), nextafter(a, np.inf)]:
            b = random_normal_blocks(1, bs, -1, 0)[0] * F32(aa / 3)
            b[rng.integers(bs)] = -aa if rng.integers(2) else aa
            blocks.append(np.clip(b, -aa, aa).astype(F32))
    return blocks


def idx_cases():
    bs, blocks = 32, []
    floor = F32(6) * F32(2.0 ** -126)
    blocks += special_blocks(bs, floor)
    # Float subnormals below the floor, and blocks at the floor.
    blocks.append(random_bit_blocks(1, bs, 0, 0)[0])
    blocks.append(random_bit_blocks(1, bs, 0, 3)[0])
    for k in list(range(-126, -110, 2)) + list(range(-20, 30, 4)) + [120]:
        for a in [F32(6 * 2.0 ** k), nextafter(6 * 2.0 ** k, 0), nextafter(6 * 2.0 ** k, np.inf),
                  F32(3 * 2.0 ** k)]:
            b = random_normal_blocks(1, bs, -1, 0)[0] * F32(a / 4)
            b[rng.integers(bs)] = a if rng.integers(2) else -a
            blocks.append(np.clip(b, -a, a).astype(F32))
    # E2M1 midpoints after scaling: A = 6 * 2^k gives s = 2^k (6 * f32(1/6) rounds to 1).
    for k in [-126, -60, -9, 0, 7, 40]:
        b = np.zeros(bs, F32)
        m = np.concatenate([E2M1_MIDS, -E2M1_MIDS])
        b[:14] = m * F32(2.0 ** k)
        b[14:28] = np.nextafter(m, F32(0)) * F32(2.0 ** k)
        b[28] = F32(6 * 2.0 ** k)
        blocks.append(b)
    return blocks


def fill(blocks, total, bs, lo_exp, hi_exp, emin, emax):
    blocks = [f32(b) for b in blocks]
    assert len(blocks) <= total, (len(blocks), total)
    rest = total - len(blocks)
    n_norm = rest * 2 // 3
    blocks += list(random_normal_blocks(n_norm, bs, lo_exp, hi_exp))
    blocks += list(random_bit_blocks(rest - n_norm, bs, emin, emax))
    x = np.stack(blocks).astype(F32)
    # Shuffle whole blocks so the special cases land in every row position.
    return x[rng.permutation(len(x))]


def write_op(path, op, n, x, row, xhat):
    rows = row.shape[0]
    with open(path, "wb") as f:
        f.write(b"DS41QV01")
        f.write(struct.pack("<IIII", op, n, rows, row.shape[1]))
        f.write(x.astype("<f4").tobytes())
        f.write(row.astype(np.uint8).tobytes())
        f.write(xhat.astype("<f4").tobytes())


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    print("numpy", np.__version__, "ml_dtypes", ml_dtypes.__version__)

    # Q_win: 384 blocks of 32, rows of n = 512 (528 B).
    x = fill(win_cases(), 384, 32, -8, 7, 90, 150)
    codes, exps, xhat = q_win(x)
    n = 512
    rows = len(x) * 32 // n
    row = np.concatenate([codes.reshape(rows, n), exps.reshape(rows, n // 32)], axis=1)
    assert row.shape[1] == 528
    write_op(out / "q_win.bin", 0, n, x, row, xhat)
    print("q_win", rows, "rows; distinct exponents", len(np.unique(exps)))

    # Q_kv: 768 blocks of 16, rows of n = 512 (288 B). Amax kept < 2784 (see docstring).
    x = fill(kv_cases(), 768, 16, -9, 2.4, 80, 133)
    x = np.where(np.abs(x) < 2700, x, F32(2700) * np.sign(x)).astype(F32)
    codes, scales, xhat = q_kv(x)
    rows = len(x) * 16 // n
    row = np.concatenate([pack_nibbles(codes.reshape(rows, n)), scales.reshape(rows, n // 16)], axis=1)
    assert row.shape[1] == 288
    write_op(out / "q_kv.bin", 1, n, x, row, xhat)
    print("q_kv", rows, "rows; distinct scales", len(np.unique(scales)))

    # Q_idx: 384 blocks of 32, rows of n = 128 (68 B).
    x = fill(idx_cases(), 384, 32, -37, 30, 0, 200)
    codes, exps, xhat = q_idx(x)
    n = 128
    rows = len(x) * 32 // n
    row = np.concatenate([pack_nibbles(codes.reshape(rows, n)), exps.reshape(rows, n // 32)], axis=1)
    assert row.shape[1] == 68
    write_op(out / "q_idx.bin", 2, n, x, row, xhat)
    print("q_idx", rows, "rows; distinct exponents", len(np.unique(exps)))

    # Scalar sweeps: E4M3 over |x| <= 464 (beyond, ml_dtypes gives NaN), E2M1 over |x| <= 6.
    v = random_bit_blocks(1, 6000, 100, 135)[0]
    v = v[np.abs(v) <= 464]
    v = np.concatenate([v, E4M3_MIDS, -E4M3_MIDS, nextafter(E4M3_MIDS, 0), nextafter(E4M3_MIDS, 1e9),
                        f32([0.0, -0.0, 448, -448, 464, -464, 2.0 ** -10, -(2.0 ** -10), 1e-30, -1e-30])])
    c, dec = e4m3_codes(v, allow_nan=True)
    print("e4m3 sweep: dropped", int(np.isnan(dec).sum()), "values that ml_dtypes maps to NaN")
    v, c = v[~np.isnan(dec)], c[~np.isnan(dec)]
    with open(out / "e4m3_sweep.bin", "wb") as f:
        f.write(b"DS41SV01" + struct.pack("<II", 0, len(v)) + v.astype("<f4").tobytes() + c.tobytes())
    w = rng.uniform(-6, 6, 3000).astype(F32)
    w = np.concatenate([w, E2M1_MIDS, -E2M1_MIDS, nextafter(E2M1_MIDS, 0), nextafter(E2M1_MIDS, 9),
                        -nextafter(E2M1_MIDS, 0), f32([0.0, -0.0, 6, -6, 1e-30, -1e-30, 0.1, -0.1])])
    c, _ = e2m1_codes(w)
    with open(out / "e2m1_sweep.bin", "wb") as f:
        f.write(b"DS41SV01" + struct.pack("<II", 1, len(w)) + w.astype("<f4").tobytes() + c.tobytes())
    print("sweeps", len(v), len(w))


if __name__ == "__main__":
    main()
