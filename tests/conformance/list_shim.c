// list_shim.c - list test-backend-ops' test cases in test-mode order without computing.
//
// LD_PRELOADed into test-backend-ops (b11434), this library interposes the public
// ggml_backend_supports_op() and answers "no" for every tensor. In `test` mode every
// selected case then prints `  OP(params): not supported [CPU, CPU] ` at once, in the
// exact order in which a real run evaluates them, fused ("whole graph") cases included.
// (`test-backend-ops support` cannot be used for this: it leaves the fused cases out.)
//
//   LD_PRELOAD=./liblist_shim.so test-backend-ops test -b CPU -o ADD
//
// scripts/conformance/tbo_run.py uses the list to tell which case a crashed or hung
// test-backend-ops process was running and to resume after it. Nothing is sent anywhere.
//
// Build: cc -shared -fPIC -O2 -o liblist_shim.so list_shim.c -I$LLAMA_B11434_INCLUDE

#include <stdbool.h>

#include "ggml-backend.h"

bool ggml_backend_supports_op(ggml_backend_t backend, const struct ggml_tensor * op) {
    (void) backend;
    (void) op;
    return false;
}
