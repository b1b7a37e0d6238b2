// rpc_shim.c - make llama.cpp's test-backend-ops (b11434) see RPC servers.
//
// test-backend-ops at b11434 has no --rpc flag: it only enumerates the devices that are
// in ggml's backend registry. The RPC backend's own registry entry (ggml_backend_rpc_reg())
// has no devices; devices only appear once ggml_backend_rpc_add_server(endpoint) has been
// called and the registry it returns has been registered with ggml_backend_register().
// llama.cpp's `--rpc` option does exactly that; this shim does it from an ELF constructor
// so that it can be LD_PRELOADed into any ggml program:
//
//   GGML_RPC_SHIM_ENDPOINT=127.0.0.1:50052 LD_PRELOAD=./librpc_shim.so  test-backend-ops -b RPC0 -o ADD
//
// GGML_RPC_SHIM_ENDPOINT may hold several endpoints separated by ','. Each server's
// devices are named RPC0, RPC1, ... in order (names are assigned by libggml-rpc).
//
// ggml_backend_rpc_add_server() sends HELLO and DEVICE_COUNT at once, so the server must
// already be listening. If it cannot be reached, the RPC client aborts the process (its
// connection failure is fatal); if it reports zero devices, the shim exits with status 3.
// Set GGML_RPC_SHIM_QUIET=1 to silence the one-line notice on stderr.
//
// The shim also makes stdout line buffered: test-backend-ops prints its headers without
// fflush, and when the RPC client dies (SIGPIPE or abort on a closed connection) whatever
// sat in a full buffer is lost, so a harness reading a pipe could not tell where it died.
// Set GGML_RPC_SHIM_KEEP_BUFFERING=1 to leave stdout alone.
//
// Build (see scripts/conformance/test-backend-ops.sh):
//   cc -shared -fPIC -O2 -o librpc_shim.so rpc_shim.c -I$LIB/../include
//      -L$LIB -lggml-rpc -lggml -lggml-base -Wl,-rpath,$LIB

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-backend.h"
#include "ggml-rpc.h"

#define SHIM_MAX_ENDPOINT 256

static void shim_add(const char * endpoint, int quiet) {
    ggml_backend_reg_t reg = ggml_backend_rpc_add_server(endpoint);
    if (reg == NULL) {
        fprintf(stderr, "rpc_shim: server %s reports no devices\n", endpoint);
        exit(3);
    }
    ggml_backend_register(reg);
    if (!quiet) {
        size_t n = ggml_backend_reg_dev_count(reg);
        for (size_t i = 0; i < n; i++) {
            ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, i);
            fprintf(stderr, "rpc_shim: registered %s (%s)\n", ggml_backend_dev_name(dev),
                    ggml_backend_dev_description(dev));
        }
    }
}

__attribute__((constructor))
static void rpc_shim_init(void) {
    const char * list = getenv("GGML_RPC_SHIM_ENDPOINT");
    const char * q    = getenv("GGML_RPC_SHIM_QUIET");
    const int quiet   = q != NULL && q[0] != '\0' && strcmp(q, "0") != 0;
    if (getenv("GGML_RPC_SHIM_KEEP_BUFFERING") == NULL) {
        setvbuf(stdout, NULL, _IOLBF, 0);
    }
    if (list == NULL || list[0] == '\0') {
        if (!quiet) {
            fprintf(stderr, "rpc_shim: GGML_RPC_SHIM_ENDPOINT is not set, no RPC device added\n");
        }
        return;
    }
    // the RPC client keeps the endpoint string (std::string copies), so a stack buffer is fine
    const char * p = list;
    while (*p != '\0') {
        const char * comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len > 0) {
            char endpoint[SHIM_MAX_ENDPOINT];
            if (len >= sizeof(endpoint)) {
                fprintf(stderr, "rpc_shim: endpoint too long\n");
                exit(3);
            }
            memcpy(endpoint, p, len);
            endpoint[len] = '\0';
            shim_add(endpoint, quiet);
        }
        if (comma == NULL) {
            break;
        }
        p = comma + 1;
    }
}
