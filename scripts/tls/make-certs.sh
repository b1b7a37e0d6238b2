#!/usr/bin/env bash
# Makes a private CA and the certificates of a TLS deployment with openssl (P-256 keys):
#   DIR/ca.crt, ca.key                the CA (keep ca.key offline)
#   DIR/server.crt, server.key        the server's, for the names given (DNS names or IPs)
#   DIR/client.crt, client.key        one client's (the tunnel next to a llama.cpp)
# Then: ggml-rpc-server --tls-cert DIR/server.crt --tls-key DIR/server.key --tls-client-ca DIR/ca.crt
#       ggml-rpc tunnel ... --tls-cert DIR/client.crt --tls-key DIR/client.key --tls-ca DIR/ca.crt
#
# usage: scripts/tls/make-certs.sh DIR [SERVER-NAME...]   (default names: localhost 127.0.0.1)
#        scripts/tls/make-certs.sh --client DIR NAME      (another client of DIR's CA: NAME.crt/.key)
# Certificates are valid for 365 days (DAYS overrides); the CA is named "ggml-rpc CA" (CA_NAME).
set -euo pipefail

days=${DAYS:-365}
leaf() { # leaf DIR STEM CN SAN EKU
    local dir=$1 stem=$2 cn=$3 san=$4 eku=$5
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$cn" \
        -keyout "$dir/$stem.key" -out "$dir/$stem.csr" 2>/dev/null
    {
        [ -n "$san" ] && echo "subjectAltName=$san"
        echo "basicConstraints=critical,CA:FALSE"
        echo "keyUsage=critical,digitalSignature"
        echo "extendedKeyUsage=$eku"
    } >"$dir/$stem.ext"
    openssl x509 -req -in "$dir/$stem.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
        -days "$days" -extfile "$dir/$stem.ext" -out "$dir/$stem.crt" 2>/dev/null
    rm -f "$dir/$stem.csr" "$dir/$stem.ext"
    chmod 600 "$dir/$stem.key"
}

if [ "${1:-}" = --client ]; then
    [ $# -eq 3 ] || { echo "usage: $0 --client DIR NAME" >&2; exit 2; }
    leaf "$2" "$3" "$3" "" clientAuth
    exit 0
fi
[ $# -ge 1 ] || { echo "usage: $0 DIR [SERVER-NAME...]" >&2; exit 2; }
dir=$1; shift
names=("$@"); [ ${#names[@]} -gt 0 ] || names=(localhost 127.0.0.1)
mkdir -p "$dir"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=${CA_NAME:-ggml-rpc CA}" \
    -days "$days" -keyout "$dir/ca.key" -out "$dir/ca.crt" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
chmod 600 "$dir/ca.key"
san=""
for n in "${names[@]}"; do
    if [[ "$n" =~ ^[0-9.]+$ || "$n" == *:* ]]; then san+="${san:+,}IP:$n"; else san+="${san:+,}DNS:$n"; fi
done
# clientAuth too: a server pushing remote copies to another presents this certificate.
leaf "$dir" server "${names[0]}" "$san" serverAuth,clientAuth
leaf "$dir" client client "" clientAuth
echo "$dir: ca.crt server.crt/.key (${names[*]}) client.crt/.key"
