//! Times a copy between two servers, relayed through this client and direct (our
//! REMOTE_COPY extension), and prints the ratio. Used on the multi-host test bed
//! (`scripts/testbed/remote_copy.sh`), one run per size:
//!
//! ```text
//! remote_copy_bench SRC_HOST:PORT DST_HOST:PORT DST_ENDPOINT_AS_SEEN_BY_SRC SIZE_MIB [RUNS]
//! ```
//!
//! Output: one line per size, `size_mib=N relayed_s=T direct_s=T ratio=R` (ratio = direct /
//! relayed), after checking that both copies are byte-exact.

use std::time::Instant;

use ggml_rpc_client::{copy_between_servers, Client, CopyMode, CopyPath, RpcTensor};

fn tensor(handle: u64, base: u64, len: u64) -> RpcTensor {
    // i8 rows of at most 2^30 bytes: ne0 is a u32 on the wire, nb are u64.
    let row = len.min(1 << 30);
    let rows = len / row;
    assert_eq!(
        rows * row,
        len,
        "size must be a multiple of 1 GiB above 1 GiB"
    );
    let mut t = RpcTensor::contiguous(1, 24, [row as u32, rows as u32, 1, 1]).unwrap();
    t.buffer = handle;
    t.data = base;
    t
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        eprintln!("usage: {} SRC DST DST_ENDPOINT SIZE_MIB [RUNS]", args[0]);
        std::process::exit(2);
    }
    let size: u64 = args[4].parse::<u64>()? << 20;
    let runs: u32 = args.get(5).map_or(Ok(1), |r| r.parse())?;
    let mut src = Client::connect_auto(&args[1]).await?;
    let mut dst = Client::connect_auto(&args[2]).await?;
    let a = src.alloc_buffer(0, size).await?.ok_or("alloc on src")?;
    let b = dst.alloc_buffer(0, size).await?.ok_or("alloc on dst")?;
    let src_t = tensor(a.handle, src.buffer_base(a.handle).await?, size);
    let dst_t = tensor(b.handle, dst.buffer_base(b.handle).await?, size);
    let data: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
    let data = bytes::Bytes::from(data);
    src.set_tensor(&src_t, 0, data.clone()).await?;
    let mut best = [f64::MAX; 2];
    for _ in 0..runs {
        for (i, mode) in [CopyMode::Relay, CopyMode::Direct].into_iter().enumerate() {
            dst.memset_tensor(&dst_t, 0, size, 0).await?;
            dst.device_count().await?;
            let start = Instant::now();
            let path = copy_between_servers(
                &mut src, &src_t, 0, &mut dst, &dst_t, 0, size, &args[3], mode,
            )
            .await?;
            // The relay's last SET_TENSOR has no answer: wait until B applied it.
            dst.device_count().await?;
            let took = start.elapsed().as_secs_f64();
            assert!(matches!(
                (mode, path),
                (CopyMode::Relay, CopyPath::Relayed { .. }) | (CopyMode::Direct, CopyPath::Direct)
            ));
            let mut at = 0;
            while at < size {
                let piece = (size - at).min(256 << 20);
                let got = dst.get_tensor(&dst_t, at, piece).await?;
                if got[..] != data[at as usize..(at + piece) as usize] {
                    return Err(format!("{mode:?} copy differs in [{at}, {})", at + piece).into());
                }
                at += piece;
            }
            best[i] = best[i].min(took);
        }
    }
    println!(
        "size_mib={} relayed_s={:.3} direct_s={:.3} ratio={:.3}",
        size >> 20,
        best[0],
        best[1],
        best[1] / best[0]
    );
    Ok(())
}
