//! Tenant credentials that change without a restart. Owns the credentials in force, the
//! reading of their sources again (the credential file, the key files its `jwt` lines name,
//! the environment value read at start), the signal to every link that they changed, and the
//! count of refusals by reason. A new version that does not load is refused whole (with its
//! line number) and the one in force stays. Never logs a token.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use sessionstore::TenantId;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::auth::{AuthRefused, AuthVerifier, CredentialError, CredentialStore, Grant};
use crate::jwt::RefusalReason;

/// How often a Host looks at its credential sources for a change: well within the 2 s in
/// which a removed or replaced credential's links must close.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// What the sources held when last read: each file's path and the SHA-256 of its bytes
/// (`None`: it could not be read).
type Stamps = Vec<(PathBuf, Option<[u8; 32]>)>;

fn stamp(paths: impl IntoIterator<Item = PathBuf>) -> Stamps {
    paths
        .into_iter()
        .map(|p| {
            let digest = std::fs::read(&p).ok().map(|b| Sha256::digest(&b).into());
            (p, digest)
        })
        .collect()
}

/// The credentials in force, reloadable.
pub struct LiveCredentials {
    file: Option<PathBuf>,
    env_value: Option<String>,
    current: RwLock<Arc<CredentialStore>>,
    /// The sources as last read, whether that version was taken or refused (so a refused
    /// version is reported once, not at every poll).
    seen: Mutex<Stamps>,
    changes: watch::Sender<u64>,
    refusals: Vec<AtomicU64>,
}

impl std::fmt::Debug for LiveCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveCredentials")
            .field("file", &self.file)
            .field("current", &self.current())
            .finish()
    }
}

impl LiveCredentials {
    /// Loads from a credential file and/or an environment value (see [`CredentialStore::load`]);
    /// both are read again by [`LiveCredentials::reload`].
    pub fn load(
        file: Option<PathBuf>,
        env_value: Option<String>,
    ) -> Result<LiveCredentials, CredentialError> {
        let store = CredentialStore::load(file.as_deref(), env_value.as_deref())?;
        let live = LiveCredentials::fixed(store);
        Ok(LiveCredentials {
            file,
            env_value,
            ..live
        }
        .with_stamps())
    }

    /// Credentials with no source to read again: a reload keeps them as they are.
    pub fn fixed(store: CredentialStore) -> LiveCredentials {
        LiveCredentials {
            file: None,
            env_value: None,
            current: RwLock::new(Arc::new(store)),
            seen: Mutex::new(Vec::new()),
            changes: watch::channel(0).0,
            refusals: RefusalReason::ALL
                .iter()
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
        .with_stamps()
    }

    fn with_stamps(self) -> LiveCredentials {
        let stamps = self.read_stamps();
        if let Ok(mut seen) = self.seen.lock() {
            *seen = stamps;
        }
        self
    }

    fn read_stamps(&self) -> Stamps {
        let keys = self.current().key_files().to_vec();
        stamp(self.file.clone().into_iter().chain(keys))
    }

    /// The credentials in force now.
    pub fn current(&self) -> Arc<CredentialStore> {
        match self.current.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Reads the sources again. On success the new credentials are in force and every link
    /// verifies its token again; on failure nothing changes and the error says why (with the
    /// line number).
    pub fn reload(&self) -> Result<(), CredentialError> {
        let loaded = CredentialStore::load(self.file.as_deref(), self.env_value.as_deref());
        let stamps = {
            // What is read now, with the key files of whichever version results.
            let keys = match &loaded {
                Ok(store) => store.key_files().to_vec(),
                Err(_) => self.current().key_files().to_vec(),
            };
            stamp(self.file.clone().into_iter().chain(keys))
        };
        if let Ok(mut seen) = self.seen.lock() {
            *seen = stamps;
        }
        let store = loaded?;
        match self.current.write() {
            Ok(mut c) => *c = Arc::new(store),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(store),
        }
        self.changes.send_modify(|n| *n += 1);
        Ok(())
    }

    /// Whether a source differs from when it was last read.
    pub fn sources_changed(&self) -> bool {
        let seen = match self.seen.lock() {
            Ok(s) => s.clone(),
            Err(p) => p.into_inner().clone(),
        };
        let now = stamp(seen.iter().map(|(p, _)| p.clone()));
        now != seen
    }

    /// Polls the sources every `interval` and reloads when one changed, logging the outcome;
    /// runs until dropped.
    pub async fn follow(self: Arc<Self>, interval: Duration) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if self.sources_changed() {
                self.reload_and_log("a credential source changed");
            }
        }
    }

    /// Reloads and logs the outcome (the cause says why the reload was asked for).
    pub fn reload_and_log(&self, cause: &str) {
        match self.reload() {
            Ok(()) => tracing::info!(
                cause,
                tenants = self.current().len(),
                "tenant credentials reloaded"
            ),
            Err(error) => tracing::warn!(
                cause,
                %error,
                "the new tenant credentials were refused; the ones in force stay"
            ),
        }
    }

    /// Refusals so far, by reason (every reason, zeros included).
    pub fn refusal_counts(&self) -> Vec<(RefusalReason, u64)> {
        RefusalReason::ALL
            .iter()
            .zip(&self.refusals)
            .map(|(r, n)| (*r, n.load(Ordering::Relaxed)))
            .collect()
    }

    fn count(&self, reason: RefusalReason) {
        if let Some(i) = RefusalReason::ALL.iter().position(|r| *r == reason)
            && let Some(n) = self.refusals.get(i)
        {
            n.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[async_trait]
impl AuthVerifier for LiveCredentials {
    async fn verify(&self, tenant: &TenantId, token: &str) -> Result<Grant, AuthRefused> {
        let result = self.current().check(tenant, token);
        if let Err(refused) = &result {
            self.count(refused.reason());
        }
        result
    }

    fn changes(&self) -> Option<watch::Receiver<u64>> {
        Some(self.changes.subscribe())
    }

    fn refusal_counts(&self) -> Vec<(RefusalReason, u64)> {
        LiveCredentials::refusal_counts(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::credential_digest_hex;

    fn t(s: &str) -> TenantId {
        TenantId::new(s).unwrap()
    }

    #[tokio::test]
    async fn a_changed_file_is_taken_and_a_broken_one_refused_with_the_old_kept() {
        let dir = std::env::temp_dir().join(format!("hostlink-live-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("credentials");
        std::fs::write(&file, format!("acme {}\n", credential_digest_hex("one"))).unwrap();
        let live = LiveCredentials::load(Some(file.clone()), None).unwrap();
        let mut changes = live.changes().unwrap();
        assert!(live.verify(&t("acme"), "one").await.is_ok());
        assert!(!live.sources_changed());

        std::fs::write(&file, format!("acme {}\n", credential_digest_hex("two"))).unwrap();
        assert!(live.sources_changed());
        live.reload().unwrap();
        assert!(changes.has_changed().unwrap());
        changes.mark_unchanged();
        assert!(live.verify(&t("acme"), "one").await.is_err());
        assert!(live.verify(&t("acme"), "two").await.is_ok());

        std::fs::write(&file, "acme not-a-digest\n").unwrap();
        let err = live.reload().unwrap_err().to_string();
        assert!(err.contains("entry 1"), "{err}");
        assert!(!changes.has_changed().unwrap());
        assert!(
            !live.sources_changed(),
            "a refused version is not reported again"
        );
        assert!(live.verify(&t("acme"), "two").await.is_ok());

        let counts = live.refusal_counts();
        let wrong = counts
            .iter()
            .find(|(r, _)| *r == RefusalReason::WrongToken)
            .unwrap();
        assert_eq!(wrong.1, 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
