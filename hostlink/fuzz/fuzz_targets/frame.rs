#![no_main]

use libfuzzer_sys::fuzz_target;
use hostlink::frame::{
    DEFAULT_MAX_FRAME_BYTES, Inbound, MAX_COMMANDS_PER_FRAME, Request, decode_frame,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(inbound) = decode_frame(data, DEFAULT_MAX_FRAME_BYTES) {
        assert!(!inbound.is_empty() && inbound.len() <= MAX_COMMANDS_PER_FRAME);
        for item in inbound {
            if let Inbound::Command(c) = item {
                // Only `send` may go without an id.
                assert!(c.id > 0 || matches!(c.request, Request::Send));
            }
        }
    }
});
