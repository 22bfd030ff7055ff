#![no_main]

#[path = "common/mod.rs"]
mod common;

use libfuzzer_sys::fuzz_target;
use hostlink::records::RegistryObservation;

fuzz_target!(|data: &[u8]| {
    common::roundtrip(data, RegistryObservation::decode, RegistryObservation::encode);
});
