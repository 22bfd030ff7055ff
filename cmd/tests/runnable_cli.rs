//! `hostd runnable` as a user runs it: the command surface, JSON shapes, exit statuses,
//! cancellation by signal, and publishing to the session store for a Host to run.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const HOSTD: &str = env!("CARGO_BIN_EXE_hostd");

fn hostd(dir: &Path, args: &[&str]) -> Output {
    Command::new(HOSTD)
        .args(args)
        .current_dir(dir)
        .env_remove("HOST_STORE_URL")
        .env_remove("HOST_DATA_DIR")
        .env_remove("HOST_RUNNABLES")
        .env_remove("HOST_RUNNABLE_TOOLS")
        .output()
        .expect("hostd runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(o)))
}

/// A workspace `shop` with shell runnables.
struct Ws {
    _tmp: tempfile::TempDir,
    root: PathBuf,
}

impl Ws {
    fn new() -> Ws {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("shop");
        std::fs::create_dir_all(root.join("runnables")).expect("folder");
        Ws { _tmp: tmp, root }
    }

    fn shell(&self, folder: &str, name: &str, version: &str, timeout: &str, script: &str) {
        let dir = self.root.join("runnables").join(folder);
        std::fs::create_dir_all(&dir).expect("folder");
        std::fs::write(
            dir.join("runnable.yaml"),
            format!(
                "name: {name}\nversion: {version}\ndescription: {name} for tests\n\
                 input: {{type: object, properties: {{n: {{type: integer}}}}, required: [n]}}\n\
                 output: {{type: object, properties: {{n: {{type: integer}}}}, required: [n]}}\n\
                 command: ./run.sh\ntimeout: {timeout}\neffect: read_only\n"
            ),
        )
        .expect("declaration");
        let script_path = dir.join("run.sh");
        std::fs::write(&script_path, format!("#!/bin/sh\n{script}")).expect("handler");
        std::fs::set_permissions(&script_path, std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
    }

    fn run(&self, args: &[&str]) -> Output {
        let mut all = vec!["runnable", "-w"];
        let root = self.root.to_string_lossy().into_owned();
        all.push(&root);
        all.extend_from_slice(args);
        hostd(self._tmp.path(), &all)
    }
}

const OK: &str = "cat >/dev/null; echo '{\"ok\":true,\"output\":{\"n\":1}}'\n";

#[test]
fn the_command_offers_exactly_list_show_build_invoke_and_publish_each_with_help() {
    let tmp = tempfile::tempdir().unwrap();
    let help = hostd(tmp.path(), &["runnable", "--help"]);
    assert!(help.status.success());
    let text = stdout(&help);
    let commands: Vec<&str> = text
        .split("Commands:")
        .nth(1)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .take_while(|w| *w != "Options:")
        .filter(|w| !w.is_empty())
        .collect();
    assert_eq!(
        commands,
        [
            "list", "show", "build", "invoke", "publish", "releases", "prune", "help"
        ],
        "{text}"
    );
    for sub in [
        "list", "show", "build", "invoke", "publish", "releases", "prune",
    ] {
        let out = hostd(tmp.path(), &["runnable", sub, "--help"]);
        assert!(out.status.success(), "{sub} --help");
        let t = stdout(&out);
        for absent in ["add", "generate", "agent", "binding", "not implemented"] {
            assert!(!t.contains(&format!("--{absent}")), "{sub}: {absent}");
        }
    }
}

#[test]
fn an_empty_workspace_lists_nothing_and_says_so() {
    let ws = Ws::new();
    let out = ws.run(&["list", "--json"]);
    assert!(out.status.success());
    assert_eq!(json(&out), Value::Array(vec![]));
    let out = ws.run(&["list"]);
    assert!(stdout(&out).contains("no runnables"), "{}", stdout(&out));
}

#[test]
fn list_rows_and_show_share_one_projection_and_list_is_byte_stable() {
    let ws = Ws::new();
    ws.shell("a", "alpha", "1.0.0", "30s", OK);
    ws.shell("b", "beta", "2", "5s", OK);
    assert!(ws.run(&["build", "alpha"]).status.success());
    let list = ws.run(&["list", "--json"]);
    assert_eq!(
        list.stdout,
        ws.run(&["list", "--json"]).stdout,
        "byte-identical"
    );
    let rows = json(&list);
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for row in rows {
        let id = row["identity"].as_str().unwrap();
        assert!(id.starts_with("shop/") && id.contains('@'), "{id}");
        let show = json(&ws.run(&["show", id, "--json"]));
        let show = show.as_object().unwrap();
        for (k, v) in row.as_object().unwrap() {
            assert_eq!(&show[k], v, "{k}");
        }
        let mut extra: Vec<&str> = show
            .keys()
            .filter(|k| !row.as_object().unwrap().contains_key(*k))
            .map(String::as_str)
            .collect();
        extra.sort();
        assert_eq!(extra, ["contract", "dependencies", "entrypoint"]);
    }
    assert_eq!(rows[0]["timeout"], "30s");
    assert!(rows[0]["digest"].as_str().unwrap().starts_with("sha256:"));
    assert_eq!(rows[1]["digest"], Value::Null);
}

#[test]
fn an_ambiguous_name_is_refused_listing_every_candidate_and_a_version_selects_one() {
    let ws = Ws::new();
    ws.shell("v1", "wc", "1.0.0", "5s", OK);
    ws.shell("v2", "wc", "2.0.0", "5s", OK);
    let out = ws.run(&["show", "wc"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("[ambiguous]")
            && err.contains("shop/wc@1.0.0")
            && err.contains("shop/wc@2.0.0"),
        "{err}"
    );
    let out = ws.run(&["show", "wc", "--json"]);
    assert_eq!(json(&out)["error"]["code"], "ambiguous");
    assert!(
        ws.run(&["show", "wc", "--version", "2.0.0"])
            .status
            .success()
    );
    let out = ws.run(&["show", "wc", "--version", "9.9.9", "--json"]);
    let doc = json(&out);
    assert_eq!(doc["error"]["code"], "not_found");
    assert_eq!(doc["error"]["available"].as_array().unwrap().len(), 2);
}

#[test]
fn invoke_exit_statuses_separate_success_certain_failure_unknown_and_refusal() {
    let ws = Ws::new();
    ws.shell("ok", "ok", "1", "5s", OK);
    ws.shell(
        "fail",
        "fail",
        "1",
        "5s",
        "cat >/dev/null; echo '{\"ok\":false,\"error\":{\"code\":\"no\",\"message\":\"m\"}}'\n",
    );
    ws.shell("crash", "crash", "1", "5s", "cat >/dev/null; exit 5\n");
    let input = ["--input", "{\"n\":1}", "--json"];
    let cases = [
        ("ok", 0, "succeeded", true),
        ("fail", 3, "failed", true),
        ("crash", 4, "crashed", false),
    ];
    for (name, code, outcome, certain) in cases {
        let mut args = vec!["invoke", name];
        args.extend_from_slice(&input);
        let out = ws.run(&args);
        assert_eq!(out.status.code(), Some(code), "{name}: {}", stderr(&out));
        let doc = json(&out);
        assert_eq!(doc["outcome"], outcome);
        assert_eq!(doc["certain"], certain);
        for key in ["identity", "digest", "intent_id", "effect_id"] {
            assert!(doc[key].is_string(), "{name}: {key}");
        }
    }
    // Refused before anything starts: bad input, trailing data, an unknown name.
    for (args, code) in [
        (
            vec!["invoke", "ok", "--input", "{\"n\":\"1\"}"],
            "invalid_input",
        ),
        (
            vec!["invoke", "ok", "--input", "{\"n\":1} {}"],
            "bad_reference",
        ),
        (vec!["invoke", "nope", "--input", "{}"], "not_found"),
    ] {
        let out = ws.run(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(
            stderr(&out).contains(&format!("[{code}]")),
            "{}",
            stderr(&out)
        );
    }
    // --input @file, and a minted intent id is printed.
    let file = ws._tmp.path().join("input.json");
    std::fs::write(&file, "{\"n\": 1}").unwrap();
    let out = ws.run(&["invoke", "ok", "--input", &format!("@{}", file.display())]);
    assert!(out.status.success());
    assert!(
        stderr(&out).contains("--intent-id int-"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn sigint_during_invoke_cancels_and_leaves_no_process_behind() {
    let ws = Ws::new();
    let marker = ws._tmp.path().join("pgid");
    ws.shell(
        "slow",
        "slow",
        "1",
        "60s",
        &format!("cat >/dev/null; echo $$ > {}; sleep 60\n", marker.display()),
    );
    let root = ws.root.to_string_lossy().into_owned();
    let child = Command::new(HOSTD)
        .args([
            "runnable",
            "-w",
            &root,
            "invoke",
            "slow",
            "--input",
            "{\"n\":1}",
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_to_string(&marker)
        .unwrap_or_default()
        .trim()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "the handler never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert_eq!(json(&out)["outcome"], "cancelled");
    let pgid = std::fs::read_to_string(&marker).unwrap().trim().to_owned();
    let alive = std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        std::fs::read_to_string(e.path().join("stat")).is_ok_and(|s| {
            s.rsplit_once(')').is_some_and(|(_, rest)| {
                let f: Vec<&str> = rest.split_whitespace().collect();
                f.get(2) == Some(&pgid.as_str()) && f[0] != "Z"
            })
        })
    });
    assert!(!alive, "a process of the handler's group survived");
}

#[test]
fn build_json_reports_a_digest_anyone_can_recompute_from_the_documented_framing() {
    use sha2::{Digest, Sha256};
    let ws = Ws::new();
    ws.shell("x", "x", "1", "5s", OK);
    let out = ws.run(&["build", "x", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc = json(&out);
    let folder = ws.root.join("runnables/x");
    let mut files: Vec<(String, Vec<u8>, bool)> = doc["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let path = f["path"].as_str().unwrap().to_owned();
            let bytes = std::fs::read(folder.join(&path)).unwrap();
            (path, bytes, f["executable"].as_bool().unwrap())
        })
        .collect();
    files.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut h = Sha256::new();
    h.update(b"hostd.runnable.digest/1\0");
    for (path, bytes, exec) in &files {
        h.update((path.len() as u64).to_be_bytes());
        h.update(path.as_bytes());
        h.update([u8::from(*exec)]);
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    }
    let want = format!("sha256:{}", hex_encode(&h.finalize()));
    assert_eq!(doc["digest"], want.as_str());
    assert_eq!(doc["identity"], "shop/x@1");
    let names: Vec<&str> = files.iter().map(|f| f.0.as_str()).collect();
    assert_eq!(names, ["run.sh", "runnable.yaml"]);
    // Building again changes nothing; changed content under the version is a conflict.
    let again = json(&ws.run(&["build", "x", "--json"]));
    assert_eq!(again["digest"], want.as_str());
    assert_eq!(again["written"], false);
    std::fs::write(folder.join("run.sh"), "#!/bin/sh\necho changed\n").unwrap();
    let out = ws.run(&["build", "x", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json(&out)["error"]["code"], "conflict");
}

fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn a_published_package_runs_on_a_host_without_the_workspace_and_a_tampered_one_is_refused() {
    let ws = Ws::new();
    ws.shell("x", "echoer", "1", "5s", OK);
    let data = ws._tmp.path().join("data");
    let data_arg = data.to_string_lossy().into_owned();
    std::fs::create_dir_all(&data).unwrap();
    let out = ws.run(&["publish", "echoer", "--data-dir", &data_arg, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc = json(&out);
    assert_eq!(doc["status"], "published");
    let again = json(&ws.run(&["publish", "echoer", "--data-dir", &data_arg, "--json"]));
    assert_eq!(again["status"], "unchanged");

    // A Host with no workspace at all takes the release from the store.
    let serve = |extra: &str| {
        let mut child = Command::new(HOSTD)
            .args(["serve", "--data-dir", &data_arg, "--listen", "127.0.0.1:0"])
            .args(["--runnable-tool", extra])
            .current_dir(ws._tmp.path())
            .env_remove("HOST_STORE_URL")
            .env_remove("HOST_DATA_DIR")
            .env_remove("HOST_RUNNABLES")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Wait until it serves (or exits).
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                let mut err = String::new();
                use std::io::Read;
                child
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut err)
                    .unwrap();
                return (Some(status), err);
            }
            if std::fs::read_to_string(data.join("hostd.json")).is_ok() || Instant::now() > deadline
            {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(child.id() as i32),
                    nix::sys::signal::Signal::SIGTERM,
                );
                let status = child.wait().unwrap();
                let mut err = String::new();
                use std::io::Read;
                child
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut err)
                    .unwrap();
                return (if status.success() { None } else { Some(status) }, err);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let (failed, log) = serve("shop/echoer@1");
    assert!(
        failed.is_none(),
        "the Host should serve the published release:\n{log}"
    );
    assert!(log.contains("offering a runnable as a tool"), "{log}");
    let cache = data.join("runnables/cache");
    assert_eq!(
        std::fs::read_dir(&cache).unwrap().count(),
        1,
        "unpacked once into the cache"
    );

    // Alter the stored package consistently (bytes and their store checksum): the store's own
    // check passes, the package's digest does not, and the Host refuses to start with it.
    let db = data.join("host.db");
    let script = format!(
        "import sqlite3, hashlib\n\
         c = sqlite3.connect({db:?})\n\
         (b,) = c.execute('SELECT bytes FROM runnable_packages').fetchone()\n\
         b = bytearray(b); b[-3] ^= 1; b = bytes(b)\n\
         c.execute('UPDATE runnable_packages SET bytes = ?, sha256 = ?', (b, hashlib.sha256(b).hexdigest()))\n\
         c.commit()\n",
        db = db.to_string_lossy()
    );
    let py = Command::new("python3")
        .arg("-c")
        .arg(&script)
        .output()
        .unwrap();
    assert!(
        py.status.success(),
        "{}",
        String::from_utf8_lossy(&py.stderr)
    );
    let _ = std::fs::remove_file(data.join("hostd.json"));
    let (failed, log) = serve("shop/echoer@1");
    assert!(
        failed.is_some(),
        "a tampered package must stop the Host:\n{log}"
    );
    assert!(log.contains("integrity"), "{log}");
}

fn releases_json(ws: &Ws) -> Vec<(String, String)> {
    let out = ws.run(&["releases", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    json(&out)
        .as_array()
        .expect("an array")
        .iter()
        .map(|r| {
            (
                r["identity"].as_str().unwrap_or_default().to_owned(),
                r["state"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[test]
fn releases_says_how_each_recorded_release_stands_and_prune_clears_the_way_to_rebuild() {
    let ws = Ws::new();
    ws.shell("wc", "wc", "1.0.0", "5s", OK);
    ws.shell("old", "old", "1.0.0", "5s", OK);
    for name in ["wc", "old"] {
        let out = ws.run(&["build", name]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    assert_eq!(
        releases_json(&ws),
        [
            ("shop/old@1.0.0".into(), "current".into()),
            ("shop/wc@1.0.0".into(), "current".into())
        ]
    );
    // Edit wc's handler under the same version, and remove old's folder.
    ws.shell("wc", "wc", "1.0.0", "5s", &format!("# edited\n{OK}"));
    std::fs::remove_dir_all(ws.root.join("runnables/old")).unwrap();
    assert_eq!(
        releases_json(&ws),
        [
            ("shop/old@1.0.0".into(), "orphan".into()),
            ("shop/wc@1.0.0".into(), "changed".into())
        ]
    );
    let conflict = ws.run(&["build", "wc"]);
    assert_eq!(conflict.status.code(), Some(1));
    assert!(
        stderr(&conflict).contains("[conflict]"),
        "{}",
        stderr(&conflict)
    );

    // A dry run removes nothing; a plain prune removes both stale releases, and says so.
    let dry = ws.run(&["prune", "--dry-run", "--data-dir", "no-such-data"]);
    assert!(dry.status.success(), "{}", stderr(&dry));
    assert!(
        stdout(&dry).contains("would remove wc@1.0.0"),
        "{}",
        stdout(&dry)
    );
    assert_eq!(releases_json(&ws).len(), 2);
    let pruned = ws.run(&["prune", "--data-dir", "no-such-data"]);
    assert!(pruned.status.success(), "{}", stderr(&pruned));
    assert!(
        stdout(&pruned).contains("removed old@1.0.0"),
        "{}",
        stdout(&pruned)
    );
    assert!(
        stdout(&pruned).contains("removed wc@1.0.0"),
        "{}",
        stdout(&pruned)
    );
    assert!(
        !ws._tmp.path().join("no-such-data").exists(),
        "prune must not create a data folder or a store"
    );
    let rebuilt = ws.run(&["build", "wc"]);
    assert!(rebuilt.status.success(), "{}", stderr(&rebuilt));
    assert_eq!(
        releases_json(&ws),
        [("shop/wc@1.0.0".into(), "current".into())]
    );
    // A name that matches nothing is refused, and nothing is removed.
    let unknown = ws.run(&["prune", "nope", "--data-dir", "no-such-data"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(
        stderr(&unknown).contains("[not_found]"),
        "{}",
        stderr(&unknown)
    );
    assert!(
        !stderr(&unknown).contains("wc@1.0.0"),
        "{}",
        stderr(&unknown)
    );
    let other_version = ws.run(&["prune", "wc@9.9.9", "--data-dir", "no-such-data"]);
    assert_eq!(other_version.status.code(), Some(1));
    assert!(
        stderr(&other_version).contains("[not_found]")
            && stderr(&other_version).contains("wc@1.0.0"),
        "the versions of that name are listed: {}",
        stderr(&other_version)
    );
    assert_eq!(releases_json(&ws).len(), 1);
}

#[test]
fn prune_keeps_a_release_a_live_run_is_pinned_to_and_names_the_run() {
    let ws = Ws::new();
    ws.shell("wc", "wc", "1.0.0", "5s", OK);
    ws.shell("other", "other", "1.0.0", "5s", OK);
    let built = json(&ws.run(&["build", "wc", "--json"]));
    let digest = built["digest"].as_str().expect("a digest").to_owned();
    assert!(ws.run(&["build", "other"]).status.success());
    let data = ws._tmp.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let url = format!("sqlite://{}", data.join("host.db").display());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = sessionstore::Store::open(sessionstore::StoreOptions::new(url))
            .await
            .expect("store");
        store
            .create_run(sessionstore::runs::NewRun {
                run_id: sessionstore::RunId::new("run-pinned-1").unwrap(),
                tenant: sessionstore::TenantId::new("local").unwrap(),
                source: "steps: []\n".into(),
                input: "{}".into(),
                holder: "host-a/attempt-1".into(),
                fencing_token: "token-1".into(),
                lease: Duration::from_secs(600),
                idempotency_key: None,
                pins: vec![sessionstore::runs::RunPin {
                    identity: "shop/wc@1.0.0".into(),
                    digest: digest.clone(),
                }],
                started_by: None,
                trace: None,
            })
            .await
            .expect("a live run pinned to wc");
        store.close().await;
    });
    let data_arg = data.to_string_lossy().into_owned();
    let out = ws.run(&["prune", "--all", "--data-dir", &data_arg]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("removed other@1.0.0"),
        "{}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains("[pinned] kept wc@1.0.0") && stderr(&out).contains("run-pinned-1"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        releases_json(&ws),
        [("shop/wc@1.0.0".into(), "current".into())]
    );
}
