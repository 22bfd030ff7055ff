//! The `hostd` binary: everything it does is `cmd::main`.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    cmd::main()
}
