//! The operator kit in `deploy/` cannot drift from the Host: every metric the Grafana dashboard
//! (`deploy/grafana/hostd-dashboard.json`) and the Prometheus rules
//! (`deploy/prometheus/hostd-alerts.yaml`) name is a family a real `hostd serve` exposes on
//! `/metrics`, once it has attached a session, applied commands and ended a run (labelled
//! families appear only once observed). Every panel's query is PromQL `promtool` accepts.
//! `promtool check rules` and `promtool test rules` on the rule file itself run in
//! `deploy/check.sh`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;
use testkit::eventually_blocking;
use testkit::process::{Serve, hostd_run, http_get, ok};

/// Named by the kit ahead of the Host: the trace exporter's drop counter, added with the
/// OpenTelemetry export. Accepted while no Host exports it; checked like any other once one
/// does (so it must then be the counter the rules expect).
const PENDING: [&str; 1] = ["host_trace_spans_dropped_total"];

const PROGRAM: &str = "\
steps:
  - name: nap
    sleep: 0s
";

fn deploy(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(file)
}

fn read(file: &str) -> String {
    std::fs::read_to_string(deploy(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// Every `host_…` metric name in `text` (a name is `host_` then lowercase letters, digits and
/// underscores, not preceded by a name character).
fn metric_names(text: &str) -> BTreeSet<String> {
    let bytes = text.as_bytes();
    let name_byte = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_';
    let mut names = BTreeSet::new();
    let mut i = 0;
    while let Some(at) = text[i..].find("host_") {
        let start = i + at;
        let mut end = start + "host_".len();
        while end < bytes.len() && name_byte(bytes[end]) {
            end += 1;
        }
        let bounded = start == 0 || !(name_byte(bytes[start - 1]) || bytes[start - 1] == b'.');
        if bounded && end > start + "host_".len() {
            names.insert(text[start..end].to_owned());
        }
        i = end;
    }
    names
}

/// The families a `/metrics` text declares (`# TYPE <name> <type>`), with their types.
fn families(exposition: &str) -> Vec<(String, String)> {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, t)| (n.to_owned(), t.to_owned()))
        .collect()
}

/// The family a queried name belongs to: a histogram's `_bucket`, `_count` and `_sum` series
/// are its family's.
fn family_of<'a>(name: &'a str, histograms: &BTreeSet<&str>) -> &'a str {
    for suffix in ["_bucket", "_count", "_sum"] {
        if let Some(base) = name.strip_suffix(suffix)
            && histograms.contains(base)
        {
            return base;
        }
    }
    name
}

/// Every query string of the dashboard: panel targets and template variables.
fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dashboard];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(map) => {
                for (k, child) in map {
                    match (k.as_str(), child) {
                        ("expr" | "definition", Value::String(s)) => out.push(s.clone()),
                        ("query", Value::Object(q)) => {
                            if let Some(Value::String(s)) = q.get("query") {
                                out.push(s.clone());
                            }
                        }
                        _ => stack.push(child),
                    }
                }
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    out
}

/// A real Host's `/metrics` after it attached a session, applied commands and ended a run.
fn exercised_host_metrics(dir: &Path) -> String {
    std::fs::write(dir.join("program.yaml"), PROGRAM).unwrap();
    let host = Serve::start(dir, "kit-host", &["--host-id", "kit-host"]);
    let s = ok(hostd_run(
        dir,
        &["session", "create", "--message", "hi"],
        &[],
    ));
    ok(hostd_run(dir, &["session", "send", &s, "hello"], &[]));
    let run = ok(hostd_run(dir, &["run", "start", "program.yaml"], &[]));
    eventually_blocking("the run to complete", || {
        let out = ok(hostd_run(dir, &["--json", "run", "status", &run], &[]));
        let v: Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
        if v["state"] == "completed" {
            Ok(())
        } else {
            Err(out)
        }
    });
    eventually_blocking("every exercised family on /metrics", || {
        let (status, body) = http_get(host.port, "/metrics").ok_or("no answer")?;
        let seen: BTreeSet<String> = families(&body).into_iter().map(|(n, _)| n).collect();
        let wanted = [
            "host_attach_seconds",
            "host_command_apply_seconds",
            "host_runs_ended_total",
            "host_run_step_seconds",
        ];
        if status == 200 && wanted.iter().all(|w| seen.contains(*w)) {
            Ok(body)
        } else {
            Err(format!("{status}: {body}"))
        }
    })
}

#[test]
fn every_metric_the_dashboard_and_the_alerts_query_is_one_a_real_host_exports() {
    let dashboard: Value =
        serde_json::from_str(&read("grafana/hostd-dashboard.json")).expect("the dashboard is JSON");
    let queries = dashboard_queries(&dashboard);
    assert!(queries.len() > 10, "{queries:?}");
    let mut used = BTreeSet::new();
    for q in &queries {
        used.extend(metric_names(q));
    }
    let rules = read("prometheus/hostd-alerts.yaml");
    let from_rules = metric_names(&rules);
    assert!(
        from_rules.contains("host_ready")
            && from_rules.contains("host_command_apply_seconds_bucket"),
        "{from_rules:?}"
    );
    used.extend(from_rules);

    let tmp = tempfile::tempdir().expect("tempdir");
    let exposition = exercised_host_metrics(tmp.path());
    let exported = families(&exposition);
    let histograms: BTreeSet<&str> = exported
        .iter()
        .filter(|(_, t)| t == "histogram")
        .map(|(n, _)| n.as_str())
        .collect();
    let names: BTreeSet<&str> = exported.iter().map(|(n, _)| n.as_str()).collect();
    let unknown: Vec<&String> = used
        .iter()
        .filter(|u| !names.contains(family_of(u, &histograms)))
        .filter(|u| !PENDING.contains(&u.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "the kit queries series no hostd serve exports: {unknown:?}\n{exposition}"
    );
    for pending in PENDING {
        assert!(used.contains(pending), "{pending} is no longer in the kit");
        if let Some((_, kind)) = exported.iter().find(|(n, _)| n == pending) {
            assert_eq!(kind, "counter", "{pending} is queried with rate()");
        }
    }
}

#[test]
fn every_dashboard_query_is_promql_that_promtool_accepts() {
    let dashboard: Value =
        serde_json::from_str(&read("grafana/hostd-dashboard.json")).expect("the dashboard is JSON");
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    let mut n = 0;
    let mut stack = vec![&dashboard];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(map) => {
                if let Some(Value::String(expr)) = map.get("expr") {
                    n += 1;
                    // Grafana's variables, as a query would be sent.
                    let promql = expr
                        .replace("$__rate_interval", "5m")
                        .replace("$instance", ".*");
                    rules.push_str(&format!(
                        "      - record: dashboard:query_{n}\n        expr: {}\n",
                        serde_json::to_string(&promql).unwrap()
                    ));
                }
                stack.extend(map.values());
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    assert!(n > 10, "{rules}");
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("dashboard-queries.yaml");
    std::fs::write(&file, &rules).unwrap();
    let out = std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .expect(
            "promtool is required (.ci/run installs it; on Debian: apt-get install prometheus)",
        );
    assert!(
        out.status.success(),
        "{}\n{}\n{rules}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_name_scan_finds_names_and_skips_longer_words() {
    let names = metric_names(
        r#"rate(host_a_total{x="1"}[5m]) / ghost_b + hostd{} and x.host_c host_d_bucket"#,
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["host_a_total", "host_d_bucket"]
    );
}
