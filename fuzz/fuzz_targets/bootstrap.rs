//! See `proto_core_fuzz::boot` (star mode) and `proto_core_fuzz::ranked` (ranked mode) for the
//! input layouts and the invariants checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    proto_core_fuzz::boot::fuzz(data);
});
