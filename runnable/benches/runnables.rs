//! Runnable overhead, in one run:
//!
//! 1. invoking a trivial handler (a `/bin/sh` script that reads the request with the `read`
//!    builtin and prints a result, no other process) through `invoke` on a prepared release,
//!    and through `Runner::invoke` from the workspace (resolve, verify the recorded release,
//!    check the cache, then invoke), against spawning the same script directly with the same
//!    request on stdin and reading its stdout. Goal: ≤ 1.5x the direct spawn.
//! 2. validating a ~64 KiB input against its schema, per KiB. Goal: ≤ 5 µs per KiB.
//!
//! Prints plain lines with the ratios. Run: `cargo bench -p runnable --bench runnables`

#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use runnable::{InvokeRequest, OutcomeClass, Runner, invoke};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const ROUNDS: usize = 200;
const SCRIPT: &str =
    "#!/bin/sh\nIFS= read -r request\nprintf '{\"ok\":true,\"output\":{\"n\":1}}\\n'\n";

fn workspace() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
    let dir = tmp.path().join("bench/runnables/trivial");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("folder: {e}"));
    std::fs::write(
        dir.join("runnable.yaml"),
        "name: trivial\nversion: 1\ninput: {type: object, properties: {n: {type: integer}}, required: [n]}\n\
         output: {type: object, properties: {n: {type: integer}}, required: [n]}\n\
         command: ./run.sh\ntimeout: 10s\neffect: read_only\n",
    )
    .unwrap_or_else(|e| panic!("declaration: {e}"));
    std::fs::write(dir.join("run.sh"), SCRIPT).unwrap_or_else(|e| panic!("script: {e}"));
    std::fs::set_permissions(dir.join("run.sh"), std::fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("chmod: {e}"));
    tmp
}

fn direct(script: &std::path::Path, request: &[u8]) -> Duration {
    let began = Instant::now();
    let mut child = Command::new(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn: {e}"));
    let mut stdin = child.stdin.take().unwrap_or_else(|| panic!("stdin"));
    stdin
        .write_all(request)
        .unwrap_or_else(|e| panic!("write: {e}"));
    drop(stdin);
    let mut out = Vec::new();
    child
        .stdout
        .take()
        .unwrap_or_else(|| panic!("stdout"))
        .read_to_end(&mut out)
        .unwrap_or_else(|e| panic!("read: {e}"));
    let status = child.wait().unwrap_or_else(|e| panic!("wait: {e}"));
    assert!(status.success() && !out.is_empty());
    began.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

use std::os::unix::process::CommandExt;

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    let tmp = workspace();
    let root = tmp.path().join("bench");
    let runner = Runner::open(&root).unwrap_or_else(|e| panic!("{e}"));
    let release = runner.release("trivial").unwrap_or_else(|e| panic!("{e}"));
    let script = release.dir().join("run.sh");
    let request = serde_json::to_vec(&json!({
        "protocol": "hostd.runnable.request/1", "runnable": "bench/trivial@1",
        "input": {"n": 1}, "intent_id": "int-x", "effect_id": "eff-x"
    }))
    .unwrap_or_default();
    let cancel = CancellationToken::new();
    println!("load average before: {}", load_average());

    // Interleave the three so machine noise hits them alike.
    let (mut raw, mut prepared, mut from_source) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..ROUNDS + 10 {
        let d = direct(&script, &request);
        let began = Instant::now();
        let inv = rt
            .block_on(invoke(
                &release,
                InvokeRequest {
                    input: json!({"n": 1}),
                    ..InvokeRequest::default()
                },
                runner.options(),
                &cancel,
            ))
            .unwrap_or_else(|e| panic!("{e}"));
        let p = began.elapsed();
        assert_eq!(inv.outcome, OutcomeClass::Succeeded, "{}", inv.detail);
        let began = Instant::now();
        let inv = rt
            .block_on(runner.invoke(
                "trivial",
                InvokeRequest {
                    input: json!({"n": 1}),
                    ..InvokeRequest::default()
                },
                &cancel,
            ))
            .unwrap_or_else(|e| panic!("{e}"));
        let s = began.elapsed();
        assert_eq!(inv.outcome, OutcomeClass::Succeeded);
        if i >= 10 {
            raw.push(d);
            prepared.push(p);
            from_source.push(s);
        }
    }
    let (raw, prepared, from_source) = (median(raw), median(prepared), median(from_source));
    println!("invoke, trivial handler, median of {ROUNDS}:");
    println!(
        "  direct spawn (baseline)        {:>9.3} ms",
        raw.as_secs_f64() * 1e3
    );
    println!(
        "  invoke(prepared release)       {:>9.3} ms   {:.2}x the direct spawn (goal <= 1.5x)",
        prepared.as_secs_f64() * 1e3,
        prepared.as_secs_f64() / raw.as_secs_f64()
    );
    println!(
        "  Runner::invoke(from workspace) {:>9.3} ms   {:.2}x the direct spawn",
        from_source.as_secs_f64() * 1e3,
        from_source.as_secs_f64() / raw.as_secs_f64()
    );

    // Schema validation per KiB.
    let catalog_dir = tmp.path().join("schema/runnables/s");
    std::fs::create_dir_all(&catalog_dir).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(
        catalog_dir.join("runnable.yaml"),
        "name: s\nversion: 1\ninput:\n  type: object\n  properties:\n    items:\n      type: array\n      maxItems: 100000\n      items:\n        type: object\n        properties:\n          sku: {type: string, maxLength: 32}\n          qty: {type: integer, minimum: 1}\n          price: {type: number, minimum: 0}\n          gift: {type: boolean, nullable: true}\n          note: {type: string, nullable: true}\n        required: [sku, qty, price]\n  required: [items]\n\
         output: {type: object}\ncommand: sh\ntimeout: 1s\neffect: read_only\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let schema_runner = Runner::open(&tmp.path().join("schema")).unwrap_or_else(|e| panic!("{e}"));
    let catalog = schema_runner.catalog().unwrap_or_else(|e| panic!("{e}"));
    let schema = &catalog.runnables[0].input;
    let items: Vec<_> = (0..900)
        .map(|i| json!({"sku": format!("SKU-{i:06}"), "qty": i % 7 + 1, "price": 9.99, "gift": null, "note": "wrap it"}))
        .collect();
    let input = json!({ "items": items });
    let kib = serde_json::to_vec(&input).unwrap_or_default().len() as f64 / 1024.0;
    assert!(schema.validate(&input).is_empty());
    let reps = 200;
    let began = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(schema.validate(std::hint::black_box(&input)));
    }
    let per = began.elapsed().as_secs_f64() / reps as f64;
    // The baseline: parsing the same bytes into a JSON value, which every invocation does.
    let bytes = serde_json::to_vec(&input).unwrap_or_default();
    let began = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(
            serde_json::from_slice::<serde_json::Value>(std::hint::black_box(&bytes)).ok(),
        );
    }
    let parse = began.elapsed().as_secs_f64() / reps as f64;
    println!("schema validation, {kib:.1} KiB input (900 objects), mean of {reps}:");
    println!(
        "  validate                       {:>9.3} µs/KiB (goal <= 5 µs/KiB)   {:.2}x parsing the same bytes",
        per * 1e6 / kib,
        per / parse
    );
    println!(
        "  serde_json parse (baseline)    {:>9.3} µs/KiB",
        parse * 1e6 / kib
    );
    println!("load average after: {}", load_average());
}
