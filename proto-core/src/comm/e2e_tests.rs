//! End-to-end: the whole newest-link `COMM_INIT` between simulated servers (set-up, exchange #1,
//! negotiation, then either an NCCL-style 129-byte exchange or a pairwise all-reduce), checking
//! that bytes coalesced across stage boundaries are handed from one machine to the next.

use bytes::Bytes;
use proptest::prelude::*;

use super::sim::{self, Node};
use super::*;

enum Stage {
    Accepting {
        setup: Rank0Setup,
        arrival: Vec<u32>,
        next: usize,
        current: Option<u32>,
    },
    Connecting(Handshake),
    Exchange1(BootstrapExchange),
    Exchange2(BootstrapExchange),
    Reduce(PairwiseAllReduce),
    Finished,
}

struct Server {
    rank: u32,
    world: u32,
    offer: bool,
    partial: Vec<f32>,
    stage: Stage,
    offers: Option<Gathered>,
    path: Option<Result<Path, CommError>>,
    ids: Option<Gathered>,
    reduced: Option<Vec<f32>>,
}

fn caps(rank: u32) -> ConnCaps {
    [rank as u8 + 1; CAPS_SIZE]
}

fn nccl_block(rank: u32) -> Vec<u8> {
    let mut b = vec![1u8];
    b.extend((0..128u32).map(|i| (i * 3 + rank * 11) as u8));
    b
}

impl Server {
    fn new(rank: u32, world: u32, offer: bool, arrival: Vec<u32>) -> Self {
        let stage = if rank == 0 {
            Stage::Accepting {
                setup: Rank0Setup::new(LinkVariant::Ranked, world, caps(0)).unwrap(),
                arrival,
                next: 0,
                current: None,
            }
        } else {
            Stage::Connecting(
                Handshake::connector(LinkVariant::Ranked, rank, world, caps(rank)).unwrap(),
            )
        };
        Self {
            rank,
            world,
            offer,
            partial: (0..7)
                .map(|i| (i as f32 + 0.25) * (rank as f32 + 1.0))
                .collect(),
            stage,
            offers: None,
            path: None,
            ids: None,
            reduced: None,
        }
    }

    fn exchange(&self, block: Vec<u8>) -> BootstrapExchange {
        BootstrapExchange::new(self.rank, self.world, block, 1 << 16).unwrap()
    }

    /// Takes events and moves to the next stage when the current one is complete.
    fn pump(&mut self) {
        loop {
            let next = match &mut self.stage {
                Stage::Accepting {
                    setup,
                    arrival,
                    next,
                    current,
                } => {
                    while let Some(ev) = setup.poll_event() {
                        match ev {
                            Rank0Event::Accept => {
                                *current = Some(arrival[*next]);
                                *next += 1;
                                setup.handle_accepted().unwrap();
                            }
                            Rank0Event::CapsExchanged { peer_caps } => {
                                assert_eq!(Some(peer_caps), current.map(caps));
                            }
                            Rank0Event::PeerJoined { rank, .. } => {
                                assert_eq!(Some(rank), current.take());
                            }
                        }
                    }
                    if !setup.is_done() {
                        return;
                    }
                    Stage::Exchange1(self.exchange(vec![path_offer(self.offer)]))
                }
                Stage::Connecting(hs) => {
                    while hs.poll_event().is_some() {}
                    if !hs.is_done() {
                        return;
                    }
                    Stage::Exchange1(self.exchange(vec![path_offer(self.offer)]))
                }
                Stage::Exchange1(bx) if bx.is_done() => {
                    let Stage::Exchange1(bx) = std::mem::replace(&mut self.stage, Stage::Finished)
                    else {
                        unreachable!()
                    };
                    let g = bx.into_result().unwrap();
                    let path = negotiate(g.as_bytes());
                    self.offers = Some(g);
                    self.path = Some(path.clone());
                    match path {
                        Ok(Path::BackendCommunicator) => {
                            Stage::Exchange2(self.exchange(nccl_block(self.rank)))
                        }
                        Ok(Path::Pairwise) => {
                            let format = WireFormat::select(true, self.partial.len() as u64);
                            Stage::Reduce(
                                PairwiseAllReduce::new(self.rank, self.partial.clone(), format)
                                    .unwrap(),
                            )
                        }
                        Err(_) => Stage::Finished,
                    }
                }
                Stage::Exchange2(bx) if bx.is_done() => {
                    let Stage::Exchange2(bx) = std::mem::replace(&mut self.stage, Stage::Finished)
                    else {
                        unreachable!()
                    };
                    self.ids = Some(bx.into_result().unwrap());
                    Stage::Finished
                }
                Stage::Reduce(ar) if ar.is_done() => {
                    let Stage::Reduce(ar) = std::mem::replace(&mut self.stage, Stage::Finished)
                    else {
                        unreachable!()
                    };
                    self.reduced = Some(ar.into_result().unwrap());
                    Stage::Finished
                }
                _ => return,
            };
            self.stage = next;
        }
    }
}

impl Node for Server {
    fn input(&mut self, from: u32, data: &[u8]) -> Result<usize, CommError> {
        match &mut self.stage {
            Stage::Accepting { setup, current, .. } => {
                assert_eq!(Some(from), *current);
                setup.handle_input(data)
            }
            Stage::Connecting(hs) => hs.handle_input(data),
            Stage::Exchange1(bx) | Stage::Exchange2(bx) => bx.handle_input(from, data),
            Stage::Reduce(ar) => ar.handle_input(data),
            Stage::Finished => Ok(0),
        }
    }

    fn transmit(&mut self) -> Option<(u32, Bytes)> {
        self.pump();
        let t = match &mut self.stage {
            Stage::Accepting { setup, current, .. } => {
                setup.poll_transmit().map(|t| (current.unwrap(), t.data))
            }
            Stage::Connecting(hs) => hs.poll_transmit().map(|t| (0, t.data)),
            Stage::Exchange1(bx) | Stage::Exchange2(bx) => {
                bx.poll_transmit().map(|t| (t.peer.unwrap(), t.data))
            }
            Stage::Reduce(ar) => ar.poll_transmit().map(|t| (1 - self.rank, t.data)),
            Stage::Finished => None,
        };
        // Handing out a transmit can complete a stage; move on so the next stage's first write
        // follows immediately (and coalesces in the pipe, as on a real socket).
        self.pump();
        t
    }

    fn done(&self) -> bool {
        matches!(self.stage, Stage::Finished)
    }

    fn readable(&self, from: u32) -> bool {
        match &self.stage {
            Stage::Accepting { current, .. } => *current == Some(from),
            _ => true,
        }
    }
}

fn scenario() -> impl Strategy<Value = (u32, Vec<u32>, Option<u32>, u64)> {
    prop_oneof![Just(2u32), Just(3), Just(4), Just(8)].prop_flat_map(|world| {
        (
            Just(world),
            Just((1..world).collect::<Vec<u32>>()).prop_shuffle(),
            prop_oneof![Just(None), (0..world).prop_map(Some)],
            any::<u64>(),
        )
    })
}

proptest! {
    #[test]
    fn comm_init_end_to_end((world, arrival, refuser, seed) in scenario()) {
        let mut nodes: Vec<Server> = (0..world)
            .map(|r| Server::new(r, world, Some(r) != refuser, arrival.clone()))
            .collect();
        let net = sim::run(&mut nodes, seed).unwrap();
        prop_assert!(net.pipes.values().all(Vec::is_empty), "no byte lost or left over");
        let offers: Vec<u8> = (0..world).map(|r| path_offer(Some(r) != refuser)).collect();
        let ids: Vec<u8> = (0..world).flat_map(nccl_block).collect();
        for n in &nodes {
            prop_assert_eq!(n.offers.as_ref().unwrap().as_bytes(), &offers[..]);
            match (refuser, world) {
                (None, _) => {
                    prop_assert_eq!(n.path.clone().unwrap(), Ok(Path::BackendCommunicator));
                    prop_assert_eq!(n.ids.as_ref().unwrap().as_bytes(), &ids[..]);
                }
                (Some(_), 2) => {
                    prop_assert_eq!(n.path.clone().unwrap(), Ok(Path::Pairwise));
                    let want: Vec<f32> = nodes[0].partial.iter().zip(&nodes[1].partial).map(|(a, b)| a + b).collect();
                    prop_assert_eq!(n.reduced.as_ref().unwrap(), &want);
                }
                (Some(_), w) => {
                    prop_assert_eq!(
                        n.path.clone().unwrap(),
                        Err(CommError::PairwiseNeedsTwoRanks { world: u64::from(w) })
                    );
                }
            }
        }
    }
}
