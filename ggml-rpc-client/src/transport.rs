//! Moving the client's bytes: the session's transmits out (vectored, in pieces), one response
//! in (small ones in one go, large ones header first and then straight into one buffer).

use bytes::{Bytes, BytesMut};
use proto_core::session::{ClientEvent, ClientSession};
use proto_core::wire::{Command, RESPONSE_HEADER_SIZE};
use shell_common::vectored::SendQueue;
use shell_common::LowWater;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::error::ClientError;

/// Responses up to this size are read in one go; larger ones are read header first, then the
/// payload into a buffer of exactly its size.
const SMALL_RESPONSE: u64 = 64 * 1024;

/// Writes what the session queued, one write per transmit: the header of a SET_TENSOR and its
/// data go out as two separate writes, the data straight from the caller's buffer.
pub(crate) async fn flush(
    stream: &mut TcpStream,
    session: &mut ClientSession,
) -> Result<(), ClientError> {
    while let Some(bytes) = session.poll_transmit() {
        // At most one SEND_PIECE per write call (see `SendQueue`).
        stream
            .write_all_buf(&mut SendQueue::from(vec![bytes]))
            .await?;
    }
    Ok(())
}

/// Reads the response to the one outstanding request (`expected` payload bytes).
pub(crate) async fn receive(
    stream: &mut TcpStream,
    session: &mut ClientSession,
    command: Command,
    expected: u64,
) -> Result<ClientEvent, ClientError> {
    receive_into(stream, session, command, expected, None).await
}

/// [`receive`], with the payload of a large response read into `buffer` when given.
pub(crate) async fn receive_into(
    stream: &mut TcpStream,
    session: &mut ClientSession,
    command: Command,
    expected: u64,
    buffer: Option<BytesMut>,
) -> Result<ClientEvent, ClientError> {
    if expected > SMALL_RESPONSE || buffer.is_some() {
        // Header first, so a wrong size is reported instead of waited for...
        let mut head = [0u8; RESPONSE_HEADER_SIZE];
        read_exact(stream, &mut head).await?;
        session.handle_input(Bytes::copy_from_slice(&head));
        if let Some(event) = session.poll_event()? {
            return Ok(event);
        }
        // ...then the payload into one buffer of exactly its size: the session hands it on
        // as it is (no copy).
        let len =
            usize::try_from(expected).map_err(|_| proto_core::Error::ResponseSizeMismatch {
                command,
                expected,
                got: expected,
            })?;
        let mut payload = match buffer {
            Some(mut buffer) => {
                buffer.clear();
                buffer.reserve(len);
                buffer
            }
            None => BytesMut::with_capacity(len),
        };
        // Woken once per sizeable piece, not per burst of segments (see `LowWater`).
        let mut low_water = LowWater::default();
        while payload.len() < len {
            let room = len - payload.len();
            low_water.expect(&*stream, room as u64)?;
            if stream
                .read_buf(&mut bytes::BufMut::limit(&mut payload, room))
                .await?
                == 0
            {
                return Err(ClientError::Closed);
            }
        }
        low_water.reset(&*stream)?;
        session.handle_input(payload.freeze());
    } else {
        let total = RESPONSE_HEADER_SIZE + expected as usize;
        let mut received = 0;
        while received < total {
            let room = total - received;
            let mut buf = BytesMut::with_capacity(room);
            if stream
                .read_buf(&mut bytes::BufMut::limit(&mut buf, room))
                .await?
                == 0
            {
                return Err(ClientError::Closed);
            }
            received += buf.len();
            session.handle_input(buf.freeze());
            if let Some(event) = session.poll_event()? {
                return Ok(event);
            }
        }
    }
    session.poll_event()?.ok_or(ClientError::Closed)
}

async fn read_exact(stream: &mut TcpStream, out: &mut [u8]) -> Result<(), ClientError> {
    match stream.read_exact(out).await {
        Ok(_) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => Err(ClientError::Closed),
        Err(error) => Err(error.into()),
    }
}
