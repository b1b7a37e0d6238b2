//! See `proto_core_fuzz::boot` for the input layout and the invariants checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = proto_core_fuzz::boot::run(data);
});
