#!/bin/bash
# N (default 200) tiny idle VMs in one run directory: host list and host serve's scrape cost.
# Run it under `flock -x /tmp/ppa-cpu.lock` (docs/operations.md, "200 VMs on one host").
BIN=${BIN:-target/release/ppa-vmm}
D=$(mktemp -d /tmp/h200.XXXX); chmod 700 $D
N=${N:-200}
head -1 /proc/stat > $D/stat0
for i in $(seq 1 $N); do
  $BIN run --guest tiny --vcpus 1 --memory-mib 8 --prefault false --ppa-page-size 0 \
    --workload idle:ms=600000,publish=off --report none --max-runtime 600 --name vm$i --run-dir $D \
    >/dev/null 2>&1 &
  PIDS="$PIDS $!"
done
for i in $(seq 1 600); do c=$(ls $D/*.sock 2>/dev/null | wc -l); [ "$c" -ge $N ] && break; sleep 0.1; done
echo "sockets: $(ls $D/*.sock | wc -l) after $i polls"
sleep 2
for k in 1 2 3; do
  s=$(date +%s.%N); $BIN host list --json --run-dir $D > $D/list.json; e=$(date +%s.%N)
  echo "host list: $(python3 -c "import json;print(len(json.load(open('$D/list.json'))))") VMs in $(echo "$e - $s" | bc) s; unreachable: $(grep -o unreachable $D/list.json | wc -l)"
done
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
echo "steal ticks during: $(paste $D/stat0 $D/stat1 | awk '{print $20-$9}')"
kill $PIDS 2>/dev/null
sleep 3; rm -rf $D
