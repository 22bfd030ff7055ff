//! The default department `hostd serve` runs: a scripted agent (`assistant`, always) whose
//! small grammar drives every path without a model service, and an OpenAI-compatible agent
//! (`openai`) when an endpoint and a key are configured. Owns their agent ids, builds and
//! tools; never holds a key longer than the model client does. Runnables offered with
//! `--runnables`/`--runnable-tool` join every agent's tools.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use department::Registration;
use harness::model::{OpenAiConfig, OpenAiModel, ScriptedModel};
use harness::tool::{EchoTool, Tool, ToolRegistry};
use harness::{AgentConfig, HarnessTarget};
use host::Registrar;
use sessionstore::{AgentId, CompatibilityId, Store};

/// The scripted agent's id and build.
pub const SCRIPTED_AGENT: &str = "assistant";
pub const SCRIPTED_BUILD: &str = "hostd-scripted-1";
/// The OpenAI-compatible agent's id and build.
pub const OPENAI_AGENT: &str = "openai";
pub const OPENAI_BUILD: &str = "hostd-openai-1";

fn tools(extra: &[Arc<dyn Tool>]) -> Result<ToolRegistry, String> {
    let mut tools: Vec<Arc<dyn Tool>> = vec![
        Arc::new(EchoTool::new("echo", false)),
        // Stands for any tool with an effect: it asks for permission before it runs.
        Arc::new(EchoTool::new("write_note", true)),
    ];
    tools.extend(extra.iter().cloned());
    ToolRegistry::new(tools).map_err(|e| format!("agent tools: {e}"))
}

/// Runnables the agents are offered as tools.
#[derive(Debug, Clone, Default)]
pub struct RunnableOffer {
    /// A runnables workspace (`--runnables`).
    pub workspace: Option<PathBuf>,
    /// What to offer (`--runnable-tool`): `name[@version]` from the workspace, or
    /// `workspace/name@version` published in the session store. Empty with a workspace: all
    /// of the workspace's runnables.
    pub tools: Vec<String>,
    /// Where published packages are unpacked, and their logs and running records kept.
    pub state_dir: PathBuf,
}

impl RunnableOffer {
    /// Builds the offered tools: workspace releases are recorded and unpacked; published ones
    /// are fetched from the store, verified against their digest and unpacked. (Handlers a
    /// crashed predecessor left running were stopped at boot, before any invocation.)
    async fn build(&self, store: &Store) -> Result<Vec<Arc<dyn Tool>>, String> {
        use ::runnable::{InvokeOptions, Reference, Release, RunnableTool, Runner};
        if self.workspace.is_none() && self.tools.is_empty() {
            return Ok(Vec::new());
        }
        let runner = match &self.workspace {
            Some(dir) => Some(Runner::open(dir).map_err(|e| format!("--runnables: {e}"))?),
            None => None,
        };
        let options = Arc::new(InvokeOptions::default());
        let mut releases = Vec::new();
        match (&runner, self.tools.is_empty()) {
            (Some(r), true) => {
                let catalog = r.catalog().map_err(|e| format!("--runnables: {e}"))?;
                for decl in &catalog.runnables {
                    releases.push(
                        r.release_of(decl)
                            .map_err(|e| format!("[{}] {e}", e.code()))?,
                    );
                }
            }
            _ => {
                for text in &self.tools {
                    let reference = Reference::parse(text)
                        .map_err(|e| format!("--runnable-tool {text}: {e}"))?;
                    let local = runner.as_ref().filter(|r| {
                        reference
                            .workspace
                            .as_ref()
                            .is_none_or(|w| *w == r.workspace().name)
                    });
                    let release = match (local, &reference.workspace, &reference.version) {
                        (Some(r), _, _) => r
                            .release(text)
                            .map_err(|e| format!("--runnable-tool {text}: [{}] {e}", e.code()))?,
                        (None, Some(w), Some(v)) => {
                            let stored = store
                                .package(w, &reference.name, v)
                                .await
                                .map_err(|e| format!("--runnable-tool {text}: {e}"))?
                                .ok_or_else(|| format!("--runnable-tool {text}: [not_found] no such release is published (hostd runnable publish)"))?;
                            let digest = ::runnable::Digest::parse(&stored.summary.digest)
                                .ok_or_else(|| format!("--runnable-tool {text}: [integrity] the store records an unreadable digest"))?;
                            Release::from_bytes(&stored.bytes, Some(&digest), &self.state_dir, None)
                                .map_err(|e| {
                                    format!("--runnable-tool {text}: [{}] {e}", e.code())
                                })?
                        }
                        _ => {
                            return Err(format!(
                                "--runnable-tool {text}: name a published release as workspace/name@version, or give --runnables <dir>"
                            ));
                        }
                    };
                    releases.push(release);
                }
            }
        }
        let mut out: Vec<Arc<dyn Tool>> = Vec::new();
        for release in releases {
            tracing::info!(runnable = %release.identity(), digest = %release.digest(), effect = release.effect().as_str(), "offering a runnable as a tool");
            let tool = RunnableTool::new(release, options.clone()).map_err(|e| e.to_string())?;
            out.push(Arc::new(tool));
        }
        Ok(out)
    }
}

impl DefaultDepartment {
    fn bound(&self, agent: &mut AgentConfig) {
        (
            agent.snapshot_every,
            agent.conversation_turns,
            agent.conversation_bytes,
        ) = self.session_bounds;
    }
}

/// The default registrar.
pub struct DefaultDepartment {
    pub openai: Option<OpenAiConfig>,
    pub permission_timeout: Duration,
    /// The bounds on what a session keeps: (snapshot cadence, conversation turns, bytes).
    pub session_bounds: (u64, usize, usize),
    pub runnables: RunnableOffer,
}

#[async_trait::async_trait]
impl Registrar for DefaultDepartment {
    async fn register(&self, store: &Store) -> Result<Vec<Registration>, String> {
        let mut regs = Vec::new();
        let runnable_tools = self.runnables.build(store).await?;
        let mut scripted = AgentConfig::new(
            Arc::new(ScriptedModel::new().with_delta_delay(Duration::from_millis(20))),
            tools(&runnable_tools)?,
        );
        scripted.permission_timeout = self.permission_timeout;
        self.bound(&mut scripted);
        regs.push(Registration {
            agent: AgentId::new(SCRIPTED_AGENT).map_err(|e| e.to_string())?,
            target: Arc::new(
                HarnessTarget::new(
                    store.clone(),
                    scripted,
                    CompatibilityId::new(SCRIPTED_BUILD).map_err(|e| e.to_string())?,
                )
                .map_err(|e| e.to_string())?,
            ),
        });
        if let Some(cfg) = &self.openai {
            let model = OpenAiModel::new(cfg.clone()).map_err(|e| format!("openai agent: {e}"))?;
            let mut agent = AgentConfig::new(Arc::new(model), tools(&runnable_tools)?);
            agent.permission_timeout = self.permission_timeout;
            self.bound(&mut agent);
            agent.system_prompt = Some("You are a helpful assistant running inside hostd.".into());
            regs.push(Registration {
                agent: AgentId::new(OPENAI_AGENT).map_err(|e| e.to_string())?,
                target: Arc::new(
                    HarnessTarget::new(
                        store.clone(),
                        agent,
                        CompatibilityId::new(OPENAI_BUILD).map_err(|e| e.to_string())?,
                    )
                    .map_err(|e| e.to_string())?,
                ),
            });
        }
        Ok(regs)
    }
}

/// The build an agent of the default department runs.
pub fn build_of(agent: &str) -> Option<&'static str> {
    match agent {
        SCRIPTED_AGENT => Some(SCRIPTED_BUILD),
        OPENAI_AGENT => Some(OPENAI_BUILD),
        _ => None,
    }
}
