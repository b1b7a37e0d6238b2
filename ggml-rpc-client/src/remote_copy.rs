//! Copying a region between two servers: straight from server to server with our
//! remote-copy extension ([`proto_core::wire::extension`]) when both servers offer it, else
//! relayed through this client (GET_TENSOR, then SET_TENSOR), with the same result.

use proto_core::wire::{
    Dialect, RemoteCopyRequest, RemoteCopyStatus, Request, Response, RpcTensor, Tensor2dHeader,
    EXTENSION_REMOTE_COPY, HELLO_FLAG_EXTENSIONS,
};

use crate::{Client, ClientError};

/// Largest piece of a relayed copy held in memory at once.
const RELAY_PIECE: u64 = 64 << 20;

/// How [`copy_between_servers`] copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyMode {
    /// Direct when both servers offer the extension; relayed otherwise, and also when the
    /// source server refuses the direct copy for a reason a relay does not share (the
    /// destination is not on its `--peer` list, unreachable from it, closed mid-stream...).
    /// A bad source or destination region is returned as [`ClientError::RemoteCopy`].
    Auto,
    /// Direct only: a refusal is [`ClientError::RemoteCopy`], a server without the extension
    /// [`ClientError::RemoteCopyUnavailable`].
    Direct,
    /// Always through this client.
    Relay,
}

/// How a copy went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyPath {
    /// Server to server.
    Direct,
    /// Through this client; `refused`: the direct copy's refusal that led here, if any.
    Relayed {
        /// Why the direct copy was not used.
        refused: Option<RemoteCopyStatus>,
    },
}

impl Client {
    /// Whether the server offers our extensions (HELLO flags bit 7).
    pub fn offers_extensions(&self) -> bool {
        self.server_flags() & HELLO_FLAG_EXTENSIONS != 0
    }

    /// Asks for the remote-copy extension on this connection (EXTENSIONS; sent once, and only
    /// to a server that offers extensions): whether it is granted.
    pub async fn enable_remote_copy(&mut self) -> Result<bool, ClientError> {
        if self.extensions & EXTENSION_REMOTE_COPY != 0 {
            return Ok(true);
        }
        if !self.offers_extensions() {
            return Ok(false);
        }
        match self
            .call(Request::Extensions {
                wanted: EXTENSION_REMOTE_COPY,
            })
            .await?
        {
            Response::Extensions(granted) => {
                self.extensions |= granted;
                Ok(granted & EXTENSION_REMOTE_COPY != 0)
            }
            _ => Err(proto_core::Error::UnexpectedResponse.into()),
        }
    }

    /// REMOTE_COPY_EXPECT (on the destination server): a one-shot ticket for writing `size`
    /// bytes at `offset` of `tensor`. Call [`enable_remote_copy`](Self::enable_remote_copy)
    /// first.
    pub async fn remote_copy_expect(
        &mut self,
        tensor: &RpcTensor,
        offset: u64,
        size: u64,
    ) -> Result<u64, ClientError> {
        self.remote_copy_expect_rows(&Tensor2dHeader {
            tensor: tensor.clone(),
            offset,
            size,
            n_copies: 1,
            stride: 0,
        })
        .await
    }

    /// REMOTE_COPY_EXPECT for `rows.n_copies` rows of `rows.size` bytes, `rows.stride`
    /// apart (rows need a protocol-8 destination).
    pub async fn remote_copy_expect_rows(
        &mut self,
        rows: &Tensor2dHeader,
    ) -> Result<u64, ClientError> {
        let request = Request::RemoteCopyExpect(Box::new(rows.clone()));
        match self.call(request).await? {
            Response::RemoteCopyExpect { status: 0, ticket } => Ok(ticket),
            Response::RemoteCopyExpect { status, .. } => Err(refusal(status)),
            _ => Err(proto_core::Error::UnexpectedResponse.into()),
        }
    }

    /// REMOTE_COPY_TENSOR (on the source server): push the region to the destination server
    /// named in the request. `Ok` once the destination confirmed the write.
    pub async fn remote_copy_tensor(
        &mut self,
        request: RemoteCopyRequest,
    ) -> Result<(), ClientError> {
        match self
            .call(Request::RemoteCopyTensor(Box::new(request)))
            .await?
        {
            Response::RemoteCopyTensor(0) => Ok(()),
            Response::RemoteCopyTensor(status) => Err(refusal(status)),
            _ => Err(proto_core::Error::UnexpectedResponse.into()),
        }
    }
}

fn refusal(byte: u8) -> ClientError {
    match RemoteCopyStatus::from_byte(byte) {
        Some(status) => ClientError::RemoteCopy(status),
        None => proto_core::Error::UnexpectedResponse.into(),
    }
}

/// Copies `size` bytes at `src_offset` of `src_tensor` on `src`'s server to `dst_offset` of
/// `dst_tensor` on `dst`'s server. `dst_endpoint` is the destination server's `host:port` as
/// the source server must reach it (and as its `--peer` list names it).
///
/// The direct path: EXTENSIONS on both connections (once), REMOTE_COPY_EXPECT on `dst`,
/// REMOTE_COPY_TENSOR on `src`. The relayed path: GET_TENSOR then SET_TENSOR, in pieces of
/// at most 64 MiB. Both end with the data in place on the destination server.
#[allow(clippy::too_many_arguments)]
pub async fn copy_between_servers(
    src: &mut Client,
    src_tensor: &RpcTensor,
    src_offset: u64,
    dst: &mut Client,
    dst_tensor: &RpcTensor,
    dst_offset: u64,
    size: u64,
    dst_endpoint: &str,
    mode: CopyMode,
) -> Result<CopyPath, ClientError> {
    let rows = |tensor: &RpcTensor, offset| Tensor2dHeader {
        tensor: tensor.clone(),
        offset,
        size,
        n_copies: 1,
        stride: 0,
    };
    copy_rows_between_servers(
        src,
        &rows(src_tensor, src_offset),
        dst,
        &rows(dst_tensor, dst_offset),
        dst_endpoint,
        mode,
    )
    .await
}

/// Copies rows: `src_rows.n_copies` rows of `src_rows.size` bytes, `src_rows.stride` apart
/// inside `src_rows.tensor` on `src`'s server, to the rows `dst_rows` describes on `dst`'s
/// server (same `size` and `n_copies`, a stride of its own). One row is a contiguous copy
/// ([`copy_between_servers`]). Direct, rows go to B as one SET_TENSOR_2D (B must speak
/// protocol 8); relayed, as GET_TENSOR_2D / SET_TENSOR_2D in batches of at most 64 MiB on
/// protocol 8, row by row on 7.
pub async fn copy_rows_between_servers(
    src: &mut Client,
    src_rows: &Tensor2dHeader,
    dst: &mut Client,
    dst_rows: &Tensor2dHeader,
    dst_endpoint: &str,
    mode: CopyMode,
) -> Result<CopyPath, ClientError> {
    if src_rows.size != dst_rows.size || src_rows.n_copies != dst_rows.n_copies {
        return Err(proto_core::Error::InvalidState(
            "source and destination rows differ in size or count",
        )
        .into());
    }
    let mut refused = None;
    if mode != CopyMode::Relay {
        let both = src.offers_extensions() && dst.offers_extensions();
        let direct = if both {
            src.enable_remote_copy().await? && dst.enable_remote_copy().await?
        } else {
            false
        };
        if direct {
            let attempt = async {
                let endpoint = RemoteCopyRequest::endpoint_field(dst_endpoint)
                    .ok_or(ClientError::RemoteCopy(RemoteCopyStatus::PeerNotAllowed))?;
                let ticket = dst.remote_copy_expect_rows(dst_rows).await?;
                src.remote_copy_tensor(RemoteCopyRequest {
                    src: src_rows.tensor.clone(),
                    src_offset: src_rows.offset,
                    size: src_rows.size,
                    n_copies: src_rows.n_copies,
                    src_stride: src_rows.stride,
                    dst: dst_rows.tensor.clone(),
                    dst_offset: dst_rows.offset,
                    dst_stride: dst_rows.stride,
                    ticket,
                    endpoint,
                })
                .await
            };
            match attempt.await {
                Ok(()) => return Ok(CopyPath::Direct),
                // A bad region would fail relayed too (and close a connection there).
                Err(ClientError::RemoteCopy(status))
                    if mode == CopyMode::Auto
                        && !matches!(
                            status,
                            RemoteCopyStatus::BadSource | RemoteCopyStatus::BadDestination
                        ) =>
                {
                    tracing::debug!(?status, "remote copy refused: relaying");
                    refused = Some(status);
                }
                Err(error) => return Err(error),
            }
        } else if mode == CopyMode::Direct {
            return Err(ClientError::RemoteCopyUnavailable);
        }
    }
    relay(src, src_rows, dst, dst_rows).await?;
    Ok(CopyPath::Relayed { refused })
}

/// The copy through this client, at most [`RELAY_PIECE`] bytes held at once (or one row).
async fn relay(
    src: &mut Client,
    src_rows: &Tensor2dHeader,
    dst: &mut Client,
    dst_rows: &Tensor2dHeader,
) -> Result<(), ClientError> {
    let overflow = || ClientError::from(proto_core::Error::SizeOverflow("copy region"));
    let (size, rows) = (src_rows.size, src_rows.n_copies);
    let span = |r: &Tensor2dHeader| {
        rows.checked_sub(1)
            .and_then(|n| n.checked_mul(r.stride))
            .and_then(|n| n.checked_add(size))
            .and_then(|n| n.checked_add(r.offset))
    };
    span(src_rows).ok_or_else(overflow)?;
    span(dst_rows).ok_or_else(overflow)?;
    let both_v8 = src.dialect() == Dialect::V8 && dst.dialect() == Dialect::V8;
    if rows > 1 && both_v8 && size > 0 {
        let batch = (RELAY_PIECE / size).max(1);
        let mut row = 0;
        while row < rows {
            let n = (rows - row).min(batch);
            let data = src
                .get_tensor_2d(
                    &src_rows.tensor,
                    src_rows.offset + row * src_rows.stride,
                    size,
                    n,
                    src_rows.stride,
                )
                .await?;
            dst.set_tensor_2d(
                &dst_rows.tensor,
                dst_rows.offset + row * dst_rows.stride,
                size,
                n,
                dst_rows.stride,
                data,
            )
            .await?;
            row += n;
        }
        return Ok(());
    }
    for row in 0..rows {
        let (from, to) = (
            src_rows.offset + row * src_rows.stride,
            dst_rows.offset + row * dst_rows.stride,
        );
        let mut done = 0;
        while done < size {
            let piece = (size - done).min(RELAY_PIECE);
            let data = src.get_tensor(&src_rows.tensor, from + done, piece).await?;
            dst.set_tensor(&dst_rows.tensor, to + done, data).await?;
            done += piece;
        }
    }
    Ok(())
}
