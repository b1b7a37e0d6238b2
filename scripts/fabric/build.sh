#!/usr/bin/env bash
# Builds the verbs fabric (verbs-fabric/) as a drop-in libibverbs.so.1 and prints the directory
# holding it: run a process with LD_LIBRARY_PATH=<that dir> to give it the software device.
# Usage: scripts/fabric/build.sh [--release]   (CARGO_TARGET_DIR is honoured)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
profile=debug
args=()
if [[ "${1:-}" == "--release" ]]; then profile=release; args=(--release); fi
target="${CARGO_TARGET_DIR:-$root/target}"
(cd "$root" && cargo build -q -p verbs-fabric "${args[@]}") >&2
out="$target/$profile/fabric"
mkdir -p "$out"
"$root/verbs-fabric/link.sh" "$target/$profile/libverbs_fabric.a" "$out/libibverbs.so.1" >&2
echo "$out"
