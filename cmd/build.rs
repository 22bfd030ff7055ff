//! Records the commit `hostd` is built from, for `hostd --version`. Asks git; outside a git
//! checkout (a source tarball, a container build without `.git`) it says so instead of
//! guessing. Never fails the build.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=HOSTD_BUILD_COMMIT");
    // A packager that builds without `.git` may pass the commit in.
    let commit = std::env::var("HOSTD_BUILD_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]));
    let text = match commit {
        Some(c) => format!("commit {c}"),
        None => "commit unknown: not built from a git checkout".to_owned(),
    };
    println!("cargo:rustc-env=HOSTD_COMMIT={text}");
    // Build again when HEAD moves: the HEAD file (a branch switch) and the branch's ref (a
    // commit), loose or packed.
    // (A path that does not exist would rebuild every time, so only existing ones.)
    let mut watched = Vec::new();
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        watched.push(Path::new(&dir).join("HEAD"));
    }
    if let (Some(common), Some(head)) = (
        git(&["rev-parse", "--git-common-dir"]),
        git(&["symbolic-ref", "-q", "HEAD"]),
    ) {
        let common = Path::new(&common);
        watched.push(common.join(&head));
        watched.push(common.join("packed-refs"));
    }
    for path in watched.into_iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}
