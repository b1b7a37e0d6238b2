//! Shared by the test binaries: a freshly linked fabric `libibverbs.so.1`.
use std::path::{Path, PathBuf};
use std::process::Command;

pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Builds the staticlib and links it into `<dir>/libibverbs.so.1`. Cargo does not refresh the
/// lib's staticlib artifact when it builds only tests, so a nested `cargo build` (in a target
/// dir of its own: no lock shared with the outer cargo) makes sure it is current.
pub fn link_fabric(dir: &Path) {
    let exe = std::env::current_exe().expect("current_exe");
    // <target>/<profile>/deps/<test binary>
    let target = exe.ancestors().nth(3).expect("target dir");
    let nested = target.join("verbs-fabric-so");
    let st = Command::new(env!("CARGO"))
        .args([
            "build",
            "--offline",
            "-q",
            "-p",
            "verbs-fabric",
            "--lib",
            "--manifest-path",
        ])
        .arg(crate_dir().join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &nested)
        .status()
        .expect("run cargo");
    assert!(st.success(), "cargo build -p verbs-fabric failed");
    let staticlib = nested.join("debug/libverbs_fabric.a");
    assert!(staticlib.is_file(), "{} missing", staticlib.display());
    std::fs::create_dir_all(dir).expect("mkdir");
    let st = Command::new(crate_dir().join("link.sh"))
        .arg(&staticlib)
        .arg(dir.join("libibverbs.so.1"))
        .status()
        .expect("run link.sh");
    assert!(st.success(), "link.sh failed");
}
