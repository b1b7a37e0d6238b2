//! The row-dot table's completeness and the vector kernels (`exp_in_place`, `columns_to_rows`).

use super::*;

#[test]
fn every_type_with_a_vec_dot_type_has_a_row_dot_kernel() {
    // MUL_MAT picks its kernel from `row_dot_kernel`: a format registered elsewhere but
    // missing there would be refused at compute time.
    for type_id in 0..64u32 {
        if vec_dot_type(type_id).is_some() && supports(type_id) {
            assert!(
                row_dot_kernel(type_id).is_some(),
                "type {type_id} has a vec_dot_type but no dot kernel"
            );
        }
    }
}

/// `exp_in_place` gives `f32::exp`'s bits (vectorized or not), over a sweep of the floats
/// of every exponent and sign, and in short slices (the tail).
#[test]
fn exp_in_place_matches_f32_exp() {
    let mut x: Vec<f32> = (0..=u32::MAX)
        .step_by(4093)
        .map(f32::from_bits)
        .chain([
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            0.0,
            -0.0,
            88.0,
            -88.0,
        ])
        .collect();
    let want: Vec<u32> = x.iter().map(|v| v.exp().to_bits()).collect();
    crate::compute::quant::exp_in_place(&mut x);
    for (got, want) in x.iter().zip(&want) {
        assert_eq!(got.to_bits(), *want);
    }
    // (whether the vectorized path ran: `--nocapture`)
    println!("exp vectorized: {}", simd::exp_vectorized());
    let mut short = [1.5f32, -2.25, 10.0];
    crate::compute::quant::exp_in_place(&mut short);
    assert_eq!(
        short.map(f32::to_bits),
        [1.5f32, -2.25, 10.0].map(|v| v.exp().to_bits())
    );
}

/// Every float: `cargo test --release -p backend-cpu exp_everywhere -- --ignored`.
#[test]
#[ignore]
fn exp_in_place_matches_f32_exp_everywhere() {
    let mut chunk = vec![0f32; 1 << 20];
    for start in (0..=u32::MAX).step_by(1 << 20) {
        for (i, v) in chunk.iter_mut().enumerate() {
            *v = f32::from_bits(start + i as u32);
        }
        crate::compute::quant::exp_in_place(&mut chunk);
        for (i, v) in chunk.iter().enumerate() {
            let x = f32::from_bits(start + i as u32);
            assert_eq!(v.to_bits(), x.exp().to_bits(), "{x:e}");
        }
    }
}

/// `columns_to_rows` against the transposition done one value at a time, for every group size
/// the kernels use and widths around the 16-row vector blocks.
#[test]
fn columns_to_rows_transposes_the_kernel_results() {
    fn check<const N: usize>() {
        for width in [0, 1, 5, 15, 16, 17, 31, 32, 33, 48, 63, 64, 100, 256, 257] {
            let group: Vec<[f32; N]> = (0..width)
                .map(|i| std::array::from_fn(|j| (i * 1000 + j) as f32 + 0.5))
                .collect();
            // a longer scratch: only the first N * width values are the rows
            let mut out = vec![-1.0f32; N * width + 7];
            columns_to_rows(&group, &mut out);
            for j in 0..N {
                for (i, g) in group.iter().enumerate() {
                    assert_eq!(
                        out[j * width + i],
                        g[j],
                        "N {N}, width {width}, row {j}, {i}"
                    );
                }
            }
            assert!(out[N * width..].iter().all(|&v| v == -1.0));
        }
    }
    check::<1>();
    check::<3>();
    check::<4>();
    check::<16>();
}

/// A `mul_add` loop run through `with_fma` (one `vfmadd` per element where the CPU has FMA)
/// gives the bits of the library `mul_add`, including where the fused result differs from
/// the separately rounded one (ROPE's rotation relies on it).
#[test]
fn with_fma_gives_the_bits_of_mul_add() {
    let n = 1000;
    let v = |i: usize, s: f32| ((i as f32 * s).sin() * 3.0, (i as f32 * s * 1.3).cos());
    let (a, b): (Vec<f32>, Vec<f32>) = (0..n).map(|i| v(i, 0.37)).unzip();
    let c: Vec<f32> = (0..n).map(|i| -(a[i] * b[(i + 7) % n])).collect();
    let want: Vec<u32> = (0..n).map(|i| a[i].mul_add(b[i], c[i]).to_bits()).collect();
    let mut got = vec![0u32; n];
    let mut body = || {
        for (g, ((a, b), c)) in got.iter_mut().zip(a.iter().zip(&b).zip(&c)) {
            *g = a.mul_add(*b, *c).to_bits();
        }
    };
    if !with_fma(&mut body) {
        body();
    }
    assert_eq!(got, want);
    let unfused = (0..n).filter(|&i| (a[i] * b[i] + c[i]).to_bits() != want[i]);
    assert!(
        unfused.count() > 0,
        "some fused results differ from the rounded ones"
    );
}
