//! Runnables: typed, versioned finite operations. A folder `runnables/<x>/` of a workspace
//! declares one in `runnable.yaml` (name, version, input and output schemas in a bounded
//! profile, a native command, a timeout and an effect class); `build` packages the folder into
//! one file named by a SHA-256 digest; `invoke` runs a verified package once in its own process
//! group and classifies what happened into one of six outcomes, only two of them certain. An
//! agent can be given runnables as tools; a workflow step invokes them through [`Runner`].
//!
//! Submodules, each owning one concern: [`identity`] (names and references), [`declaration`]
//! (reading `runnable.yaml`), [`schema`] (the bounded schema profile: read from YAML with
//! `Schema::read`, which workflow answer schemas use too, rendered, checked), [`workspace`]
//! (discovery and the one resolver), [`package`] (digest, package file, recorded releases,
//! cache), [`release`] (a verified, unpacked release), [`deps`] (flow dependencies), [`outcome`]
//! (the pure classifier), [`invoke`](mod@invoke) (the handler's process), [`guard`] (what
//! stops a handler whose invoker died), [`projection`]
//! (list/show/tool views), [`runner`] (the library entry point), [`tool`] (the agent tool
//! adapter) and [`error`] (the vocabulary of refusal).
//!
//! Nothing here reaches a session store: publishing packages is the store's own module, and
//! `hostd` moves the bytes between the two.

#![forbid(unsafe_code)]

pub mod declaration;
pub mod deps;
pub mod error;
pub mod guard;
pub mod identity;
pub mod invoke;
pub mod outcome;
pub mod package;
pub mod projection;
pub mod recorded;
pub mod release;
pub mod runner;
pub mod schema;
pub mod tool;
pub mod workspace;

pub use declaration::{Declaration, DependencyDecl, Effect};
pub use error::{DeclarationProblem, HandlerError, RunnableError, Violation};
pub use identity::{Identity, Reference};
pub use invoke::{Invocation, InvokeOptions, InvokeRequest, effect_id, invoke, stop_orphans};
pub use outcome::{OutcomeClass, classify};
pub use package::{Built, Destination, Digest, Package};
pub use release::Release;
pub use runner::Runner;
pub use schema::Schema;
pub use tool::RunnableTool;
pub use workspace::{Catalog, Workspace, resolve};
