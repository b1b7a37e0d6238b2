//! TOP_K_MASK (8.0.1) against a reference written from §12.2.1 of PROTOCOL.md (and
//! `ggml_compute_forward_top_k_mask`): broadcast masks, absent optional sources,
//! out-of-range picks and cells, −∞ / NaN scores, F16 masks, strided sources; and the
//! refusals of `ggml_top_k_mask`'s asserts.

use super::*;

/// An optional I32 / F32 source: its shape and values (logical order).
type Opt<'a> = Option<([usize; 4], &'a [f32])>;

/// The expected result, straight from the specification.
fn reference(
    mask: ([usize; 4], &[f32]),
    top_k: ([usize; 4], &[f32]),
    score: Opt<'_>,
    blocks: Opt<'_>,
    extra: Opt<'_>,
) -> Vec<f32> {
    let (mne, mv) = mask;
    let (tne, tv) = top_k;
    let n_kv = mne[0];
    let dne = [n_kv, tne[1], tne[2], tne[3]];
    let n_pick = match (blocks, score) {
        (Some((bne, _)), _) => bne[1] as i64,
        (None, Some((sne, _))) => sne[0] as i64,
        (None, None) => n_kv as i64,
    };
    let mut out = vec![f32::NEG_INFINITY; dne.iter().product()];
    for i3 in 0..dne[3] {
        for i2 in 0..dne[2] {
            for i1 in 0..dne[1] {
                let mut keep = |c: i64| {
                    if c >= 0 && (c as usize) < n_kv {
                        let c = c as usize;
                        let from = at(mne, [c, i1 % mne[1], i2 % mne[2], i3 % mne[3]]);
                        out[at(dne, [c, i1, i2, i3])] = mv[from];
                    }
                };
                for j in 0..tne[0] {
                    let p = tv[at(tne, [j, i1, i2, i3])] as i64;
                    if p < 0 || p >= n_pick {
                        continue;
                    }
                    let p = p as usize;
                    if let Some((sne, sv)) = score {
                        let s = sv[at(sne, [p, i1, i2, i3])];
                        if s.is_nan() || s == f32::NEG_INFINITY {
                            continue;
                        }
                    }
                    match blocks {
                        None => keep(p as i64),
                        Some((bne, bv)) => {
                            for k in 0..bne[0] {
                                keep(bv[at(bne, [k, p, 0, 0])] as i64);
                            }
                        }
                    }
                }
                if let Some((ene, ev)) = extra {
                    for j in 0..ene[0] {
                        keep(ev[at(ene, [j, i1, i2, i3])] as i64);
                    }
                }
            }
        }
    }
    out
}

/// Random ints in `lo..hi`, as f32.
fn ints(rng: &mut Rng, n: usize, lo: i64, hi: i64) -> Vec<f32> {
    (0..n)
        .map(|_| (lo + rng.below((hi - lo) as usize) as i64) as f32)
        .collect()
}

fn n(ne: [usize; 4]) -> usize {
    ne.iter().product()
}

/// Builds and runs one TOP_K_MASK node; returns (got, want).
#[allow(clippy::too_many_arguments)]
fn run_case(
    rng: &mut Rng,
    mask_type: u32,
    mne: [usize; 4],
    tne: [usize; 4],
    sne: Option<[usize; 4]>,
    bne: Option<[usize; 4]>,
    ene: Option<[usize; 4]>,
    transposed_top_k: bool,
) -> (Vec<f32>, Vec<f32>) {
    let n_kv = mne[0] as i64;
    let mask = stored(mask_type, &rng.values(n(mne), 4.0));
    let picks = ints(rng, n(tne), -2, n_kv + 3);
    let score: Option<Vec<f32>> = sne.map(|ne| {
        (0..n(ne))
            .map(|_| match rng.below(6) {
                0 => f32::NEG_INFINITY,
                1 => f32::NAN,
                2 => f32::INFINITY,
                _ => rng.f32(),
            })
            .collect()
    });
    let blocks = bne.map(|ne| ints(rng, n(ne), -2, n_kv + 2));
    let extra = ene.map(|ne| ints(rng, n(ne), -2, n_kv + 2));
    let mut g = G::new();
    let m = g.input(mask_type, mne, &mask);
    let t = if transposed_top_k {
        // stored [ne1, ne0, ...], viewed back as [ne0, ne1, ...]
        let mut stored_ne = tne;
        stored_ne.swap(0, 1);
        let mut transposed = vec![0.0; n(tne)];
        for i3 in 0..tne[3] {
            for i2 in 0..tne[2] {
                for i1 in 0..tne[1] {
                    for i0 in 0..tne[0] {
                        transposed[at(stored_ne, [i1, i0, i2, i3])] =
                            picks[at(tne, [i0, i1, i2, i3])];
                    }
                }
            }
        }
        let s = g.input(ty::I32, stored_ne, &transposed);
        g.transpose(s)
    } else {
        g.input(ty::I32, tne, &picks)
    };
    let s = match (&score, sne) {
        (Some(v), Some(ne)) => g.input(ty::F32, ne, v),
        _ => NONE,
    };
    let b = match (&blocks, bne) {
        (Some(v), Some(ne)) => g.input(ty::I32, ne, v),
        _ => NONE,
    };
    let e = match (&extra, ene) {
        (Some(v), Some(ne)) => g.input(ty::I32, ne, v),
        _ => NONE,
    };
    let dne = [mne[0], tne[1], tne[2], tne[3]];
    let out_node = g.node(Op::TOP_K_MASK, mask_type, dne, &[m, t, s, b, e], &[]);
    let bytes = g.run(3).unwrap();
    let got = g.read(&bytes, out_node);
    let want = reference(
        (mne, &mask),
        (tne, &picks),
        score.as_deref().zip(sne).map(|(v, ne)| (ne, v)),
        blocks.as_deref().zip(bne).map(|(v, ne)| (ne, v)),
        extra.as_deref().zip(ene).map(|(v, ne)| (ne, v)),
    );
    (got, want)
}

#[track_caller]
fn assert_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{what}: element {i}: {g} vs {w}");
    }
}

#[test]
fn top_k_mask_matches_the_reference() {
    let mut rng = Rng::new(0x70C);
    for mask_type in [ty::F32, ty::F16] {
        for (what, mne, tne, sne, bne, ene, transposed) in [
            // picks only, the mask broadcast over dimensions 1 and 2
            ("plain", [9, 2, 1, 1], [4, 6, 3, 1], None, None, None, false),
            // picks only, strided picks, broadcast over dimension 3
            (
                "strided",
                [7, 1, 1, 1],
                [5, 3, 2, 2],
                None,
                None,
                None,
                true,
            ),
            // scores: n_pick = score.ne[0] (< n_kv); −∞ / NaN scores skip
            (
                "score",
                [12, 3, 1, 1],
                [6, 3, 2, 1],
                Some([5, 3, 2, 1]),
                None,
                None,
                false,
            ),
            // blocks without scores: n_pick = blocks.ne[1]
            (
                "blocks",
                [16, 1, 2, 1],
                [3, 4, 2, 1],
                None,
                Some([3, 6, 1, 1]),
                None,
                false,
            ),
            // everything
            (
                "all",
                [20, 2, 1, 1],
                [4, 4, 3, 1],
                Some([7, 4, 3, 1]),
                Some([2, 7, 1, 1]),
                Some([3, 4, 3, 1]),
                false,
            ),
            // extra cells only
            (
                "extra",
                [10, 1, 1, 1],
                [2, 5, 1, 1],
                None,
                None,
                Some([4, 5, 1, 1]),
                false,
            ),
            // no picks at all (n_top = 0), extra cells still kept
            (
                "no picks",
                [6, 1, 1, 1],
                [0, 3, 1, 1],
                None,
                None,
                Some([2, 3, 1, 1]),
                false,
            ),
            // many rows: the work is split over the threads
            (
                "rows",
                [33, 4, 1, 1],
                [8, 64, 2, 1],
                Some([33, 64, 2, 1]),
                None,
                None,
                false,
            ),
        ] {
            let (got, want) = run_case(&mut rng, mask_type, mne, tne, sne, bne, ene, transposed);
            assert_bits(&got, &want, &format!("{what}, type {mask_type}"));
            assert!(want.iter().any(|v| v.is_finite()) || what == "no picks");
        }
    }
}

#[test]
fn top_k_mask_hand_computed() {
    // mask row [10, 11, 12, 13, 14], picks [3, -1, 9, 0], scores: pick 0 is −∞, so only 3
    let mut g = G::new();
    let m = g.input(ty::F32, [5, 1, 1, 1], &[10.0, 11.0, 12.0, 13.0, 14.0]);
    let t = g.ids(ty::I32, [4, 1, 1, 1], &[3, -1, 9, 0]);
    let s = g.input(
        ty::F32,
        [5, 1, 1, 1],
        &[f32::NEG_INFINITY, 0.0, 0.0, -1e30, f32::NAN],
    );
    let e = g.ids(ty::I32, [2, 1, 1, 1], &[1, 5]);
    let out = g.node(
        Op::TOP_K_MASK,
        ty::F32,
        [5, 1, 1, 1],
        &[m, t, s, NONE, e],
        &[],
    );
    let bytes = g.run(1).unwrap();
    let ninf = f32::NEG_INFINITY;
    assert_bits(
        &g.read(&bytes, out),
        &[ninf, 11.0, ninf, 13.0, ninf],
        "hand-computed",
    );
}

/// An optional source of a refusal case: its type and shape.
type Src = Option<(u32, [usize; 4])>;
/// A refusal case: what, the error, mask type and shape, picks type and shape, result type and
/// shape, score, blocks, extra.
type Refusal = (
    &'static str,
    ErrorKind,
    u32,
    [usize; 4],
    u32,
    [usize; 4],
    u32,
    [usize; 4],
    Src,
    Src,
    Src,
);

#[test]
fn top_k_mask_refusals() {
    // (what, mask type, mask ne, top_k type, top_k ne, dst type, dst ne, score, blocks, extra)
    let cases: Vec<Refusal> = vec![
        (
            "I32 mask",
            ErrorKind::OpRefused,
            ty::I32,
            [4, 1, 1, 1],
            ty::I32,
            [2, 1, 1, 1],
            ty::I32,
            [4, 1, 1, 1],
            None,
            None,
            None,
        ),
        (
            "BF16 mask",
            ErrorKind::OpRefused,
            ty::BF16,
            [4, 1, 1, 1],
            ty::I32,
            [2, 1, 1, 1],
            ty::BF16,
            [4, 1, 1, 1],
            None,
            None,
            None,
        ),
        (
            "F32 picks",
            ErrorKind::InvalidGraph,
            ty::F32,
            [4, 1, 1, 1],
            ty::F32,
            [2, 1, 1, 1],
            ty::F32,
            [4, 1, 1, 1],
            None,
            None,
            None,
        ),
        (
            "result type",
            ErrorKind::InvalidGraph,
            ty::F32,
            [4, 1, 1, 1],
            ty::I32,
            [2, 1, 1, 1],
            ty::F16,
            [4, 1, 1, 1],
            None,
            None,
            None,
        ),
        (
            "result shape",
            ErrorKind::InvalidGraph,
            ty::F32,
            [4, 1, 1, 1],
            ty::I32,
            [2, 3, 1, 1],
            ty::F32,
            [4, 2, 1, 1],
            None,
            None,
            None,
        ),
        (
            "result n_kv",
            ErrorKind::InvalidGraph,
            ty::F32,
            [4, 1, 1, 1],
            ty::I32,
            [2, 1, 1, 1],
            ty::F32,
            [5, 1, 1, 1],
            None,
            None,
            None,
        ),
        (
            "no broadcast",
            ErrorKind::InvalidGraph,
            ty::F32,
            [4, 2, 1, 1],
            ty::I32,
            [2, 3, 1, 1],
            ty::F32,
            [4, 3, 1, 1],
            None,
            None,
            None,
        ),
        (
            "F16 scores",
            ErrorKind::InvalidGraph,
            ty::F32,
            [4, 1, 1, 1],
            ty::I32,
            [2, 1, 1, 1],
            ty::F32,
            [4, 1, 1, 1],
            Some((ty::F16, [4, 1, 1, 1])),
            None,
            None,
        ),
        (
            "score rows",
            ErrorKind::InvalidGraph,
            ty::F32,
            [4, 1, 1, 1],
            ty::I32,
            [2, 2, 1, 1],
            ty::F32,
            [4, 2, 1, 1],
            Some((ty::F32, [4, 1, 1, 1])),
            None,
            None,
        ),
        (
            "F32 blocks",
            ErrorKind::InvalidGraph,
            ty::F32,
            [4, 1, 1, 1],
            ty::I32,
            [2, 1, 1, 1],
            ty::F32,
            [4, 1, 1, 1],
            None,
            Some((ty::F32, [2, 3, 1, 1])),
            None,
        ),
        (
            "blocks ne2",
            ErrorKind::InvalidGraph,
            ty::F32,
            [4, 1, 1, 1],
            ty::I32,
            [2, 1, 1, 1],
            ty::F32,
            [4, 1, 1, 1],
            None,
            Some((ty::I32, [2, 3, 2, 1])),
            None,
        ),
        (
            "blocks vs scores",
            ErrorKind::InvalidGraph,
            ty::F32,
            [4, 1, 1, 1],
            ty::I32,
            [2, 1, 1, 1],
            ty::F32,
            [4, 1, 1, 1],
            Some((ty::F32, [4, 1, 1, 1])),
            Some((ty::I32, [2, 3, 1, 1])),
            None,
        ),
        (
            "extra type",
            ErrorKind::InvalidGraph,
            ty::F32,
            [4, 1, 1, 1],
            ty::I32,
            [2, 1, 1, 1],
            ty::F32,
            [4, 1, 1, 1],
            None,
            None,
            Some((I64, [2, 1, 1, 1])),
        ),
        (
            "extra rows",
            ErrorKind::InvalidGraph,
            ty::F32,
            [4, 1, 1, 1],
            ty::I32,
            [2, 2, 1, 1],
            ty::F32,
            [4, 2, 1, 1],
            None,
            None,
            Some((ty::I32, [2, 1, 1, 1])),
        ),
    ];
    for (what, kind, mt, mne, tt, tne, dt, dne, score, blocks, extra) in cases {
        let mut g = G::new();
        let m = g.zeros(mt, mne);
        let t = g.zeros(tt, tne);
        let mut opt = |s: Src| s.map_or(NONE, |(t, ne)| g.zeros(t, ne));
        let (s, b, e) = (opt(score), opt(blocks), opt(extra));
        g.node(Op::TOP_K_MASK, dt, dne, &[m, t, s, b, e], &[]);
        let error = g.run(2).unwrap_err();
        assert_eq!(error.kind(), kind, "{what}: {error}");
    }
    // a mask with strided cells (ggml asserts nb[0] == type size)
    let mut g = G::new();
    let m = g.zeros(ty::F32, [3, 4, 1, 1]);
    let mt = g.transpose(m);
    let t = g.zeros(ty::I32, [2, 3, 1, 1]);
    g.node(Op::TOP_K_MASK, ty::F32, [4, 3, 1, 1], &[mt, t], &[]);
    assert_refused(&g, ErrorKind::InvalidGraph);
    // missing picks
    let mut g = G::new();
    let m = g.zeros(ty::F32, [3, 1, 1, 1]);
    g.node(Op::TOP_K_MASK, ty::F32, [3, 1, 1, 1], &[m], &[]);
    assert_refused(&g, ErrorKind::InvalidGraph);
}
