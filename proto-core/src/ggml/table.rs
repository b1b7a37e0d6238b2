//! The op and type numbering a peer uses, chosen by its protocol version.
//!
//! The wire carries raw op and type ids whose meaning depends on the ggml the peer was built
//! from: protocol 8.0.1 inserted `TOP_K_MASK` at op 91 (so `UNARY` … `GLU` moved up by one) and
//! added type 43 (`f8_e4m3`), yet 8.0.0 and 8.0.1 peers accept each other in HELLO (PROTOCOL.md
//! §1.6, §12). Everything above the wire works with the newest numbering ([`Op`]); a
//! [`GgmlTable`] translates at the boundary, in the server's graph decoder and the client's
//! graph encoder.

use std::fmt;

use super::ops::{op_name, Op};
use super::types::{type_info, TypeInfo};
use crate::wire::ProtocolVersion;

/// One numbering of ggml's op and type tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlTable {
    /// Protocols 7.0.0 and 8.0.0 (llama.cpp b11434, b11739): 101 ops, 43 types.
    V8_0_0,
    /// Protocol 8.0.1 (llama.cpp b12032 and later): 102 ops with `TOP_K_MASK` at 91, 44 types.
    V8_0_1,
}

impl GgmlTable {
    /// The table of a protocol version: 8.0.1 and every later 8.x use the newest one.
    pub fn of(version: ProtocolVersion) -> GgmlTable {
        if version.major == 8 && (version.minor, version.patch) >= (0, 1) {
            GgmlTable::V8_0_1
        } else {
            GgmlTable::V8_0_0
        }
    }

    /// Number of op ids (`GGML_OP_COUNT`).
    pub fn op_count(self) -> u32 {
        match self {
            GgmlTable::V8_0_0 => 101,
            GgmlTable::V8_0_1 => 102,
        }
    }

    /// Number of type ids (`GGML_TYPE_COUNT`).
    pub fn type_count(self) -> u32 {
        match self {
            GgmlTable::V8_0_0 => 43,
            GgmlTable::V8_0_1 => 44,
        }
    }

    /// The op a wire id means, `None` past the table.
    pub fn op_from_wire(self, id: u32) -> Option<Op> {
        if id >= self.op_count() {
            return None;
        }
        Some(match self {
            GgmlTable::V8_0_0 if id >= Op::TOP_K_MASK.0 => Op(id + 1),
            _ => Op(id),
        })
    }

    /// The wire id of an op, `None` when the table has no such op (`TOP_K_MASK` before 8.0.1).
    pub fn op_to_wire(self, op: Op) -> Option<u32> {
        if !op.is_valid() {
            return None;
        }
        match self {
            GgmlTable::V8_0_0 if op == Op::TOP_K_MASK => None,
            GgmlTable::V8_0_0 if op.0 > Op::TOP_K_MASK.0 => Some(op.0 - 1),
            _ => Some(op.0),
        }
    }

    /// ggml's display name of a wire op id, `None` past the table.
    pub fn op_name(self, id: u32) -> Option<&'static str> {
        op_name(self.op_from_wire(id)?.0)
    }

    /// Looks a wire type id up; `None` for removed ids and ids past the table.
    pub fn type_info(self, type_id: u32) -> Option<&'static TypeInfo> {
        type_info(type_id).filter(|_| type_id < self.type_count())
    }

    /// The newer table a peer most likely uses when it sends `op`, an id past this table or a
    /// custom op here (8.0.1's `UNARY` … `MAP_CUSTOM3` are 8.0.0's custom ops).
    pub fn likely_peer_table(self, op: u32) -> Option<GgmlTable> {
        let newer = GgmlTable::V8_0_1;
        let custom_here = self.op_from_wire(op).is_some_and(Op::is_custom);
        let known_there = newer.op_from_wire(op).is_some_and(|o| !o.is_custom());
        (self == GgmlTable::V8_0_0 && known_there && (op >= self.op_count() || custom_here))
            .then_some(newer)
    }
}

impl fmt::Display for GgmlTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GgmlTable::V8_0_0 => "7.0.0/8.0.0",
            GgmlTable::V8_0_1 => "8.0.1",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_table_numbers_ops_from_unary_one_lower() {
        let old = GgmlTable::V8_0_0;
        assert_eq!(old.op_from_wire(90), Some(Op::DSV4_HC_POST));
        assert_eq!(old.op_from_wire(91), Some(Op::UNARY));
        assert_eq!(old.op_from_wire(100), Some(Op::GLU));
        assert_eq!(old.op_from_wire(101), None);
        assert_eq!(old.op_to_wire(Op::TOP_K_MASK), None);
        assert_eq!(old.op_to_wire(Op::GLU), Some(100));
        assert_eq!(old.op_name(91), Some("UNARY"));
        for id in 0..old.op_count() {
            let op = old.op_from_wire(id).unwrap();
            assert_eq!(old.op_to_wire(op), Some(id));
        }
    }

    #[test]
    fn new_table_is_the_canonical_numbering() {
        let new = GgmlTable::V8_0_1;
        for id in 0..new.op_count() {
            assert_eq!(new.op_from_wire(id), Some(Op(id)));
            assert_eq!(new.op_to_wire(Op(id)), Some(id));
        }
        assert_eq!(new.op_from_wire(102), None);
        assert_eq!(new.op_to_wire(Op(102)), None);
        assert_eq!(new.op_name(91), Some("TOP_K_MASK"));
    }

    #[test]
    fn type_43_exists_from_8_0_1_on() {
        assert!(GgmlTable::V8_0_0.type_info(43).is_none());
        assert_eq!(GgmlTable::V8_0_1.type_info(43).unwrap().name, "f8_e4m3");
        assert!(GgmlTable::V8_0_1.type_info(44).is_none());
        assert_eq!(GgmlTable::V8_0_0.type_info(1).unwrap().name, "f16");
    }

    #[test]
    fn versions_choose_their_table() {
        let v = |major, minor, patch| ProtocolVersion {
            major,
            minor,
            patch,
        };
        assert_eq!(GgmlTable::of(v(7, 0, 0)), GgmlTable::V8_0_0);
        assert_eq!(GgmlTable::of(v(8, 0, 0)), GgmlTable::V8_0_0);
        assert_eq!(GgmlTable::of(v(8, 0, 1)), GgmlTable::V8_0_1);
        assert_eq!(GgmlTable::of(v(8, 1, 0)), GgmlTable::V8_0_1);
    }

    #[test]
    fn a_newer_client_is_named_where_its_ops_collide() {
        let old = GgmlTable::V8_0_0;
        assert_eq!(old.likely_peer_table(101), Some(GgmlTable::V8_0_1)); // its GLU
        assert_eq!(old.likely_peer_table(92), Some(GgmlTable::V8_0_1)); // its UNARY
        assert_eq!(old.likely_peer_table(93), None); // custom in both
        assert_eq!(old.likely_peer_table(102), None);
        assert_eq!(GgmlTable::V8_0_1.likely_peer_table(102), None);
    }
}
