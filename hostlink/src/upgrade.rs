//! What an HTTP upgrade request to `/hostlink/{tenant}` asks for, decided from untrusted
//! bytes before the WebSocket exists: which protocol (JSON, with or without naming the
//! `centrifuge-json` subprotocol) or a refusal. Selection follows Centrifuge servers: no
//! subprotocol, `centrifuge-json`, `format=json` or `cf_protocol=json` is JSON;
//! `centrifuge-protobuf`, `format=protobuf` and any protocol version but `v2` are refused.
//! Pure: never reads a socket; header values arrive as the raw bytes a client sent.

/// The JSON subprotocol name.
pub const JSON_SUBPROTOCOL: &str = "centrifuge-json";
/// The Protobuf subprotocol name (refused: not implemented).
pub const PROTOBUF_SUBPROTOCOL: &str = "centrifuge-protobuf";

/// What the request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// JSON; `subprotocol` when the client offered `centrifuge-json` (the answer then names
    /// it).
    Json { subprotocol: bool },
    /// Something this Host does not speak, and why.
    Refused(&'static str),
}

/// Decides the protocol from the query pairs and the raw `Sec-WebSocket-Protocol` header
/// values (each a comma-separated list; values that are not text are ignored).
pub fn select_protocol(query: &[(String, String)], offered: &[&[u8]]) -> Protocol {
    for (key, value) in query {
        match key.as_str() {
            "format" | "cf_protocol" => match value.as_str() {
                "json" => {}
                "protobuf" => return Protocol::Refused("the protobuf protocol is not served"),
                _ => return Protocol::Refused("unknown protocol format"),
            },
            "cf_protocol_version" if value != "v2" => {
                return Protocol::Refused("only Centrifuge protocol v2 is served");
            }
            _ => {}
        }
    }
    let names = || {
        offered
            .iter()
            .filter_map(|v| std::str::from_utf8(v).ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|p| !p.is_empty())
    };
    if names().any(|p| p == JSON_SUBPROTOCOL) {
        return Protocol::Json { subprotocol: true };
    }
    if names().any(|p| p == PROTOBUF_SUBPROTOCOL) {
        return Protocol::Refused("the protobuf protocol is not served");
    }
    Protocol::Json { subprotocol: false }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Vec<(String, String)> {
        s.split('&')
            .map(|p| match p.split_once('=') {
                Some((k, v)) => (k.to_owned(), v.to_owned()),
                None => (p.to_owned(), String::new()),
            })
            .collect()
    }

    #[test]
    fn json_is_chosen_by_default_by_the_subprotocol_or_by_the_query() {
        assert_eq!(
            select_protocol(&[], &[]),
            Protocol::Json { subprotocol: false }
        );
        assert_eq!(
            select_protocol(&[], &[b"foo, centrifuge-json"]),
            Protocol::Json { subprotocol: true }
        );
        assert_eq!(
            select_protocol(&q("format=json&cf_protocol_version=v2"), &[]),
            Protocol::Json { subprotocol: false }
        );
    }

    #[test]
    fn protobuf_unknown_formats_and_other_versions_are_refused() {
        for query in [
            "format=protobuf",
            "cf_protocol=xml",
            "cf_protocol_version=v1",
        ] {
            assert!(
                matches!(select_protocol(&q(query), &[]), Protocol::Refused(_)),
                "{query}"
            );
        }
        assert!(matches!(
            select_protocol(&[], &[b"centrifuge-protobuf"]),
            Protocol::Refused(_)
        ));
        // Bytes that are not text offer nothing.
        assert_eq!(
            select_protocol(&[], &[b"\xff\xfe"]),
            Protocol::Json { subprotocol: false }
        );
    }
}
