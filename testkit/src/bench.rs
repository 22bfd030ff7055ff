//! What the Host benches share (host's `commands`, `idle`, `soak` and `fanout`; the
//! `system-tests` benches): a Host composed over a bench's store with the real harness and its
//! scripted model, sessions attached and fed inputs the way a controller does, and the Host's
//! own count of applied inputs. Everything a bench needs below a Host (the backends asked for,
//! a runtime, a database per backend, a session to measure on, `/proc` readings, medians,
//! fits, the load average) is `sessionstore::testing`'s, re-exported here so that a Host bench
//! imports one module.
//!
//! It measures nothing on its own and asserts nothing about a figure; what a bench measures
//! and prints stays in the bench.

use std::sync::Arc;
use std::time::Duration;

use department::{LaunchMode, Registration, RuntimeProfile};
use harness::model::ScriptedModel;
use harness::tool::ToolRegistry;
use harness::{AgentConfig, HarnessTarget};
use host::{AttachRequest, Composition, Options, Registrar, Service};
use sessionstore::wire::{CommandBodyV1, encode_command_body};
use sessionstore::{
    AgentId, CommandBody, CommandId, CommandKind, CommandRecord, CompatibilityId, HostId,
    NewCommand, SessionRecord, Store, StoreOptions,
};

pub use sessionstore::testing::bench::*;
pub use sessionstore::testing::new_session;

/// Registers one agent, `assistant`: the harness with the scripted model and no tools, at the
/// build `compatibility`, journaling into the Host's own store.
pub struct ScriptedAgent {
    pub compatibility: String,
}

#[async_trait::async_trait]
impl Registrar for ScriptedAgent {
    async fn register(&self, store: &Store) -> Result<Vec<Registration>, String> {
        let agent = AgentConfig::new(
            Arc::new(ScriptedModel::new()),
            ToolRegistry::new(vec![]).map_err(|e| e.to_string())?,
        );
        let compatibility = CompatibilityId::new(&self.compatibility).map_err(|e| e.to_string())?;
        let target =
            HarnessTarget::new(store.clone(), agent, compatibility).map_err(|e| e.to_string())?;
        Ok(vec![Registration {
            agent: AgentId::new("assistant").map_err(|e| e.to_string())?,
            target: Arc::new(target),
        }])
    }
}

/// A bench Host's options: the id `host_id` and a placeholder internal endpoint (benches
/// serve no listener); the rest as shipped, for the bench to adjust.
pub fn host_options(host_id: &str) -> Options {
    Options {
        host_id: Some(HostId::new(host_id).expect("a host id")),
        internal_endpoint: Some("ws://127.0.0.1:7400".into()),
        ..Options::default()
    }
}

/// Composes and starts a Host over `store` with [`ScriptedAgent`] at the build `build`, which
/// is also the version it reports. Panics when it does not compose or start.
pub async fn start_host(options: Options, store: StoreOptions, build: &str) -> Service {
    let svc = Composition {
        options,
        store,
        registrar: Box::new(ScriptedAgent {
            compatibility: build.into(),
        }),
        profile: RuntimeProfile::Durable,
        version: build.into(),
    }
    .build()
    .await
    .expect("the bench's Host composes");
    svc.start().await.expect("the bench's Host starts");
    svc
}

/// The attach of session `s` in `mode`, without an actor.
pub fn attach_request(s: &SessionRecord, mode: LaunchMode) -> AttachRequest {
    AttachRequest {
        tenant: s.tenant.clone(),
        session: s.session.clone(),
        agent: s.agent.clone(),
        compatibility: Some(s.compatibility.clone()),
        mode,
        actor: None,
        trace: None,
    }
}

/// Admits the input `hello` as `command` into session `s`, as a controller does (no
/// principal, an hour to apply it). Panics when the store refuses.
pub async fn admit_input(store: &Store, s: &SessionRecord, command: CommandId) -> CommandRecord {
    store
        .admit(NewCommand {
            tenant: s.tenant.clone(),
            session: s.session.clone(),
            command,
            kind: CommandKind::Input,
            body: CommandBody::Inline(encode_command_body(&CommandBodyV1::Input {
                text: "hello".into(),
            })),
            principal: None,
            metadata: None,
            apply_within: Duration::from_secs(3600),
            trace: None,
        })
        .await
        .expect("admit")
}

/// How many inputs the Host has applied so far: its own in-memory count (the sample count of
/// `host_command_apply_seconds{kind="input"}`), read without touching the store.
pub fn inputs_applied(svc: &Service) -> u64 {
    svc.metrics()
        .apply_seconds
        .with_label_values(&["input"])
        .get_sample_count()
}
