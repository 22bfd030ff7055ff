#![no_main]

use libfuzzer_sys::fuzz_target;
use hostlink::auth::CredentialStore;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = CredentialStore::empty().add_file_text("fuzz", text);
        let _ = CredentialStore::empty().add_env_value(text);
    }
});
