//! The shells' zero-copy tensor data path: what a non-blocking socket call made where the
//! dispatcher lends backend memory (`Dispatcher::receive_in_place` / `send_in_place`) comes to.
//!
//! A shell waits until its socket is ready, then calls [`receive_once`] / [`send_once`] with
//! one non-blocking `recv` / `send`, which runs on the lent region; the answer says whether
//! data moved, the peer closed, the dispatcher declined (take the buffered path) or the socket
//! had nothing after all (wait and retry).

use std::io;

use proto_core::backend::Backend;
use proto_core::driver::Connection;

use crate::shell::ConnectionError;

/// Most bytes one direct `send` offers the socket. A reply sent in pieces this large beat one
/// `send` of all that the socket buffer takes by 15-20 % on loopback (256 MiB GET_TENSOR, tokio
/// shell, five interleaved rounds: 4.3-5.1 against 3.6-4.3 GB/s; 128 KiB and 4 MiB pieces were
/// slower again): between pieces the socket is unlocked, so the peer's acknowledgements are
/// processed, and the next segments pushed, where they arrive instead of piling up in the
/// backlog that the sending thread works off under its own lock.
pub const SEND_PIECE: usize = 512 << 10;

/// The part of `src` that one direct `send` offers the socket ([`SEND_PIECE`] at most).
pub fn send_piece(src: &[u8]) -> &[u8] {
    &src[..src.len().min(SEND_PIECE)]
}

/// How a direct transfer between a socket and lent backend memory went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direct {
    /// Some bytes moved.
    Moved,
    /// The peer closed its side.
    Eof,
    /// Not possible now: take the buffered path.
    Declined,
}

/// Keeps a socket call's `result` in `outcome` and returns the byte count to tell the lender
/// (0 on an error).
pub fn record(result: io::Result<usize>, outcome: &mut Option<io::Result<usize>>) -> usize {
    let n = *result.as_ref().unwrap_or(&0);
    *outcome = Some(result);
    n
}

/// Whether a socket error only means "not now" (wait for readiness and try again).
pub fn retry(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

/// What a direct receive came to: `lent` is what the dispatcher returned (`None`: declined),
/// `outcome` what the recorded `recv` gave. `Ok(None)`: nothing was there; retry.
pub fn received(
    lent: Option<usize>,
    outcome: Option<io::Result<usize>>,
) -> io::Result<Option<Direct>> {
    match (lent, outcome) {
        (None, _) | (_, None) => Ok(Some(Direct::Declined)),
        (Some(_), Some(Ok(0))) => Ok(Some(Direct::Eof)),
        (Some(_), Some(Ok(_))) => Ok(Some(Direct::Moved)),
        (Some(_), Some(Err(error))) if retry(&error) => Ok(None),
        (Some(_), Some(Err(error))) => Err(error),
    }
}

/// What a direct send came to (as [`received`]; a send that took nothing is not an end of
/// stream). `Ok(None)`: the socket took nothing; retry.
pub fn sent(lent: Option<usize>, outcome: Option<io::Result<usize>>) -> io::Result<Option<Direct>> {
    match (lent, outcome) {
        (None, _) => Ok(Some(Direct::Declined)),
        (Some(_), Some(Err(error))) if retry(&error) => Ok(None),
        (Some(_), Some(Err(error))) => Err(error),
        (Some(_), _) => Ok(Some(Direct::Moved)),
    }
}

/// One non-blocking `recv` straight into the memory `conn` lends for the streamed write:
/// [`received`]'s answer (`Ok(None)`: nothing was there; wait until readable and retry).
pub fn receive_once<B: Backend + ?Sized>(
    conn: &mut Connection<B>,
    mut recv: impl FnMut(&mut [u8]) -> io::Result<usize>,
) -> Result<Option<Direct>, ConnectionError> {
    let mut outcome = None;
    let lent = conn.receive_in_place(&mut |dst| record(recv(dst), &mut outcome))?;
    Ok(received(lent, outcome)?)
}

/// One non-blocking `send` of at most [`SEND_PIECE`] bytes of the reply in progress straight
/// from the memory `conn` lends: [`sent`]'s answer (`Ok(None)`: the socket took nothing).
pub fn send_once<B: Backend + ?Sized>(
    conn: &mut Connection<B>,
    mut send: impl FnMut(&[u8]) -> io::Result<usize>,
) -> Result<Option<Direct>, ConnectionError> {
    let mut outcome = None;
    let lent = conn.send_in_place(&mut |src| record(send(send_piece(src)), &mut outcome))?;
    Ok(sent(lent, outcome)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_map_to_what_the_shell_does_next() {
        let would_block = || Some(Err(io::Error::from(io::ErrorKind::WouldBlock)));
        let reset = || Some(Err(io::Error::from(io::ErrorKind::ConnectionReset)));
        assert_eq!(received(None, None).unwrap(), Some(Direct::Declined));
        assert_eq!(received(Some(0), Some(Ok(0))).unwrap(), Some(Direct::Eof));
        assert_eq!(received(Some(5), Some(Ok(5))).unwrap(), Some(Direct::Moved));
        assert_eq!(received(Some(0), would_block()).unwrap(), None);
        assert!(received(Some(0), reset()).is_err());
        assert_eq!(sent(None, None).unwrap(), Some(Direct::Declined));
        assert_eq!(sent(Some(0), Some(Ok(0))).unwrap(), Some(Direct::Moved));
        assert_eq!(sent(Some(0), would_block()).unwrap(), None);
        assert!(sent(Some(0), reset()).is_err());
        let mut outcome = None;
        assert_eq!(record(Ok(7), &mut outcome), 7);
        assert_eq!(
            record(Err(io::ErrorKind::WouldBlock.into()), &mut outcome),
            0
        );
        assert!(outcome.unwrap().is_err());
    }

    #[test]
    fn a_send_offers_at_most_one_piece() {
        let region = vec![7u8; SEND_PIECE * 2 + 3];
        assert_eq!(send_piece(&region).len(), SEND_PIECE);
        assert_eq!(send_piece(&region[..10]).len(), 10);
        assert!(send_piece(&[]).is_empty());
    }
}
