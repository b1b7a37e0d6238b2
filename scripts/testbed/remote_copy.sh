#!/usr/bin/env bash
# The measurement PR #8032's discussion asked for: a copy between two servers on different
# hosts, relayed through a client on a third host vs direct (our REMOTE_COPY extension), at
# several link rates, one run per size (README: "Server-to-server copies").
#
#   sudo bash scripts/testbed/remote_copy.sh [RATE...]      (default: 1gbit 10gbit none)
#
# Needs target/release/ggml-rpc-server and target/release/examples/remote_copy_bench
# (cargo build --release -p ggml-rpc-server && cargo build --release -p ggml-rpc-client
#  --example remote_copy_bench). SIZES_MIB overrides the sizes (default "64 1024").
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
server=$target/release/ggml-rpc-server
bench=$target/release/examples/remote_copy_bench
rates=("$@")
[ ${#rates[@]} -gt 0 ] || rates=(1gbit 10gbit none)
sizes=${SIZES_MIB:-64 1024}
for rate in "${rates[@]}"; do
    cat >/tmp/remote_copy_tb.sh <<EOS
set -e
# Host 1: server A, allowed to push to host 2; host 2: server B; host 3: the client.
"\$TESTBED" spawn 1 "$server" -H "\$TESTBED_ADDR_1" --insecure-plain -p 50052 --peer "\$TESTBED_ADDR_2:50052" >/dev/null
"\$TESTBED" spawn 2 "$server" -H "\$TESTBED_ADDR_2" --insecure-plain -p 50052 >/dev/null
sleep 1
for size in $sizes; do
    printf 'rate=%s ' "$rate"
    "\$TESTBED" exec 3 "$bench" "\$TESTBED_ADDR_1:50052" "\$TESTBED_ADDR_2:50052" \
        "\$TESTBED_ADDR_2:50052" "\$size"
done
EOS
    bash "$here/testbed.sh" run --hosts 3 --rate "$rate" -- bash /tmp/remote_copy_tb.sh
done
