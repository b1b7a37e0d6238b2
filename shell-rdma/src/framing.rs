//! Where writes begin and end on RDMA (PROTOCOL.md §10.3, "segmentation rule"): 7.0.0 and
//! 8.0.x receivers take whole completions, so a SEND must never reach past the end of the read
//! that consumes it. The reference reads a request as the command byte, the 8-byte size and
//! the payload, and a response as the size and the payload; [`Framer`] cuts any byte stream of
//! messages (as the sessions' transmit queues produce it, split anywhere) into exactly those
//! writes.

/// Which messages a stream carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Client → server: `cmd u8 | size u64 | payload`.
    Request,
    /// Server → client: `size u64 | payload`.
    Response,
}

/// Cuts an outgoing message stream into the writes the reference's reads expect.
#[derive(Debug, Clone)]
pub struct Framer {
    framing: Framing,
    /// Header bytes gathered so far (command byte, then size).
    header: [u8; 9],
    have: usize,
    /// Payload bytes of the current message still to pass.
    payload_left: u64,
}

impl Framer {
    /// A framer at a message boundary.
    pub fn new(framing: Framing) -> Framer {
        Framer {
            framing,
            header: [0; 9],
            have: 0,
            payload_left: 0,
        }
    }

    /// Whether the stream is between two messages.
    pub fn at_boundary(&self) -> bool {
        self.have == 0 && self.payload_left == 0
    }

    fn header_len(&self) -> usize {
        match self.framing {
            Framing::Request => 9,
            Framing::Response => 8,
        }
    }

    /// Feeds the next bytes of the stream; `write` gets each write in order (a header field
    /// whole, payload in pieces no larger than what was fed).
    pub fn feed<E>(
        &mut self,
        mut data: &[u8],
        write: &mut dyn FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        while !data.is_empty() {
            if self.payload_left > 0 {
                let take = data
                    .len()
                    .min(usize::try_from(self.payload_left).unwrap_or(usize::MAX));
                write(&data[..take])?;
                self.payload_left -= take as u64;
                data = &data[take..];
                continue;
            }
            let take = (self.header_len() - self.have).min(data.len());
            self.header[self.have..self.have + take].copy_from_slice(&data[..take]);
            self.have += take;
            data = &data[take..];
            if self.have < self.header_len() {
                continue;
            }
            let size_at = match self.framing {
                Framing::Request => {
                    write(&self.header[..1])?;
                    1
                }
                Framing::Response => 0,
            };
            let mut size = [0u8; 8];
            size.copy_from_slice(&self.header[size_at..size_at + 8]);
            write(&size)?;
            self.payload_left = u64::from_le_bytes(size);
            self.have = 0;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writes(framing: Framing, pieces: &[&[u8]]) -> Vec<Vec<u8>> {
        let mut framer = Framer::new(framing);
        let mut out = Vec::new();
        for piece in pieces {
            framer
                .feed::<()>(piece, &mut |w| {
                    out.push(w.to_vec());
                    Ok(())
                })
                .unwrap();
        }
        assert!(framer.at_boundary());
        out
    }

    fn request(cmd: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![cmd];
        v.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn requests_are_cut_into_command_size_and_payload_even_when_coalesced() {
        let mut both = request(6, &[1, 2, 3]);
        both.extend(request(11, &[]));
        both.extend(request(9, &[7]));
        let out = writes(Framing::Request, &[&both]);
        let size = |n: u64| n.to_le_bytes().to_vec();
        assert_eq!(
            out,
            vec![
                vec![6],
                size(3),
                vec![1, 2, 3],
                vec![11],
                size(0),
                vec![9],
                size(1),
                vec![7]
            ]
        );
    }

    #[test]
    fn split_headers_are_gathered_and_payload_pieces_stay_inside_the_payload() {
        let msg = {
            let mut v = 5u64.to_le_bytes().to_vec();
            v.extend_from_slice(b"hello");
            v
        };
        let out = writes(Framing::Response, &[&msg[..3], &msg[3..10], &msg[10..]]);
        assert_eq!(
            out,
            vec![5u64.to_le_bytes().to_vec(), b"he".to_vec(), b"llo".to_vec()]
        );
    }
}
