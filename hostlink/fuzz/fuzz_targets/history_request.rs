#![no_main]

use hostlink::frame::{HistoryRequest, Inbound, Request, decode_frame};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let direct = HistoryRequest::decode(data);
    // The request object decodes alike on its own and inside a history line.
    if let Ok(text) = std::str::from_utf8(data)
        && !text.contains('\n')
    {
        let line = format!(r#"{{"id":1,"history":{text}}}"#);
        match decode_frame(line.as_bytes(), usize::MAX) {
            Ok(mut inbound) => {
                let Some(Inbound::Command(c)) = inbound.pop() else {
                    panic!("a history line decoded to something else");
                };
                let Request::History(h) = c.request else {
                    panic!("a history line decoded to another request");
                };
                assert_eq!(Some(&h), direct.as_ref().ok());
            }
            Err(_) => assert!(direct.is_err()),
        }
    }
});
