//! The default department `hostd serve` runs: a scripted agent (`assistant`, always) whose
//! small grammar drives every path without a model service, and an OpenAI-compatible agent
//! (`openai`) when an endpoint and a key are configured. Owns their agent ids, builds and
//! tools; never holds a key longer than the model client does.

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

fn tools() -> Result<ToolRegistry, String> {
    let tools: Vec<Arc<dyn Tool>> = vec![
        Arc::new(EchoTool::new("echo", false)),
        // Stands for any tool with an effect: it asks for permission before it runs.
        Arc::new(EchoTool::new("write_note", true)),
    ];
    ToolRegistry::new(tools).map_err(|e| e.to_string())
}

/// The default registrar.
pub struct DefaultDepartment {
    pub openai: Option<OpenAiConfig>,
    pub permission_timeout: Duration,
}

#[async_trait::async_trait]
impl Registrar for DefaultDepartment {
    async fn register(&self, store: &Store) -> Result<Vec<Registration>, String> {
        let mut regs = Vec::new();
        let mut scripted = AgentConfig::new(
            Arc::new(ScriptedModel::new().with_delta_delay(Duration::from_millis(20))),
            tools()?,
        );
        scripted.permission_timeout = self.permission_timeout;
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
            let mut agent = AgentConfig::new(Arc::new(model), tools()?);
            agent.permission_timeout = self.permission_timeout;
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
