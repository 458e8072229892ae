#!/usr/bin/env bash
# Fuzzes the parsers of untrusted input (docs/fuzzing.md) with cargo-fuzz and libFuzzer, each
# target for a bounded time, on the stable toolchain.
#
#   scripts/fuzz.sh [--seconds N] [target...]
#
# Every target when none is named; 45 s each by default (the CI budget), as many at once as
# there are CPUs (FUZZ_JOBS). For a long run:
# `scripts/fuzz.sh --seconds 600`. Installs cargo-fuzz (pinned) under $CARGO_HOME/ppa-vmm-tools
# when it is not on PATH; builds into target/fuzz; keeps the growing corpus in target/fuzz/corpus/NAME
# (seeded from fuzz/seeds/NAME, which is never written). A crash, timeout or out-of-memory
# input is copied to fuzz/regressions/NAME/ (replayed by `cargo test` from then on), printed
# in base64 for CI logs, and makes the script fail once every target has run.
#
# libFuzzer's random seed is FUZZ_SEED when set, else derived from the commit checked out (so
# a CI run of a commit can be repeated, and each new commit explores afresh), else random.
#
# cargo-fuzz builds with -Z flags (AddressSanitizer); RUSTC_BOOTSTRAP=1 lets the stable
# compiler accept them. FUZZ_SANITIZER=none builds without AddressSanitizer (faster, and
# without the flag's need for -Z).
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_FUZZ_VERSION=0.13.2
seconds=45
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --seconds=*) seconds="${1#*=}"; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if [ ${#targets[@]} -eq 0 ]; then
  for f in fuzz/fuzz_targets/*.rs; do targets+=("$(basename "$f" .rs)"); done
fi

# The pinned cargo-fuzz lives beside cargo's own tools, in a directory of its version (so a
# clean clone, CI's, does not build it again, and a cargo-fuzz of another version that the
# user installed is left alone).
tools="${CARGO_HOME:-$HOME/.cargo}/ppa-vmm-tools/cargo-fuzz-$CARGO_FUZZ_VERSION"
export PATH="$tools/bin:$PATH"
if ! cargo fuzz --version 2>/dev/null | grep -q "^cargo-fuzz $CARGO_FUZZ_VERSION\$"; then
  echo "fuzz.sh: installing cargo-fuzz $CARGO_FUZZ_VERSION into $tools"
  cargo install --locked --quiet cargo-fuzz --version "$CARGO_FUZZ_VERSION" --root "$tools"
fi
command -v c++ >/dev/null 2>&1 || {
  echo "fuzz.sh: libfuzzer-sys needs a C++ compiler (scripts/setup.sh installs g++)" >&2
  exit 1
}

export RUSTC_BOOTSTRAP=1
sanitizer="${FUZZ_SANITIZER:-address}"
# One target, or all of them in one build (they share every dependency).
one=()
[ ${#targets[@]} -eq 1 ] && one=("${targets[0]}")
# FUZZ_CODEGEN_UNITS: cargo-fuzz builds with one codegen unit, which compiles ppa-vmm on one
# CPU; CI's 10-second runs take 16 (scripts/test.sh), a faster build for slower runs.
cargo fuzz build --sanitizer "$sanitizer" --codegen-units "${FUZZ_CODEGEN_UNITS:-1}" \
  --target-dir target/fuzz "${one[@]}"
bin_dir=target/fuzz/x86_64-unknown-linux-gnu/release

seed="${FUZZ_SEED:-}"
if [ -z "$seed" ] && rev=$(git rev-parse --short=8 HEAD 2>/dev/null); then
  seed=$((16#$rev % 2147483647 + 1))
fi
seed_opt=()
[ -n "$seed" ] && seed_opt=(-seed="$seed")
echo "fuzz.sh: libFuzzer seed ${seed:-random}"

# One target on each CPU at a time (FUZZ_JOBS overrides): the fuzzers are CPU-bound and
# independent, so N CPUs run N targets for the time one takes.
jobs="${FUZZ_JOBS:-$(nproc)}"
[ "$jobs" -ge 1 ] 2>/dev/null || jobs=1

# Runs target $1 for $seconds; its exit status goes to its log directory's .status file.
fuzz_one() {
  local t=$1 status=0
  local corpus="target/fuzz/corpus/$t" artifacts="target/fuzz/artifacts/$t" log="target/fuzz/logs/$t.log"
  # -rss_limit_mb: a parser that allocates past 2 GiB on a small input is a bug too.
  "$bin_dir/$t" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 "${seed_opt[@]}" \
    -print_final_stats=1 -artifact_prefix="$artifacts/" "$corpus" "fuzz/seeds/$t" \
    >"$log" 2>&1 || status=$?
  echo "$status" >"target/fuzz/logs/$t.status"
}

for t in "${targets[@]}"; do
  [ -x "$bin_dir/$t" ] || { echo "fuzz.sh: no target $t (see fuzz/fuzz_targets/)" >&2; exit 2; }
done
running=0
for t in "${targets[@]}"; do
  rm -rf "target/fuzz/artifacts/$t"
  mkdir -p "target/fuzz/corpus/$t" "target/fuzz/artifacts/$t" target/fuzz/logs
  rm -f "target/fuzz/logs/$t.status"
  echo "fuzz.sh: $t for ${seconds}s"
  fuzz_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait || true

failed=()
summary=()
for t in "${targets[@]}"; do
  artifacts="target/fuzz/artifacts/$t"
  log="target/fuzz/logs/$t.log"
  status=$(cat "target/fuzz/logs/$t.status" 2>/dev/null || echo 1)
  # Runs, speed, and the last status line's coverage (edges), features and corpus.
  execs=$(awk '/^stat::number_of_executed_units/ {print $2}' "$log")
  speed=$(awk '/^stat::average_exec_per_sec/ {print $2}' "$log")
  cov=$(grep -E '^#[0-9]+' "$log" | tail -1 | grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9a-zA-Z]+' || true)
  summary+=("$t: ${seconds} s, ${execs:-?} runs, ${speed:-?} runs/s, $cov")
  found=$(find "$artifacts" -type f \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' -o -name 'leak-*' \) 2>/dev/null)
  if [ "$status" -ne 0 ] || [ -n "$found" ]; then
    failed+=("$t")
    # The panic (from its line to the backtrace) or the sanitizer's report, and the input.
    awk '/panicked at/ {p=1} /^stack backtrace/ {p=0} p; /^(==[0-9]+==)?ERROR: |^SUMMARY: |^Base64: /' \
      "$log" | head -n 40 >&2
    mkdir -p "fuzz/regressions/$t"
    for f in $found; do
      cp "$f" "fuzz/regressions/$t/"
      echo "fuzz.sh: $t: saved fuzz/regressions/$t/$(basename "$f") (give it a name that says what it found)" >&2
    done
  fi
done

echo "fuzz.sh: summary"
printf '  %s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: failed: ${failed[*]} (inputs in fuzz/regressions/; docs/fuzzing.md)" >&2
  exit 1
fi
