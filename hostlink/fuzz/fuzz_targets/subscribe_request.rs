#![no_main]

use hostlink::frame::{Inbound, Request, SubscribeRequest, decode_frame};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let direct = SubscribeRequest::decode(data);
    // The request object decodes alike on its own and inside a subscribe line.
    if let Ok(text) = std::str::from_utf8(data)
        && !text.contains('\n')
    {
        let line = format!(r#"{{"id":1,"subscribe":{text}}}"#);
        match decode_frame(line.as_bytes(), usize::MAX) {
            Ok(mut inbound) => {
                let Some(Inbound::Command(c)) = inbound.pop() else {
                    panic!("a subscribe line decoded to something else");
                };
                let Request::Subscribe(s) = c.request else {
                    panic!("a subscribe line decoded to another request");
                };
                let d = direct.as_ref().expect("the line decoded but the object did not");
                assert_eq!(s.channel, d.channel);
                assert_eq!(s.recover, d.recover);
            }
            Err(_) => assert!(direct.is_err()),
        }
    }
});
