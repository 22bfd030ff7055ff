#![no_main]

#[path = "common/mod.rs"]
mod common;

use libfuzzer_sys::fuzz_target;
use hostlink::records::BindRequest;

fuzz_target!(|data: &[u8]| {
    common::roundtrip(data, BindRequest::decode, BindRequest::encode);
});
