#![no_main]

#[path = "common/mod.rs"]
mod common;

use libfuzzer_sys::fuzz_target;
use hostlink::records::AttachRequest;

fuzz_target!(|data: &[u8]| {
    common::roundtrip(data, AttachRequest::decode, AttachRequest::encode);
});
