#![no_main]

#[path = "common/mod.rs"]
mod common;

use libfuzzer_sys::fuzz_target;
use hostlink::records::EphemeralPublication;

fuzz_target!(|data: &[u8]| {
    common::roundtrip(data, EphemeralPublication::decode, EphemeralPublication::encode);
});
