#![no_main]

use hostlink::auth::CredentialStore;
use hostlink::jwt::{JwtAlgorithm, JwtKeys, JwtRules, JwtVerifier, decode_unverified};
use jsonwebtoken::DecodingKey;
use libfuzzer_sys::fuzz_target;
use sessionstore::TenantId;

// The JWT header/claims decoder a link's token meets before any signature check, and the whole
// check behind it: arbitrary text must never panic, a decoded token's parts must be the JSON
// they claim, and nothing unsigned by the key may pass.
fuzz_target!(|data: &[u8]| {
    let Ok(token) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(read) = decode_unverified(token) {
        let header: serde_json::Value = serde_json::from_str(&read.header_json).unwrap();
        assert!(header["alg"].is_string());
        let _: serde_json::Value = serde_json::from_str(&read.claims_json).unwrap();
    }
    let verifier = JwtVerifier {
        keys: JwtKeys::Single(
            JwtAlgorithm::Hs256,
            DecodingKey::from_secret(b"a fuzzing secret of thirty-two bytes at least"),
        ),
        rules: JwtRules::default(),
        key_file: "fuzz".into(),
    };
    // The fuzzer cannot forge an HMAC: every input is refused.
    assert!(verifier.verify("acme", token, 1_800_000_000).is_err());
    let mut store = CredentialStore::empty();
    store
        .add_jwt(TenantId::new("acme").unwrap(), verifier)
        .unwrap();
    assert!(
        store
            .check_at(&TenantId::new("acme").unwrap(), token, 1_800_000_000)
            .is_err()
    );
});
