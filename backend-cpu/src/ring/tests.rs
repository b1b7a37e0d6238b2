use std::sync::{Arc, Barrier, Mutex};
use std::thread;

use super::*;
use proto_core::backend::Duplex;

/// An in-memory bootstrap: ranks meet at a barrier and read each other's blocks.
struct MemoryBootstrap {
    rank: u32,
    world: u32,
    blocks: Arc<Mutex<Vec<Vec<u8>>>>,
    barrier: Arc<Barrier>,
    /// Whether `secure` scrambles the connections (a stand-in for TLS) and counts each side.
    scramble: Option<Sides>,
}

/// The ranks' calls of `secure`: (rank, side).
type Sides = Arc<Mutex<Vec<(u32, Side)>>>;

/// A stream whose bytes are XORed both ways: every byte of the ring must go through the
/// stream `secure` returned, or the peer reads garbage.
struct Scrambled(Box<dyn Duplex>);

const KEY: u8 = 0x5a;

impl Read for Scrambled {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.0.read(buf)?;
        buf[..n].iter_mut().for_each(|b| *b ^= KEY);
        Ok(n)
    }
}

impl Write for Scrambled {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let scrambled: Vec<u8> = buf.iter().map(|b| b ^ KEY).collect();
        self.0.write(&scrambled)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl Bootstrap for MemoryBootstrap {
    fn rank(&self) -> u32 {
        self.rank
    }
    fn world(&self) -> u32 {
        self.world
    }
    fn exchange(&mut self, block: &[u8]) -> std::result::Result<Vec<u8>, CommError> {
        self.blocks.lock().unwrap()[self.rank as usize] = block.to_vec();
        self.barrier.wait();
        let all = self.blocks.lock().unwrap().concat();
        self.barrier.wait();
        Ok(all)
    }
    fn local_ip(&self) -> Ipv4Addr {
        Ipv4Addr::LOCALHOST
    }
    fn timeout(&self) -> Duration {
        Duration::from_secs(20)
    }
    fn peer_allowed(&self, ip: std::net::IpAddr) -> bool {
        ip.is_loopback()
    }
    fn secure(
        &self,
        stream: Box<dyn Duplex>,
        side: Side,
        peer: std::net::IpAddr,
    ) -> std::result::Result<SecuredStream, CommError> {
        assert!(peer.is_loopback(), "{peer}");
        match &self.scramble {
            None => Ok(Box::new(stream)),
            Some(sides) => {
                sides.lock().unwrap().push((self.rank, side));
                Ok(Box::new(Scrambled(stream)))
            }
        }
    }
}

/// Partial `rank` of a tensor of `n` elements: values in [-1, 1) with many mantissa bits.
fn values(n: usize, rank: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u64 * 2_654_435_761 + u64::from(rank) * 40_503) % 1_000_003) as f32 / 500_001.5
                - 1.0
        })
        .collect()
}

/// Starts `world` ranks on threads, each building its ring and then running `work` on it.
fn spawn_ranks<T: Send + 'static>(
    world: u32,
    work: impl Fn(u32, Ring) -> T + Send + Sync + 'static,
) -> Vec<thread::JoinHandle<T>> {
    spawn_ranks_with(world, None, work)
}

/// [`spawn_ranks`] with the bootstraps' `scramble`.
fn spawn_ranks_with<T: Send + 'static>(
    world: u32,
    scramble: Option<Sides>,
    work: impl Fn(u32, Ring) -> T + Send + Sync + 'static,
) -> Vec<thread::JoinHandle<T>> {
    let blocks = Arc::new(Mutex::new(vec![Vec::new(); world as usize]));
    let barrier = Arc::new(Barrier::new(world as usize));
    let work = Arc::new(work);
    (0..world)
        .map(|rank| {
            let mut bootstrap = MemoryBootstrap {
                rank,
                world,
                blocks: blocks.clone(),
                barrier: barrier.clone(),
                scramble: scramble.clone(),
            };
            let work = work.clone();
            thread::spawn(move || work(rank, Ring::establish(&mut bootstrap).expect("ring set-up")))
        })
        .collect()
}

/// Runs one ring of `world` ranks over loopback and returns every rank's result.
fn run_ring(world: u32, n: usize, rounds: usize) -> Vec<Vec<f32>> {
    spawn_ranks(world, move |rank, mut ring| {
        let mut v = values(n, rank + 1);
        for _ in 0..rounds {
            ring.reduce(&mut v).expect("all-reduce");
        }
        v
    })
    .into_iter()
    .map(|h| h.join().unwrap())
    .collect()
}

#[test]
fn every_rank_ends_with_the_same_sums() {
    for world in 2..=8u32 {
        for n in [1usize, 5, 1000, 40_000, 3 * SEGMENT + 17] {
            let results = run_ring(world, n, 1);
            let bf16 = n as u64 >= proto_core::comm::BF16_WIRE_MIN_ELEMENTS;
            for (rank, got) in results.iter().enumerate() {
                assert_eq!(got.len(), n);
                for (i, v) in got.iter().enumerate() {
                    assert_eq!(
                        v.to_bits(),
                        results[0][i].to_bits(),
                        "world {world}, {n} elements: rank {rank} element {i} differs from rank 0"
                    );
                }
            }
            // Against the exact sum: f32 rounding per addition, plus bf16 on the wire.
            let inputs: Vec<Vec<f32>> = (1..=world).map(|r| values(n, r)).collect();
            for i in 0..n {
                let exact: f64 = inputs.iter().map(|v| f64::from(v[i])).sum();
                let magnitude: f64 = inputs.iter().map(|v| f64::from(v[i]).abs()).sum();
                let tolerance = if bf16 {
                    magnitude * f64::from(world) / 128.0
                } else {
                    magnitude * 1e-6
                };
                let got = f64::from(results[0][i]);
                assert!(
                    (got - exact).abs() <= tolerance,
                    "world {world}, {n} elements: element {i} is {got}, exact sum {exact}"
                );
            }
        }
    }
}

/// Both ring connections of every rank go through `Bootstrap::secure` (connected once,
/// accepted once), and every byte of the set-up and the all-reduce through the stream it
/// returned: with scrambled streams the sums are the same bits as over plain sockets.
#[test]
fn every_byte_goes_through_the_secured_streams() {
    for world in [2u32, 3] {
        for n in [1000usize, 40_000] {
            let plain = run_ring(world, n, 2);
            let sides = Arc::new(Mutex::new(Vec::new()));
            let scrambled: Vec<Vec<f32>> =
                spawn_ranks_with(world, Some(sides.clone()), move |rank, mut ring| {
                    let mut v = values(n, rank + 1);
                    for _ in 0..2 {
                        ring.reduce(&mut v).expect("all-reduce");
                    }
                    v
                })
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect();
            for (a, b) in plain.iter().zip(&scrambled) {
                assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()));
            }
            let mut sides = sides.lock().unwrap().clone();
            sides.sort_by_key(|&(rank, side)| (rank, side == Side::Accepted));
            let want: Vec<(u32, Side)> = (0..world)
                .flat_map(|rank| [(rank, Side::Connected), (rank, Side::Accepted)])
                .collect();
            assert_eq!(sides, want, "world {world}");
        }
    }
}

#[test]
fn small_tensors_sum_exactly_in_ring_order() {
    // F32 on the wire: chunk c is summed starting at rank c, then c + 1, ...
    let world = 3u32;
    let n = 6;
    let results = run_ring(world, n, 1);
    let inputs: Vec<Vec<f32>> = (1..=world).map(|r| values(n, r)).collect();
    for i in 0..n {
        let c = (0..world as usize)
            .find(|&c| chunk(n, world as usize, c).contains(&i))
            .unwrap();
        let mut sum = inputs[c][i];
        for k in 1..world as usize {
            sum += inputs[(c + k) % world as usize][i];
        }
        assert_eq!(results[1][i].to_bits(), sum.to_bits(), "element {i}");
    }
}

#[test]
fn the_ring_is_reusable() {
    let results = run_ring(4, 1000, 3);
    assert!(results.iter().all(|r| r == &results[0]));
}

#[test]
fn chunks_cover_the_tensor() {
    for n in [0usize, 1, 7, 100, 1 << 20] {
        for world in 2..=8 {
            let mut next = 0;
            for c in 0..world {
                let r = chunk(n, world, c);
                assert_eq!(r.start, next);
                next = r.end;
                let covered: usize = segments(r.clone()).map(|s| s.len()).sum();
                assert_eq!(covered, r.len());
            }
            assert_eq!(next, n);
        }
    }
}

#[test]
fn a_dead_neighbour_fails_the_all_reduce_within_the_timeout() {
    let handles = spawn_ranks(3, |rank, mut ring| {
        ring.timeout = Duration::from_secs(5);
        if rank == 2 {
            drop(ring); // dies before the all-reduce
            return Ok(());
        }
        let mut v = values(100_000, rank);
        ring.reduce(&mut v)
    });
    let started = Instant::now();
    for (rank, h) in handles.into_iter().enumerate().take(2) {
        let result = h.join().unwrap();
        assert!(result.is_err(), "rank {rank} must fail without rank 2");
    }
    assert!(started.elapsed() < Duration::from_secs(30));
}
