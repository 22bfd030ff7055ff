//! The per-link hot path of enduring publications: one subscription's pushes encoded straight
//! into the outgoing frame, byte for byte what the record's own encoding inside a publication
//! push gives. Owns no state beyond the fixed head and tail of one subscription.

use std::fmt::Write as _;

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
        // The SDKs split every message on line feeds: a raw line break (only ever insignificant whitespace in
        // valid JSON, and only the body can hold one) goes out as a space, as `one_line` does.
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
