#![no_main]

#[path = "common/mod.rs"]
mod common;

use libfuzzer_sys::fuzz_target;
use hostlink::records::DrainObservation;

fuzz_target!(|data: &[u8]| {
    common::roundtrip(data, DrainObservation::decode, DrainObservation::encode);
});
