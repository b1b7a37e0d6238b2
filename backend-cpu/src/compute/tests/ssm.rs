//! Tests of SSM_CONV, SSM_SCAN, RWKV_WKV6, RWKV_WKV7 and GATED_LINEAR_ATTN: results against
//! naive f64 references written here (several shapes, sequences, groups, rollback snapshots,
//! strided and overlapping sources), the same bytes from one and three threads, and refusals
//! of malformed nodes before anything is written.

use proto_core::ggml::types::id as ty;
use proto_core::ggml::Op;
use proto_core::graph::TensorIndex;
use proto_core::ErrorKind;

use super::{assert_close, assert_refused, contiguous_nb, Rng, G};

const I64: u32 = 27;

/// Runs `g` on one and on three threads, checks that the bytes agree, returns them.
fn run_both(g: &G, what: &str) -> Vec<u8> {
    let one = g.run(1).unwrap();
    let three = g.run(3).unwrap();
    assert!(one == three, "{what}: 1 and 3 threads differ");
    one
}

// --- SSM_CONV --------------------------------------------------------------------------------

/// `out[i1, t, s] = sum_i0 sx[t + i0, i1, s] * c[i0, i1]`, in f64.
fn conv_reference(sx: &[f32], c: &[f32], d_conv: usize, d_inner: usize, n_s: usize) -> Vec<f64> {
    let window = sx.len() / (d_inner * n_s);
    let n_t = window + 1 - d_conv;
    let mut out = Vec::with_capacity(d_inner * n_t * n_s);
    for s in 0..n_s {
        for t in 0..n_t {
            for i1 in 0..d_inner {
                let sum: f64 = (0..d_conv)
                    .map(|i0| {
                        f64::from(sx[(s * d_inner + i1) * window + t + i0])
                            * f64::from(c[i1 * d_conv + i0])
                    })
                    .sum();
                out.push(sum);
            }
        }
    }
    out
}

#[test]
fn ssm_conv_slides_each_channel_window_over_tokens_and_sequences() {
    let mut rng = Rng::new(71);
    // (d_conv, d_inner, tokens, sequences, sx sequences spaced apart)
    for (d_conv, d_inner, n_t, n_s, spaced) in [
        (4, 8, 1, 1, false),
        (3, 5, 6, 2, false),
        (4, 33, 9, 3, true),
        (1, 3, 2, 2, false),
        (9, 16, 64, 4, true),
    ] {
        let what = format!("d_conv {d_conv}, d_inner {d_inner}, {n_t} tokens, {n_s} seqs");
        let window = d_conv - 1 + n_t;
        let sx_ne = [window, d_inner, n_s, 1];
        let sx_values = rng.values(window * d_inner * n_s, 1.0);
        let c_values = rng.values(d_conv * d_inner, 1.0);
        let mut g = G::new();
        let sx = if spaced {
            // sequences one plane apart in a tensor twice as deep (ggml allows any nb2)
            let mut padded = vec![7.0f32; window * d_inner * n_s * 2];
            for (s, plane) in sx_values.chunks(window * d_inner).enumerate() {
                let at = 2 * s * window * d_inner;
                padded[at..at + plane.len()].copy_from_slice(plane);
            }
            let base = g.input(ty::F32, [window, d_inner, 2 * n_s, 1], &padded);
            let mut nb = contiguous_nb(ty::F32, sx_ne);
            nb[2] *= 2;
            nb[3] *= 2;
            g.view(base, sx_ne, nb, 0)
        } else {
            g.input(ty::F32, sx_ne, &sx_values)
        };
        let c = g.input(ty::F32, [d_conv, d_inner, 1, 1], &c_values);
        let out = g.node(Op::SSM_CONV, ty::F32, [d_inner, n_t, n_s, 1], &[sx, c], &[]);
        let bytes = run_both(&g, &what);
        let want = conv_reference(&sx_values, &c_values, d_conv, d_inner, n_s);
        assert_close(&g.read(&bytes, out), &want, 1e-12, &what);
    }
}

// --- SSM_SCAN --------------------------------------------------------------------------------

/// One SSM_SCAN node's sizes.
#[derive(Debug, Clone, Copy)]
struct Scan {
    d_state: usize,
    head_dim: usize,
    n_head: usize,
    n_group: usize,
    n_tokens: usize,
    n_seqs: usize,
    /// States in `s` (at least `n_seqs`).
    n_rs: usize,
    /// Snapshots per sequence (`K`).
    k: usize,
    /// `A` per state element (Mamba 1) instead of per head.
    mamba1: bool,
}

impl Scan {
    fn state_len(&self) -> usize {
        self.d_state * self.head_dim * self.n_head
    }

    fn y_len(&self) -> usize {
        self.head_dim * self.n_head * self.n_tokens * self.n_seqs
    }

    fn total(&self) -> usize {
        self.y_len() + self.k * self.state_len() * self.n_seqs
    }
}

/// The scan's sources, logical order.
struct ScanInputs {
    s: Vec<f32>,
    x: Vec<f32>,
    dt: Vec<f32>,
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
    ids: Vec<usize>,
}

fn softplus(x: f64) -> f64 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// The destination in f64: the outputs, then `K` states per sequence, `None` where nothing is
/// written (snapshot slots beyond the sequence's tokens).
fn scan_reference(p: &Scan, v: &ScanInputs) -> Vec<Option<f64>> {
    let (nc, nr, nh, ng, nt, ns) = (
        p.d_state, p.head_dim, p.n_head, p.n_group, p.n_tokens, p.n_seqs,
    );
    let state_len = p.state_len();
    let mut out = vec![None; p.total()];
    for seq in 0..ns {
        let first = v.ids[seq] * state_len;
        let mut state: Vec<f64> = v.s[first..first + state_len]
            .iter()
            .map(|&x| f64::from(x))
            .collect();
        for t in 0..nt {
            let step = seq * nt + t;
            for h in 0..nh {
                let dt = softplus(f64::from(v.dt[step * nh + h]));
                let g = h / (nh / ng);
                for i1 in 0..nr {
                    let x_dt = f64::from(v.x[(step * nh + h) * nr + i1]) * dt;
                    let mut sum = 0.0;
                    for i0 in 0..nc {
                        let a = if p.mamba1 { v.a[h * nc + i0] } else { v.a[h] };
                        let bc = (step * ng + g) * nc + i0;
                        let st = &mut state[(h * nr + i1) * nc + i0];
                        *st = *st * (dt * f64::from(a)).exp() + f64::from(v.b[bc]) * x_dt;
                        sum += *st * f64::from(v.c[bc]);
                    }
                    out[(step * nh + h) * nr + i1] = Some(sum);
                }
            }
            let back = nt - 1 - t;
            if back < p.k {
                let at = p.y_len() + (back * ns + seq) * state_len;
                for (o, &s) in out[at..at + state_len].iter_mut().zip(&state) {
                    *o = Some(s);
                }
            }
        }
    }
    out
}

fn scan_inputs(p: &Scan, rng: &mut Rng, ids: Vec<usize>) -> ScanInputs {
    let bc_len = p.d_state * p.n_group * p.n_tokens * p.n_seqs;
    let a_len = if p.mamba1 { p.d_state } else { 1 } * p.n_head;
    ScanInputs {
        s: rng.values(p.state_len() * p.n_rs, 1.0),
        x: rng.values(p.y_len(), 1.0),
        dt: rng.values(p.n_head * p.n_tokens * p.n_seqs, 1.0),
        // negative decay rates, as the models (and test-backend-ops) have them
        a: rng.values(a_len, 0.25).iter().map(|v| v - 0.75).collect(),
        b: rng.values(bc_len, 1.0),
        c: rng.values(bc_len, 1.0),
        ids,
    }
}

/// Builds the node over separate contiguous sources; returns the graph and the node.
fn scan_graph(p: &Scan, v: &ScanInputs) -> (G, TensorIndex) {
    let mut g = G::new();
    let (nc, nr, nh, ng, nt, ns) = (
        p.d_state, p.head_dim, p.n_head, p.n_group, p.n_tokens, p.n_seqs,
    );
    let s = g.input(ty::F32, [nc, nr, nh, p.n_rs], &v.s);
    let x = g.input(ty::F32, [nr, nh, nt, ns], &v.x);
    let dt = g.input(ty::F32, [nh, nt, ns, 1], &v.dt);
    let a_ne0 = if p.mamba1 { nc } else { 1 };
    let a = g.input(ty::F32, [a_ne0, nh, 1, 1], &v.a);
    let b = g.input(ty::F32, [nc, ng, nt, ns], &v.b);
    let c = g.input(ty::F32, [nc, ng, nt, ns], &v.c);
    let ids: Vec<i64> = v.ids.iter().map(|&i| i as i64).collect();
    let ids = g.ids(ty::I32, [ns, 1, 1, 1], &ids);
    let node = g.node(
        Op::SSM_SCAN,
        ty::F32,
        [p.total(), 1, 1, 1],
        &[s, x, dt, a, b, c, ids],
        &[p.k as i32],
    );
    (g, node)
}

/// Checks the node's destination against the reference: written values within `1e-10` NMSE,
/// unwritten ones still zero.
#[track_caller]
fn check_scan(got: &[f32], want: &[Option<f64>], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let (mut values, mut expected) = (Vec::new(), Vec::new());
    for (i, (&g, w)) in got.iter().zip(want).enumerate() {
        match w {
            Some(w) => {
                values.push(g);
                expected.push(*w);
            }
            None => assert_eq!(g, 0.0, "{what}: element {i} should be untouched"),
        }
    }
    assert_close(&values, &expected, 1e-10, what);
}

#[test]
fn ssm_scan_mamba2_with_groups_sequences_ids_and_snapshots() {
    let mut rng = Rng::new(72);
    let base = Scan {
        d_state: 16,
        head_dim: 4,
        n_head: 6,
        n_group: 2,
        n_tokens: 5,
        n_seqs: 2,
        n_rs: 3,
        k: 1,
        mamba1: false,
    };
    let cases = [
        base,
        // snapshots, and more snapshots than tokens (those slots stay untouched)
        Scan { k: 3, ..base },
        Scan {
            k: 4,
            n_tokens: 2,
            ..base
        },
        // one group for every head, d_state not a multiple of the dot product's lanes
        Scan {
            d_state: 13,
            n_group: 1,
            n_head: 3,
            n_tokens: 7,
            n_seqs: 3,
            n_rs: 3,
            ..base
        },
        // as many groups as heads, one token, d_state of a real model
        Scan {
            d_state: 128,
            head_dim: 8,
            n_head: 4,
            n_group: 4,
            n_tokens: 1,
            n_seqs: 1,
            n_rs: 2,
            ..base
        },
    ];
    for p in cases {
        let what = format!("{p:?}");
        // sequences start from shuffled states, the last state unused
        let ids: Vec<usize> = (0..p.n_seqs).rev().collect();
        let v = scan_inputs(&p, &mut rng, ids);
        let (g, node) = scan_graph(&p, &v);
        let bytes = run_both(&g, &what);
        check_scan(&g.read(&bytes, node), &scan_reference(&p, &v), &what);
    }
}

#[test]
fn ssm_scan_mamba1_decays_every_state_element() {
    let mut rng = Rng::new(73);
    for (d_state, head_dim, n_head, n_tokens, n_seqs) in
        [(16, 1, 40, 6, 3), (5, 2, 3, 4, 2), (16, 1, 8, 1, 1)]
    {
        let p = Scan {
            d_state,
            head_dim,
            n_head,
            n_group: 1,
            n_tokens,
            n_seqs,
            n_rs: n_seqs + 1,
            k: 1,
            mamba1: true,
        };
        let what = format!("{p:?}");
        // two sequences may start from the same state
        let ids: Vec<usize> = (0..n_seqs).map(|i| (2 * i) % p.n_rs).collect();
        let v = scan_inputs(&p, &mut rng, ids);
        let (g, node) = scan_graph(&p, &v);
        let bytes = run_both(&g, &what);
        check_scan(&g.read(&bytes, node), &scan_reference(&p, &v), &what);
    }
}

#[test]
fn ssm_scan_reads_x_b_and_c_as_views_of_one_tensor() {
    // test-backend-ops' `xbc_overlap` case: x, B and C are views of one {d_state, n_head,
    // n_tokens, 2 n_seqs} tensor, sequences 1 and 3 for x, 0..2 for B, 2..4 for C
    let mut rng = Rng::new(74);
    let p = Scan {
        d_state: 8,
        head_dim: 8,
        n_head: 4,
        n_group: 4,
        n_tokens: 3,
        n_seqs: 2,
        n_rs: 2,
        k: 2,
        mamba1: false,
    };
    let (nc, nh, nt, ns) = (p.d_state, p.n_head, p.n_tokens, p.n_seqs);
    let xbc_ne = [nc, nh, nt, 2 * ns];
    let xbc_values = rng.values(xbc_ne.iter().product(), 1.0);
    let nb = contiguous_nb(ty::F32, xbc_ne);
    let mut v = scan_inputs(&p, &mut rng, vec![1, 0]);
    // the logical values each view shows
    let plane = nc * nh * nt;
    let seq_planes = |first: usize, step: usize| -> Vec<f32> {
        (0..ns)
            .flat_map(|s| {
                let at = (first + s * step) * plane;
                xbc_values[at..at + plane].to_vec()
            })
            .collect()
    };
    v.x = seq_planes(1, 1);
    v.b = seq_planes(0, 1);
    v.c = seq_planes(2, 1);
    let mut g = G::new();
    let s = g.input(ty::F32, [nc, p.head_dim, nh, p.n_rs], &v.s);
    let xbc = g.input(ty::F32, xbc_ne, &xbc_values);
    let view = |g: &mut G, offset: usize| {
        g.view(
            xbc,
            [nc, nh, nt, ns],
            [nb[0], nb[1], nb[2], nb[3]],
            offset * nb[3],
        )
    };
    let x = view(&mut g, 1);
    let b = view(&mut g, 0);
    let c = view(&mut g, 2);
    let dt = g.input(ty::F32, [nh, nt, ns, 1], &v.dt);
    let a = g.input(ty::F32, [1, nh, 1, 1], &v.a);
    let ids = g.ids(ty::I32, [ns, 1, 1, 1], &[1, 0]);
    let node = g.node(
        Op::SSM_SCAN,
        ty::F32,
        [p.total(), 1, 1, 1],
        &[s, x, dt, a, b, c, ids],
        &[p.k as i32],
    );
    let bytes = run_both(&g, "overlapping x, B, C");
    check_scan(
        &g.read(&bytes, node),
        &scan_reference(&p, &v),
        "overlapping x, B, C",
    );
}

// --- refusals --------------------------------------------------------------------------------

/// A malformed SSM_CONV: what it breaks, the shapes of sx, c and the destination, and the
/// sources' type.
type BadConv = (&'static str, [usize; 4], [usize; 4], [usize; 4], u32);

/// Sources of a small valid Mamba 2 scan, with one of them replaceable.
struct ScanSources {
    s: [usize; 4],
    x: [usize; 4],
    dt: [usize; 4],
    a: [usize; 4],
    b: [usize; 4],
    c: [usize; 4],
    ids: [usize; 4],
    k: i32,
    dst: usize,
    ids_type: u32,
    src_type: u32,
}

impl ScanSources {
    fn valid() -> ScanSources {
        // d_state 4, head_dim 2, 4 heads, 2 groups, 3 tokens, 2 sequences
        ScanSources {
            s: [4, 2, 4, 2],
            x: [2, 4, 3, 2],
            dt: [4, 3, 2, 1],
            a: [1, 4, 1, 1],
            b: [4, 2, 3, 2],
            c: [4, 2, 3, 2],
            ids: [2, 1, 1, 1],
            k: 1,
            dst: 2 * 4 * 3 * 2 + 4 * 2 * 4 * 2,
            ids_type: ty::I32,
            src_type: ty::F32,
        }
    }

    fn build(&self, g: &mut G) {
        let input = |g: &mut G, ne: [usize; 4]| {
            let n = ne.iter().product();
            g.input(self.src_type, ne, &vec![0.5; n])
        };
        let s = input(g, self.s);
        let x = input(g, self.x);
        let dt = input(g, self.dt);
        let a = input(g, self.a);
        let b = input(g, self.b);
        let c = input(g, self.c);
        let ids = g.ids(self.ids_type, self.ids, &vec![0; self.ids.iter().product()]);
        g.node(
            Op::SSM_SCAN,
            ty::F32,
            [self.dst, 1, 1, 1],
            &[s, x, dt, a, b, c, ids],
            &[self.k],
        );
    }
}

#[test]
fn malformed_ssm_nodes_are_refused_before_anything_is_written() {
    // the valid scan runs
    let mut g = G::new();
    ScanSources::valid().build(&mut g);
    g.run(2).unwrap();

    let bad_scans: Vec<(&str, ScanSources, ErrorKind)> = vec![
        (
            "dt of another token count",
            ScanSources {
                dt: [4, 2, 2, 1],
                ..ScanSources::valid()
            },
            ErrorKind::InvalidGraph,
        ),
        (
            "B and C of different shapes",
            ScanSources {
                c: [4, 1, 3, 2],
                ..ScanSources::valid()
            },
            ErrorKind::InvalidGraph,
        ),
        (
            "heads not a multiple of the groups",
            ScanSources {
                b: [4, 3, 3, 2],
                c: [4, 3, 3, 2],
                ..ScanSources::valid()
            },
            ErrorKind::InvalidGraph,
        ),
        (
            "no groups",
            ScanSources {
                b: [4, 0, 3, 2],
                c: [4, 0, 3, 2],
                ..ScanSources::valid()
            },
            ErrorKind::InvalidGraph,
        ),
        (
            "s of another head_dim",
            ScanSources {
                s: [4, 3, 4, 2],
                ..ScanSources::valid()
            },
            ErrorKind::InvalidGraph,
        ),
        (
            "B of another d_state",
            ScanSources {
                b: [5, 2, 3, 2],
                c: [5, 2, 3, 2],
                ..ScanSources::valid()
            },
            ErrorKind::InvalidGraph,
        ),
        (
            "A neither per head nor per state",
            ScanSources {
                a: [3, 4, 1, 1],
                ..ScanSources::valid()
            },
            ErrorKind::InvalidGraph,
        ),
        (
            "Mamba 1 A with snapshots",
            ScanSources {
                a: [4, 4, 1, 1],
                k: 2,
                dst: 2 * 4 * 3 * 2 + 2 * 4 * 2 * 4 * 2,
                ..ScanSources::valid()
            },
            ErrorKind::InvalidGraph,
        ),
        (
            "K of zero",
            ScanSources {
                k: 0,
                ..ScanSources::valid()
            },
            ErrorKind::InvalidGraph,
        ),
        (
            "negative K",
            ScanSources {
                k: -1,
                ..ScanSources::valid()
            },
            ErrorKind::InvalidGraph,
        ),
        (
            "a destination one state short",
            ScanSources {
                k: 2,
                ..ScanSources::valid()
            },
            ErrorKind::InvalidGraph,
        ),
        (
            "one id for two sequences",
            ScanSources {
                ids: [1, 1, 1, 1],
                ..ScanSources::valid()
            },
            ErrorKind::InvalidGraph,
        ),
        (
            "I64 ids",
            ScanSources {
                ids_type: I64,
                ..ScanSources::valid()
            },
            ErrorKind::InvalidGraph,
        ),
        (
            "F16 sources",
            ScanSources {
                src_type: ty::F16,
                ..ScanSources::valid()
            },
            ErrorKind::OpRefused,
        ),
    ];
    for (what, sources, kind) in bad_scans {
        let mut g = G::new();
        sources.build(&mut g);
        let error = g.run(1).unwrap_err();
        assert_eq!(error.kind(), kind, "{what}: {error}");
        assert_refused(&g, kind);
    }

    // a source with another number of sources (a missing one)
    let mut g = G::new();
    let s = g.input(ty::F32, [4, 1, 1, 1], &[1.0; 4]);
    g.node(Op::SSM_SCAN, ty::F32, [4, 1, 1, 1], &[s], &[1]);
    assert_refused(&g, ErrorKind::InvalidGraph);

    // a non-contiguous state tensor (every other head)
    let mut g = G::new();
    let valid = ScanSources::valid();
    let base = g.input(ty::F32, [4, 2, 8, 2], &[0.5; 128]);
    let mut nb = contiguous_nb(ty::F32, [4, 2, 8, 2]);
    nb[2] *= 2;
    let s = g.view(base, valid.s, nb, 0);
    let x = g.input(ty::F32, valid.x, &[0.5; 48]);
    let dt = g.input(ty::F32, valid.dt, &[0.5; 24]);
    let a = g.input(ty::F32, valid.a, &[0.5; 4]);
    let b = g.input(ty::F32, valid.b, &[0.5; 48]);
    let c = g.input(ty::F32, valid.c, &[0.5; 48]);
    let ids = g.ids(ty::I32, valid.ids, &[0, 1]);
    g.node(
        Op::SSM_SCAN,
        ty::F32,
        [valid.dst, 1, 1, 1],
        &[s, x, dt, a, b, c, ids],
        &[1],
    );
    assert_refused(&g, ErrorKind::InvalidGraph);

    // sequence ids outside the states fail at run time, before anything is written
    for bad_id in [2, -1, i64::from(i32::MAX)] {
        let mut g = G::new();
        let valid = ScanSources::valid();
        let input = |g: &mut G, ne: [usize; 4]| {
            let n = ne.iter().product();
            g.input(ty::F32, ne, &vec![0.5; n])
        };
        let srcs =
            [valid.s, valid.x, valid.dt, valid.a, valid.b, valid.c].map(|ne| input(&mut g, ne));
        let ids = g.ids(ty::I32, valid.ids, &[0, bad_id]);
        let mut all = srcs.to_vec();
        all.push(ids);
        g.node(Op::SSM_SCAN, ty::F32, [valid.dst, 1, 1, 1], &all, &[1]);
        assert_refused(&g, ErrorKind::OutOfBounds);
    }

    // SSM_CONV
    let bad_convs: Vec<BadConv> = vec![
        (
            "channels differ",
            [6, 5, 2, 1],
            [4, 4, 1, 1],
            [4, 3, 2, 1],
            ty::F32,
        ),
        (
            "fewer columns than taps",
            [2, 4, 1, 1],
            [4, 4, 1, 1],
            [4, 1, 1, 1],
            ty::F32,
        ),
        (
            "a 4-D sx",
            [6, 4, 1, 2],
            [4, 4, 1, 1],
            [4, 3, 1, 2],
            ty::F32,
        ),
        ("a 3-D c", [6, 4, 2, 1], [4, 4, 2, 1], [4, 3, 2, 1], ty::F32),
        (
            "a destination of other tokens",
            [6, 4, 2, 1],
            [4, 4, 1, 1],
            [4, 2, 2, 1],
            ty::F32,
        ),
        (
            "F16 sources",
            [6, 4, 2, 1],
            [4, 4, 1, 1],
            [4, 3, 2, 1],
            ty::F16,
        ),
    ];
    for (what, sx_ne, c_ne, dst_ne, src_type) in bad_convs {
        let mut g = G::new();
        let sx = g.input(src_type, sx_ne, &vec![0.5; sx_ne.iter().product()]);
        let c = g.input(src_type, c_ne, &vec![0.5; c_ne.iter().product()]);
        g.node(Op::SSM_CONV, ty::F32, dst_ne, &[sx, c], &[]);
        let kind = if src_type == ty::F32 {
            ErrorKind::InvalidGraph
        } else {
            ErrorKind::OpRefused
        };
        let error = g.run(1).unwrap_err();
        assert_eq!(error.kind(), kind, "{what}: {error}");
        assert_refused(&g, kind);
    }
    // sx rows that are not packed (a transposed view)
    let mut g = G::new();
    let base = g.input(ty::F32, [4, 6, 1, 1], &[0.5; 24]);
    let sx = g.view(base, [6, 4, 1, 1], [16, 4, 96, 96], 0);
    let c = g.input(ty::F32, [4, 4, 1, 1], &[0.5; 16]);
    g.node(Op::SSM_CONV, ty::F32, [4, 3, 1, 1], &[sx, c], &[]);
    assert_refused(&g, ErrorKind::InvalidGraph);
}

// --- RWKV_WKV6, RWKV_WKV7, GATED_LINEAR_ATTN --------------------------------------------------

/// One linear-attention recurrence node: the op, its sizes, and its sources in slot order
/// (every slot but `time_first` and the state is `{S, H, n_tokens}`).
struct Recurrence {
    op: Op,
    /// GATED_LINEAR_ATTN's scale.
    scale: f32,
    head_size: usize,
    heads: usize,
    seq_tokens: usize,
    n_seqs: usize,
    srcs: Vec<Vec<f32>>,
}

impl Recurrence {
    fn new(op: Op, [head_size, heads, seq_tokens, n_seqs]: [usize; 4], rng: &mut Rng) -> Self {
        let tokens = seq_tokens * n_seqs;
        let per_token = head_size * heads * tokens;
        // decays in (0.5, 1), everything else in (-1, 1); RWKV 7's a and b small, as their
        // l2-normalized values are in the models
        let decay = |rng: &mut Rng, n: usize| -> Vec<f32> {
            rng.values(n, 0.25).iter().map(|v| v + 0.75).collect()
        };
        let state = rng.values(head_size * head_size * heads * n_seqs, 1.0);
        let srcs = match op {
            // k, v, r, time_first, time_decay, state
            Op::RWKV_WKV6 => vec![
                rng.values(per_token, 1.0),
                rng.values(per_token, 1.0),
                rng.values(per_token, 1.0),
                rng.values(head_size * heads, 1.0),
                decay(rng, per_token),
                state,
            ],
            // r, w, k, v, a, b, state
            Op::RWKV_WKV7 => vec![
                rng.values(per_token, 1.0),
                decay(rng, per_token),
                rng.values(per_token, 1.0),
                rng.values(per_token, 1.0),
                rng.values(per_token, 0.3),
                rng.values(per_token, 0.3),
                state,
            ],
            // k, v, q, g, state
            _ => vec![
                rng.values(per_token, 1.0),
                rng.values(per_token, 1.0),
                rng.values(per_token, 1.0),
                decay(rng, per_token),
                state,
            ],
        };
        Recurrence {
            op,
            scale: 0.125,
            head_size,
            heads,
            seq_tokens,
            n_seqs,
            srcs,
        }
    }

    fn tokens(&self) -> usize {
        self.seq_tokens * self.n_seqs
    }

    fn dst_ne(&self) -> [usize; 4] {
        [
            self.head_size * self.heads,
            self.tokens() + self.head_size * self.n_seqs,
            1,
            1,
        ]
    }

    /// The source shapes, slot by slot.
    fn shapes(&self) -> Vec<[usize; 4]> {
        let (n, h, t) = (self.head_size, self.heads, self.tokens());
        (0..self.srcs.len())
            .map(|slot| {
                if slot == self.srcs.len() - 1 {
                    [n * n * h, self.n_seqs, 1, 1]
                } else if self.op == Op::RWKV_WKV6 && slot == 3 {
                    [n, h, 1, 1]
                } else {
                    [n, h, t, 1]
                }
            })
            .collect()
    }

    fn graph(&self) -> (G, TensorIndex) {
        let mut g = G::new();
        let srcs: Vec<TensorIndex> = self
            .shapes()
            .into_iter()
            .zip(&self.srcs)
            .map(|(ne, values)| g.input(ty::F32, ne, values))
            .collect();
        let params = [self.scale.to_bits() as i32];
        let node = g.node(self.op, ty::F32, self.dst_ne(), &srcs, &params);
        (g, node)
    }

    /// The destination in f64.
    fn reference(&self) -> Vec<f64> {
        let (n, nh) = (self.head_size, self.heads);
        let width = n * nh;
        let wide = |v: &[f32]| -> Vec<f64> { v.iter().map(|&x| f64::from(x)).collect() };
        let srcs: Vec<Vec<f64>> = self.srcs.iter().map(|v| wide(v)).collect();
        let mut out = vec![0.0f64; width * (self.tokens() + n * self.n_seqs)];
        let states_at = width * self.tokens();
        for seq in 0..self.n_seqs {
            let mut st = srcs[srcs.len() - 1][seq * n * width..(seq + 1) * n * width].to_vec();
            for local in 0..self.seq_tokens {
                let t = seq * self.seq_tokens + local;
                for h in 0..nh {
                    let x = |slot: usize, i: usize| srcs[slot][(t * nh + h) * n + i];
                    let s = |i: usize, j: usize| (h * n + i) * n + j;
                    let y = |j: usize| t * width + h * n + j;
                    match self.op {
                        Op::RWKV_WKV6 => {
                            for j in 0..n {
                                out[y(j)] = (0..n)
                                    .map(|i| {
                                        let kv = x(0, i) * x(1, j);
                                        x(2, i) * (kv * srcs[3][h * n + i] + st[s(i, j)])
                                    })
                                    .sum();
                            }
                            for i in 0..n {
                                for j in 0..n {
                                    st[s(i, j)] = st[s(i, j)] * x(4, i) + x(0, i) * x(1, j);
                                }
                            }
                        }
                        Op::RWKV_WKV7 => {
                            for i in 0..n {
                                let sa: f64 = (0..n).map(|j| x(4, j) * st[s(i, j)]).sum();
                                for j in 0..n {
                                    st[s(i, j)] =
                                        st[s(i, j)] * x(1, j) + x(3, i) * x(2, j) + sa * x(5, j);
                                }
                                out[y(i)] = (0..n).map(|j| st[s(i, j)] * x(0, j)).sum();
                            }
                        }
                        _ => {
                            for i in 0..n {
                                for j in 0..n {
                                    st[s(i, j)] = st[s(i, j)] * x(3, i) + x(0, i) * x(1, j);
                                }
                            }
                            for j in 0..n {
                                out[y(j)] = (0..n)
                                    .map(|i| st[s(i, j)] * x(2, i) * f64::from(self.scale))
                                    .sum();
                            }
                        }
                    }
                }
            }
            let at = states_at + seq * n * width;
            out[at..at + n * width].copy_from_slice(&st);
        }
        out
    }
}

#[test]
fn rwkv6_rwkv7_and_gla_match_naive_recurrences_per_sequence() {
    let mut rng = Rng::new(75);
    for op in [Op::RWKV_WKV6, Op::RWKV_WKV7, Op::GATED_LINEAR_ATTN] {
        // [S, H, tokens per sequence, sequences]
        for sizes in [[4, 3, 5, 2], [8, 2, 1, 3], [16, 5, 7, 1], [3, 4, 4, 2]] {
            let rec = Recurrence::new(op, sizes, &mut rng);
            let what = format!("{op:?} {sizes:?}");
            let (g, node) = rec.graph();
            let bytes = run_both(&g, &what);
            assert_close(&g.read(&bytes, node), &rec.reference(), 1e-10, &what);
        }
    }
}

/// A malformed recurrence: what it breaks, the shapes of its sources and destination.
type BadRecurrence = (&'static str, Vec<[usize; 4]>, [usize; 4]);

#[test]
fn malformed_recurrences_are_refused_before_anything_is_written() {
    let mut rng = Rng::new(76);
    for op in [Op::RWKV_WKV6, Op::RWKV_WKV7, Op::GATED_LINEAR_ATTN] {
        let rec = Recurrence::new(op, [4, 2, 3, 2], &mut rng);
        let last = rec.srcs.len() - 1;
        let mut cases: Vec<BadRecurrence> = Vec::new();
        let mut shapes = rec.shapes();
        shapes[1] = [4, 2, 5, 1];
        cases.push(("an input of other tokens", shapes, rec.dst_ne()));
        let mut shapes = rec.shapes();
        // 6 tokens over 4 sequences
        shapes[last] = [4 * 4 * 2, 4, 1, 1];
        cases.push(("tokens not shared evenly by the sequences", shapes, {
            let mut ne = rec.dst_ne();
            ne[1] = 6 + 4 * 4;
            ne
        }));
        let mut shapes = rec.shapes();
        shapes[last] = [4 * 4 * 2 - 1, 2, 1, 1];
        cases.push(("a state one value short", shapes, rec.dst_ne()));
        let mut shapes = rec.shapes();
        shapes[last] = [4 * 4 * 2 * 2, 0, 1, 1];
        cases.push(("no sequences", shapes, [8, 6, 1, 1]));
        let mut ne = rec.dst_ne();
        ne[1] -= 1;
        cases.push(("a destination one row short", rec.shapes(), ne));
        let mut shapes = rec.shapes();
        shapes[0] = [4, 2, 6, 2];
        cases.push(("a 4-D input", shapes, rec.dst_ne()));
        if op == Op::RWKV_WKV6 {
            let mut shapes = rec.shapes();
            shapes[3] = [4, 3, 1, 1];
            cases.push(("time_first of another head count", shapes, rec.dst_ne()));
        }
        for (what, shapes, dst_ne) in cases {
            let mut g = G::new();
            let srcs: Vec<TensorIndex> = shapes
                .iter()
                .map(|&ne| g.input(ty::F32, ne, &vec![0.5; ne.iter().product()]))
                .collect();
            g.node(op, ty::F32, dst_ne, &srcs, &[0]);
            let error = g.run(1).unwrap_err();
            assert_eq!(
                error.kind(),
                ErrorKind::InvalidGraph,
                "{op:?}, {what}: {error}"
            );
            assert_refused(&g, ErrorKind::InvalidGraph);
        }
        // F16 sources: no kernel
        let mut g = G::new();
        let srcs: Vec<TensorIndex> = rec
            .shapes()
            .iter()
            .map(|&ne| g.input(ty::F16, ne, &vec![0.5; ne.iter().product()]))
            .collect();
        g.node(op, ty::F32, rec.dst_ne(), &srcs, &[0]);
        assert_refused(&g, ErrorKind::OpRefused);
        // a missing source
        let mut g = G::new();
        let srcs: Vec<TensorIndex> = rec.shapes()[..last]
            .iter()
            .map(|&ne| g.input(ty::F32, ne, &vec![0.5; ne.iter().product()]))
            .collect();
        g.node(op, ty::F32, rec.dst_ne(), &srcs, &[0]);
        assert_refused(&g, ErrorKind::InvalidGraph);
        // a transposed (non-contiguous) first input
        let mut g = G::new();
        let mut srcs: Vec<TensorIndex> = rec
            .shapes()
            .iter()
            .map(|&ne| g.input(ty::F32, ne, &vec![0.5; ne.iter().product()]))
            .collect();
        let base = g.input(ty::F32, [2, 4, 6, 1], &[0.5; 48]);
        srcs[0] = g.view(base, [4, 2, 6, 1], [8, 4, 32, 192], 0);
        g.node(op, ty::F32, rec.dst_ne(), &srcs, &[0]);
        assert_refused(&g, ErrorKind::InvalidGraph);
    }
}
