//! See `proto_core_fuzz::compute` for the input layout and what is checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = proto_core_fuzz::compute::run(data);
});
