#![no_main]

//! The HTTP upgrade path's untrusted input: a query string and `Sec-WebSocket-Protocol`
//! header values (the input's lines after the first), as a client could send them. Selection
//! never panics and is a pure function of what was offered.

use hostlink::upgrade::{Protocol, select_protocol};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut lines = data.split(|b| *b == b'\n');
    let query_line = lines.next().unwrap_or_default();
    let query: Vec<(String, String)> = query_line
        .split(|b| *b == b'&')
        .map(|pair| {
            let mut kv = pair.splitn(2, |b| *b == b'=');
            let k = String::from_utf8_lossy(kv.next().unwrap_or_default()).into_owned();
            let v = String::from_utf8_lossy(kv.next().unwrap_or_default()).into_owned();
            (k, v)
        })
        .collect();
    let headers: Vec<&[u8]> = lines.collect();
    let first = select_protocol(&query, &headers);
    assert_eq!(first, select_protocol(&query, &headers));
    if let Protocol::Json { subprotocol: true } = first {
        assert!(
            headers
                .iter()
                .filter_map(|h| std::str::from_utf8(h).ok())
                .any(|h| h.contains(hostlink::upgrade::JSON_SUBPROTOCOL))
        );
    }
});
