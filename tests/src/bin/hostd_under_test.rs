//! `hostd` for the whole-system tests: the same entry point as the shipped binary.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    cmd::main()
}
