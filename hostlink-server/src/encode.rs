//! The per-link hot path of enduring publications: one subscription's pushes encoded straight
//! into the outgoing frame, byte for byte what the record's own encoding inside a publication
//! push gives. Owns no state beyond the fixed head and tail of one subscription.

use std::fmt::Write as _;
use std::sync::Arc;

use hostlink::frame::StreamPosition;
use hostlink::json::push_json_string;
use sessionstore::{SessionId, TenantId};

use super::backend::StreamPublication;

/// The Centrifuge publication tag that names a push's record type.
pub const RECORD_TAG: &str = "record";
/// The tag value of an enduring record.
pub const ENDURING_RECORD: &str = "enduring_publication";
/// The tag value of a preview.
pub const EPHEMERAL_RECORD: &str = "ephemeral_publication";

/// Encodes one subscription's enduring pushes: byte for byte what
/// `encode_push(channel, &encode_publication(&record.encode(), Some(offset), &[(RECORD_TAG, ENDURING_RECORD)]))`
/// gives, with everything fixed for the subscription (channel, tenant, session, tags) encoded
/// once. The pump hands the record itself to the writer ([`Outbound::Enduring`]), which
/// encodes it straight into the frame it goes out in: on a session with many links this is
/// the per-link hot path, so it costs one copy of the body and no allocation of its own.
pub(crate) struct EnduringEncoder {
    /// `{"push":{"channel":…,"pub":{"data":{"tenant_id":…,"session_id":…,"event_id":`
    head: String,
    /// `,"tags":{"record":"enduring_publication"}}}}`
    tail: String,
}

/// Room for `,"journal_seq":N,"covered_through":N,"body":` and `},"offset":N` with three
/// 20-digit numbers.
const ENDURING_MIDDLE_BYTES: usize = 112;

impl EnduringEncoder {
    pub(crate) fn new(channel: &str, tenant: &TenantId, session: &SessionId) -> EnduringEncoder {
        let mut head = String::from(r#"{"push":{"channel":"#);
        push_json_string(&mut head, channel);
        head.push_str(r#","pub":{"data":{"tenant_id":"#);
        push_json_string(&mut head, tenant.as_str());
        head.push_str(r#","session_id":"#);
        push_json_string(&mut head, session.as_str());
        head.push_str(r#","event_id":"#);
        let mut tail = String::from(r#","tags":{"#);
        push_json_string(&mut tail, RECORD_TAG);
        tail.push(':');
        push_json_string(&mut tail, ENDURING_RECORD);
        tail.push_str("}}}}");
        EnduringEncoder { head, tail }
    }

    /// Encodes one session's enduring publications alone, as they go inside a subscribe or
    /// history reply: byte for byte
    /// `encode_publication(&record.encode(), Some(offset), &[(RECORD_TAG, ENDURING_RECORD)])`.
    pub(crate) fn publication(tenant: &TenantId, session: &SessionId) -> EnduringEncoder {
        let mut head = String::from(r#"{"data":{"tenant_id":"#);
        push_json_string(&mut head, tenant.as_str());
        head.push_str(r#","session_id":"#);
        push_json_string(&mut head, session.as_str());
        head.push_str(r#","event_id":"#);
        let mut tail = String::from(r#","tags":{"#);
        push_json_string(&mut tail, RECORD_TAG);
        tail.push(':');
        push_json_string(&mut tail, ENDURING_RECORD);
        tail.push_str("}}");
        EnduringEncoder { head, tail }
    }

    /// About how many bytes the push for `record` takes (exact unless the event id needs
    /// escaping): for sizing frames and batches.
    pub(crate) fn encoded_len(&self, publication: &StreamPublication) -> usize {
        let record = &publication.record;
        self.head.len()
            + record.event_id.as_str().len()
            + 2
            + ENDURING_MIDDLE_BYTES
            + record.body().get().len()
            + self.tail.len()
    }

    /// Appends the push for `publication`, which belongs to the encoder's tenant and session.
    pub(crate) fn encode_into(&self, out: &mut String, publication: &StreamPublication) {
        let record = &publication.record;
        let body = record.body().get();
        out.push_str(&self.head);
        push_json_string(out, record.event_id.as_str());
        let _ = write!(
            out,
            r#","journal_seq":{},"covered_through":{},"body":"#,
            record.journal_seq.get(),
            record.covered_through
        );
        // The SDKs split every message on line feeds: a raw line break (only ever
        // insignificant whitespace in valid JSON, and only the body can hold one) goes out as
        // a space, as `one_line` does.
        if body.as_bytes().contains(&b'\n') || body.as_bytes().contains(&b'\r') {
            out.extend(body.chars().map(|c| match c {
                '\n' | '\r' => ' ',
                c => c,
            }));
        } else {
            out.push_str(body);
        }
        let _ = write!(out, r#"}},"offset":{}"#, publication.offset);
        out.push_str(&self.tail);
    }

    #[cfg(test)]
    pub(crate) fn encode(&self, publication: &StreamPublication) -> String {
        let mut out = String::with_capacity(self.encoded_len(publication));
        self.encode_into(&mut out, publication);
        out
    }
}

/// The publications of a reply as one JSON array, each record's body copied once straight
/// into it (`[]` for none).
fn publications_array(
    out: &mut String,
    encoder: &EnduringEncoder,
    publications: &[Arc<StreamPublication>],
) {
    out.push('[');
    for (i, p) in publications.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        encoder.encode_into(out, p);
    }
    out.push(']');
}

fn reply_capacity(encoder: &EnduringEncoder, publications: &[Arc<StreamPublication>]) -> usize {
    128 + publications
        .iter()
        .map(|p| encoder.encoded_len(p) + 1)
        .sum::<usize>()
}

/// The reply to a subscribe on a recoverable stream, in one buffer: byte for byte
/// `hostlink::frame::encode_subscribe_reply` with each publication encoded by
/// `encode_publication(&record.encode(), Some(offset), [record tag])`, without encoding a
/// record twice or copying the recovered records from one string into the next.
pub(crate) fn subscribe_reply(
    id: u32,
    encoder: &EnduringEncoder,
    position: &StreamPosition,
    publications: &[Arc<StreamPublication>],
    recovering: Option<bool>,
) -> String {
    let mut out = String::with_capacity(reply_capacity(encoder, publications));
    let _ = write!(
        out,
        r#"{{"id":{id},"subscribe":{{"recoverable":true,"epoch":"#
    );
    push_json_string(&mut out, &position.epoch);
    let _ = write!(out, r#","offset":{}"#, position.offset);
    if !publications.is_empty() {
        out.push_str(r#","publications":"#);
        publications_array(&mut out, encoder, publications);
    }
    if let Some(recovered) = recovering {
        let _ = write!(out, r#","recovered":{recovered},"was_recovering":true"#);
    }
    out.push_str("}}");
    out
}

/// The reply to a history request, in one buffer: byte for byte
/// `hostlink::frame::encode_history_reply` (see [`subscribe_reply`]).
pub(crate) fn history_reply(
    id: u32,
    encoder: &EnduringEncoder,
    publications: &[Arc<StreamPublication>],
    position: &StreamPosition,
) -> String {
    let mut out = String::with_capacity(reply_capacity(encoder, publications));
    let _ = write!(out, r#"{{"id":{id},"history":{{"publications":"#);
    publications_array(&mut out, encoder, publications);
    out.push_str(r#","epoch":"#);
    push_json_string(&mut out, &position.epoch);
    let _ = write!(out, r#","offset":{}}}}}"#, position.offset);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hostlink::frame::{
        SubscribeResult, encode_history_reply, encode_publication, encode_subscribe_reply,
    };
    use hostlink::records::EnduringPublication;
    use serde_json::value::RawValue;
    use sessionstore::EventId;
    use std::num::NonZeroU64;

    fn publications(tenant: &TenantId, session: &SessionId) -> Vec<Arc<StreamPublication>> {
        let bodies = [
            r#"{"type":"assistant_message","text":"caf\u00e9 \"quoted\" \n é"}"#,
            "{\n  \"kind\": \"applied\",\r\n  \"n\": [1, 2]\n}",
            "42",
            r#""text""#,
        ];
        bodies
            .iter()
            .enumerate()
            .map(|(i, body)| {
                let seq = 3 * i as u64 + 1;
                Arc::new(StreamPublication {
                    offset: i as u64 + 1,
                    record: EnduringPublication::new(
                        tenant.clone(),
                        session.clone(),
                        EventId::new(format!("event-{i}")).unwrap(),
                        NonZeroU64::new(seq).unwrap(),
                        seq,
                        RawValue::from_string((*body).to_owned()).unwrap(),
                    )
                    .unwrap(),
                })
            })
            .collect()
    }

    fn generic(p: &StreamPublication) -> String {
        encode_publication(
            &p.record.encode(),
            Some(p.offset),
            &[(RECORD_TAG, ENDURING_RECORD)],
        )
    }

    #[test]
    fn replies_with_publications_are_what_the_generic_encoders_write() {
        let tenant = TenantId::new("tenant-1").unwrap();
        let session = SessionId::new("session-1").unwrap();
        let encoder = EnduringEncoder::publication(&tenant, &session);
        let all = publications(&tenant, &session);
        let position = StreamPosition {
            offset: 4,
            epoch: "0123abcd".into(),
        };
        for n in [0, 1, all.len()] {
            let pubs = &all[..n];
            let texts: Vec<String> = pubs.iter().map(|p| generic(p)).collect();
            for recovering in [None, Some(true), Some(false)] {
                let expected = encode_subscribe_reply(
                    7,
                    &SubscribeResult {
                        position: &position,
                        publications: &texts,
                        was_recovering: recovering.is_some(),
                        recovered: recovering.unwrap_or(false),
                    },
                );
                let ours = subscribe_reply(7, &encoder, &position, pubs, recovering);
                assert_eq!(ours, expected);
                assert!(!ours.contains(['\n', '\r']));
            }
            assert_eq!(
                history_reply(9, &encoder, pubs, &position),
                encode_history_reply(9, &texts, &position)
            );
        }
    }
}
