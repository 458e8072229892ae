#!/usr/bin/env bash
# The soak of issue 17 (docs/soak.md): one `ppa-vmm run` of 64 mixed vCPUs with a VM limit, a
# group limit and runaway detection, under 50 `stats` pollers at 20 Hz, a subscriber, a 1 Hz
# scraper, clients killed mid-response and a `set-limit` change every second. Prints RSS and fd
# counts over time, events lost, socket latency, the identity at the end and a verdict.
# Not in CI. The load itself is driven by scripts/soak.py (Python 3, standard library only).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"

usage() {
  cat <<EOF
Usage: scripts/soak.sh [--duration SECS] [--out DIR] [--binary PATH] [OPTIONS]

Runs the soak and prints a summary; exit code 0 on PASS, 1 on FAIL, 2 on bad usage.

  --duration SECS       how long the load runs (default 600)
  --out DIR             where the results go (default /tmp/ppa-soak-DATE): summary.txt,
                        summary.json, report.json (the VMM's final report), vmm.stderr,
                        command.txt
  --binary PATH         the ppa-vmm to run (default $repo/target/release/ppa-vmm)
  --clients N           stats pollers on persistent connections (default 50)
  --rate HZ             stats requests per second per poller (default 20)
  --kill-fraction F     share of the pollers killed mid-response every second (default 0.10)
  --vcpus N             vCPUs of the mixed workload (default 64; the group is the first quarter)
  --cpu-limit LIMIT     the VM-wide limit (default 100%, so the soak leaves a core to others)
  --group-limit LIMIT   the limit of group \`soak\` at start (default 20%)
  --runaway-ms MS       runaway detection threshold (default 200)
  --sample-interval S   RSS/fd sampling period (default min(5, duration/20), at least 0.5)
  --client-nice N       nice of the client threads (default -10, as the VMM's api threads and
                        \`bench socket\`'s client; needs CAP_SYS_NICE, else they stay at 0)
  -h, --help            this text

Pass rules (docs/soak.md): the VMM's last RSS and fd count are at most 1.5 x their value at
10 % of the run, and (runs of 600 s or more) its RSS grows by at most 8 KiB a minute over the
second half of the run; every vCPU's identity error in the final report is within
max(0.5 % of wall, 200 us); the VMM stays up and exits 0 after \`shutdown\` with its report;
no stats request goes unanswered for 10 s; no error answers, failed scrapes or connects.
EOF
}

duration=600
out=""
binary="$repo/target/release/ppa-vmm"
pass=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --duration) duration="${2:?--duration needs a value}"; shift 2 ;;
    --out) out="${2:?--out needs a value}"; shift 2 ;;
    --binary) binary="${2:?--binary needs a value}"; shift 2 ;;
    --clients|--rate|--kill-fraction|--vcpus|--cpu-limit|--group-limit|--runaway-ms|--sample-interval|--client-nice)
      pass+=("$1" "${2:?$1 needs a value}"); shift 2 ;;
    *) echo "soak.sh: unknown argument \`$1\` (see --help)" >&2; exit 2 ;;
  esac
done

if ! [[ "$duration" =~ ^[0-9]+([.][0-9]+)?$ ]]; then
  echo "soak.sh: --duration must be a number of seconds, not \`$duration\`" >&2
  exit 2
fi
if [ ! -x "$binary" ]; then
  echo "soak.sh: no ppa-vmm at $binary: build it (cargo build --release) or give --binary" >&2
  exit 2
fi
if ! command -v python3 >/dev/null 2>&1; then
  echo "soak.sh: python3 is needed to drive the load" >&2
  exit 2
fi
if [ ! -w /dev/kvm ]; then
  echo "soak.sh: /dev/kvm is missing or not writable" >&2
  exit 2
fi
[ -n "$out" ] || out="/tmp/ppa-soak-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"

exec python3 "$here/soak.py" --binary "$binary" --duration "$duration" --out "$out" "${pass[@]}"
