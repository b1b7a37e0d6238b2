//! The grid formats (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M).

use super::*;

// ---------------------------------------------------------------------------------------
// The grid formats (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M)

/// 64-bit FNV-1a, as `quant-golden.py` hashes ggml's dequantization of the grid walks.
fn fnv1a64(data: impl IntoIterator<Item = u8>) -> u64 {
    data.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// ggml's `dequantize_row_*` (libggml-base of b11434, through `quant-golden.py`): random
/// blocks bit for bit, and blocks whose grid indices walk through every entry of the grid
/// (the tables of `iq_grids.rs`) through a hash of ggml's output.
#[test]
fn quant_grid_formats_match_ggml_golden() {
    macro_rules! golden {
        ($name:literal) => {
            (
                include_bytes!(concat!(
                    "../../../../tests/data/k_quant_golden/deq_",
                    $name,
                    ".bin"
                ))
                .as_slice(),
                include_bytes!(concat!(
                    "../../../../tests/data/k_quant_golden/grid_",
                    $name,
                    ".bin"
                ))
                .as_slice(),
            )
        };
    }
    #[allow(clippy::type_complexity)]
    let cases: [(u32, usize, (&[u8], &[u8])); 7] = [
        (id("iq2_xxs"), 256, golden!("iq2_xxs")),
        (id("iq2_xs"), 512, golden!("iq2_xs")),
        (id("iq2_s"), 1024, golden!("iq2_s")),
        (id("iq3_xxs"), 256, golden!("iq3_xxs")),
        (id("iq3_s"), 512, golden!("iq3_s")),
        (id("iq1_s"), 2048, golden!("iq1_s")),
        (id("iq1_m"), 2048, golden!("iq1_m")),
    ];
    for (t, grid_len, (deq_data, walk)) in cases {
        let (block, bytes) = block_layout(t).unwrap();
        let raw_len = deq_data.len() / (bytes + 4 * block) * bytes;
        assert!(raw_len > 0, "type {t}");
        let (raw, want_f) = deq_data.split_at(raw_len);
        let n = raw_len / bytes * block;
        assert_eq!(want_f.len(), 4 * n, "type {t}");
        let got = deq(t, raw, n);
        for (i, (g, w)) in got.iter().zip(want_f.chunks_exact(4)).enumerate() {
            let w = f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
            assert_eq!(g.to_bits(), w.to_bits(), "type {t} element {i}: {g} vs {w}");
        }

        let (raw, digest) = walk.split_at(walk.len() - 8);
        assert_eq!(raw.len() % bytes, 0, "type {t}");
        let n = raw.len() / bytes * block;
        // every grid entry once: 8 elements per entry for the 8-wide grids, 4 for IQ3's
        let per_entry = if matches!(type_name(t), "iq3_xxs" | "iq3_s") {
            4
        } else {
            8
        };
        assert_eq!(n, grid_len * per_entry, "type {t}");
        let got = deq(t, raw, n);
        let want = u64::from_le_bytes(digest.try_into().unwrap());
        assert_eq!(
            fnv1a64(got.iter().flat_map(|v| v.to_le_bytes())),
            want,
            "type {t}: dequantization of the grid walk differs from ggml's"
        );
    }
}

/// Structure of the generated tables: the IQ2 grids hold magnitudes 8, 25 and 43, IQ3_XXS's
/// 4, 12, ..., 52, 62, IQ3_S's odd 1..15, IQ1_S's values -1, 0 and 1; no grid repeats a point;
/// the sign table gives every 7-bit pattern an even number of set bits.
#[test]
fn quant_grid_tables_are_well_formed() {
    use crate::compute::quant::iq_grids::*;
    use std::collections::HashSet;
    fn check<T: Copy + Eq + std::hash::Hash>(
        name: &str,
        grid: &[T],
        bytes: fn(T) -> Vec<u8>,
        ok: fn(u8) -> bool,
    ) {
        let distinct: HashSet<T> = grid.iter().copied().collect();
        assert_eq!(distinct.len(), grid.len(), "{name}: repeated points");
        for &p in grid {
            assert!(bytes(p).into_iter().all(ok), "{name}: bad point");
        }
    }
    let u64b = |p: u64| p.to_le_bytes().to_vec();
    let u32b = |p: u32| p.to_le_bytes().to_vec();
    check("iq2xxs", &IQ2XXS_GRID, u64b, |v| matches!(v, 8 | 25 | 43));
    check("iq2xs", &IQ2XS_GRID, u64b, |v| matches!(v, 8 | 25 | 43));
    check("iq2s", &IQ2S_GRID, u64b, |v| matches!(v, 8 | 25 | 43));
    check("iq3xxs", &IQ3XXS_GRID, u32b, |v| {
        matches!(v, 4 | 12 | 20 | 28 | 36 | 44 | 52 | 62)
    });
    check("iq3s", &IQ3S_GRID, u32b, |v| v % 2 == 1 && v <= 15);
    check("iq1s", &IQ1S_GRID, u64b, |v| matches!(v, 0 | 1 | 0xFF));
    for (i, &s) in KSIGNS_IQ2XS.iter().enumerate() {
        assert_eq!(usize::from(s & 127), i);
        assert_eq!(s.count_ones() % 2, 0, "ksigns[{i}]");
    }
}

/// Hand-built blocks: the scales, signs, index bits and deltas land where ggml puts them.
#[test]
fn quant_grid_formats_known_answers() {
    use crate::compute::quant::iq_grids::*;
    let one = f16_bits(1.0);

    // IQ2_XXS: block 1 has grid indices 0, 1, 2, 3, sign pattern 1 (elements 0 and 7 negative)
    // for group 0, scale 3: db = (0.5 + 3) * 0.25
    let mut b = vec![0u8; 66];
    b[..2].copy_from_slice(&one);
    b[10..14].copy_from_slice(&[0, 1, 2, 3]);
    b[14..18].copy_from_slice(&(1u32 | (3 << 28)).to_le_bytes());
    let y = deq(id("iq2_xxs"), &b, 256);
    let db = 0.875f32;
    for l in 0..4 {
        let g = IQ2XXS_GRID[l].to_le_bytes();
        for j in 0..8 {
            let neg = l == 0 && (j == 0 || j == 7);
            let want = db * f32::from(g[j]) * if neg { -1.0 } else { 1.0 };
            assert_eq!(y[32 + 8 * l + j], want, "iq2_xxs l {l} j {j}");
        }
    }
    // block 0: all indices 0, scale 0: 0.125 * 8
    assert!(y[..32].iter().all(|&v| v == 1.0));

    // IQ3_S: block 3 (odd: high nibble of scales[1]), group 2, second index with qh bit 5
    let mut b = vec![0u8; 110];
    b[..2].copy_from_slice(&one);
    b[2 + 24 + 4] = 7; // qs[8*3 + 2*2]
    b[2 + 24 + 5] = 9; // qs[8*3 + 2*2 + 1]
    b[66 + 3] = 1 << 5; // qh[3]: high bit of the second index of group 2
    b[74 + 12 + 2] = 0b0001_0000; // signs[4*3 + 2]: element 4 of group 2 negative
    b[106 + 1] = 5 << 4; // scales[1] >> 4 = 5: db = 11
    let y = deq(id("iq3_s"), &b, 256);
    let (g1, g2) = (IQ3S_GRID[7].to_le_bytes(), IQ3S_GRID[256 + 9].to_le_bytes());
    for j in 0..4 {
        assert_eq!(y[96 + 16 + j], 11.0 * f32::from(g1[j]));
        let s = if j == 0 { -1.0 } else { 1.0 };
        assert_eq!(y[96 + 16 + 4 + j], 11.0 * f32::from(g2[j]) * s);
    }

    // IQ1_S: block 2, group 1 with index 5 | 6 << 8, scale 2 (dl = 5), negative delta
    let mut b = vec![0u8; 50];
    b[..2].copy_from_slice(&one);
    b[2 + 8 + 1] = 5;
    let qh: u16 = (6 << 3) | (2 << 12) | 0x8000;
    b[34 + 4..34 + 6].copy_from_slice(&qh.to_le_bytes());
    let y = deq(id("iq1_s"), &b, 256);
    let g = IQ1S_GRID[5 | (6 << 8)].to_le_bytes();
    for j in 0..8 {
        assert_eq!(y[64 + 8 + j], 5.0 * (f32::from(g[j] as i8) - 0.125));
    }
    // group 0 of block 2: index 0 (all -1), same scale and delta
    assert!(y[64..72].iter().all(|&v| v == 5.0 * (-1.0 - 0.125)));

    // IQ1_M: d = 1.0 (f16 0x3C00 spread over the scale words' top nibbles), block 1 group 3:
    // index 4 | 2 << 8 with a negative delta, scale (scales[0] >> 9) & 7 = 3 (dl = 7)
    let mut b = vec![0u8; 56];
    let mut sc = [0u16; 4];
    for (k, s) in sc.iter_mut().enumerate() {
        *s = ((0x3C00u16 >> (4 * k)) & 15) << 12;
    }
    sc[0] |= 3 << 9;
    for (k, s) in sc.iter().enumerate() {
        b[48 + 2 * k..50 + 2 * k].copy_from_slice(&s.to_le_bytes());
    }
    b[4 + 3] = 4;
    b[32 + 3] = (2 | 8) << 4; // qh[2*1 + 1], high nibble: index bits and delta sign
    let y = deq(id("iq1_m"), &b, 256);
    let g = IQ1S_GRID[4 | (2 << 8)].to_le_bytes();
    for j in 0..8 {
        assert_eq!(y[32 + 24 + j], 7.0 * (f32::from(g[j] as i8) - 0.125));
    }
    // group 0 of block 0: index 0, scale 0 (dl = 1), positive delta
    assert!(y[..8].iter().all(|&v| v == -1.0 + 0.125));
}

/// Any bytes are valid blocks of the grid formats (NaN and infinite scales included): the
/// dequantizers and dot products take them without panicking; partial blocks are errors.
#[test]
fn quant_grid_formats_take_arbitrary_input() {
    let mut rng = Rng::new(37);
    for t in grid_types() {
        for _ in 0..20 {
            let n = 1024;
            let x = rng.bytes(row_size(t, n).unwrap());
            let y = rng.bytes(row_size(id("q8_K"), n).unwrap());
            let _ = deq(t, &x, n);
            let _ = vec_dot(t, n, &x, &y).unwrap();
        }
        let (block, bytes) = block_layout(t).unwrap();
        assert!(dequantize_row(t, &vec![0u8; 2 * bytes], &mut vec![0f32; block + 1]).is_err());
        assert!(dequantize_row(t, &vec![0u8; bytes - 1], &mut vec![0f32; block]).is_err());
        assert!(vec_dot(t, block, &vec![0u8; bytes], &[0u8; 8]).is_err());
        assert!(vec_dot(t, block, &vec![0u8; bytes - 1], &[0u8; 292]).is_err());
    }
}
