//! Copying a region between two servers: straight from server to server with our
//! remote-copy extension ([`proto_core::wire::extension`]) when both servers offer it, else
//! relayed through this client (GET_TENSOR, then SET_TENSOR), with the same result.

use proto_core::wire::{
    RemoteCopyRequest, RemoteCopyStatus, Request, Response, RpcTensor, EXTENSION_REMOTE_COPY,
    HELLO_FLAG_EXTENSIONS,
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
        let request = Request::RemoteCopyExpect {
            tensor: Box::new(tensor.clone()),
            offset,
            size,
        };
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
                let ticket = dst.remote_copy_expect(dst_tensor, dst_offset, size).await?;
                src.remote_copy_tensor(RemoteCopyRequest {
                    src: src_tensor.clone(),
                    src_offset,
                    size,
                    dst: dst_tensor.clone(),
                    dst_offset,
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
    let overflow = || ClientError::from(proto_core::Error::SizeOverflow("copy region"));
    src_offset.checked_add(size).ok_or_else(overflow)?;
    dst_offset.checked_add(size).ok_or_else(overflow)?;
    let mut done = 0;
    while done < size {
        let piece = (size - done).min(RELAY_PIECE);
        let data = src.get_tensor(src_tensor, src_offset + done, piece).await?;
        dst.set_tensor(dst_tensor, dst_offset + done, data).await?;
        done += piece;
    }
    Ok(CopyPath::Relayed { refused })
}
