//! Shared checks for the record fuzz targets.

#![allow(dead_code)]

use std::fmt::Debug;

use hostlink::records::RecordError;

/// Decoding arbitrary bytes never panics; whatever decodes encodes to text that decodes to
/// the same record, and encoding is a fixed point.
pub fn roundtrip<T: PartialEq + Debug>(
    data: &[u8],
    decode: fn(&[u8]) -> Result<T, RecordError>,
    encode: fn(&T) -> String,
) {
    if let Ok(record) = decode(data) {
        let text = encode(&record);
        let again = match decode(text.as_bytes()) {
            Ok(r) => r,
            Err(e) => panic!("an encoded record does not decode: {e}: {text}"),
        };
        assert_eq!(again, record);
        assert_eq!(encode(&again), text);
    }
}
