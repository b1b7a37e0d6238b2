#!/usr/bin/env bash
# The project's one test command (README.md, "Run every test"). On a fresh machine it installs
# what the tests need (Rust components, cargo-fuzz, Debian packages, the llama.cpp peers), then
# runs formatting and lint checks, the workspace tests, the interop tests against the real
# llama.cpp, llama.cpp's test-backend-ops through our server and end-to-end generation, and
# every fuzz target for a bounded time.
#
# Environment:
#   FUZZ_SECONDS   seconds per fuzz target (default 60)
#   SKIP_FUZZ=1    skip the fuzz stage (local iterations only; CI never sets it)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
FUZZ_SECONDS=${FUZZ_SECONDS:-60}

# Each step prints the wall-clock time since the start, so a slow CI run shows where it went.
start_seconds=$SECONDS
step() { printf '\n=== %s (at %d s) ===\n' "$*" $((SECONDS - start_seconds)); }

step "toolchain"
rustup component add rustfmt clippy >/dev/null 2>&1 || true
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

step "Debian packages (the RDMA transport's rdma-sys: libibverbs, librdmacm, libclang for bindgen)"
# shell-rdma builds against libibverbs through rdma-sys, whose build script finds libibverbs
# and librdmacm with pkg-config and generates its bindings with bindgen (libclang).
rdma_packages=(libibverbs-dev librdmacm-dev libclang-dev pkg-config)
missing=()
for p in "${rdma_packages[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

step "llama.cpp peers (cached in \${GGML_RPC_PEER_CACHE:-/var/cache/ggml-rpc-peer})"
# b11434 (protocol 7.0.0) built from the PyPI sdist; b11739 (protocol 8.0.0) libraries from the
# PyPI wheel in a Debian 13 chroot; b12032+1 (protocol 8.0.1) built from the llama.cpp tree of the
# crates.io package llama-cpp-sys-4 0.11.0 with the multi-rank COMM_INIT change and RDMA. All
# three do nothing when already installed.
bash scripts/peer/build-b11434.sh
bash scripts/peer/setup-b11739.sh
bash scripts/peer/build-b12032.sh

step "format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings

step "workspace tests"
cargo nextest run --workspace --no-fail-fast
# doc tests are not run by nextest
cargo test --workspace --doc

step "conformance kit (ggml-rpc conformance)"
# The test vectors and hostile cases through the CLI: our server in every shell and protocol
# must pass every case (--strict); the runs against b11434, b11739 and b12032+1 must complete
# and pass exactly the cases README.md's tables list ("Conformance kit"). About 2 min.
bash scripts/conformance/kit.sh

step "multi-host test bed (network namespaces; needs root, fails without)"
# scripts/testbed/README.md: 3 hosts behind 200mbit links, our server in two, probe and a 64 MiB
# SET/GET from the third at 50-110 % of the shaping rate, isolation of two test beds, nothing
# left after down, a failing run, TERM/INT; about 12 s.
bash scripts/testbed/selftest.sh
# The comm link's faults on the test bed (tests/examples/comm_testbed.rs; root, fails
# without): world 4 of our release servers in hosts 1-4 (--comm-timeout 5, --max-clients 1),
# the client in host 5, 200mbit links. Rank 1's server killed (SIGKILL), then stopped
# (SIGSTOP), in the middle of a 64 MiB all-reduce: every other rank's connection closes within
# the timeout + 8 s of the fault, its server logs the comm error, its RSS falls back, a fresh
# connection is served, and a fresh world 4 with a replacement (resumed) rank all-reduces
# correctly. About 20 s. Then a short run of the comm benchmark (1 round, 64 MiB, worlds 2
# and 3, our pairwise link and b12032+1's servers at world 2; asserts only that it runs; about
# 25 s): README.md, "Tensor parallelism (COMM_INIT)".
cargo build --release -p ggml-rpc-server
cargo build --release -p ggml-rpc-tests --example comm_testbed
comm_testbed="${CARGO_TARGET_DIR:-$root/target}/release/examples/comm_testbed"
"$comm_testbed" fault
"$comm_testbed" bench --rounds 1 --sizes 64 --worlds 2,3

step "soak, short (every shell)"
# tests/examples/soak.rs: 12 clients repeating verified model-load cycles (uploads, an ADD
# graph, downloads, byte for byte) while 4 fault injectors kill clients mid-upload, stall
# readers, half-close, send hostile messages, never say HELLO, tear headers; then a fresh
# client is served and the server's RSS, file descriptors and threads are back at their
# baseline. About 25 s per shell. The full run (64 clients, minutes) is in README "Soak".
cargo build --release -p ggml-rpc-tests --example soak
soak="${CARGO_TARGET_DIR:-$root/target}/release/examples/soak"
for shell in tokio uring smol; do
    "$soak" --clients 12 --faulters 4 --seconds 10 --max-mib 8 --shell "$shell"
done

step "llama.cpp conformance: test-backend-ops through RPC, end-to-end generation, fidelity"
# Every case (for FLASH_ATTN_EXT and MUL_MAT_ID an evenly spread quarter) of the ops a
# llama/qwen/gemma graph uses (and the fused whole-graph cases), and of
# every further op the CPU backend implements ("extra"), whose types are all among the
# supported ones, against llama.cpp's CPU backend (b11434); then greedy
# generation on tiny F32/F16/Q8_0/Q4_0/Q4_K models through our server, the reference server
# and CPU only, flash attention off and on: identical tokens required, once with b11434's
# llama-completion (our server --protocol 7) and once with b12032+1's (--protocol 8.0.1),
# plus the negative check (b12032's client against our --protocol 8.0.0 must fail, naming 8.0.1).
# FLASH_ATTN_EXT (5317 cases) and MUL_MAT_ID (945) run an evenly spread quarter of their
# cases: on a slow CPU (first-generation Zen) all their cases took 19 minutes per op, 38 of
# the 90 minutes a CI run may take; the full lists are run by hand (tests/conformance/README.md).
bash scripts/conformance/test-backend-ops.sh --ops default,fused,extra --scope listed --case-timeout 600 \
    --sample-op FLASH_ATTN_EXT=1330 --sample-op MUL_MAT_ID=236
bash scripts/conformance/e2e.sh --strict
# Admission (README.md, "Admission"): with hundreds of connections open that never say HELLO
# (from the client's address, from 253 others, and a flood replacing each one closed), b11434's
# llama-completion loads a tiny model and generates within the bound, for each shell; about
# 50 s.
bash scripts/conformance/admission-e2e.sh
# Our RDMA transport on the verbs fabric (needs verbs-fabric/ and scripts/fabric/build.sh; fails,
# never skips, without them): b12032+1's llama-completion through our server over RDMA in every
# shell (tokio, uring, smol) with text identical to TCP, our client against b12032+1's server
# (256 MiB byte-exact) and against our own in every shell, hostile peers in every shell (caps
# naming no QP, a client killed mid SET_TENSOR, a SEND overrunning a receive slot). ~2.5 min.
bash scripts/conformance/rdma_ours.sh
# The comm link over RDMA on the verbs fabric: groups of our servers (ranked link at world 2 on
# the pairwise path and at world 3 with the CPU ring, the plain 8.0.1 pairwise link) whose comm
# sockets switch to RDMA after the caps exchange; all-reduce results identical to TCP. ~20 s.
bash scripts/conformance/rdma_comm.sh
# RDMA throughput smoke (scripts/bench-rdma.sh; the full run, 5 rounds of 256 MiB, is by hand and
# its table is in README.md, "RDMA"): one round of 16 MiB against our server and b12032+1's,
# each over TCP and over RDMA on the verbs fabric; fails unless every RDMA run used RDMA.
bash scripts/bench-rdma.sh --smoke
# Fidelity on models we did not make (short version: one model seed, 10 random prompts, 40
# tokens; the full run, 20 prompts x 3 seeds x 64 tokens, is the script's default and is run by
# hand): greedy generation token by token against b11434's CPU backend; fails on a divergence
# at a reference top-2 margin above the type's threshold (tests/conformance/README.md, section 4).
bash scripts/conformance/fidelity.sh --seeds 1 --prompts 10 -n 40
# The real llama.cpp over RDMA: b12032+1's llama-completion and ggml-rpc-server, both on the
# verbs fabric (verbs-fabric/, a userspace libibverbs.so.1 via LD_LIBRARY_PATH); every connection
# must upgrade to RDMA and the text must equal the GGML_RPC_NO_RDMA=1 (TCP) run; on loopback,
# then across two test-bed hosts (network namespaces).
bash scripts/conformance/rdma_fabric.sh --testbed
# Tensor parallelism: b12032+1's llama-completion with -sm tensor across 2, 3 and 4 of our
# servers (ranked comm link, the CPU ring all-reduce): greedy text identical to CPU-only, and
# every server ran COMM_ALLREDUCE; then b11739's client (its libllama in its chroot,
# scripts/peer/b11739_generate.py) across two of our --protocol 8.0.0 servers (and 3, 4, where it
# sums by itself): token ids identical to its CPU-only run; on the multi-host test bed (a network
# namespace per server). About 1 min of the step is b11739's.
bash scripts/conformance/tp.sh --testbed
# TLS: b11434's llama-completion through `ggml-rpc tunnel` to our server with --tls-*: text
# identical to plain TCP; a tunnel of another CA and a plain client refused in the handshake.
# Then a 1-round smoke of the tunnel-vs-plain throughput comparison (the full run is by hand).
bash scripts/conformance/tls.sh
bash scripts/bench-tls.sh --rounds 1 --size 16MiB --iterations 2

step "benchmarks, short versions (the full runs are by hand: README.md, \"Benchmarks\")"
# The shells benchmark: one short round of every shell and b11434's server, the client and the
# servers pinned to one CPU; fails if any measurement fails. About 1 min.
BENCH_ROUNDS=1 BENCH_SECONDS=0.5 BENCH_REPEAT=1 BENCH_PIN=same \
    cargo bench -p ggml-rpc-server --bench shells
# llama-bench through our server and the reference on the tiny models, one repetition of a short
# prompt and generation: b11434 with flash attention off, b12032+1 with it on. About 1 min.
bash scripts/conformance/bench-llama.sh --tiny-only -r 1 --rounds 1 -p 16 -n 8
bash scripts/conformance/bench-llama.sh --peer b12032 --fa on --tiny-only -r 1 --rounds 1 -p 16 -n 8

step "fuzz (${FUZZ_SECONDS}s per target)"
if [ "${SKIP_FUZZ:-0}" != 1 ]; then
    bash scripts/fuzz.sh "$FUZZ_SECONDS"
fi

step "all steps passed"
