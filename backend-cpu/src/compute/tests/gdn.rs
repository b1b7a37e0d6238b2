//! Tests of CUMSUM, TRI, FILL, SOLVE_TRI, GATED_DELTA_NET, PAD, ROLL, ARANGE and
//! TIMESTEP_EMBEDDING: each against a naive f64
//! reference written here, on several shapes and non-contiguous sources where the op takes
//! them; thread-count independence; and the refusal of malformed shapes (before anything is
//! written). The harness is [`super`]'s.

use proto_core::ggml::types::id as ty;
use proto_core::ggml::Op;
use proto_core::graph::TensorIndex;
use proto_core::ErrorKind;

use super::{assert_close, assert_refused, f, Rng, G};

fn at(ne: [usize; 4], i: [usize; 4]) -> usize {
    i[0] + ne[0] * (i[1] + ne[1] * (i[2] + ne[2] * i[3]))
}

fn rows(ne: [usize; 4]) -> impl Iterator<Item = [usize; 3]> {
    (0..ne[3])
        .flat_map(move |i3| (0..ne[2]).flat_map(move |i2| (0..ne[1]).map(move |i1| [i1, i2, i3])))
}

/// `values` (logical order of `ne`) stored with dimensions 1 and 2 swapped, then permuted
/// back: a view of shape `ne` whose rows are not in order (`ggml_permute(.., 0, 2, 1, 3)`).
fn swapped_rows(g: &mut G, ne: [usize; 4], values: &[f32]) -> TensorIndex {
    let base_ne = [ne[0], ne[2], ne[1], ne[3]];
    let mut base = vec![0.0f32; values.len()];
    for [i1, i2, i3] in rows(ne) {
        for i0 in 0..ne[0] {
            base[at(base_ne, [i0, i2, i1, i3])] = values[at(ne, [i0, i1, i2, i3])];
        }
    }
    let stored = g.input(ty::F32, base_ne, &base);
    g.permute(stored, [0, 2, 1, 3])
}

// --- CUMSUM, TRI, FILL -----------------------------------------------------------------------

#[test]
fn cumsum_runs_along_rows_of_contiguous_and_permuted_sources() {
    let mut rng = Rng::new(71);
    for ne in [[10, 5, 4, 3], [1, 3, 1, 1], [257, 2, 3, 1], [3000, 1, 1, 1]] {
        for permuted in [false, true] {
            let n: usize = ne.iter().product();
            let values = rng.values(n, 1.0);
            let mut g = G::new();
            let a = if permuted {
                swapped_rows(&mut g, ne, &values)
            } else {
                g.input(ty::F32, ne, &values)
            };
            let sum = g.node(Op::CUMSUM, ty::F32, ne, &[a], &[]);
            let out = g.run(3).unwrap();
            let mut want = Vec::with_capacity(n);
            for row in values.chunks(ne[0]) {
                let mut running = 0.0f64;
                for &v in row {
                    running += f64::from(v);
                    want.push(running);
                }
            }
            assert_close(
                &g.read(&out, sum),
                &want,
                1e-12,
                &format!("cumsum {ne:?} permuted={permuted}"),
            );
        }
    }
    // the first element is copied: -0.0 stays -0.0 (0.0 + -0.0 would be +0.0)
    let mut g = G::new();
    let a = g.input(ty::F32, [2, 1, 1, 1], &[-0.0, 1.0]);
    let sum = g.node(Op::CUMSUM, ty::F32, [2, 1, 1, 1], &[a], &[]);
    let out = g.run(1).unwrap();
    assert!(g.read(&out, sum)[0].is_sign_negative());
}

/// Whether TRI keeps element (column, row).
type Keeps = fn(usize, usize) -> bool;

#[test]
fn tri_keeps_each_triangle_and_zeroes_the_rest() {
    let mut rng = Rng::new(72);
    let ne = [7, 7, 2, 3];
    let n: usize = ne.iter().product();
    let mut values = rng.values(n, 1.0);
    values[5] = f32::NAN; // row 0, column 5: kept by the upper types, zeroed by the lower
    let cases: [(i32, Keeps); 4] = [
        (0, |c, r| c >= r),
        (1, |c, r| c > r),
        (2, |c, r| c <= r),
        (3, |c, r| c < r),
    ];
    for (tri_type, keeps) in cases {
        let mut g = G::new();
        let a = g.input(ty::F32, ne, &values);
        let t = g.node(Op::TRI, ty::F32, ne, &[a], &[tri_type]);
        let out = g.run(3).unwrap();
        let want: Vec<f64> = rows(ne)
            .flat_map(|[r, i2, i3]| {
                let values = &values;
                (0..ne[0]).map(move |c| {
                    if keeps(c, r) {
                        f64::from(values[at(ne, [c, r, i2, i3])])
                    } else {
                        0.0
                    }
                })
            })
            .collect();
        assert_close(
            &g.read(&out, t),
            &want,
            0.0,
            &format!("tri type {tri_type}"),
        );
    }
}

#[test]
fn fill_writes_the_value_in_f32_and_f16_also_in_place() {
    for (type_id, value, stored) in [
        (ty::F32, 3.3f32, f64::from(3.3f32)),
        // 3.3 rounds to the nearest f16, 3.30078125
        (ty::F16, 3.3f32, 3.30078125),
        (ty::F32, -152.0, -152.0),
    ] {
        let ne = [33, 7, 3, 2];
        let n: usize = ne.iter().product();
        let mut g = G::new();
        let a = g.input(type_id, ne, &vec![1.0; n]);
        let fresh = g.node(Op::FILL, type_id, ne, &[a], &[f(value)]);
        let b = g.input(type_id, ne, &vec![1.0; n]);
        let in_place = g.node_into(Op::FILL, b, &[b], &[f(value)]);
        let out = g.run(3).unwrap();
        let want = vec![stored; n];
        assert_close(&g.read(&out, fresh), &want, 0.0, "fill");
        assert_close(&g.read(&out, in_place), &want, 0.0, "fill in place");
        // the source of the fresh fill is untouched
        assert_close(&g.read(&out, a), &vec![1.0; n], 0.0, "fill source");
    }
}

// --- SOLVE_TRI -------------------------------------------------------------------------------

/// Lower triangular matrices with a diagonal in [0.5, 1.5] (well conditioned), and garbage
/// above the diagonal that the solver must not read.
fn lower_triangular(rng: &mut Rng, ne: [usize; 4]) -> Vec<f32> {
    let mut a = rng.values(ne.iter().product(), 1.0);
    for [r, i2, i3] in rows(ne) {
        for c in 0..ne[0] {
            let v = &mut a[at(ne, [c, r, i2, i3])];
            if c == r {
                *v = 1.0 + *v * 0.5;
            } else if c > r {
                *v = f32::NAN;
            } else {
                *v *= 0.5;
            }
        }
    }
    a
}

#[test]
fn solve_tri_matches_forward_substitution_in_f64() {
    let mut rng = Rng::new(73);
    for (n, k, b2, b3) in [
        (10, 3, 4, 3),
        (1, 1, 1, 1),
        (17, 9, 2, 4),
        (64, 64, 1, 2),
        (5, 40, 3, 1),
    ] {
        let (ne_a, ne_b) = ([n, n, b2, b3], [k, n, b2, b3]);
        let a = lower_triangular(&mut rng, ne_a);
        let b = rng.values(ne_b.iter().product(), 1.0);
        let mut g = G::new();
        let ta = g.input(ty::F32, ne_a, &a);
        let tb = g.input(ty::F32, ne_b, &b);
        let x = g.node(Op::SOLVE_TRI, ty::F32, ne_b, &[ta, tb], &[]);
        let out = g.run(3).unwrap();
        let mut want = vec![0.0f64; b.len()];
        for i3 in 0..b3 {
            for i2 in 0..b2 {
                for col in 0..k {
                    for r in 0..n {
                        let mut sum = 0.0f64;
                        for t in 0..r {
                            sum += f64::from(a[at(ne_a, [t, r, i2, i3])])
                                * want[at(ne_b, [col, t, i2, i3])];
                        }
                        let diag = f64::from(a[at(ne_a, [r, r, i2, i3])]);
                        want[at(ne_b, [col, r, i2, i3])] =
                            (f64::from(b[at(ne_b, [col, r, i2, i3])]) - sum) / diag;
                    }
                }
            }
        }
        assert_close(
            &g.read(&out, x),
            &want,
            1e-10,
            &format!("solve_tri n={n} k={k}"),
        );
    }
}

// --- GATED_DELTA_NET -------------------------------------------------------------------------

/// One GATED_DELTA_NET case.
#[derive(Clone, Copy, Debug)]
struct DeltaCase {
    s_v: usize,
    /// Heads of q and k.
    qk_heads: usize,
    /// v's heads per q/k head.
    v_repeat: usize,
    tokens: usize,
    seqs: usize,
    /// Sequences of q and k (dividing `seqs`).
    qk_seqs: usize,
    /// One gate per state row (KDA).
    kda: bool,
    /// q, k and v as permuted views.
    permuted: bool,
    /// Snapshot slots.
    snapshots: usize,
}

/// The inputs of a case, logical order.
struct DeltaInputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    gate: Vec<f32>,
    beta: Vec<f32>,
    state: Vec<f32>,
}

impl DeltaCase {
    fn heads(&self) -> usize {
        self.qk_heads * self.v_repeat
    }

    fn qk_ne(&self) -> [usize; 4] {
        [self.s_v, self.qk_heads, self.tokens, self.qk_seqs]
    }

    fn v_ne(&self) -> [usize; 4] {
        [self.s_v, self.heads(), self.tokens, self.seqs]
    }

    fn gate_ne(&self) -> [usize; 4] {
        let ne0 = if self.kda { self.s_v } else { 1 };
        [ne0, self.heads(), self.tokens, self.seqs]
    }

    fn beta_ne(&self) -> [usize; 4] {
        [1, self.heads(), self.tokens, self.seqs]
    }

    fn state_ne(&self) -> [usize; 4] {
        [self.s_v, self.s_v, self.heads(), self.seqs]
    }

    fn dst_ne(&self) -> [usize; 4] {
        let rows = self.tokens * self.seqs + self.snapshots * self.s_v * self.seqs;
        [self.s_v * self.heads(), rows, 1, 1]
    }

    fn inputs(&self, rng: &mut Rng) -> DeltaInputs {
        let count = |ne: [usize; 4]| ne.iter().product::<usize>();
        DeltaInputs {
            q: rng.values(count(self.qk_ne()), 0.5),
            k: rng.values(count(self.qk_ne()), 0.5),
            v: rng.values(count(self.v_ne()), 2.0),
            // log-decays in (-1.01, -0.01)
            gate: (0..count(self.gate_ne()))
                .map(|_| -0.51 + rng.f32() * 0.5)
                .collect(),
            beta: (0..count(self.beta_ne()))
                .map(|_| 0.5 + rng.f32() * 0.5)
                .collect(),
            state: rng.values(count(self.state_ne()), 0.3),
        }
    }

    /// The graph: a GATED_DELTA_NET node writing into a destination prefilled with
    /// `sentinel` (slots the op does not write keep it).
    fn graph(&self, x: &DeltaInputs, sentinel: f32) -> (G, TensorIndex) {
        let mut g = G::new();
        let qkv = |g: &mut G, ne, values: &[f32]| {
            if self.permuted {
                swapped_rows(g, ne, values)
            } else {
                g.input(ty::F32, ne, values)
            }
        };
        let q = qkv(&mut g, self.qk_ne(), &x.q);
        let k = qkv(&mut g, self.qk_ne(), &x.k);
        let v = qkv(&mut g, self.v_ne(), &x.v);
        let gate = g.input(ty::F32, self.gate_ne(), &x.gate);
        let beta = g.input(ty::F32, self.beta_ne(), &x.beta);
        let state = g.input(ty::F32, self.state_ne(), &x.state);
        let dst_ne = self.dst_ne();
        let target = g.input(ty::F32, dst_ne, &vec![sentinel; dst_ne.iter().product()]);
        let node = g.node_into(
            Op::GATED_DELTA_NET,
            target,
            &[q, k, v, gate, beta, state],
            &[self.snapshots as i32],
        );
        (g, node)
    }

    /// The destination as the delta rule defines it, in f64, `sentinel` where nothing is
    /// written.
    fn reference(&self, x: &DeltaInputs, sentinel: f32) -> Vec<f64> {
        let (s_v, heads, tokens, seqs) = (self.s_v, self.heads(), self.tokens, self.seqs);
        let dst_ne = self.dst_ne();
        let width = dst_ne[0];
        let mut want = vec![f64::from(sentinel); dst_ne.iter().product()];
        let scale = 1.0 / (s_v as f64).sqrt();
        for seq in 0..seqs {
            for h in 0..heads {
                // s[i][j]: row i of the math's state; the tensor holds it transposed
                let mut s = vec![vec![0.0f64; s_v]; s_v];
                for (i, row) in s.iter_mut().enumerate() {
                    for (j, v) in row.iter_mut().enumerate() {
                        *v = f64::from(x.state[at(self.state_ne(), [i, j, h, seq])]);
                    }
                }
                let qk_seq = seq / (seqs / self.qk_seqs);
                let qk_head = h % self.qk_heads;
                for t in 0..tokens {
                    let qk = |values: &[f32], i| {
                        f64::from(values[at(self.qk_ne(), [i, qk_head, t, qk_seq])])
                    };
                    for (i, row) in s.iter_mut().enumerate() {
                        let gi = if self.kda { i } else { 0 };
                        let decay = f64::from(x.gate[at(self.gate_ne(), [gi, h, t, seq])]).exp();
                        row.iter_mut().for_each(|v| *v *= decay);
                    }
                    let beta = f64::from(x.beta[at(self.beta_ne(), [0, h, t, seq])]);
                    let delta: Vec<f64> = (0..s_v)
                        .map(|j| {
                            let kv: f64 = (0..s_v).map(|i| s[i][j] * qk(&x.k, i)).sum();
                            (f64::from(x.v[at(self.v_ne(), [j, h, t, seq])]) - kv) * beta
                        })
                        .collect();
                    for (i, row) in s.iter_mut().enumerate() {
                        for (j, v) in row.iter_mut().enumerate() {
                            *v += qk(&x.k, i) * delta[j];
                        }
                    }
                    for j in 0..s_v {
                        let o: f64 = (0..s_v).map(|i| s[i][j] * qk(&x.q, i)).sum();
                        want[(seq * tokens + t) * width + h * s_v + j] = o * scale;
                    }
                    let slot = tokens - 1 - t;
                    if slot < self.snapshots {
                        let base = tokens * seqs * width
                            + slot * s_v * seqs * width
                            + (seq * heads + h) * s_v * s_v;
                        for (i, row) in s.iter().enumerate() {
                            for (j, v) in row.iter().enumerate() {
                                want[base + j * s_v + i] = *v;
                            }
                        }
                    }
                }
                if tokens == 0 && self.snapshots == 1 {
                    // no token: the final state is the initial one
                    let base = (seq * heads + h) * s_v * s_v;
                    for (i, row) in s.iter().enumerate() {
                        for (j, v) in row.iter().enumerate() {
                            want[base + j * s_v + i] = *v;
                        }
                    }
                }
            }
        }
        want
    }
}

const DELTA_BASE: DeltaCase = DeltaCase {
    s_v: 16,
    qk_heads: 4,
    v_repeat: 1,
    tokens: 1,
    seqs: 1,
    qk_seqs: 1,
    kda: false,
    permuted: false,
    snapshots: 1,
};

#[test]
fn gated_delta_net_matches_the_delta_rule_in_f64() {
    let cases = [
        DELTA_BASE,
        DeltaCase {
            tokens: 5,
            seqs: 2,
            qk_seqs: 2,
            ..DELTA_BASE
        },
        DeltaCase {
            kda: true,
            tokens: 4,
            ..DELTA_BASE
        },
        DeltaCase {
            s_v: 8,
            qk_heads: 2,
            v_repeat: 3,
            tokens: 3,
            seqs: 2,
            qk_seqs: 1,
            kda: true,
            ..DELTA_BASE
        },
        DeltaCase {
            permuted: true,
            tokens: 6,
            seqs: 2,
            qk_seqs: 2,
            ..DELTA_BASE
        },
        DeltaCase {
            permuted: true,
            kda: true,
            v_repeat: 2,
            tokens: 3,
            ..DELTA_BASE
        },
        // more slots than tokens: slots 2 and 3 keep the sentinel
        DeltaCase {
            s_v: 4,
            tokens: 2,
            seqs: 2,
            qk_seqs: 2,
            snapshots: 4,
            ..DELTA_BASE
        },
        // fewer slots than tokens: the last three states
        DeltaCase {
            s_v: 8,
            qk_heads: 3,
            tokens: 7,
            snapshots: 3,
            kda: true,
            ..DELTA_BASE
        },
        DeltaCase {
            s_v: 1,
            qk_heads: 1,
            tokens: 3,
            kda: true,
            ..DELTA_BASE
        },
        // no token: the single slot is the initial state, several slots stay untouched
        DeltaCase {
            tokens: 0,
            seqs: 2,
            qk_seqs: 2,
            ..DELTA_BASE
        },
        DeltaCase {
            tokens: 0,
            snapshots: 2,
            ..DELTA_BASE
        },
    ];
    let mut rng = Rng::new(74);
    let sentinel = 7.25;
    for case in cases {
        let inputs = case.inputs(&mut rng);
        let (g, node) = case.graph(&inputs, sentinel);
        let out = g.run(3).unwrap();
        let want = case.reference(&inputs, sentinel);
        let got = g.read(&out, node);
        assert_close(&got, &want, 1e-10, &format!("{case:?}"));
        // the slots not written hold exactly the sentinel
        for (i, (&got, &want)) in got.iter().zip(&want).enumerate() {
            if want == f64::from(sentinel) {
                assert_eq!(got, sentinel, "{case:?}: element {i}");
            }
        }
    }
}

#[test]
fn thread_count_does_not_change_a_byte_of_these_ops() {
    let mut rng = Rng::new(75);
    let case = DeltaCase {
        s_v: 16,
        qk_heads: 3,
        v_repeat: 2,
        tokens: 9,
        seqs: 2,
        qk_seqs: 2,
        kda: true,
        permuted: true,
        snapshots: 2,
    };
    let inputs = case.inputs(&mut rng);
    let (mut g, delta) = case.graph(&inputs, 0.0);
    let ne = [64, 64, 3, 2];
    let a = lower_triangular(&mut rng, ne);
    let ta = g.input(ty::F32, ne, &a);
    let tri = g.node(Op::TRI, ty::F32, ne, &[ta], &[3]);
    let b_ne = [37, 64, 3, 2];
    let b = rng.values(b_ne.iter().product(), 1.0);
    let tb = g.input(ty::F32, b_ne, &b);
    let solved = g.node(Op::SOLVE_TRI, ty::F32, b_ne, &[ta, tb], &[]);
    let sum = g.node(Op::CUMSUM, ty::F32, b_ne, &[solved], &[]);
    let filled = g.node(Op::FILL, ty::F32, ne, &[tri], &[f(0.5)]);
    let padded = g.node(
        Op::PAD,
        ty::F32,
        [67, 66, 4, 2],
        &[tri],
        &[1, 2, 0, 2, 1, 0, 0, 0, 1],
    );
    let rolled = g.node(Op::ROLL, ty::F32, ne, &[tri], &[5, -7, 1, 0]);
    let range = g.node(
        Op::ARANGE,
        ty::F32,
        [4096, 1, 1, 1],
        &[],
        &[f(0.0), f(2048.0), f(0.5)],
    );
    let t = g.input(ty::F32, [33, 1, 1, 1], &rng.values(33, 100.0));
    let embedded = g.node(
        Op::TIMESTEP_EMBEDDING,
        ty::F32,
        [65, 33, 1, 1],
        &[t],
        &[65, 10000],
    );
    let one = g.run(1).unwrap();
    let three = g.run(3).unwrap();
    for t in [
        delta, tri, solved, sum, filled, padded, rolled, range, embedded,
    ] {
        assert_eq!(g.raw(&one, t), g.raw(&three, t), "tensor {t}");
    }
}

// --- refusals --------------------------------------------------------------------------------

#[test]
fn malformed_shapes_and_types_are_refused_cleanly() {
    type Build = Box<dyn Fn(&mut G)>;
    let ones = |n: usize| vec![1.0f32; n];
    let invalid: Vec<(&str, Build)> = vec![
        (
            "cumsum into another shape",
            Box::new(move |g: &mut G| {
                let a = g.input(ty::F32, [4, 3, 1, 1], &ones(12));
                g.node(Op::CUMSUM, ty::F32, [4, 2, 1, 1], &[a], &[]);
            }),
        ),
        (
            "cumsum of a transposed source (strided rows)",
            Box::new(move |g: &mut G| {
                let a = g.input(ty::F32, [4, 3, 1, 1], &ones(12));
                let t = g.permute(a, [1, 0, 2, 3]);
                g.node(Op::CUMSUM, ty::F32, [3, 4, 1, 1], &[t], &[]);
            }),
        ),
        (
            "tri of a non-square matrix",
            Box::new(move |g: &mut G| {
                let a = g.input(ty::F32, [4, 3, 1, 1], &ones(12));
                g.node(Op::TRI, ty::F32, [4, 3, 1, 1], &[a], &[0]);
            }),
        ),
        (
            "tri with an unknown type",
            Box::new(move |g: &mut G| {
                let a = g.input(ty::F32, [3, 3, 1, 1], &ones(9));
                g.node(Op::TRI, ty::F32, [3, 3, 1, 1], &[a], &[4]);
            }),
        ),
        (
            "fill of a non-contiguous source",
            Box::new(move |g: &mut G| {
                let a = g.input(ty::F32, [4, 3, 1, 1], &ones(12));
                let t = g.permute(a, [1, 0, 2, 3]);
                g.node(Op::FILL, ty::F32, [3, 4, 1, 1], &[t], &[f(1.0)]);
            }),
        ),
        (
            "solve_tri with B of other rows",
            Box::new(move |g: &mut G| {
                let a = g.input(ty::F32, [4, 4, 1, 1], &ones(16));
                let b = g.input(ty::F32, [2, 3, 1, 1], &ones(6));
                g.node(Op::SOLVE_TRI, ty::F32, [2, 3, 1, 1], &[a, b], &[]);
            }),
        ),
        (
            "solve_tri with a non-square A",
            Box::new(move |g: &mut G| {
                let a = g.input(ty::F32, [3, 4, 1, 1], &ones(12));
                let b = g.input(ty::F32, [2, 4, 1, 1], &ones(8));
                g.node(Op::SOLVE_TRI, ty::F32, [2, 4, 1, 1], &[a, b], &[]);
            }),
        ),
        (
            "solve_tri into a bigger destination",
            Box::new(move |g: &mut G| {
                let a = g.input(ty::F32, [4, 4, 1, 1], &ones(16));
                let b = g.input(ty::F32, [2, 4, 1, 1], &ones(8));
                g.node(Op::SOLVE_TRI, ty::F32, [2, 4, 2, 1], &[a, b], &[]);
            }),
        ),
        (
            "solve_tri with other batches",
            Box::new(move |g: &mut G| {
                let a = g.input(ty::F32, [4, 4, 2, 1], &ones(32));
                let b = g.input(ty::F32, [2, 4, 1, 1], &ones(8));
                g.node(Op::SOLVE_TRI, ty::F32, [2, 4, 1, 1], &[a, b], &[]);
            }),
        ),
        (
            "solve_tri without B",
            Box::new(move |g: &mut G| {
                let a = g.input(ty::F32, [4, 4, 1, 1], &ones(16));
                g.node(Op::SOLVE_TRI, ty::F32, [2, 4, 1, 1], &[a], &[]);
            }),
        ),
    ];
    for (what, build) in invalid {
        let mut g = G::new();
        build(&mut g);
        eprintln!("{what}: {}", g.run(1).unwrap_err());
        assert_refused(&g, ErrorKind::InvalidGraph);
    }
    // types without a kernel
    let refused: Vec<(&str, Build)> = vec![
        (
            "cumsum of F16",
            Box::new(move |g: &mut G| {
                let a = g.input(ty::F16, [4, 1, 1, 1], &ones(4));
                g.node(Op::CUMSUM, ty::F16, [4, 1, 1, 1], &[a], &[]);
            }),
        ),
        (
            "fill of I32",
            Box::new(move |g: &mut G| {
                let a = g.input(ty::I32, [4, 1, 1, 1], &ones(4));
                g.node(Op::FILL, ty::I32, [4, 1, 1, 1], &[a], &[f(1.0)]);
            }),
        ),
        (
            "solve_tri of F16",
            Box::new(move |g: &mut G| {
                let a = g.input(ty::F16, [2, 2, 1, 1], &ones(4));
                let b = g.input(ty::F32, [1, 2, 1, 1], &ones(2));
                g.node(Op::SOLVE_TRI, ty::F32, [1, 2, 1, 1], &[a, b], &[]);
            }),
        ),
    ];
    for (what, build) in refused {
        let mut g = G::new();
        build(&mut g);
        eprintln!("{what}: {}", g.run(1).unwrap_err());
        assert_refused(&g, ErrorKind::OpRefused);
    }
}

/// Breaks one rule of the GATED_DELTA_NET node it is given.
type Break = fn(&mut G, TensorIndex);

#[test]
fn malformed_gated_delta_nets_are_refused_cleanly() {
    let case = DeltaCase {
        s_v: 4,
        qk_heads: 2,
        tokens: 3,
        seqs: 2,
        qk_seqs: 2,
        ..DELTA_BASE
    };
    let mut rng = Rng::new(76);
    let inputs = case.inputs(&mut rng);
    // each breaks one rule of a well-formed graph
    let breaks: [(&str, Break); 12] = [
        ("a transposed (non-contiguous) state", |g, node| {
            let stored = g.zeros(ty::F32, [4, 4, 2, 2]);
            let transposed = g.permute(stored, [1, 0, 2, 3]);
            set_src(g, node, 5, transposed);
        }),
        ("state of other heads", |g, node| {
            resize_src(g, node, 5, [4, 4, 3, 2])
        }),
        ("beta with two values a head", |g, node| {
            resize_src(g, node, 4, [2, 2, 3, 2])
        }),
        ("gate neither scalar nor a row", |g, node| {
            resize_src(g, node, 3, [3, 2, 3, 2])
        }),
        ("gate of other tokens", |g, node| {
            resize_src(g, node, 3, [1, 2, 2, 2])
        }),
        ("q of other rows", |g, node| {
            resize_src(g, node, 0, [3, 2, 3, 2])
        }),
        ("k of other tokens", |g, node| {
            resize_src(g, node, 1, [4, 2, 2, 2])
        }),
        ("q sequences not dividing v's", |g, node| {
            resize_src(g, node, 0, [4, 2, 3, 3])
        }),
        ("zero snapshots", |g, node| {
            g.tensors[node as usize].record.op_params[0] = 0
        }),
        ("negative snapshots", |g, node| {
            g.tensors[node as usize].record.op_params[0] = -2
        }),
        ("destination without the state rows", |g, node| {
            let r = &mut g.tensors[node as usize].record;
            r.ne[1] -= 1;
            g.tensors[node as usize].byte_size = r.byte_size().unwrap();
        }),
        ("missing state", |g, node| {
            g.tensors[node as usize].src[5] = None;
            g.tensors[node as usize].record.src[5] = 0;
        }),
    ];
    for (what, break_it) in breaks {
        let (mut g, node) = case.graph(&inputs, 0.0);
        break_it(&mut g, node);
        eprintln!("{what}: {}", g.run(1).unwrap_err());
        assert_refused(&g, ErrorKind::InvalidGraph);
    }
    // an F16 state has no kernel
    let (mut g, node) = case.graph(&inputs, 0.0);
    let state = g.input(ty::F16, case.state_ne(), &vec![0.5; 4 * 4 * 2 * 2]);
    set_src(&mut g, node, 5, state);
    assert_refused(&g, ErrorKind::OpRefused);
}

/// Replaces source `slot` of `node` by a fresh zeroed F32 tensor of shape `ne`.
fn resize_src(g: &mut G, node: TensorIndex, slot: usize, ne: [usize; 4]) {
    let fresh = g.zeros(ty::F32, ne);
    set_src(g, node, slot, fresh);
}

fn set_src(g: &mut G, node: TensorIndex, slot: usize, src: TensorIndex) {
    let t = &mut g.tensors[node as usize];
    t.src[slot] = Some(src);
    t.record.src[slot] = u64::from(src) + 1;
}

// --- PAD, ROLL, ARANGE, TIMESTEP_EMBEDDING ----------------------------------------------------

/// The values of a source of shape `ne` as a test reads them: logical order, optionally
/// through a view whose rows are out of order.
fn source(g: &mut G, ne: [usize; 4], values: &[f32], permuted: bool) -> TensorIndex {
    if permuted {
        swapped_rows(g, ne, values)
    } else {
        g.input(ty::F32, ne, values)
    }
}

fn every(ne: [usize; 4]) -> impl Iterator<Item = [usize; 4]> {
    rows(ne).flat_map(move |[i1, i2, i3]| (0..ne[0]).map(move |i0| [i0, i1, i2, i3]))
}

/// Source shape, pads before and after each dimension, circular.
type PadCase = ([usize; 4], [i64; 4], [i64; 4], bool);

#[test]
fn pad_with_zeros_or_wrapped_around_over_permuted_sources() {
    let mut rng = Rng::new(81);
    let cases: [PadCase; 6] = [
        ([5, 4, 3, 2], [1, 0, 2, 1], [2, 1, 0, 1], false),
        ([5, 4, 3, 2], [1, 0, 2, 1], [2, 1, 0, 1], true),
        ([7, 3, 1, 1], [0, 0, 0, 0], [3, 2, 0, 0], false),
        ([4, 4, 2, 1], [6, 5, 0, 0], [1, 0, 0, 0], true),
        // a negative pad crops
        ([6, 5, 1, 1], [-1, 0, 0, 0], [2, -2, 0, 0], false),
        ([1, 1, 1, 1], [2, 1, 1, 1], [1, 2, 0, 0], false),
    ];
    for (ne, before, after, circular) in cases {
        for permuted in [false, true] {
            let values = rng.values(ne.iter().product(), 1.0);
            let dst_ne: [usize; 4] =
                std::array::from_fn(|d| (ne[d] as i64 + before[d] + after[d]) as usize);
            let mut params = [0i32; 9];
            for d in 0..4 {
                params[2 * d] = before[d] as i32;
                params[2 * d + 1] = after[d] as i32;
            }
            params[8] = i32::from(circular);
            let mut g = G::new();
            let a = source(&mut g, ne, &values, permuted);
            let padded = g.node(Op::PAD, ty::F32, dst_ne, &[a], &params);
            let out = g.run(3).unwrap();
            let want: Vec<f64> = every(dst_ne)
                .map(|i| {
                    let mut j = [0usize; 4];
                    for d in 0..4 {
                        let k = i[d] as i64 - before[d];
                        let n = ne[d] as i64;
                        let k = if circular { k.rem_euclid(n) } else { k };
                        if k < 0 || k >= n {
                            return 0.0;
                        }
                        j[d] = k as usize;
                    }
                    f64::from(values[at(ne, j)])
                })
                .collect();
            assert_close(
                &g.read(&out, padded),
                &want,
                0.0,
                &format!("pad {ne:?} {before:?} {after:?} circular={circular} permuted={permuted}"),
            );
        }
    }
}

#[test]
fn roll_rotates_every_dimension_of_permuted_sources() {
    let mut rng = Rng::new(82);
    let ne = [10, 5, 4, 3];
    for shifts in [[3, -2, 1, -1], [0, 0, 0, 0], [-9, 4, -3, 2]] {
        for permuted in [false, true] {
            let values = rng.values(ne.iter().product(), 1.0);
            let mut g = G::new();
            let a = source(&mut g, ne, &values, permuted);
            let rolled = g.node(Op::ROLL, ty::F32, ne, &[a], &shifts);
            let out = g.run(3).unwrap();
            let want: Vec<f64> = every(ne)
                .map(|i| {
                    let j: [usize; 4] = std::array::from_fn(|d| {
                        (i[d] as i64 - i64::from(shifts[d])).rem_euclid(ne[d] as i64) as usize
                    });
                    f64::from(values[at(ne, j)])
                })
                .collect();
            assert_close(
                &g.read(&out, rolled),
                &want,
                0.0,
                &format!("roll {shifts:?} permuted={permuted}"),
            );
        }
    }
}

#[test]
fn arange_counts_from_start_by_step() {
    for (start, stop, step, ne) in [
        (0.0f32, 10.0f32, 1.0f32, [10, 1, 1, 1]),
        (0.5, 3.0, 0.25, [10, 1, 1, 1]),
        (3.0, -1.0, -0.5, [8, 1, 1, 1]),
        // the count rounds up: 0, 0.75, 1.5
        (0.0, 2.0, 0.75, [3, 1, 1, 1]),
        // any shape with the right element count, filled in flat order
        (1.0, 13.0, 1.0, [3, 2, 2, 1]),
    ] {
        let mut g = G::new();
        let range = g.node(Op::ARANGE, ty::F32, ne, &[], &[f(start), f(stop), f(step)]);
        let out = g.run(3).unwrap();
        let n: usize = ne.iter().product();
        let want: Vec<f64> = (0..n)
            .map(|i| f64::from(start) + f64::from(step) * i as f64)
            .collect();
        assert_close(
            &g.read(&out, range),
            &want,
            0.0,
            &format!("arange({start}, {stop}, {step})"),
        );
    }
}

#[test]
fn timestep_embedding_gives_cosines_then_sines() {
    let mut rng = Rng::new(83);
    for (dim, max_period, count) in [(320, 10000, 2), (7, 100, 5), (1, 10000, 3), (64, 3, 9)] {
        let timesteps: Vec<f32> = (0..count).map(|_| (rng.f32() + 1.0) * 5.0).collect();
        let mut g = G::new();
        let t = g.input(ty::F32, [count, 1, 1, 1], &timesteps);
        let embedded = g.node(
            Op::TIMESTEP_EMBEDDING,
            ty::F32,
            [dim, count, 1, 1],
            &[t],
            &[dim as i32, max_period],
        );
        let out = g.run(3).unwrap();
        let half = dim / 2;
        let mut want = vec![0.0f64; dim * count];
        for (i, &t) in timesteps.iter().enumerate() {
            for j in 0..half {
                let freq = (-(f64::from(max_period)).ln() * j as f64 / half as f64).exp();
                let arg = f64::from(t) * freq;
                want[i * dim + j] = arg.cos();
                want[i * dim + half + j] = arg.sin();
            }
        }
        assert_close(
            &g.read(&out, embedded),
            &want,
            1e-10,
            &format!("timestep_embedding dim={dim}"),
        );
    }
}

#[test]
fn malformed_generic_ops_are_refused_cleanly() {
    type Build = Box<dyn Fn(&mut G)>;
    let ones = |n: usize| vec![1.0f32; n];
    let invalid: Vec<(&str, Build)> = vec![
        (
            "pad into a shape the pads do not give",
            Box::new(move |g: &mut G| {
                let a = g.input(ty::F32, [4, 3, 1, 1], &ones(12));
                g.node(
                    Op::PAD,
                    ty::F32,
                    [6, 3, 1, 1],
                    &[a],
                    &[1, 0, 0, 0, 0, 0, 0, 0, 0],
                );
            }),
        ),
        (
            "pad with extreme pads (no overflow, no match)",
            Box::new(move |g: &mut G| {
                let a = g.input(ty::F32, [4, 1, 1, 1], &ones(4));
                g.node(
                    Op::PAD,
                    ty::F32,
                    [5, 1, 1, 1],
                    &[a],
                    &[i32::MAX, i32::MIN, 0, 0, 0, 0, 0, 0, 0],
                );
            }),
        ),
        (
            "roll by a whole dimension",
            Box::new(move |g: &mut G| {
                let a = g.input(ty::F32, [4, 3, 1, 1], &ones(12));
                g.node(Op::ROLL, ty::F32, [4, 3, 1, 1], &[a], &[0, -3, 0, 0]);
            }),
        ),
        (
            "roll by i32::MIN",
            Box::new(move |g: &mut G| {
                let a = g.input(ty::F32, [4, 3, 1, 1], &ones(12));
                g.node(Op::ROLL, ty::F32, [4, 3, 1, 1], &[a], &[i32::MIN, 0, 0, 0]);
            }),
        ),
        (
            "roll of a transposed source (strided rows)",
            Box::new(move |g: &mut G| {
                let a = g.input(ty::F32, [4, 3, 1, 1], &ones(12));
                let t = g.permute(a, [1, 0, 2, 3]);
                g.node(Op::ROLL, ty::F32, [3, 4, 1, 1], &[t], &[1, 1, 0, 0]);
            }),
        ),
        (
            "arange with another count",
            Box::new(move |g: &mut G| {
                g.node(
                    Op::ARANGE,
                    ty::F32,
                    [9, 1, 1, 1],
                    &[],
                    &[f(0.0), f(10.0), f(1.0)],
                );
            }),
        ),
        (
            "arange with a zero step",
            Box::new(move |g: &mut G| {
                g.node(
                    Op::ARANGE,
                    ty::F32,
                    [9, 1, 1, 1],
                    &[],
                    &[f(0.0), f(10.0), f(0.0)],
                );
            }),
        ),
        (
            "arange with a NaN bound",
            Box::new(move |g: &mut G| {
                g.node(
                    Op::ARANGE,
                    ty::F32,
                    [9, 1, 1, 1],
                    &[],
                    &[f(0.0), f(f32::NAN), f(1.0)],
                );
            }),
        ),
        (
            "timestep embedding of another width",
            Box::new(move |g: &mut G| {
                let t = g.input(ty::F32, [3, 1, 1, 1], &ones(3));
                g.node(
                    Op::TIMESTEP_EMBEDDING,
                    ty::F32,
                    [8, 3, 1, 1],
                    &[t],
                    &[6, 10000],
                );
            }),
        ),
        (
            "timestep embedding of other timesteps",
            Box::new(move |g: &mut G| {
                let t = g.input(ty::F32, [3, 1, 1, 1], &ones(3));
                g.node(
                    Op::TIMESTEP_EMBEDDING,
                    ty::F32,
                    [8, 4, 1, 1],
                    &[t],
                    &[8, 10000],
                );
            }),
        ),
        (
            "timestep embedding of a negative width",
            Box::new(move |g: &mut G| {
                let t = g.input(ty::F32, [3, 1, 1, 1], &ones(3));
                g.node(
                    Op::TIMESTEP_EMBEDDING,
                    ty::F32,
                    [8, 3, 1, 1],
                    &[t],
                    &[-8, 10000],
                );
            }),
        ),
    ];
    for (what, build) in invalid {
        let mut g = G::new();
        build(&mut g);
        eprintln!("{what}: {}", g.run(1).unwrap_err());
        assert_refused(&g, ErrorKind::InvalidGraph);
    }
    let refused: Vec<(&str, Build)> = vec![
        (
            "pad of F16",
            Box::new(move |g: &mut G| {
                let a = g.input(ty::F16, [4, 1, 1, 1], &ones(4));
                g.node(
                    Op::PAD,
                    ty::F16,
                    [5, 1, 1, 1],
                    &[a],
                    &[1, 0, 0, 0, 0, 0, 0, 0, 0],
                );
            }),
        ),
        (
            "arange into F16",
            Box::new(move |g: &mut G| {
                g.node(
                    Op::ARANGE,
                    ty::F16,
                    [10, 1, 1, 1],
                    &[],
                    &[f(0.0), f(10.0), f(1.0)],
                );
            }),
        ),
    ];
    for (what, build) in refused {
        let mut g = G::new();
        build(&mut g);
        eprintln!("{what}: {}", g.run(1).unwrap_err());
        assert_refused(&g, ErrorKind::OpRefused);
    }
}
