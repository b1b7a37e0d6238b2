//! The 296-byte `rpc_tensor` record and the tensor arithmetic every bounds check needs.

use bytes::BufMut;
use nom::bytes::complete::take;
use nom::number::complete::{le_i32, le_u32, le_u64};
use nom::IResult;

use crate::error::{Error, Result};
use crate::ggml::{type_info, GgmlTable};

/// Number of dimensions (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Number of source links (`GGML_MAX_SRC`).
pub const MAX_SRC: usize = 10;
/// Number of i32 op parameter slots (`GGML_MAX_OP_PARAMS` / 4).
pub const OP_PARAMS: usize = 16;
/// Bytes of the name field (`GGML_MAX_NAME`).
pub const NAME_LEN: usize = 64;
/// Size of one encoded record.
pub const RPC_TENSOR_SIZE: usize = 296;

/// One `rpc_tensor` record exactly as it travels on the wire.
///
/// `id`, `src` and `view_src` are opaque identities chosen by the client; `buffer` is a server
/// buffer handle and `data` an address inside that buffer's address range.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RpcTensor {
    /// Non-zero identity (0 = "no tensor").
    pub id: u64,
    /// ggml type id.
    pub type_id: u32,
    /// Server buffer handle, 0 = not in a buffer of this server.
    pub buffer: u64,
    /// Elements per dimension (32 bits on the wire).
    pub ne: [u32; MAX_DIMS],
    /// Byte strides per dimension (32 bits on the wire).
    pub nb: [u32; MAX_DIMS],
    /// ggml op id.
    pub op: u32,
    /// Raw op parameters.
    pub op_params: [i32; OP_PARAMS],
    /// Tensor flag bits (see [`crate::ggml::flags`]).
    pub flags: i32,
    /// Source tensor ids (0 = none).
    pub src: [u64; MAX_SRC],
    /// Id of the tensor this one views (0 = not a view).
    pub view_src: u64,
    /// Byte offset of the view inside `view_src`.
    pub view_offs: u64,
    /// Address of the first byte inside `buffer`'s range, or 0.
    pub data: u64,
    /// Name bytes, NUL padded (need not be NUL terminated).
    pub name: [u8; NAME_LEN],
    /// Graph use count (only meaningful inside GRAPH_COMPUTE).
    pub use_count: i32,
}

impl Default for RpcTensor {
    fn default() -> Self {
        RpcTensor {
            id: 0,
            type_id: 0,
            buffer: 0,
            ne: [0; MAX_DIMS],
            nb: [0; MAX_DIMS],
            op: 0,
            op_params: [0; OP_PARAMS],
            flags: 0,
            src: [0; MAX_SRC],
            view_src: 0,
            view_offs: 0,
            data: 0,
            name: [0; NAME_LEN],
            use_count: 0,
        }
    }
}

fn array<'a, const N: usize, T: Copy + Default>(
    mut input: &'a [u8],
    item: impl Fn(&'a [u8]) -> IResult<&'a [u8], T>,
) -> IResult<&'a [u8], [T; N]> {
    let mut out = [T::default(); N];
    for slot in out.iter_mut() {
        let (rest, value) = item(input)?;
        *slot = value;
        input = rest;
    }
    Ok((input, out))
}

impl RpcTensor {
    /// A contiguous tensor of `type_id` with shape `ne`, strides computed as ggml does.
    /// Returns `None` for an invalid type.
    pub fn contiguous(id: u64, type_id: u32, ne: [u32; MAX_DIMS]) -> Option<RpcTensor> {
        let info = type_info(type_id)?;
        let mut nb = [0u32; MAX_DIMS];
        nb[0] = info.type_size;
        nb[1] = (u64::from(info.type_size) * u64::from(ne[0]) / u64::from(info.block_size))
            .try_into()
            .ok()?;
        nb[2] = nb[1].checked_mul(ne[1])?;
        nb[3] = nb[2].checked_mul(ne[2])?;
        Some(RpcTensor {
            id,
            type_id,
            ne,
            nb,
            ..RpcTensor::default()
        })
    }

    /// Parses one record (nom). Never fails on content, only on length.
    pub fn parse(input: &[u8]) -> IResult<&[u8], RpcTensor> {
        let (input, id) = le_u64(input)?;
        let (input, type_id) = le_u32(input)?;
        let (input, buffer) = le_u64(input)?;
        let (input, ne) = array::<MAX_DIMS, _>(input, le_u32)?;
        let (input, nb) = array::<MAX_DIMS, _>(input, le_u32)?;
        let (input, op) = le_u32(input)?;
        let (input, op_params) = array::<OP_PARAMS, _>(input, le_i32)?;
        let (input, flags) = le_i32(input)?;
        let (input, src) = array::<MAX_SRC, _>(input, le_u64)?;
        let (input, view_src) = le_u64(input)?;
        let (input, view_offs) = le_u64(input)?;
        let (input, data) = le_u64(input)?;
        let (input, name_bytes) = take(NAME_LEN)(input)?;
        let (input, use_count) = le_i32(input)?;
        let mut name = [0u8; NAME_LEN];
        name.copy_from_slice(name_bytes);
        Ok((
            input,
            RpcTensor {
                id,
                type_id,
                buffer,
                ne,
                nb,
                op,
                op_params,
                flags,
                src,
                view_src,
                view_offs,
                data,
                name,
                use_count,
            },
        ))
    }

    /// Appends the 296-byte encoding.
    pub fn encode(&self, out: &mut impl BufMut) {
        out.put_u64_le(self.id);
        out.put_u32_le(self.type_id);
        out.put_u64_le(self.buffer);
        self.ne.iter().for_each(|&v| out.put_u32_le(v));
        self.nb.iter().for_each(|&v| out.put_u32_le(v));
        out.put_u32_le(self.op);
        self.op_params.iter().for_each(|&v| out.put_i32_le(v));
        out.put_i32_le(self.flags);
        self.src.iter().for_each(|&v| out.put_u64_le(v));
        out.put_u64_le(self.view_src);
        out.put_u64_le(self.view_offs);
        out.put_u64_le(self.data);
        out.put_slice(&self.name);
        out.put_i32_le(self.use_count);
    }

    /// The name up to the first NUL (lossy UTF-8).
    pub fn name_str(&self) -> String {
        let name = self.name.split(|&b| b == 0).next().unwrap_or_default();
        String::from_utf8_lossy(name).into_owned()
    }

    /// Sets the name, truncated to 63 bytes and NUL padded as the reference client does.
    pub fn set_name(&mut self, name: &str) {
        self.name = [0; NAME_LEN];
        for (slot, &byte) in self.name.iter_mut().take(NAME_LEN - 1).zip(name.as_bytes()) {
            *slot = byte;
        }
    }

    /// Number of elements (checked: ggml requires it to fit in i64).
    pub fn element_count(&self) -> Result<u64> {
        let count = self
            .ne
            .iter()
            .try_fold(1u64, |acc, &n| acc.checked_mul(u64::from(n)))
            .filter(|&n| i64::try_from(n).is_ok())
            .ok_or(Error::SizeOverflow("element count"))?;
        Ok(count)
    }

    /// Validates what ggml's tensor constructor needs: a type of `table`, `ne[0]` a multiple of
    /// the block size, and an element count that fits ggml's i64.
    pub fn validate_shape(&self, table: GgmlTable) -> Result<()> {
        let info = table.type_info(self.type_id).ok_or(Error::InvalidType {
            type_id: self.type_id,
        })?;
        if !self.ne[0].is_multiple_of(info.block_size) {
            return Err(Error::BlockMisaligned {
                ne0: self.ne[0],
                block_size: info.block_size,
            });
        }
        self.element_count()?;
        Ok(())
    }

    /// The tensor's byte extent (ggml's `nbytes`), with every step overflow checked.
    /// Requires a valid type (see [`RpcTensor::validate_shape`]).
    pub fn byte_size(&self) -> Result<u64> {
        let info = type_info(self.type_id).ok_or(Error::InvalidType {
            type_id: self.type_id,
        })?;
        if self.ne.contains(&0) {
            return Ok(0);
        }
        let overflow = || Error::SizeOverflow("byte size");
        let block = u64::from(info.block_size);
        let (first, start_dim) = if block == 1 {
            (u64::from(info.type_size), 0)
        } else {
            let row = u64::from(self.ne[0])
                .checked_mul(u64::from(self.nb[0]))
                .ok_or_else(overflow)?
                / block;
            (row, 1)
        };
        // Every ne is non-zero here, so `ne - 1` cannot wrap.
        self.ne
            .iter()
            .zip(&self.nb)
            .skip(start_dim)
            .try_fold(first, |acc, (&ne, &nb)| {
                u64::from(ne - 1)
                    .checked_mul(u64::from(nb))
                    .and_then(|extent| acc.checked_add(extent))
                    .ok_or_else(overflow)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml::types::id;

    #[test]
    fn record_is_296_bytes_and_round_trips() {
        let mut tensor = RpcTensor::contiguous(0xdead_beef, id::F32, [3, 2, 1, 1]).unwrap();
        tensor.src[9] = 7;
        tensor.view_offs = 9;
        tensor.op_params[15] = -1;
        tensor.set_name("blk.0.attn_q.weight");
        tensor.use_count = 3;
        let mut bytes = Vec::new();
        tensor.encode(&mut bytes);
        assert_eq!(bytes.len(), RPC_TENSOR_SIZE);
        // field offsets from the layout table
        assert_eq!(&bytes[0..8], &0xdead_beefu64.to_le_bytes());
        assert_eq!(&bytes[196..204], &7u64.to_le_bytes());
        assert_eq!(&bytes[212..220], &9u64.to_le_bytes());
        assert_eq!(&bytes[228..247], b"blk.0.attn_q.weight");
        assert_eq!(&bytes[292..296], &3i32.to_le_bytes());
        let (rest, parsed) = RpcTensor::parse(&bytes).unwrap();
        assert!(rest.is_empty());
        assert_eq!(parsed, tensor);
        assert_eq!(parsed.name_str(), "blk.0.attn_q.weight");
        assert!(RpcTensor::parse(&bytes[..295]).is_err());
    }

    #[test]
    fn byte_size_follows_ggml() {
        let f32 = RpcTensor::contiguous(1, id::F32, [4, 3, 2, 1]).unwrap();
        assert_eq!(f32.byte_size().unwrap(), 4 * 3 * 2 * 4);
        let q4k = RpcTensor::contiguous(1, id::Q4_K, [512, 2, 1, 1]).unwrap();
        assert_eq!(q4k.byte_size().unwrap(), 2 * 2 * 144);
        let empty = RpcTensor::contiguous(1, id::F32, [0, 3, 1, 1]).unwrap();
        assert_eq!(empty.byte_size().unwrap(), 0);
        let mut huge = RpcTensor::contiguous(1, id::F32, [1, 1, 1, 1]).unwrap();
        huge.ne = [u32::MAX; 4];
        huge.nb = [u32::MAX; 4];
        assert_eq!(
            huge.validate_shape(GgmlTable::V8_0_1).unwrap_err().kind(),
            crate::ErrorKind::SizeOverflow
        );
        let mut misaligned = RpcTensor::contiguous(1, id::Q8_0, [32, 1, 1, 1]).unwrap();
        misaligned.ne[0] = 33;
        assert_eq!(
            misaligned.validate_shape(GgmlTable::V8_0_1).unwrap_err(),
            Error::BlockMisaligned {
                ne0: 33,
                block_size: 32
            }
        );
        let bad_type = RpcTensor { type_id: 4, ..f32 };
        assert_eq!(
            bad_type.validate_shape(GgmlTable::V8_0_1).unwrap_err(),
            Error::InvalidType { type_id: 4 }
        );
    }
}
