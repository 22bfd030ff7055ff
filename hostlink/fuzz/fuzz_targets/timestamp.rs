#![no_main]

use libfuzzer_sys::fuzz_target;
use hostlink::timestamp::Timestamp;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(t) = Timestamp::parse(text)
    {
        assert_eq!(Timestamp::parse(&t.to_string()), Ok(t));
    }
});
