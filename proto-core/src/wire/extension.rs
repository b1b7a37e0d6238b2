//! Our private, negotiated extensions (not part of any upstream protocol version).
//!
//! # Negotiation
//!
//! Our server sets [`HELLO_FLAG_EXTENSIONS`] (bit 7 of the HELLO response's byte 3). A
//! 7.0.0 / 8.0.x llama.cpp client ignores byte 3 (padding), a flags-change client only looks at
//! bit 0; neither ever sends an id of the private range `0xF0..=0xF3`. A client that sees the
//! bit may send EXTENSIONS (`0xF0`, request `u64 wanted`, response `u64 granted`): the server
//! answers the subset of `wanted` it offers, and from then on accepts the commands of the
//! granted extensions on that one connection. Without a grant, an extension id closes the
//! connection (`extension_not_negotiated`), as an unknown id does.
//!
//! # REMOTE_COPY (bit [`EXTENSION_REMOTE_COPY`])
//!
//! Copy `size` bytes from a tensor on server A to a tensor on server B without passing them
//! through the client (the idea of the unmerged upstream PR #8032, PROTOCOL.md §14, with
//! ids and an authorization model of its own). Buffers are private to the connection that
//! allocated them, so B must be told that A may write into the client's buffer:
//!
//! A region is `n_copies` rows of `size` bytes, `stride` bytes apart, from `offset` inside a
//! tensor (SET_TENSOR_2D's shape); `n_copies = 1` is a contiguous region (SET_TENSOR's rules,
//! the stride is then ignored). Rows (`n_copies > 1`) need a protocol-8 destination.
//!
//! 1. client → B, `REMOTE_COPY_EXPECT` (`0xF1`): `rpc_tensor dst | u64 offset | u64 size |
//!    u64 n_copies | u64 stride` (328 bytes, GET_TENSOR_2D's layout). B checks the region as
//!    for SET_TENSOR / SET_TENSOR_2D and answers `u8 status | u64 ticket` (9 bytes): an
//!    unguessable one-shot ticket for exactly that region of that connection's buffer (a
//!    connection holds at most one; it is dropped with the connection or its buffer).
//! 2. client → A, `REMOTE_COPY_TENSOR` (`0xF3`): `rpc_tensor src | u64 src_offset | u64 size |
//!    u64 n_copies | u64 src_stride | rpc_tensor dst | u64 dst_offset | u64 dst_stride |
//!    u64 ticket | endpoint[64]` (712 bytes; the endpoint is B's `host:port`, NUL padded). A
//!    checks the source region and B's endpoint against its `--peer` allow-list, then, off its
//!    event loop, connects to B as a client:
//!    HELLO, EXTENSIONS(remote copy), `REMOTE_COPY_ATTACH` (`0xF2`, `u64 ticket | u64 buffer |
//!    u64 start | u64 size | u64 n_copies | u64 stride` (48 bytes; `start` = `dst.data +
//!    dst_offset`) → `u8 status`: the ticket must name exactly that region), one SET_TENSOR
//!    (one row) or SET_TENSOR_2D (rows) of `dst` at `dst_offset` with the bytes streamed
//!    straight from A's backend memory, and DEVICE_COUNT as a barrier (its answer proves B
//!    applied the write), then closes. A answers the client `u8 status` ([`RemoteCopyStatus`]).
//!
//! An attached connection on B may do nothing but that one SET_TENSOR (exactly the granted
//! region) and DEVICE_COUNT; every other request closes it.

use bytes::BufMut;
use nom::bytes::complete::take;
use nom::number::complete::le_u64;
use nom::IResult;

use super::tensor::{RpcTensor, RPC_TENSOR_SIZE};

/// HELLO response byte 3, bit 7: the server accepts EXTENSIONS (`0xF0`). Ours only.
pub const HELLO_FLAG_EXTENSIONS: u8 = 0x80;

/// EXTENSIONS bit: REMOTE_COPY_EXPECT / _ATTACH / _TENSOR.
pub const EXTENSION_REMOTE_COPY: u64 = 1;

/// Every extension bit this implementation knows.
pub const KNOWN_EXTENSIONS: u64 = EXTENSION_REMOTE_COPY;

/// Bytes of the endpoint field of REMOTE_COPY_TENSOR.
pub const ENDPOINT_SIZE: usize = 64;

/// The answer of REMOTE_COPY_EXPECT, _ATTACH and _TENSOR (one byte on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RemoteCopyStatus {
    /// Done.
    Ok = 0,
    /// B's endpoint is not on A's `--peer` allow-list (or not a valid `host:port`).
    PeerNotAllowed = 1,
    /// A could not connect to B, or B did not answer in time.
    PeerUnreachable = 2,
    /// B does not speak the remote-copy extension (or a major A cannot talk to).
    PeerWithoutExtension = 3,
    /// The source region is not inside a tensor of the client's buffers on A.
    BadSource = 4,
    /// The destination region is not inside a tensor of the client's buffers on B
    /// (REMOTE_COPY_EXPECT; rows on a protocol-7 B), or it differs from the ticket's
    /// (REMOTE_COPY_TENSOR).
    BadDestination = 5,
    /// B refused the ticket (unknown, used, revoked, or the attaching connection holds
    /// buffers of its own).
    TicketRefused = 6,
    /// B closed the connection or stopped answering while the data streamed.
    PeerClosed = 7,
}

impl RemoteCopyStatus {
    /// The status of a wire byte (`None`: a byte no server of ours sends).
    pub fn from_byte(byte: u8) -> Option<RemoteCopyStatus> {
        use RemoteCopyStatus::*;
        Some(match byte {
            0 => Ok,
            1 => PeerNotAllowed,
            2 => PeerUnreachable,
            3 => PeerWithoutExtension,
            4 => BadSource,
            5 => BadDestination,
            6 => TicketRefused,
            7 => PeerClosed,
            _ => return None,
        })
    }

    /// The wire byte.
    pub fn byte(self) -> u8 {
        self as u8
    }
}

/// The REMOTE_COPY_TENSOR payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteCopyRequest {
    /// Source tensor, in A's (this connection's) address space.
    pub src: RpcTensor,
    /// Byte offset of the region inside `src`.
    pub src_offset: u64,
    /// Bytes per row (all of them when `n_copies` is 1).
    pub size: u64,
    /// Rows (1: a contiguous region).
    pub n_copies: u64,
    /// Distance between rows inside `src`.
    pub src_stride: u64,
    /// Destination tensor, in the address space of the client's connection to B.
    pub dst: RpcTensor,
    /// Byte offset of the region inside `dst`.
    pub dst_offset: u64,
    /// Distance between rows inside `dst`.
    pub dst_stride: u64,
    /// B's ticket for the destination region (REMOTE_COPY_EXPECT).
    pub ticket: u64,
    /// B's `host:port`, NUL padded.
    pub endpoint: [u8; ENDPOINT_SIZE],
}

impl RemoteCopyRequest {
    /// Encoded size.
    pub const SIZE: usize = 2 * RPC_TENSOR_SIZE + 7 * 8 + ENDPOINT_SIZE;

    /// Bytes copied (`size · n_copies`), `None` on overflow.
    pub fn total(&self) -> Option<u64> {
        self.size.checked_mul(self.n_copies)
    }

    /// The endpoint up to the first NUL, `None` when it is not UTF-8.
    pub fn endpoint_str(&self) -> Option<&str> {
        let text = self.endpoint.split(|&b| b == 0).next().unwrap_or_default();
        std::str::from_utf8(text).ok()
    }

    /// `host:port` as the endpoint field; `None` when it does not fit (64 bytes with a NUL).
    pub fn endpoint_field(endpoint: &str) -> Option<[u8; ENDPOINT_SIZE]> {
        let bytes = endpoint.as_bytes();
        if bytes.len() >= ENDPOINT_SIZE || bytes.contains(&0) {
            return None;
        }
        let mut field = [0u8; ENDPOINT_SIZE];
        field.get_mut(..bytes.len())?.copy_from_slice(bytes);
        Some(field)
    }

    /// Parses the payload.
    pub fn parse(input: &[u8]) -> IResult<&[u8], RemoteCopyRequest> {
        let (input, src) = RpcTensor::parse(input)?;
        let (input, src_offset) = le_u64(input)?;
        let (input, size) = le_u64(input)?;
        let (input, n_copies) = le_u64(input)?;
        let (input, src_stride) = le_u64(input)?;
        let (input, dst) = RpcTensor::parse(input)?;
        let (input, dst_offset) = le_u64(input)?;
        let (input, dst_stride) = le_u64(input)?;
        let (input, ticket) = le_u64(input)?;
        let (input, field) = take(ENDPOINT_SIZE)(input)?;
        let mut endpoint = [0u8; ENDPOINT_SIZE];
        endpoint.copy_from_slice(field);
        Ok((
            input,
            RemoteCopyRequest {
                src,
                src_offset,
                size,
                n_copies,
                src_stride,
                dst,
                dst_offset,
                dst_stride,
                ticket,
                endpoint,
            },
        ))
    }

    /// Appends the payload.
    pub fn encode(&self, out: &mut impl BufMut) {
        self.src.encode(out);
        out.put_u64_le(self.src_offset);
        out.put_u64_le(self.size);
        out.put_u64_le(self.n_copies);
        out.put_u64_le(self.src_stride);
        self.dst.encode(out);
        out.put_u64_le(self.dst_offset);
        out.put_u64_le(self.dst_stride);
        out.put_u64_le(self.ticket);
        out.put_slice(&self.endpoint);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_bytes_round_trip() {
        for byte in 0..=255u8 {
            if let Some(status) = RemoteCopyStatus::from_byte(byte) {
                assert_eq!(status.byte(), byte);
            } else {
                assert!(byte > 7);
            }
        }
    }

    #[test]
    fn endpoint_field_bounds() {
        let field = RemoteCopyRequest::endpoint_field("10.0.0.2:50052").unwrap();
        assert_eq!(&field[..14], b"10.0.0.2:50052");
        assert!(field[14..].iter().all(|&b| b == 0));
        assert!(RemoteCopyRequest::endpoint_field(&"x".repeat(64)).is_none());
        assert!(RemoteCopyRequest::endpoint_field("a\0b").is_none());
        assert_eq!(RemoteCopyRequest::SIZE, 712);
    }
}
