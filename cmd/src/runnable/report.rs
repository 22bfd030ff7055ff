//! How `hostd runnable` reports: a refusal's code and reason on stderr (and as JSON with
//! `--json`), pretty JSON on stdout. A leaf the subcommands share.

use std::io::Write;
use std::process::ExitCode;

use ::runnable::RunnableError;
use serde_json::{Value, json};

/// Exit status of a refusal (nothing ran, nothing changed).
pub const EXIT_REFUSED: u8 = 1;

/// Prints a refusal on stderr (and as JSON on stdout) and gives the refusal exit status.
pub fn refuse(err: &RunnableError, json: bool) -> ExitCode {
    eprintln!("hostd: [{}] {err}", err.code());
    if json {
        println!("{}", json!({ "error": err.to_json() }));
    }
    ExitCode::from(EXIT_REFUSED)
}

pub fn print_json(v: &Value) {
    let mut out = std::io::stdout().lock();
    // A closed pipe is a quiet end, not a panic.
    let _ = serde_json::to_writer_pretty(&mut out, v);
    let _ = writeln!(out);
}
