#!/usr/bin/env bash
# Builds every HostLink fuzz target and runs each for <seconds>; exits non-zero if any target
# crashes (a panic, a failed round-trip assertion, a sanitizer report, a timeout or OOM).
#
# Coverage-guided with libFuzzer through cargo-fuzz on the stable toolchain: cargo-fuzz needs
# `-Zsanitizer=address` and friends, which stable rustc accepts with RUSTC_BOOTSTRAP=1. The
# ASan runtime ships with the stable `rust-std` component, and libfuzzer-sys builds libFuzzer
# with the system C++ compiler. cargo-fuzz is installed from crates.io when missing.
#
# usage: fuzz/run.sh <seconds-per-target> [target...]
#   HOSTLINK_FUZZ_TARGET_DIR  build directory (default: $CARGO_TARGET_DIR-fuzz, else fuzz/target)
#   HOSTLINK_FUZZ_CORPUS_DIR  where corpora grow (default: the build directory's fuzz-corpus/)
#   HOSTLINK_FUZZ_SANITIZER   address (default) or none (faster; the code under test is safe Rust)
set -euo pipefail

secs="${1:?usage: fuzz/run.sh <seconds-per-target> [target...]}"
shift
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

if [[ -n "${HOSTLINK_FUZZ_TARGET_DIR:-}" ]]; then
  export CARGO_TARGET_DIR="$HOSTLINK_FUZZ_TARGET_DIR"
elif [[ -n "${CARGO_TARGET_DIR:-}" ]]; then
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR%/}-fuzz"
else
  export CARGO_TARGET_DIR="$here/target"
fi
corpus_root="${HOSTLINK_FUZZ_CORPUS_DIR:-$CARGO_TARGET_DIR/fuzz-corpus}"
export RUSTC_BOOTSTRAP=1
sanitizer="${HOSTLINK_FUZZ_SANITIZER:-address}"

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz 0.13.2" >&2
  cargo install cargo-fuzz --version 0.13.2 --locked
fi

if [[ $# -gt 0 ]]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo fuzz list)
fi

echo "fuzz: building the targets" >&2
cargo fuzz build -O -s "$sanitizer"

passed=0
failed=0
failures=()
for t in "${targets[@]}"; do
  corpus="$corpus_root/$t"
  mkdir -p "$corpus"
  if [[ -d "seeds/$t" ]]; then
    cp -n "seeds/$t"/* "$corpus"/ 2>/dev/null || true
  fi
  echo "fuzz: $t for ${secs}s" >&2
  if cargo fuzz run -O -s "$sanitizer" "$t" "$corpus" -- \
      -max_total_time="$secs" -dict=json.dict -timeout=10 -rss_limit_mb=2048 \
      -max_len=65536 -print_final_stats=1 >"$CARGO_TARGET_DIR/fuzz-$t.log" 2>&1; then
    passed=$((passed + 1))
    grep -E '^stat::number_of_executed_units' "$CARGO_TARGET_DIR/fuzz-$t.log" | sed "s/^/fuzz: $t: /" >&2 || true
  else
    failed=$((failed + 1))
    failures+=("$t")
    echo "fuzz: $t FAILED; log: $CARGO_TARGET_DIR/fuzz-$t.log; reproducer under fuzz/artifacts/$t/" >&2
    tail -n 40 "$CARGO_TARGET_DIR/fuzz-$t.log" >&2
  fi
done

echo "fuzz: $passed passed, $failed failed"
if [[ $failed -gt 0 ]]; then
  echo "fuzz: failing targets: ${failures[*]}" >&2
  exit 1
fi
