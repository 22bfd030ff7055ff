//! The workspace format: `flow.yaml` naming services, each declared inline or in
//! `services/<name>/service.yaml`, parsed strictly into typed manifests.
//!
//! This module owns reading and validating declarations, and every refusal names the file,
//! the service and the reason. It must never touch a process, a port or the state folder, and
//! it must never guess: an unknown key, a dangling name or a contradictory edge is refused
//! rather than ignored.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use strict_yaml::read::{self, Map, Problem, ProblemKind};
use strict_yaml::{Node, Resolved};
use wire_enum::wire_enum;

use crate::error::{ManifestError, ManifestProblem};
use crate::restart::{RestartPolicy, RestartSpec};

/// The file every workspace starts from.
pub const FLOW_FILE: &str = "flow.yaml";
/// Where a service declared by name only keeps its manifest, relative to the workspace.
pub const SERVICES_DIR: &str = "services";
/// The manifest file name inside `services/<name>/`.
pub const SERVICE_FILE: &str = "service.yaml";

const FLOW_KEYS: &[&str] = &["name", "services"];
const SERVICE_KEYS: &[&str] = &[
    "name",
    "command",
    "args",
    "env",
    "cwd",
    "endpoints",
    "dependencies",
    "restart",
];
const ENDPOINT_KEYS: &[&str] = &["name", "api", "port", "health", "tls"];
const DEPENDENCY_KEYS: &[&str] = &["name", "kind", "endpoints"];
const RESTART_KEYS: &[&str] = &["policy", "max_restarts", "window", "backoff", "max_backoff"];

wire_enum! {
    /// Why a consumer depends on a producer, as declared. What each kind means for the stages
    /// and the waits is the dependency graph's business (`graph.rs`).
    pub enum DependencyKind {
        /// No kind declared: constrains build and run, waits for the producer to be healthy.
        Legacy = "legacy",
        /// A build or code-generation input: constrains build only, waits for nothing.
        Build = "build",
        /// The producer's API contract is read at build time: build only, waits for nothing.
        Schema = "schema",
        /// A consumed endpoint: run only, waits for the producer to be healthy.
        Runtime = "runtime",
        /// One-shot work that must finish first: run only, waits for an exit status 0.
        Completion = "completion",
        /// Provided outside the workspace: no stage, never started or waited for.
        External = "external",
    }
    kind = "dependency_kind";
}

/// A declared kind, as a manifest's `kind:` spells it. `legacy` is written (it is what an
/// edge without `kind:` is) but never read: a manifest asks for it by leaving `kind:` out.
impl FromStr for DependencyKind {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match DependencyKind::from_wire(s) {
            Ok(DependencyKind::Legacy) | Err(_) => Err(()),
            Ok(kind) => Ok(kind),
        }
    }
}

/// A loaded, validated workspace.
#[derive(Debug, Clone)]
pub struct Workspace {
    pub root: PathBuf,
    pub name: String,
    pub services: Vec<ServiceManifest>,
}

wire_enum! {
    /// What a service endpoint speaks, which decides its readiness predicate.
    pub enum Api {
        Tcp = "tcp",
        Http = "http",
        Grpc = "grpc",
    }
    kind = "api";
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub name: String,
    pub api: Api,
    /// A fixed port; `None` means the flow allocates a free loopback port.
    pub port: Option<u16>,
    /// `http`: the path probed by the `http-status` predicate. `grpc`: the fully qualified
    /// gRPC service (`shop.Orders`) whose `grpc.health.v1` status decides readiness; without
    /// it the server-wide status (`""`) is asked.
    pub health: Option<String>,
    /// The endpoint serves TLS (gRPC or HTTP): readiness probes speak TLS to it.
    pub tls: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dependency {
    pub name: String,
    pub kind: DependencyKind,
    /// The producer's endpoints this edge names; empty means "all of them" for a kind that
    /// consumes endpoints and "none" for one that does not.
    pub endpoints: Vec<String>,
}

/// One piece of an environment value: literal text or a reference to a producer's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvSegment {
    Text(String),
    EndpointRef { service: String, endpoint: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvValue {
    pub segments: Vec<EnvSegment>,
}

impl EnvValue {
    pub fn references(&self) -> impl Iterator<Item = (&str, &str)> {
        self.segments.iter().filter_map(|s| match s {
            EnvSegment::EndpointRef { service, endpoint } => {
                Some((service.as_str(), endpoint.as_str()))
            }
            EnvSegment::Text(_) => None,
        })
    }
}

#[derive(Debug, Clone)]
pub struct ServiceManifest {
    pub name: String,
    /// The file the service was declared in (`flow.yaml` for an inline service).
    pub source: PathBuf,
    pub command: String,
    pub args: Vec<String>,
    pub env: Vec<(String, EnvValue)>,
    /// The working directory: `cwd` resolved against the declaring file's folder, or that
    /// folder itself.
    pub cwd: PathBuf,
    pub endpoints: Vec<Endpoint>,
    pub dependencies: Vec<Dependency>,
    /// The restart policy: as declared, else `on-failure` for a service and `no` for a
    /// one-shot job (settled once the whole workspace says which services are jobs).
    pub restart: RestartSpec,
    /// Whether `restart.policy` was written in the manifest.
    pub restart_policy_declared: bool,
}

impl ServiceManifest {
    pub fn endpoint(&self, name: &str) -> Option<&Endpoint> {
        self.endpoints.iter().find(|e| e.name == name)
    }
}

impl Workspace {
    /// Reads and validates the workspace rooted at `root`.
    pub fn load(root: &Path) -> Result<Workspace, ManifestError> {
        let flow_file = root.join(FLOW_FILE);
        let doc = read_yaml(&flow_file)?;
        let top = Ctx::file(&flow_file);
        let map = top.mapping(&doc, "flow.yaml")?;
        top.check_keys(&map, FLOW_KEYS, "flow.yaml")?;
        let name = match map.get("name") {
            Some(v) => top.string(v, "name")?,
            None => root
                .canonicalize()
                .ok()
                .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_else(|| "flow".to_owned()),
        };
        let entries = match map.get("services") {
            Some(v) => read::sequence(v, "services", "must be a list of services")
                .map_err(|p| top.refuse(p))?,
            None => return Err(top.missing("services", "flow.yaml")),
        };
        if entries.is_empty() {
            return Err(top.invalid("services", "declares no services"));
        }

        let mut services: Vec<ServiceManifest> = Vec::new();
        let mut seen: HashMap<String, usize> = HashMap::new();
        for (index, entry) in entries.iter().enumerate() {
            let entry_map = top.mapping(entry, &format!("services entry #{}", index + 1))?;
            let name = match entry_map.get("name") {
                Some(v) => top.string(v, "name")?,
                None => return Err(top.missing("name", &format!("services entry #{}", index + 1))),
            };
            let ctx = Ctx::service(&flow_file, &name);
            validate_name(&ctx, "name", &name)?;
            if let Some(first) = seen.get(&name) {
                return Err(ctx.problem(ManifestProblem::DuplicateService {
                    where_: format!("entries #{} and #{} of flow.yaml", first + 1, index + 1),
                }));
            }
            seen.insert(name.clone(), index);

            let file_manifest = root.join(SERVICES_DIR).join(&name).join(SERVICE_FILE);
            let by_name_only = entry_map.len() == 1;
            let service = if by_name_only {
                let doc = read_yaml_for(&file_manifest, &name)?;
                let fctx = Ctx::service(&file_manifest, &name);
                let fmap = fctx.mapping(&doc, "the service manifest")?;
                if let Some(v) = fmap.get("name") {
                    let declared = fctx.string(v, "name")?;
                    if declared != name {
                        return Err(fctx.invalid(
                            "name",
                            &format!(
                                "is `{declared}` but flow.yaml and the folder name it `{name}`"
                            ),
                        ));
                    }
                }
                let base = file_manifest.parent().unwrap_or(root).to_path_buf();
                parse_service(&fctx, &fmap, &name, &base)?
            } else {
                if file_manifest.exists() {
                    return Err(ctx.problem(ManifestProblem::DuplicateService {
                        where_: format!("inline in flow.yaml and in {}", file_manifest.display()),
                    }));
                }
                parse_service(&ctx, &entry_map, &name, root)?
            };
            services.push(service);
        }

        let mut workspace = Workspace {
            root: root.to_path_buf(),
            name,
            services,
        };
        workspace.settle_restart_defaults();
        workspace.validate()?;
        Ok(workspace)
    }

    pub fn service(&self, name: &str) -> Option<&ServiceManifest> {
        self.services.iter().find(|s| s.name == name)
    }

    /// Services some consumer waits on as a one-shot job (a `completion` edge).
    pub fn is_job(&self, name: &str) -> bool {
        self.services.iter().any(|s| {
            s.dependencies
                .iter()
                .any(|d| d.name == name && d.kind == DependencyKind::Completion)
        })
    }

    /// A service whose manifest names no restart policy is restarted on failure (within its
    /// budget); a one-shot job is not, since running it twice may not be safe.
    fn settle_restart_defaults(&mut self) {
        let jobs: Vec<bool> = self.services.iter().map(|s| self.is_job(&s.name)).collect();
        for (service, is_job) in self.services.iter_mut().zip(jobs) {
            if !service.restart_policy_declared {
                service.restart.policy = if is_job {
                    RestartPolicy::No
                } else {
                    RestartPolicy::OnFailure
                };
            }
        }
    }

    fn validate(&self) -> Result<(), ManifestError> {
        let by_name: BTreeMap<&str, &ServiceManifest> =
            self.services.iter().map(|s| (s.name.as_str(), s)).collect();
        let mut fixed_ports: BTreeMap<u16, String> = BTreeMap::new();
        // producer -> (consumer waiting for completion, consumer waiting for a service)
        let mut job_consumer: BTreeMap<&str, &str> = BTreeMap::new();
        let mut service_consumer: BTreeMap<&str, &str> = BTreeMap::new();

        for service in &self.services {
            let ctx = Ctx::service(&service.source, &service.name);
            for endpoint in &service.endpoints {
                if let Some(port) = endpoint.port {
                    let here = format!("{}/{}", service.name, endpoint.name);
                    if let Some(first) = fixed_ports.get(&port) {
                        return Err(ctx.problem(ManifestProblem::DuplicatePort {
                            port,
                            first: first.clone(),
                            second: here,
                        }));
                    }
                    fixed_ports.insert(port, here);
                }
            }
            for dep in &service.dependencies {
                if dep.name == service.name {
                    return Err(ctx.problem(ManifestProblem::SelfDependency));
                }
                let producer = by_name.get(dep.name.as_str());
                if dep.kind == DependencyKind::Completion && !dep.endpoints.is_empty() {
                    return Err(ctx.problem(ManifestProblem::CompletionWithEndpoints {
                        producer: dep.name.clone(),
                    }));
                }
                let Some(producer) = producer else {
                    if dep.kind == DependencyKind::External {
                        continue;
                    }
                    return Err(ctx.problem(ManifestProblem::DanglingDependency {
                        producer: dep.name.clone(),
                    }));
                };
                if dep.kind == DependencyKind::Runtime && producer.endpoints.is_empty() {
                    return Err(ctx.problem(ManifestProblem::RuntimeWithoutEndpoints {
                        producer: dep.name.clone(),
                    }));
                }
                for endpoint in &dep.endpoints {
                    if producer.endpoint(endpoint).is_none() {
                        return Err(ctx.problem(ManifestProblem::UndeclaredEndpoint {
                            producer: dep.name.clone(),
                            endpoint: endpoint.clone(),
                        }));
                    }
                }
                match dep.kind {
                    DependencyKind::Completion => {
                        job_consumer
                            .entry(producer.name.as_str())
                            .or_insert(service.name.as_str());
                    }
                    DependencyKind::Legacy | DependencyKind::Runtime => {
                        service_consumer
                            .entry(producer.name.as_str())
                            .or_insert(service.name.as_str());
                    }
                    DependencyKind::Build | DependencyKind::Schema | DependencyKind::External => {}
                }
            }
            for (_, value) in &service.env {
                for (producer_name, endpoint) in value.references() {
                    let Some(producer) = by_name.get(producer_name) else {
                        return Err(ctx.problem(ManifestProblem::DanglingDependency {
                            producer: producer_name.to_owned(),
                        }));
                    };
                    if producer.endpoint(endpoint).is_none() {
                        return Err(ctx.problem(ManifestProblem::UndeclaredEndpoint {
                            producer: producer_name.to_owned(),
                            endpoint: endpoint.to_owned(),
                        }));
                    }
                    if producer.name != service.name {
                        service_consumer
                            .entry(producer.name.as_str())
                            .or_insert(service.name.as_str());
                    }
                }
            }
        }

        for (producer, job_by) in &job_consumer {
            let Some(producer_manifest) = by_name.get(producer) else {
                continue;
            };
            if let Some(service_by) = service_consumer.get(producer) {
                let consumer = by_name
                    .get(service_by)
                    .copied()
                    .unwrap_or(producer_manifest);
                return Err(Ctx::service(&consumer.source, &consumer.name).problem(
                    ManifestProblem::JobAndService {
                        producer: (*producer).to_owned(),
                        job_consumer: (*job_by).to_owned(),
                        service_consumer: (*service_by).to_owned(),
                    },
                ));
            }
            if producer_manifest.restart.policy == RestartPolicy::Always {
                return Err(Ctx::service(&producer_manifest.source, producer)
                    .problem(ManifestProblem::AlwaysRestartedJob));
            }
        }
        Ok(())
    }
}

/// Where a refusal is attributed.
struct Ctx {
    file: PathBuf,
    service: Option<String>,
}

impl Ctx {
    fn file(file: &Path) -> Ctx {
        Ctx {
            file: file.to_path_buf(),
            service: None,
        }
    }

    fn service(file: &Path, service: &str) -> Ctx {
        Ctx {
            file: file.to_path_buf(),
            service: Some(service.to_owned()),
        }
    }

    fn problem(&self, problem: ManifestProblem) -> ManifestError {
        ManifestError {
            file: self.file.clone(),
            service: self.service.clone(),
            problem: Box::new(problem),
        }
    }

    fn invalid(&self, key: &str, reason: &str) -> ManifestError {
        self.problem(ManifestProblem::InvalidValue {
            key: key.to_owned(),
            reason: reason.to_owned(),
        })
    }

    fn missing(&self, key: &str, context: &str) -> ManifestError {
        self.problem(ManifestProblem::MissingKey {
            key: key.to_owned(),
            context: context.to_owned(),
        })
    }

    /// A value that does not fit, refused in the manifest's words under the key it was read
    /// at.
    fn refuse(&self, problem: Problem) -> ManifestError {
        let reason = match &problem.kind {
            ProblemKind::Duration { text, reason } => {
                format!("`{text}` is not a duration like 500ms, 10s or 1m ({reason})")
            }
            _ => problem.message(),
        };
        self.invalid(&problem.path, &reason)
    }

    fn mapping<'n>(&self, node: &'n Node, what: &str) -> Result<Map<'n>, ManifestError> {
        read::mapping(node, what, "must be a mapping of keys to values").map_err(|p| self.refuse(p))
    }

    /// Refuses the first key of `map` that is not `allowed`.
    fn check_keys(&self, map: &Map, allowed: &[&str], context: &str) -> Result<(), ManifestError> {
        match map.unknown_keys(allowed).next() {
            None => Ok(()),
            Some((_, key)) => Err(self.problem(ManifestProblem::UnknownKey {
                key: key.to_owned(),
                context: context.to_owned(),
                allowed: allowed.join(", "),
            })),
        }
    }

    /// The list under `key` (read as `label`), empty when absent or null.
    fn list<'n>(&self, map: &Map<'n>, key: &str, label: &str) -> Result<&'n [Node], ManifestError> {
        match map.given(key) {
            None => Ok(&[]),
            Some(v) => read::sequence(v, label, "must be a list").map_err(|p| self.refuse(p)),
        }
    }

    fn string(&self, node: &Node, key: &str) -> Result<String, ManifestError> {
        read::string(node, key, "must be a string")
            .map(str::to_owned)
            .map_err(|p| self.refuse(p))
    }

    /// A string, number or boolean, as text (for args and env values): numbers as written,
    /// booleans as `true` or `false`.
    fn scalar(&self, node: &Node, key: &str) -> Result<String, ManifestError> {
        let scalar = read::text(node, key, "must be a string, number or boolean")
            .map_err(|p| self.refuse(p))?;
        Ok(match scalar.resolved {
            Resolved::Bool(b) => b.to_string(),
            _ => scalar.text.clone(),
        })
    }

    fn duration(&self, node: &Node, key: &str) -> Result<Duration, ManifestError> {
        let text = self.scalar(node, key)?;
        read::duration(node, key, &text).map_err(|p| self.refuse(p))
    }
}

fn read_yaml(path: &Path) -> Result<Node, ManifestError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Ctx::file(path).problem(ManifestProblem::Unreadable(e.to_string())))?;
    strict_yaml::load(&text)
        .map_err(|e| Ctx::file(path).problem(ManifestProblem::Syntax(e.to_string())))
}

fn read_yaml_for(path: &Path, service: &str) -> Result<Node, ManifestError> {
    read_yaml(path).map_err(|mut e| {
        e.service = Some(service.to_owned());
        e
    })
}

fn validate_name(ctx: &Ctx, key: &str, name: &str) -> Result<(), ManifestError> {
    let mut chars = name.chars();
    let valid_first = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    let valid_rest = chars.all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if valid_first && valid_rest {
        Ok(())
    } else {
        Err(ctx.invalid(
            key,
            &format!("`{name}` must start with a letter or digit and contain only letters, digits, `-` and `_`"),
        ))
    }
}

fn validate_env_key(ctx: &Ctx, key: &str) -> Result<(), ManifestError> {
    let mut chars = key.chars();
    let valid_first = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let valid_rest = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if valid_first && valid_rest {
        Ok(())
    } else {
        Err(ctx.invalid(
            "env",
            &format!("`{key}` is not a valid environment variable name"),
        ))
    }
}

fn parse_service(
    ctx: &Ctx,
    map: &Map,
    name: &str,
    base: &Path,
) -> Result<ServiceManifest, ManifestError> {
    ctx.check_keys(map, SERVICE_KEYS, "the service manifest")?;
    let command = match map.get("command") {
        Some(v) => ctx.scalar(v, "command")?,
        None => return Err(ctx.missing("command", "the service manifest")),
    };
    if command.trim().is_empty() {
        return Err(ctx.invalid("command", "is empty"));
    }

    let args = ctx
        .list(map, "args", "args")?
        .iter()
        .map(|v| ctx.scalar(v, "args"))
        .collect::<Result<Vec<_>, _>>()?;

    let mut env = Vec::new();
    if let Some(v) = map.given("env") {
        let m = read::mapping(v, "env", "must be a mapping of variable names to values")
            .map_err(|p| ctx.refuse(p))?;
        for (k, v) in m.entries() {
            let key = ctx.string(k, "env")?;
            validate_env_key(ctx, &key)?;
            let text = ctx.scalar(v, &format!("env.{key}"))?;
            env.push((key.clone(), parse_env_value(ctx, &key, &text)?));
        }
    }

    let cwd = match map.get("cwd") {
        None => base.to_path_buf(),
        Some(v) => {
            let text = ctx.string(v, "cwd")?;
            let path = PathBuf::from(&text);
            if path.is_absolute() {
                path
            } else {
                base.join(path)
            }
        }
    };

    let mut endpoints: Vec<Endpoint> = Vec::new();
    for (i, item) in ctx.list(map, "endpoints", "endpoints")?.iter().enumerate() {
        let context = format!("endpoints entry #{}", i + 1);
        let m = ctx.mapping(item, &context)?;
        ctx.check_keys(&m, ENDPOINT_KEYS, &context)?;
        let endpoint = parse_endpoint(ctx, &m, &context)?;
        if endpoints.iter().any(|e| e.name == endpoint.name) {
            return Err(ctx.problem(ManifestProblem::DuplicateEndpoint {
                endpoint: endpoint.name,
            }));
        }
        endpoints.push(endpoint);
    }

    let mut dependencies: Vec<Dependency> = Vec::new();
    for (i, item) in ctx
        .list(map, "dependencies", "dependencies")?
        .iter()
        .enumerate()
    {
        let context = format!("dependencies entry #{}", i + 1);
        let m = ctx.mapping(item, &context)?;
        ctx.check_keys(&m, DEPENDENCY_KEYS, &context)?;
        let dep = parse_dependency(ctx, &m, &context)?;
        if dependencies.iter().any(|d| d.name == dep.name) {
            return Err(ctx.problem(ManifestProblem::DuplicateDependency { producer: dep.name }));
        }
        dependencies.push(dep);
    }

    let (restart, restart_policy_declared) = match map.given("restart") {
        None => (RestartSpec::default(), false),
        Some(v) => {
            let m = ctx.mapping(v, "restart")?;
            ctx.check_keys(&m, RESTART_KEYS, "restart")?;
            (parse_restart(ctx, &m)?, m.get("policy").is_some())
        }
    };

    Ok(ServiceManifest {
        name: name.to_owned(),
        source: ctx.file.clone(),
        command,
        args,
        env,
        cwd,
        endpoints,
        dependencies,
        restart,
        restart_policy_declared,
    })
}

fn parse_endpoint(ctx: &Ctx, m: &Map, context: &str) -> Result<Endpoint, ManifestError> {
    let name = match m.get("name") {
        Some(v) => ctx.string(v, "endpoints.name")?,
        None => return Err(ctx.missing("name", context)),
    };
    validate_name(ctx, "endpoints.name", &name)?;
    let api = match m.get("api") {
        None => return Err(ctx.missing("api", context)),
        Some(v) => Api::from_wire(&ctx.string(v, "endpoints.api")?).map_err(|e| {
            ctx.invalid(
                "endpoints.api",
                &format!(
                    "`{}` on endpoint `{name}` is not one of {}",
                    e.value,
                    e.expected_list()
                ),
            )
        })?,
    };
    let port = match m.given("port") {
        None => None,
        Some(v) => Some(parse_port(ctx, v, &name)?),
    };
    let health = match m.given("health") {
        None => None,
        Some(v) => {
            let path = ctx.string(v, "endpoints.health")?;
            if api == Api::Tcp {
                return Err(ctx.invalid(
                    "endpoints.health",
                    &format!(
                        "endpoint `{name}` speaks tcp, whose readiness is a plain connect; `health` is a path for http and a service name for grpc"
                    ),
                ));
            }
            if api == Api::Grpc && !is_grpc_service_name(&path) {
                return Err(ctx.invalid(
                    "endpoints.health",
                    &format!(
                        "`{path}` on endpoint `{name}` is not a gRPC service name: dot-separated words of letters, digits and `_`, such as `shop.Orders`"
                    ),
                ));
            }
            if api == Api::Http && !path.starts_with('/') {
                return Err(ctx.invalid(
                    "endpoints.health",
                    &format!(
                        "`{path}` on endpoint `{name}` must be an absolute path starting with `/`"
                    ),
                ));
            }
            Some(path)
        }
    };
    let tls = match m.given("tls") {
        None => false,
        Some(v) => {
            read::boolean(v, "endpoints.tls", "must be true or false").map_err(|p| ctx.refuse(p))?
        }
    };
    if tls && api == Api::Tcp {
        return Err(ctx.invalid(
            "endpoints.tls",
            &format!(
                "endpoint `{name}` speaks tcp, whose readiness is a plain connect; `tls` is for grpc and http"
            ),
        ));
    }
    Ok(Endpoint {
        name,
        api,
        port,
        health,
        tls,
    })
}

/// A fully qualified gRPC service name as `grpc.health.v1` takes it: dot-separated, non-empty
/// words of ASCII letters, digits and `_`, the first character of each word not a digit.
fn is_grpc_service_name(name: &str) -> bool {
    !name.is_empty()
        && name.split('.').all(|word| {
            word.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && word.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

/// A fixed port: a number, and a whole one from 1 to 65535.
fn parse_port(ctx: &Ctx, node: &Node, endpoint: &str) -> Result<u16, ManifestError> {
    let Some(n) = node
        .scalar()
        .filter(|n| matches!(n.resolved, Resolved::Int(_) | Resolved::Float(_)))
    else {
        return Err(ctx.invalid("endpoints.port", "must be a number"));
    };
    match n.resolved {
        Resolved::Int(p) => u16::try_from(p).ok().filter(|p| *p > 0),
        _ => None,
    }
    .ok_or_else(|| {
        ctx.invalid(
            "endpoints.port",
            &format!(
                "`{}` on endpoint `{endpoint}` is not a port between 1 and 65535",
                n.text
            ),
        )
    })
}

fn parse_dependency(ctx: &Ctx, m: &Map, context: &str) -> Result<Dependency, ManifestError> {
    let name = match m.get("name") {
        Some(v) => ctx.string(v, "dependencies.name")?,
        None => return Err(ctx.missing("name", context)),
    };
    let kind = match m.given("kind") {
        None => DependencyKind::Legacy,
        Some(v) => {
            let text = ctx.string(v, "dependencies.kind")?;
            text.parse::<DependencyKind>().map_err(|_| {
                ctx.invalid(
                    "dependencies.kind",
                    &format!(
                        "`{text}` on the dependency on `{name}` is not one of build, schema, runtime, completion, external (or absent for legacy)"
                    ),
                )
            })?
        }
    };
    let mut endpoints = Vec::new();
    for item in ctx.list(m, "endpoints", "dependencies.endpoints")? {
        let endpoint = match (item.as_str(), item.entries()) {
            (Some(s), _) => s.to_owned(),
            (None, Some(_)) => {
                let em = ctx.mapping(item, "a dependency endpoint")?;
                ctx.check_keys(&em, &["name"], "a dependency endpoint")?;
                match em.get("name") {
                    Some(v) => ctx.string(v, "dependencies.endpoints.name")?,
                    None => return Err(ctx.missing("name", "a dependency endpoint")),
                }
            }
            (None, None) => {
                return Err(ctx.invalid(
                    "dependencies.endpoints",
                    "entries must be endpoint names (or `{name: ...}`)",
                ));
            }
        };
        endpoints.push(endpoint);
    }
    Ok(Dependency {
        name,
        kind,
        endpoints,
    })
}

fn parse_restart(ctx: &Ctx, m: &Map) -> Result<RestartSpec, ManifestError> {
    let mut spec = RestartSpec::default();
    if let Some(v) = m.get("policy") {
        spec.policy = match (v.scalar().map(|s| s.resolved), v.as_str()) {
            (Some(Resolved::Bool(false)), _) => RestartPolicy::No,
            (_, Some(s)) => RestartPolicy::from_wire(s).map_err(|e| {
                ctx.invalid(
                    "restart.policy",
                    &format!("`{}` is not one of {}", e.value, e.expected_list()),
                )
            })?,
            _ => {
                return Err(ctx.invalid(
                    "restart.policy",
                    &format!("must be one of {}", RestartPolicy::TEXTS.join(", ")),
                ));
            }
        };
    }
    if let Some(v) = m.get("max_restarts") {
        let n = read::integer(
            v,
            "restart.max_restarts",
            0..=i64::from(u32::MAX),
            "must be a non-negative integer",
        )
        .map_err(|p| ctx.refuse(p))?;
        spec.max_restarts = u32::try_from(n).unwrap_or(u32::MAX);
    }
    if let Some(v) = m.get("window") {
        spec.window = ctx.duration(v, "restart.window")?;
        if spec.window.is_zero() {
            return Err(ctx.invalid("restart.window", "must be longer than zero"));
        }
    }
    if let Some(v) = m.get("backoff") {
        spec.backoff = ctx.duration(v, "restart.backoff")?;
    }
    if let Some(v) = m.get("max_backoff") {
        spec.max_backoff = ctx.duration(v, "restart.max_backoff")?;
    }
    if spec.max_backoff < spec.backoff {
        return Err(ctx.invalid(
            "restart.max_backoff",
            "must not be shorter than restart.backoff",
        ));
    }
    Ok(spec)
}

const REFERENCE_OPEN: &str = "${endpoint:";

fn parse_env_value(ctx: &Ctx, key: &str, text: &str) -> Result<EnvValue, ManifestError> {
    let mut segments = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(REFERENCE_OPEN) {
        if start > 0 {
            segments.push(EnvSegment::Text(rest[..start].to_owned()));
        }
        let after = &rest[start + REFERENCE_OPEN.len()..];
        let malformed = |reference: &str| {
            ctx.problem(ManifestProblem::MalformedReference {
                key: key.to_owned(),
                reference: reference.to_owned(),
            })
        };
        let Some(end) = after.find('}') else {
            return Err(malformed(&rest[start..]));
        };
        let inner = &after[..end];
        let reference = &rest[start..start + REFERENCE_OPEN.len() + end + 1];
        let Some((service, endpoint)) = inner.split_once('/') else {
            return Err(malformed(reference));
        };
        let well_formed = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        };
        if !well_formed(service) || !well_formed(endpoint) {
            return Err(malformed(reference));
        }
        segments.push(EnvSegment::EndpointRef {
            service: service.to_owned(),
            endpoint: endpoint.to_owned(),
        });
        rest = &after[end + 1..];
    }
    if !rest.is_empty() || segments.is_empty() {
        segments.push(EnvSegment::Text(rest.to_owned()));
    }
    Ok(EnvValue { segments })
}
