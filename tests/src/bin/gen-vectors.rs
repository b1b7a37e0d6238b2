//! Writes every test vector into `tests/vectors/` (or the folder given as the only argument) and
//! removes vector files that are no longer generated.

fn main() {
    let dir = std::env::args_os()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(ggml_rpc_tests::vectors_dir);
    match ggml_rpc_tests::generate::write_all(&dir) {
        Ok(count) => println!("wrote {count} vectors to {}", dir.display()),
        Err(error) => {
            eprintln!("gen-vectors: {error}");
            std::process::exit(1);
        }
    }
}
