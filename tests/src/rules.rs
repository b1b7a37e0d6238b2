//! The validation rules the invalid vectors exercise, each with the error kind a violation
//! must produce. `vectors/README.md` lists the same table; the coverage test checks both.

use proto_core::ErrorKind;

use crate::vector::Level;

/// One validation rule.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// The name used in a vector's `rule` field.
    pub slug: &'static str,
    /// Frame rules fail on one frame alone; session rules need server state.
    pub level: Level,
    /// The error kind a violation produces.
    pub kind: ErrorKind,
    /// Where PROTOCOL.md states it.
    pub spec: &'static str,
    /// The rule in words.
    pub summary: &'static str,
}

const fn rule(
    slug: &'static str,
    level: Level,
    kind: ErrorKind,
    spec: &'static str,
    summary: &'static str,
) -> Rule {
    Rule {
        slug,
        level,
        kind,
        spec,
        summary,
    }
}

use ErrorKind as K;
use Level::{Frame as F, Session as S};

/// Every rule, frame rules first.
#[rustfmt::skip]
pub const RULES: &[Rule] = &[
    rule("unknown_command_id", F, K::UnknownCommand, "§2.5 step 7",
        "a command id the version does not define (NONE and above) closes the connection"),
    rule("fixed_request_size", F, K::RequestSizeMismatch, "§2.4, §2.5 step 8",
        "a fixed-size request must declare exactly its size"),
    rule("variable_request_minimum", F, K::RequestTooShort, "§2.4, §5.10, §5.17, §5.19",
        "SET_TENSOR, GRAPH_COMPUTE and SET_TENSOR_2D must be at least their fixed part"),
    rule("graph_counts_fit_payload", F, K::MalformedPayload, "§5.17 step 2",
        "n_nodes and n_tensors must fit in the GRAPH_COMPUTE payload"),
    rule("set_tensor_2d_data_length", F, K::MalformedPayload, "§5.19",
        "SET_TENSOR_2D data must be exactly size·n_copies bytes"),
    rule("tensor_2d_nonzero", F, K::MalformedPayload, "§5.19, §5.20",
        "size and n_copies of the 2D commands must be non-zero"),
    rule("tensor_2d_length_fits", F, K::MalformedPayload, "§5.20",
        "size·n_copies of GET_TENSOR_2D must not overflow 64 bits"),
    rule("response_size", F, K::ResponseSizeMismatch, "§2.3, §1.5",
        "a response must be exactly as long as its request implies"),
    rule("hello_version", F, K::VersionMismatch, "§1.5",
        "a client accepts only the same major and a minor not above its own"),
    rule("unsolicited_response", F, K::UnexpectedResponse, "§2.3",
        "a client receives bytes only in answer to a request that has a response"),
    rule("hello_first", S, K::HelloExpected, "§2.5 step 2",
        "the first command must be HELLO"),
    rule("extension_negotiated", S, K::ExtensionNotNegotiated, "§2.5 step 7 (ours: ids 0xF1-0xF3)",
        "our private remote-copy ids close a connection that did not negotiate them with EXTENSIONS"),
    rule("hello_once", S, K::DuplicateHello, "§2.5 step 7, §5.1",
        "a second HELLO closes the connection"),
    rule("device_index", S, K::InvalidDevice, "§4.2",
        "every device index must be below the device count"),
    rule("buffer_handle", S, K::UnknownBuffer, "§5.7-§5.9, §3.3 step 4, G1, G18",
        "a non-zero buffer handle must be one this connection allocated and did not free"),
    rule("tensor_needs_buffer", S, K::MissingBuffer, "§3.3, §5.10 step 2, §5.17 step 5, G8",
        "data commands need a tensor in a buffer; a graph tensor with data needs its buffer"),
    rule("tensor_inside_buffer", S, K::OutOfBounds, "§3.3 step 5, G2",
        "a tensor with elements must lie inside its buffer"),
    rule("region_inside_buffer", S, K::OutOfBounds, "§5.10 step 3, §5.12, §5.15, §5.19",
        "a data region must lie inside the buffer (SET/GET_TENSOR: start strictly inside)"),
    rule("region_inside_tensor", S, K::OutOfBounds, "G4, §5.15, §5.19, §5.20",
        "a data region must lie inside the tensor's nbytes"),
    rule("type_id", S, K::InvalidType, "§3.3 step 1, §12.1",
        "a type id must be below the version's type count (43; 44 in 8.0.1) and not removed"),
    rule("block_multiple", S, K::BlockMisaligned, "G3, §12.1",
        "ne[0] must be a multiple of the type's block size"),
    rule("element_count", S, K::SizeOverflow, "§3.3 step 2, G3",
        "the element count must fit in i64"),
    rule("address_arithmetic", S, K::SizeOverflow, "G5, §5.19",
        "address and span arithmetic must not wrap"),
    rule("buffered_request_limit", S, K::MessageTooLarge, "G10",
        "a buffered request larger than the server's limit is refused before it is read"),
    rule("streamed_length", S, K::OutOfBounds, "G10, §5.10",
        "a streamed write longer than its destination is refused before its data is read"),
    rule("stored_graph", S, K::GraphNotFound, "§5.18, §5.8, G20",
        "GRAPH_RECOMPUTE needs a stored, valid graph"),
    rule("graph_structure", S, K::InvalidGraph, "§5.17, G8",
        "graph ids, links, node list, order, views and storage must be consistent"),
    rule("graph_op", S, K::OpRefused, "G6, G7, §12.2-§12.4",
        "graph ops must be in the version's ggml table, not custom, with valid unary/GLU sub-ops"),
    rule("copy_destination", S, K::OutOfBounds, "§5.16, G19",
        "COPY_TENSOR must write inside the destination buffer and tensor"),
    rule("memory_quota", S, K::QuotaExceeded, "G10 (hardening, configurable)",
        "a connection may not hold more buffer bytes than its quota"),
    rule("communicator_required", S, K::Comm, "§5.22",
        "COMM_ALLREDUCE needs a communicator on its device"),
    rule("complete_frames", S, K::UnexpectedEof, "§2.5 step 7",
        "the stream must not end inside a frame"),
];

/// The rule with this slug.
pub fn rule_by_slug(slug: &str) -> Option<&'static Rule> {
    RULES.iter().find(|rule| rule.slug == slug)
}
