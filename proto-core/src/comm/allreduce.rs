//! The pairwise all-reduce exchange for two ranks (PROTOCOL.md §6.4).
//!
//! Each `COMM_ALLREDUCE` on the pairwise path swaps the two ranks' partial sums over the one
//! comm socket, raw, with no header: rank 0 sends then receives, rank 1 receives then sends, so
//! large payloads cannot deadlock on full socket buffers. Tensors of at least
//! [`BF16_WIRE_MIN_ELEMENTS`] f32 elements travel as BF16 to halve the bytes. Each rank then adds
//! the (widened) peer values to its own f32 partial, which is **not** rounded: with a BF16 wire
//! the two ranks end with slightly different sums, exactly like the reference.
//!
//! The link carries no ids; both servers receive the `COMM_ALLREDUCE`s in the same order, and the
//! driver runs one [`PairwiseAllReduce`] per request, in that order.

use bytes::Bytes;

use super::bf16::{bf16_to_f32, f32_to_bf16};
use super::error::CommError;
use super::recv::RecvBuf;
use super::transmit::Transmit;

/// Element count from which an F32 tensor is reduced over a BF16 wire.
pub const BF16_WIRE_MIN_ELEMENTS: u64 = 32_768;

/// How the partials travel on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WireFormat {
    /// 4 bytes per element, the f32 bits little-endian.
    F32,
    /// 2 bytes per element, bf16 bits little-endian (round to nearest even, NaN made quiet).
    Bf16,
}

impl WireFormat {
    /// The reference's choice: BF16 iff the tensor is F32 and has at least
    /// [`BF16_WIRE_MIN_ELEMENTS`] elements.
    pub fn select(tensor_is_f32: bool, ne: u64) -> Self {
        if tensor_is_f32 && ne >= BF16_WIRE_MIN_ELEMENTS {
            Self::Bf16
        } else {
            Self::F32
        }
    }

    /// Bytes one element takes on the wire.
    pub fn element_size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::Bf16 => 2,
        }
    }

    /// Wire bytes for `ne` elements (`2·ne` or `4·ne`), or `None` on overflow.
    pub fn wire_bytes(self, ne: u64) -> Option<u64> {
        ne.checked_mul(self.element_size() as u64)
    }
}

/// One pairwise all-reduce on one rank, as a sans-IO state machine.
///
/// Rank 0 offers its payload at once and consumes the peer's afterwards; rank 1 consumes the
/// peer's payload first and only then offers its own. The payload a rank sends is its partial as
/// it was before the reduction (encoded when the machine is created).
#[derive(Debug, Clone)]
pub struct PairwiseAllReduce {
    rank: u32,
    format: WireFormat,
    values: Vec<f32>,
    /// Own payload, until handed out for transmission.
    send: Option<Bytes>,
    recv: RecvBuf,
    /// Whether the received values were added to `values`.
    summed: bool,
    error: Option<CommError>,
}

impl PairwiseAllReduce {
    /// Starts the exchange on `rank` (0 or 1) with this rank's partial `local`, on the wire
    /// `format` (both ranks must pick the same; use [`WireFormat::select`]).
    ///
    /// An empty tensor needs no exchange: the machine is done at once and transmits nothing,
    /// as the reference skips 0-byte tensors.
    pub fn new(rank: u32, local: Vec<f32>, format: WireFormat) -> Result<Self, CommError> {
        if rank > 1 {
            return Err(CommError::InvalidRank { rank, world: 2 });
        }
        let wire_len =
            local
                .len()
                .checked_mul(format.element_size())
                .ok_or(CommError::SizeOverflow {
                    size: format.element_size(),
                    world: u64::try_from(local.len()).unwrap_or(u64::MAX),
                })?;
        let send = if local.is_empty() {
            None
        } else {
            Some(encode(&local, format, wire_len))
        };
        Ok(Self {
            rank,
            format,
            values: local,
            send,
            recv: RecvBuf::new(wire_len),
            summed: false,
            error: None,
        })
    }

    /// The wire format in use.
    pub fn format(&self) -> WireFormat {
        self.format
    }

    /// Whether this rank must still receive the peer's payload before it may send (rank 1).
    fn send_blocked(&self) -> bool {
        self.rank == 1 && !self.recv.is_full()
    }

    /// Offers bytes received from the peer; returns how many were consumed.
    ///
    /// Rank 0 consumes only after its own payload was handed out; neither rank consumes beyond
    /// the peer's payload (the rest is the next reduction's).
    pub fn handle_input(&mut self, data: &[u8]) -> Result<usize, CommError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        if self.rank == 0 && self.send.is_some() {
            // Rank 1 sends only after receiving rank 0's payload.
            return Ok(0);
        }
        let n = self.recv.fill(data);
        if self.recv.is_full() && !self.summed {
            self.sum();
        }
        Ok(n)
    }

    /// Adds the peer's values to the local partial, in place.
    fn sum(&mut self) {
        // The receive is full, so its length is exactly `values.len()` elements.
        add_peer_values(&mut self.values, self.recv.as_slice(), self.format);
        self.summed = true;
    }

    /// This rank's payload, when the protocol allows sending it.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        if self.error.is_some() || self.send_blocked() {
            return None;
        }
        self.send.take().map(|data| Transmit { peer: None, data })
    }

    /// The comm connection closed. Before the exchange finished that is an error.
    pub fn handle_close(&mut self) -> Result<(), CommError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        if self.is_done() {
            Ok(())
        } else {
            let e = CommError::ConnectionClosed {
                peer: Some(1 - self.rank),
            };
            self.error = Some(e.clone());
            Err(e)
        }
    }

    /// How many more payload bytes this rank needs from the peer (0 while it may not read yet).
    pub fn wanted(&self) -> usize {
        if self.error.is_some() || (self.rank == 0 && self.send.is_some()) {
            0
        } else {
            self.recv.remaining()
        }
    }

    /// Whether both directions are complete.
    pub fn is_done(&self) -> bool {
        self.error.is_none() && self.send.is_none() && self.recv.is_full()
    }

    /// The error the exchange failed with, if any.
    pub fn error(&self) -> Option<&CommError> {
        self.error.as_ref()
    }

    /// The reduced values (local partial + widened peer partial); fails with the exchange's
    /// error or [`CommError::NotDone`].
    pub fn into_result(self) -> Result<Vec<f32>, CommError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if !self.is_done() {
            return Err(CommError::NotDone);
        }
        Ok(self.values)
    }
}

/// Encodes a partial for the wire: each element's f32 bits (F32) or its bf16 narrowing (BF16),
/// little-endian, back to back.
pub fn encode_partial(values: &[f32], format: WireFormat) -> Bytes {
    let wire_len = values.len().saturating_mul(format.element_size());
    encode(values, format, wire_len)
}

/// Adds a peer's wire payload to the local partial in place: `local[i] += widen(peer[i])`.
/// The local values are not rounded. Fails if `peer_wire` is not exactly one wire element per
/// local value.
pub fn accumulate(
    local: &mut [f32],
    peer_wire: &[u8],
    format: WireFormat,
) -> Result<(), CommError> {
    let expected = local.len().checked_mul(format.element_size());
    if expected != Some(peer_wire.len()) {
        return Err(CommError::WireLengthMismatch {
            expected: expected.unwrap_or(usize::MAX),
            got: peer_wire.len(),
        });
    }
    add_peer_values(local, peer_wire, format);
    Ok(())
}

/// The in-place sum; callers guarantee matching lengths (extra elements on either side would
/// simply be ignored by the zip).
fn add_peer_values(local: &mut [f32], peer_wire: &[u8], format: WireFormat) {
    match format {
        WireFormat::F32 => {
            for (v, b) in local.iter_mut().zip(peer_wire.chunks_exact(4)) {
                if let Ok(raw) = <[u8; 4]>::try_from(b) {
                    *v += f32::from_le_bytes(raw);
                }
            }
        }
        WireFormat::Bf16 => {
            for (v, b) in local.iter_mut().zip(peer_wire.chunks_exact(2)) {
                if let Ok(raw) = <[u8; 2]>::try_from(b) {
                    *v += bf16_to_f32(u16::from_le_bytes(raw));
                }
            }
        }
    }
}

/// Encodes into a buffer of the precomputed wire length.
fn encode(values: &[f32], format: WireFormat, wire_len: usize) -> Bytes {
    let mut out = Vec::with_capacity(wire_len);
    match format {
        WireFormat::F32 => {
            for v in values {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        WireFormat::Bf16 => {
            for &v in values {
                out.extend_from_slice(&f32_to_bf16(v).to_le_bytes());
            }
        }
    }
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::super::sim::{self, Node};
    use super::*;
    use proptest::prelude::*;

    /// One rank; records how much of the peer payload it had consumed when it first sent.
    struct Rank {
        ar: PairwiseAllReduce,
        consumed: usize,
        consumed_at_send: Option<usize>,
    }

    impl Node for Rank {
        fn input(&mut self, _from: u32, data: &[u8]) -> Result<usize, CommError> {
            let n = self.ar.handle_input(data)?;
            self.consumed += n;
            Ok(n)
        }
        fn transmit(&mut self) -> Option<(u32, Bytes)> {
            let t = self.ar.poll_transmit()?;
            assert_eq!(t.peer, None);
            self.consumed_at_send.get_or_insert(self.consumed);
            Some((1 - self.ar.rank, t.data))
        }
        fn done(&self) -> bool {
            self.ar.is_done()
        }
    }

    fn widen(x: f32, format: WireFormat) -> f32 {
        match format {
            WireFormat::F32 => x,
            WireFormat::Bf16 => bf16_to_f32(f32_to_bf16(x)),
        }
    }

    /// Bit-identical results; where both are NaN, any NaN (when both addends are NaNs, which
    /// payload a sum keeps depends on the operand order the CPU's add instruction sees).
    fn same_bits(got: &[f32], want: &[f32]) -> bool {
        got.len() == want.len()
            && got
                .iter()
                .zip(want)
                .all(|(g, w)| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()))
    }

    /// Runs both ranks and checks each result against the direct computation.
    fn check_pair(a: Vec<f32>, b: Vec<f32>, format: WireFormat, seed: u64) {
        let wire = a.len() * format.element_size();
        let mut nodes = [
            Rank {
                ar: PairwiseAllReduce::new(0, a.clone(), format).unwrap(),
                consumed: 0,
                consumed_at_send: None,
            },
            Rank {
                ar: PairwiseAllReduce::new(1, b.clone(), format).unwrap(),
                consumed: 0,
                consumed_at_send: None,
            },
        ];
        let net = sim::run(&mut nodes, seed).unwrap();
        assert!(net.pipes.values().all(Vec::is_empty));
        if a.is_empty() {
            assert!(net.log.is_empty(), "an empty tensor is not exchanged");
        } else {
            assert_eq!(
                net.log,
                vec![(0, 1, wire), (1, 0, wire)],
                "rank 0 sends first, one write each"
            );
            assert_eq!(nodes[0].consumed_at_send, Some(0));
            assert_eq!(
                nodes[1].consumed_at_send,
                Some(wire),
                "rank 1 sends only after receiving all"
            );
        }
        // The local partial is not rounded; only the peer's values went through the wire.
        let want0: Vec<f32> = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| x + widen(y, format))
            .collect();
        let want1: Vec<f32> = b
            .iter()
            .zip(&a)
            .map(|(&y, &x)| y + widen(x, format))
            .collect();
        let [r0, r1] = nodes;
        assert!(same_bits(&r0.ar.into_result().unwrap(), &want0));
        assert!(same_bits(&r1.ar.into_result().unwrap(), &want1));
    }

    fn values(n: std::ops::Range<usize>) -> impl Strategy<Value = Vec<f32>> {
        proptest::collection::vec(
            prop_oneof![
                4 => -1.0e4f32..1.0e4,
                1 => any::<u32>().prop_map(f32::from_bits),
            ],
            n,
        )
    }

    proptest! {
        #[test]
        fn f32_wire(n in 0usize..300, seed in any::<u64>(), data in values(600..601)) {
            let (a, b) = data.split_at(300);
            check_pair(a[..n].to_vec(), b[..n].to_vec(), WireFormat::F32, seed);
        }

        #[test]
        fn bf16_wire_small(n in 0usize..300, seed in any::<u64>(), data in values(600..601)) {
            let (a, b) = data.split_at(300);
            check_pair(a[..n].to_vec(), b[..n].to_vec(), WireFormat::Bf16, seed);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(6))]

        #[test]
        fn bf16_wire_at_the_reference_threshold(extra in 0u64..64, seed in any::<u64>(), salt in any::<u32>()) {
            let ne = BF16_WIRE_MIN_ELEMENTS + extra;
            let format = WireFormat::select(true, ne);
            prop_assert_eq!(format, WireFormat::Bf16);
            let mut rng = sim::Rng::new(u64::from(salt));
            let mut gen = || (rng.below(2_000_001) as f32 - 1.0e6) / 7.0;
            let a: Vec<f32> = (0..ne).map(|_| gen()).collect();
            let b: Vec<f32> = (0..ne).map(|_| gen()).collect();
            check_pair(a, b, format, seed);
        }
    }

    #[test]
    fn public_helpers_match_the_machine() {
        // The last value is an exact RNE tie (1 + 2^-8).
        let a = [
            1.0f32,
            -0.0,
            3.0e38,
            f32::INFINITY,
            f32::from_bits(0x3f80_8000),
        ];
        let mut local = [0.5f32; 5];
        let wire = encode_partial(&a, WireFormat::Bf16);
        assert_eq!(wire.len(), 10);
        assert_eq!(&wire[..4], &[0x80, 0x3f, 0x00, 0x80]);
        accumulate(&mut local, &wire, WireFormat::Bf16).unwrap();
        let want: Vec<f32> = a
            .iter()
            .map(|&x| 0.5 + widen(x, WireFormat::Bf16))
            .collect();
        assert!(same_bits(&local, &want));
        assert_eq!(
            accumulate(&mut local, &wire[..9], WireFormat::Bf16).unwrap_err(),
            CommError::WireLengthMismatch {
                expected: 10,
                got: 9
            }
        );
        assert_eq!(
            accumulate(&mut local, &wire, WireFormat::F32).unwrap_err(),
            CommError::WireLengthMismatch {
                expected: 20,
                got: 10
            }
        );
        let f = encode_partial(&a, WireFormat::F32);
        assert_eq!(&f[..4], &1.0f32.to_le_bytes());
    }

    #[test]
    fn format_selection() {
        assert_eq!(WireFormat::select(true, 0), WireFormat::F32);
        assert_eq!(WireFormat::select(true, 32_767), WireFormat::F32);
        assert_eq!(WireFormat::select(true, 32_768), WireFormat::Bf16);
        assert_eq!(WireFormat::select(false, 1 << 20), WireFormat::F32);
        assert_eq!(WireFormat::F32.wire_bytes(10), Some(40));
        assert_eq!(WireFormat::Bf16.wire_bytes(10), Some(20));
        assert_eq!(WireFormat::F32.wire_bytes(u64::MAX / 2), None);
    }

    #[test]
    fn rank1_holds_its_payload_until_it_received_everything() {
        let a = [1.5f32, -2.0, 3.25];
        let mut r1 = PairwiseAllReduce::new(1, vec![10.0, 20.0, 30.0], WireFormat::F32).unwrap();
        assert_eq!(r1.format(), WireFormat::F32);
        let wire: Vec<u8> = a.iter().flat_map(|v| v.to_le_bytes()).collect();
        for (i, byte) in wire.iter().enumerate() {
            assert_eq!(r1.poll_transmit(), None, "after {i} bytes");
            assert_eq!(r1.wanted(), wire.len() - i);
            assert_eq!(r1.handle_input(std::slice::from_ref(byte)).unwrap(), 1);
        }
        // Surplus (the next reduction's bytes) is not consumed.
        assert_eq!(r1.handle_input(&[1, 2, 3]).unwrap(), 0);
        assert!(!r1.is_done());
        let t = r1.poll_transmit().unwrap();
        // Rank 1 sends its own partial, not the sum.
        let own: Vec<u8> = [10.0f32, 20.0, 30.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(&t.data[..], &own[..]);
        assert!(r1.is_done());
        assert_eq!(r1.handle_close(), Ok(()));
        assert_eq!(r1.into_result().unwrap(), vec![11.5, 18.0, 33.25]);
    }

    #[test]
    fn rank0_sends_first_and_reads_after() {
        let mut r0 = PairwiseAllReduce::new(0, vec![1.0, 2.0], WireFormat::Bf16).unwrap();
        assert_eq!(r0.wanted(), 0);
        assert_eq!(r0.handle_input(&[0x80, 0x3f]).unwrap(), 0);
        let t = r0.poll_transmit().unwrap();
        assert_eq!(&t.data[..], &[0x80, 0x3f, 0x00, 0x40]);
        assert_eq!(r0.poll_transmit(), None);
        assert_eq!(r0.wanted(), 4);
        assert_eq!(r0.handle_input(&[0x80, 0x3f, 0x40, 0x40, 0xff]).unwrap(), 4);
        assert_eq!(r0.into_result().unwrap(), vec![2.0, 5.0]);
    }

    #[test]
    fn hostile_and_misuse() {
        assert_eq!(
            PairwiseAllReduce::new(2, vec![1.0], WireFormat::F32).unwrap_err(),
            CommError::InvalidRank { rank: 2, world: 2 }
        );
        // An empty tensor is a no-op.
        let mut e = PairwiseAllReduce::new(1, vec![], WireFormat::F32).unwrap();
        assert!(e.is_done());
        assert_eq!(e.poll_transmit(), None);
        assert_eq!(e.handle_input(&[1, 2]).unwrap(), 0);
        assert_eq!(e.into_result().unwrap(), Vec::<f32>::new());
        // Truncated stream.
        let mut r0 = PairwiseAllReduce::new(0, vec![1.0, 2.0], WireFormat::F32).unwrap();
        r0.poll_transmit().unwrap();
        r0.handle_input(&[0; 7]).unwrap();
        assert_eq!(r0.clone().into_result().unwrap_err(), CommError::NotDone);
        let want = CommError::ConnectionClosed { peer: Some(1) };
        assert_eq!(r0.handle_close().unwrap_err(), want);
        assert_eq!(r0.error(), Some(&want));
        assert_eq!(r0.handle_input(&[0]).unwrap_err(), want);
        assert_eq!(r0.poll_transmit(), None);
        assert_eq!(r0.wanted(), 0);
        // Rank 1 closed on before it could answer.
        let mut r1 = PairwiseAllReduce::new(1, vec![1.0], WireFormat::F32).unwrap();
        assert_eq!(
            r1.handle_close().unwrap_err(),
            CommError::ConnectionClosed { peer: Some(0) }
        );
    }

    proptest! {
        #[test]
        fn garbage_never_panics(
            rank in 0u32..3,
            n in 0usize..20,
            bf16 in any::<bool>(),
            inputs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..30), 0..6),
        ) {
            let format = if bf16 { WireFormat::Bf16 } else { WireFormat::F32 };
            let Ok(mut ar) = PairwiseAllReduce::new(rank, vec![0.5; n], format) else { return Ok(()) };
            for data in &inputs {
                let _ = ar.poll_transmit();
                if let Ok(k) = ar.handle_input(data) {
                    prop_assert!(k <= data.len());
                }
            }
            let _ = ar.handle_close();
            if let Ok(v) = ar.into_result() {
                prop_assert_eq!(v.len(), n);
            }
        }
    }
}
