#!/usr/bin/env bash
# link.sh <libverbs_fabric.a> <output libibverbs.so.1>: links the staticlib into a shared object
# with soname libibverbs.so.1 and rdma-core 44's symbol versions (libibverbs.map). The output is
# written under a temporary name and renamed, so concurrent links never expose a partial file.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
lib="$1"; out="$2"
map="$here/libibverbs.map"
undef=()
for s in $(sed -n 's/^[[:space:]]*\([_a-z0-9]*\);$/\1/p' "$map"); do undef+=("-Wl,-u,$s"); done
tmp="$out.tmp.$$"
${CC:-cc} -shared -o "$tmp" -Wl,-soname,libibverbs.so.1 -Wl,--version-script="$map" \
  "${undef[@]}" -Wl,--gc-sections "$lib" -lpthread -ldl -lgcc_s -lc -lm
mv -f "$tmp" "$out"
