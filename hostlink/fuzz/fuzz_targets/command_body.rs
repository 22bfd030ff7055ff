#![no_main]

//! Command bodies as a controller admits them (untrusted bytes, checked strictly by the Host
//! before any attempt): decoding never panics, for every command kind, and whatever decodes
//! encodes to a body that decodes to the same command.

use libfuzzer_sys::fuzz_target;
use sessionstore::wire::{decode_command_body, encode_command_body};
use sessionstore::{CommandId, CommandKind, SessionId};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, bytes)) = data.split_first() else {
        return;
    };
    let kinds = CommandKind::ALL;
    let kind = kinds[usize::from(selector) % kinds.len()];
    let (Ok(session), Ok(command)) = (SessionId::new("s-fuzz"), CommandId::new("c-fuzz")) else {
        return;
    };
    if let Ok(body) = decode_command_body(kind, bytes, &session, &command) {
        let again = encode_command_body(&body);
        match decode_command_body(body.kind(), &again, &session, &command) {
            Ok(b) => assert_eq!(b, body),
            Err(e) => panic!("an encoded body does not decode: {e}"),
        }
    }
});
