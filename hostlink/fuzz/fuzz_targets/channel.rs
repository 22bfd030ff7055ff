#![no_main]

use libfuzzer_sys::fuzz_target;
use hostlink::channel::{parse_session_channel, session_channel};

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok((tenant, session)) = parse_session_channel(text)
    {
        // Only the canonical spelling parses.
        assert_eq!(session_channel(&tenant, &session), text);
    }
});
