#![no_main]

#[path = "common/mod.rs"]
mod common;

use libfuzzer_sys::fuzz_target;
use hostlink::records::Delivery;

fuzz_target!(|data: &[u8]| {
    common::roundtrip(data, Delivery::decode, Delivery::encode);
});
