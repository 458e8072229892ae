#!/bin/bash
# N (default 200) tiny idle VMs in one run directory: host list and host serve's scrape cost.
# Run it under `flock -x /tmp/ppa-cpu.lock` (docs/operations.md, "200 VMs on one host").
#
#   N=200 RUNS=5 SESSION=same|own COMPARE=/path/to/other/ppa-vmm scripts/host-many.sh
#
# SESSION=own starts the VMMs in a session of their own: one scheduler autogroup for all of
# them, apart from the one `host list` runs in, as VMMs run by systemd units are apart from
# an operator's shell. The default (same) shares this script's session with them: the list
# competes with every VMM thread one to one, the worst case. COMPARE alternates each `host
# list` with the same list by another binary (a before/after pair measured side by side).
# Every VMM started is killed at the end, also when the script is interrupted.
BIN=${BIN:-target/release/ppa-vmm}
N=${N:-200}
RUNS=${RUNS:-5}
SESSION=${SESSION:-same}
D=$(mktemp -d /tmp/h200.XXXX); chmod 700 $D
export BIN N D

cleanup() {
  [ -f $D/pids ] && kill $(cat $D/pids) 2>/dev/null
  sleep 3
  [ -f $D/pids ] && kill -9 $(cat $D/pids) 2>/dev/null
  rm -rf $D
}
trap cleanup EXIT

launch() {
  for i in $(seq 1 $N); do
    $BIN run --guest tiny --vcpus 1 --memory-mib 8 --prefault false --ppa-page-size 0 \
      --workload idle:ms=600000,publish=off --report none --max-runtime 600 --name vm$i \
      --run-dir $D >/dev/null 2>&1 &
    echo $!
  done > $D/pids
}
if [ "$SESSION" = own ]; then
  export -f launch
  setsid -w bash -c launch
else
  launch
fi
for i in $(seq 1 600); do c=$(ls $D/*.sock 2>/dev/null | wc -l); [ "$c" -ge $N ] && break; sleep 0.1; done
echo "sockets: $(ls $D/*.sock | wc -l) after $i polls; session: $SESSION"
sleep 2
head -1 /proc/stat > $D/stat0

# One `host list --json` by binary $1: wall ms, CPU s, rows and their states.
list_once() {
  local s e
  s=$(date +%s%N)
  /usr/bin/time -f "%U %S" -o $D/cpu $1 host list --json --run-dir $D > $D/list.json 2>/dev/null
  e=$(date +%s%N)
  python3 - "$(( (e - s) / 1000000 ))" "$(cat $D/cpu)" "$D/list.json" "$2" <<'EOF'
import json, sys, collections
ms, cpu, path, tag = sys.argv[1], sys.argv[2].split(), sys.argv[3], sys.argv[4]
rows = json.load(open(path))
states = collections.Counter(r["state"] for r in rows)
nocpu = sum(1 for r in rows if r.get("state") == "running" and r.get("cpu_percent") is None)
print(f"{tag} host list: {ms} ms, CPU {float(cpu[0]) + float(cpu[1]):.2f} s, {len(rows)} VMs: "
      + ", ".join(f"{k} {v}" for k, v in sorted(states.items())) + f"; running without CPU% {nocpu}")
EOF
}
for k in $(seq 1 $RUNS); do
  list_once $BIN new
  [ -n "$COMPARE" ] && list_once $COMPARE other
done | tee $D/lists
python3 - $D/lists <<'EOF'
import re, sys, statistics, collections
t = collections.defaultdict(list)
for l in open(sys.argv[1]):
    m = re.match(r"(\w+) host list: (\d+) ms", l)
    if m:
        t[m.group(1)].append(int(m.group(2)))
for k, v in t.items():
    print(f"{k}: median {statistics.median(v)} ms of {len(v)} (min {min(v)}, max {max(v)})")
EOF
cat /proc/loadavg

PORT=19465
$BIN host serve --run-dir $D --metrics-listen 127.0.0.1:$PORT --scrape-timeout-ms 2000 2>/dev/null & SP=$!
sleep 0.5
for k in 1 2 3; do
  t0=$(awk '{print $14+$15}' /proc/$SP/stat)
  s=$(date +%s.%N); curl -s http://127.0.0.1:$PORT/metrics > $D/m.txt; e=$(date +%s.%N)
  t1=$(awk '{print $14+$15}' /proc/$SP/stat)
  echo "scrape: $(wc -c < $D/m.txt) bytes, $(grep -vc '^#' $D/m.txt) series, $(echo "$e - $s" | bc) s wall, serve CPU $(( (t1 - t0) * 10 )) ms, vm_up=0: $(grep -c 'ppa_host_vm_up{.*} 0' $D/m.txt)"
done
kill $SP
head -1 /proc/stat > $D/stat1
paste $D/stat0 $D/stat1 | awk '{t=0; for (i = 2; i <= 9; i++) t += $(i + 11) - $i;
  printf "host during: %d ticks, busy %.0f %%, steal %d ticks\n", t, 100 * (t - ($16 - $5) - ($17 - $6)) / t, $20 - $9}'
