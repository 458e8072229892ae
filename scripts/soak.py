#!/usr/bin/env python3
"""The soak of issue 17: one `ppa-vmm run` under steady control-plane load for a long time.

Started by scripts/soak.sh (see docs/soak.md). Standard library only. What runs at once:

- the VMM: 64 vCPUs of `mixed`, a VM-wide limit, a vCPU group with its own limit, runaway
  detection, the control socket, the metrics endpoint and a report file;
- `--clients` pollers (50) on persistent connections, each sending `stats` at `--rate` (20 Hz),
  all driven by one selector loop (no thread or process per request); every second 10 % of
  them are killed mid-response (the request is sent, the socket closed unread or after a
  partial read) and reconnect;
- one subscriber counting events by kind and the events the VMM says it dropped;
- a scraper GETting /metrics at 1 Hz;
- a `set-limit` change every second on its own connection;
- a sampler reading the VMM's RSS, fds and threads (/proc/PID) and the host's CPU (/proc/stat).

At the end it sends `shutdown`, reads the final report, checks the identity of every vCPU,
writes summary.json and summary.txt into --out, prints the text and exits 0 on PASS, 1 on FAIL.
"""

import argparse
import heapq
import json
import math
import os
import random
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from array import array

HANG_S = 10.0  # a request unanswered this long is a hang
GROWTH_FACTOR = 1.5  # RSS or fds at the end above this times the value at 10 % of the run: FAIL
REF_FRACTION = 0.10
# Memory after warm-up (issue 28): the RSS slope over the second half of the run, KiB per
# minute, above which the soak fails (8 KiB/min is 11.5 MB a day), judged on runs of at least
# SLOPE_MIN_RUN_S (a shorter second half is too few pages to tell a slope from noise).
RSS_SLOPE_MAX = 8.0
SLOPE_MIN_RUN_S = 600
LIMIT_CYCLE = [
    ("soak", "10%"),
    ("soak", "30%"),
    ("soak", "4ms/10ms"),  # 250 us each of the 16 members: the least a member is held to
    ("soak", "none"),
    ("soak", "20%"),
    ("vm", "90%"),
    ("soak", "15ms/50ms"),
    ("vm", "100%"),
]


def now():
    return time.monotonic()


def pct(sorted_vals, p):
    """Nearest-rank percentile of an ascending list (None when empty)."""
    if not sorted_vals:
        return None
    k = max(0, min(len(sorted_vals) - 1, math.ceil(p * len(sorted_vals) / 100.0 - 1e-9) - 1))
    return sorted_vals[k]


# ---------------------------------------------------------------- host and process readings


def read_cpu_line():
    """The aggregate `cpu` line of /proc/stat as a list of ticks."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu "):
                return [int(x) for x in line.split()[1:]]
    return []


def cpu_shares(a, b):
    """Busy, steal and idle shares of all host CPUs between two /proc/stat `cpu` lines."""
    d = [y - x for x, y in zip(a, b)]
    total = sum(d[:8]) or 1  # user nice system idle iowait irq softirq steal
    idle = d[3] + d[4]
    steal = d[7] if len(d) > 7 else 0
    return {
        "busy_pct": round(100.0 * (total - idle - steal) / total, 1),
        "steal_pct": round(100.0 * steal / total, 2),
        "idle_pct": round(100.0 * idle / total, 1),
    }


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def thread_ticks(pid):
    """CPU ticks (utime + stime) by thread name; the vCPU threads summed as `vcpu*`."""
    by_name = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                head, _, rest = f.read().rpartition(")")
        except OSError:
            continue
        name = head.partition("(")[2]
        name = "vcpu*" if name.startswith("vcpu") else name
        fields = rest.split()
        by_name[name] = by_name.get(name, 0) + int(fields[11]) + int(fields[12])
    return by_name


def proc_sample(pid):
    """RSS, peak RSS, threads, open fds and CPU ticks of a process, or None if it is gone."""
    try:
        out = {}
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, val = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(val.split()[0])
                elif key == "Threads":
                    out[key] = int(val)
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out["cpu_ticks"] = int(fields[11]) + int(fields[12])
        out["thread_ticks"] = thread_ticks(pid)
        return out
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


def set_thread_nice(st, nice):
    """Give the calling thread `nice` (Linux: a tid is a PRIO_PROCESS target), as the VMM's api
    threads and `bench socket`'s client have, so that the latency measured is the VMM's and not
    this thread's wait behind 64 vCPU threads. Called on the main thread after the VMM started
    and before the other threads: they inherit it, so that no thread of ours holds the GIL while
    it waits behind the vCPUs at a lower priority. Falls back to the inherited nice."""
    if nice is None:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except OSError as e:
        with st.lock:
            st.nice_status = f"could not set nice {nice} ({e.strerror}); clients at nice {os.nice(0)}"


# ---------------------------------------------------------------- shared state


class Stats:
    """Everything the load threads record; one lock for the rare updates."""

    def __init__(self):
        self.lock = threading.Lock()
        self.lat = array("d")  # stats latency, s
        self.lat_t = array("d")  # when each answer arrived, s since the soak started
        self.stats_ok = 0
        self.stats_err = 0
        self.err_examples = []
        self.hangs = 0
        self.missed_ticks = 0
        self.kills = 0
        self.reconnects = 0
        self.connect_fail = 0
        self.connect_lat = array("d")
        self.events = {}
        self.events_lost = 0
        self.dropped_msgs = 0
        self.sub_status = "not started"
        self.vm_exit = None
        self.scrapes_ok = 0
        self.scrape_fail = 0
        self.scrape_lat = array("d")
        self.scrape_bytes = []
        self.limit_ok = 0
        self.limit_err = 0
        self.limit_lat = array("d")
        self.samples = []
        self.nice_status = "ok"

    def error(self, what):
        with self.lock:
            if len(self.err_examples) < 20:
                self.err_examples.append(what[:300])


# ---------------------------------------------------------------- pollers (one selector loop)


class Poller:
    __slots__ = ("idx", "sock", "buf", "sent_at", "req_id", "due", "kill", "mode")

    def __init__(self, idx):
        self.idx = idx
        self.sock = None
        self.buf = bytearray()
        self.sent_at = None
        self.req_id = 0
        self.due = 0.0
        self.kill = None  # None, "close" (after the send) or "partial" (after a partial read)
        self.mode = "idle"


def run_pollers(args, sock_path, st, t0, stop):
    sel = selectors.DefaultSelector()
    period = 1.0 / args.rate
    pollers = [Poller(i) for i in range(args.clients)]
    n_kill = max(1, round(args.clients * args.kill_fraction)) if args.kill_fraction > 0 else 0

    def connect(p):
        c0 = now()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(sock_path)
        except OSError as e:
            s.close()
            st.connect_fail += 1
            st.error(f"client {p.idx}: connect failed: {e}")
            return False
        st.connect_lat.append(now() - c0)
        s.setblocking(False)
        p.sock, p.buf, p.sent_at, p.mode = s, bytearray(), None, "idle"
        sel.register(s, selectors.EVENT_READ, p)
        return True

    def drop(p):
        if p.sock is not None:
            sel.unregister(p.sock)
            p.sock.close()
            p.sock = None

    def reconnect(p):
        drop(p)
        st.reconnects += 1
        return connect(p)

    heap = []
    start = now()
    for p in pollers:
        connect(p)
        p.due = start + period * p.idx / len(pollers)
        heapq.heappush(heap, (p.due, p.idx))
    next_kill = start + 1.0

    while not stop.is_set():
        t = now()
        if t >= next_kill and n_kill:
            for p in random.sample(pollers, n_kill):
                p.kill = random.choice(("close", "partial"))
            next_kill += 1.0
        # Send what is due.
        while heap and heap[0][0] <= t:
            _, i = heapq.heappop(heap)
            p = pollers[i]
            if p.sock is None and not connect(p):
                pass
            elif p.sent_at is not None:
                st.missed_ticks += 1  # the previous answer has not arrived: skip this tick
                if t - p.sent_at > HANG_S:
                    st.hangs += 1
                    st.error(f"client {p.idx}: no answer to request {p.req_id} in {HANG_S} s")
                    reconnect(p)
            else:
                p.req_id += 1
                try:
                    p.sock.send(b'{"id":%d,"cmd":"stats"}\n' % p.req_id)
                    p.sent_at = now()
                except BlockingIOError:
                    st.missed_ticks += 1
                except OSError as e:
                    st.error(f"client {p.idx}: send failed: {e}")
                    reconnect(p)
                else:
                    if p.kill == "close":
                        p.kill = None
                        st.kills += 1
                        reconnect(p)
            p.due += period
            if p.due < t - period:  # fell behind by more than a period: do not burst
                st.missed_ticks += int((t - p.due) / period)
                p.due = t + period
            heapq.heappush(heap, (p.due, i))
        timeout = max(0.0, min(heap[0][0] if heap else t + 0.05, next_kill) - now())
        for key, _ in sel.select(timeout=min(timeout, 0.05)):
            p = key.data
            if p.kill == "partial" and p.sent_at is not None:
                try:
                    p.sock.recv(512)
                except OSError:
                    pass
                p.kill = None
                st.kills += 1
                reconnect(p)
                continue
            try:
                chunk = p.sock.recv(1 << 17)
            except BlockingIOError:
                continue
            except OSError as e:
                st.error(f"client {p.idx}: recv failed: {e}")
                reconnect(p)
                continue
            if not chunk:
                if not stop.is_set():
                    st.error(f"client {p.idx}: the VMM closed the connection")
                reconnect(p)
                continue
            p.buf += chunk
            while True:
                nl = p.buf.find(b"\n")
                if nl < 0:
                    break
                line = bytes(p.buf[:nl])
                del p.buf[: nl + 1]
                t_ans = now()
                if p.sent_at is None:
                    st.stats_err += 1
                    st.error(f"client {p.idx}: unexpected line: {line[:200]!r}")
                    continue
                if line.startswith(b'{"id":%d,"ok":true' % p.req_id):
                    st.stats_ok += 1
                    st.lat.append(t_ans - p.sent_at)
                    st.lat_t.append(t_ans - t0)
                else:
                    st.stats_err += 1
                    st.error(f"client {p.idx}: request {p.req_id}: {line[:300]!r}")
                p.sent_at = None
    for p in pollers:
        drop(p)


# ---------------------------------------------------------------- subscriber, scraper, limits


def run_subscriber(args, sock_path, st):
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sock_path)
        f = s.makefile("rb")
        s.sendall(b'{"id":"sub","cmd":"subscribe"}\n')
        first = json.loads(f.readline())
        if not first.get("ok"):
            st.sub_status = f"subscribe refused: {first}"
            return
        st.sub_status = "subscribed to " + ",".join(first["result"]["events"])
        for line in f:
            ev = json.loads(line)
            kind = ev.get("event", "response")
            with st.lock:
                st.events[kind] = st.events.get(kind, 0) + 1
                if kind == "dropped":
                    st.dropped_msgs += 1
                    st.events_lost += int(ev.get("count", 0))
            if kind == "vm-exit":
                st.vm_exit = ev
        st.sub_status += "; the VMM closed the stream"
        if st.vm_exit is None:
            st.sub_status += " without a vm-exit event"
    except (OSError, ValueError) as e:
        st.sub_status = f"subscriber failed: {e}"


def run_scraper(args, url, st, stop):
    nxt = now()
    while not stop.is_set():
        t = now()
        try:
            with urllib.request.urlopen(url, timeout=HANG_S) as r:
                body = r.read()
                code = r.status
            if code == 200 and body:
                st.scrapes_ok += 1
                st.scrape_lat.append(now() - t)
                st.scrape_bytes.append(len(body))
            else:
                st.scrape_fail += 1
                st.error(f"scrape: HTTP {code}, {len(body)} bytes")
        except Exception as e:  # noqa: BLE001 - any failure of a scrape is counted
            if stop.is_set():
                break
            st.scrape_fail += 1
            st.error(f"scrape failed: {e}")
        nxt += 1.0
        stop.wait(max(0.0, nxt - now()))


def run_limits(args, sock_path, st, stop):
    s = None
    i = 0
    nxt = now() + 1.0
    while not stop.wait(max(0.0, nxt - now())):
        nxt += 1.0
        group, limit = LIMIT_CYCLE[i % len(LIMIT_CYCLE)]
        i += 1
        try:
            if s is None:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(HANG_S)
                s.connect(sock_path)
                f = s.makefile("rb")
            req = {"id": i, "cmd": "set-limit", "group": group, "limit": limit}
            t = now()
            s.sendall(json.dumps(req).encode() + b"\n")
            line = f.readline()
            st.limit_lat.append(now() - t)
            ans = json.loads(line)
            if ans.get("ok") and ans.get("id") == i:
                st.limit_ok += 1
            else:
                st.limit_err += 1
                st.error(f"set-limit {group}={limit}: {line[:300]!r}")
        except (OSError, ValueError) as e:
            st.limit_err += 1
            st.error(f"set-limit {group}={limit}: {e}")
            if s is not None:
                s.close()
            s = None
    if s is not None:
        s.close()


def run_sampler(pid, st, t0, interval, stop):
    while True:
        s = proc_sample(pid)
        if s is not None:
            s["t"] = round(now() - t0, 2)
            s["host_cpu"] = read_cpu_line()
            s["load1"] = loadavg()
            with st.lock:
                st.samples.append(s)
        if stop.wait(interval):
            return


# ---------------------------------------------------------------- the VMM


def request(sock_path, obj, timeout=HANG_S):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(sock_path)
        s.sendall(json.dumps(obj).encode() + b"\n")
        return json.loads(s.makefile("rb").readline())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_vmm(args, sock_path, port):
    ms = int(args.duration + 300) * 1000  # every workload outlasts the soak; `shutdown` ends it
    cmd = [
        args.binary, "run",
        "--vcpus", str(args.vcpus),
        "--workload", f"mixed:ms={ms}",
        "--cpu-limit", args.cpu_limit,
        "--vcpu-group", f"soak:0-{args.vcpus // 4 - 1}:{args.group_limit}",
        "--runaway", str(args.runaway_ms),
        "--api-sock", sock_path,
        "--metrics-addr", f"127.0.0.1:{port}",
        "--name", "soak",
        "--report", "json",
        "--report-file", os.path.join(args.out, "report.json"),
        "--max-runtime", str(int(args.duration) + 600),
    ]
    with open(os.path.join(args.out, "command.txt"), "w") as f:
        f.write(" ".join(cmd) + "\n")
    err = open(os.path.join(args.out, "vmm.stderr"), "wb")
    out = open(os.path.join(args.out, "vmm.stdout"), "wb")
    proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
    deadline = now() + 60
    while now() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"soak: the VMM exited at start with code {proc.returncode}; "
                             f"see {args.out}/vmm.stderr")
        try:
            ans = request(sock_path, {"id": 0, "cmd": "version"}, timeout=5)
            if ans.get("ok"):
                return proc, cmd, ans["result"]
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("soak: the VMM did not answer on its socket within 60 s")


# ---------------------------------------------------------------- summary and verdict


def slope_per_min(points):
    """Least-squares slope of (t s, value) points, per minute (None under 3 points)."""
    if len(points) < 3:
        return None
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    return round(60.0 * sum((t - mt) * (v - mv) for t, v in points) / den, 2) if den else None


def series(samples, key, ref_t):
    vals = [(s["t"], s[key]) for s in samples if key in s]
    if not vals:
        return None
    ref = next((v for t, v in vals if t >= ref_t), vals[-1][1])
    first, last = vals[0][1], vals[-1][1]
    return {"first": first, "at_10pct": ref, "max": max(v for _, v in vals), "last": last,
            "last_over_10pct": round(last / ref, 3) if ref else None,
            "slope_per_min_after_10pct": slope_per_min([(t, v) for t, v in vals if t >= ref_t]),
            "slope_per_min_second_half": slope_per_min(
                [(t, v) for t, v in vals if t >= vals[-1][0] / 2])}


def summarize(args, st, ctx):
    fails = []
    lat = sorted(st.lat)
    ms = lambda v: None if v is None else round(v * 1000.0, 3)  # noqa: E731
    ref_t = REF_FRACTION * ctx["ran_s"]
    rss = series(st.samples, "VmRSS", ref_t)
    fds = series(st.samples, "fds", ref_t)
    thr = series(st.samples, "Threads", ref_t)
    for name, s in (("RSS", rss), ("fds", fds)):
        if s is None:
            fails.append(f"no {name} samples")
        elif s["last"] > GROWTH_FACTOR * s["at_10pct"]:
            fails.append(f"{name} grew: {s['last']} at the end > {GROWTH_FACTOR} x "
                         f"{s['at_10pct']} at 10 % of the run")
    half = (rss or {}).get("slope_per_min_second_half")
    if ctx["ran_s"] >= SLOPE_MIN_RUN_S and half is not None and half > RSS_SLOPE_MAX:
        fails.append(f"RSS still grows after warm-up: {half} KiB/min over the second half of "
                     f"the run > {RSS_SLOPE_MAX}")
    # Latency over time: p99 of each tenth of the run, to see a trend.
    tenths = []
    if ctx["ran_s"] > 0:
        buckets = [[] for _ in range(10)]
        for t, v in zip(st.lat_t, st.lat):
            buckets[min(9, int(10 * t / ctx["ran_s"]))].append(v)
        tenths = [ms(pct(sorted(b), 99)) for b in buckets]
    host = {}
    if len(st.samples) >= 2:
        a, b = st.samples[0], st.samples[-1]
        host = cpu_shares(a["host_cpu"], b["host_cpu"])
        span = b["t"] - a["t"] or 1
        tck = os.sysconf("SC_CLK_TCK")
        host["vmm_cpu_pct_of_one_cpu"] = round(100.0 * (b["cpu_ticks"] - a["cpu_ticks"]) / tck / span, 1)
        a_t, b_t = a.get("thread_ticks", {}), b.get("thread_ticks", {})
        host["vmm_threads_cpu_pct_of_one_cpu"] = {
            k: round(100.0 * (b_t[k] - a_t.get(k, 0)) / tck / span, 1) for k in sorted(b_t)}
        host["load1_first_max_last"] = [a["load1"], max(s["load1"] for s in st.samples), b["load1"]]
    host["cpus"] = os.cpu_count()
    host["kernel"] = os.uname().release
    host["load_generator_cpu_s"] = round(ctx["gen_cpu_s"], 1)
    # The VMM's end and the final report.
    vmm = {"exit_code": ctx["exit_code"], "died_during_soak": ctx["died"],
           "shutdown_answer": ctx["shutdown_answer"], "stop_s": ctx["stop_s"]}
    if ctx["died"]:
        fails.append(f"the VMM died during the soak (exit code {ctx['exit_code']})")
    elif ctx["exit_code"] is None:
        fails.append("the VMM did not exit within 60 s of `shutdown` (killed)")
    elif ctx["exit_code"] != 0:
        fails.append(f"the VMM exited with code {ctx['exit_code']} after `shutdown`")
    ident = {"checked": 0}
    try:
        with open(os.path.join(args.out, "report.json")) as f:
            rep = json.load(f)
        vmm["end"] = rep["vm"].get("end")
        vmm["uptime_s"] = round(rep["vm"].get("uptime_ns", 0) / 1e9, 1)
        worst, bad, overloads = 0, [], 0
        for v in rep["vcpus"]:
            err, wall = v["identity_error_ns"], v["wall_ns"]
            tol = max(wall // 200, 200_000)  # ppa-vmm-api identity_within, stopped vCPU
            worst = max(worst, abs(err))
            overloads += v.get("overloads", 0)
            if abs(err) > tol:
                bad.append({"vcpu": v["id"], "identity_error_ns": err, "tolerance_ns": tol})
        ident = {"checked": len(rep["vcpus"]), "max_abs_identity_error_ns": worst,
                 "failing": bad, "all_within": not bad}
        vmm["overloads"] = overloads
        vmm["groups"] = [{k: g.get(k) for k in ("name", "limit", "periods", "throttled_periods",
                                                  "limited_ns", "overshoot_max_ns")}
                         for g in rep.get("groups", [])]
        if bad:
            fails.append(f"{len(bad)} vCPU(s) outside the identity tolerance")
        if vmm["end"] != "shutdown":
            fails.append(f"the run ended as {vmm['end']!r}, not 'shutdown'")
    except (OSError, ValueError, KeyError) as e:
        fails.append(f"no readable final report: {e}")
    if st.hangs:
        fails.append(f"{st.hangs} stats request(s) unanswered for {HANG_S} s")
    if st.stats_err:
        fails.append(f"{st.stats_err} stats request(s) answered with an error")
    if st.limit_err:
        fails.append(f"{st.limit_err} set-limit request(s) failed")
    if st.scrape_fail:
        fails.append(f"{st.scrape_fail} scrape(s) failed")
    if st.connect_fail:
        fails.append(f"{st.connect_fail} connect(s) failed")
    if not ctx["died"] and st.vm_exit is None:
        fails.append(f"the subscriber got no vm-exit event ({st.sub_status})")
    slat = sorted(st.scrape_lat)
    llat = sorted(st.limit_lat)
    clat = sorted(st.connect_lat)
    return {
        "verdict": "FAIL" if fails else "PASS",
        "failures": fails,
        "rules": {
            "growth": f"FAIL if the last RSS or fd sample > {GROWTH_FACTOR} x the first sample "
                      f"at or after {int(REF_FRACTION * 100)} % of the run, or (runs of "
                      f"{SLOPE_MIN_RUN_S} s or more) the RSS slope over the second half of the "
                      f"run > {RSS_SLOPE_MAX} KiB/min",
            "identity": "FAIL if a vCPU's |identity_error_ns| in the final report > "
                        "max(wall_ns / 200, 200000) (ppa-vmm-api identity_within, stopped)",
            "vmm": "FAIL if the VMM dies, does not exit 0 within 60 s of `shutdown`, or the "
                   "report is missing or does not end as 'shutdown'",
            "requests": f"FAIL on a stats request unanswered for {HANG_S} s, an error answer "
                        "to stats or set-limit, a failed scrape or connect, or no vm-exit event",
        },
        "settings": {k: getattr(args, k) for k in ("duration", "clients", "rate", "kill_fraction",
                                                   "vcpus", "cpu_limit", "group_limit",
                                                   "runaway_ms", "sample_interval",
                                                   "client_nice")},
        "client_nice": st.nice_status,
        "command": ctx["cmd"],
        "version": ctx["version"],
        "ran_s": round(ctx["ran_s"], 1),
        "rss_kib": rss, "fds": fds, "threads": thr,
        "stats_requests": {"ok": st.stats_ok, "errors": st.stats_err, "hangs": st.hangs,
                           "missed_ticks": st.missed_ticks,
                           "rate_per_s": round(st.stats_ok / ctx["ran_s"], 1) if ctx["ran_s"] else 0,
                           "p50_ms": ms(pct(lat, 50)), "p99_ms": ms(pct(lat, 99)),
                           "p999_ms": ms(pct(lat, 99.9)), "max_ms": ms(lat[-1] if lat else None),
                           "p99_ms_by_tenth_of_run": tenths},
        "kills": {"killed_mid_response": st.kills, "reconnects": st.reconnects,
                  "connect_fail": st.connect_fail, "connect_p99_ms": ms(pct(clat, 99))},
        "events": {"received": dict(sorted(st.events.items())),
                   "received_total": sum(v for k, v in st.events.items() if k != "dropped"),
                   "lost": st.events_lost, "dropped_messages": st.dropped_msgs,
                   "subscriber": st.sub_status, "vm_exit": st.vm_exit},
        "scrapes": {"ok": st.scrapes_ok, "failed": st.scrape_fail, "p50_ms": ms(pct(slat, 50)),
                    "max_ms": ms(slat[-1] if slat else None),
                    "bytes_last": st.scrape_bytes[-1] if st.scrape_bytes else None},
        "set_limit": {"ok": st.limit_ok, "failed": st.limit_err, "p50_ms": ms(pct(llat, 50)),
                      "max_ms": ms(llat[-1] if llat else None)},
        "identity": ident,
        "vmm": vmm,
        "host": host,
        "errors_seen": st.err_examples,
        "samples": [{k: s[k] for k in ("t", "VmRSS", "VmHWM", "fds", "Threads", "load1")
                     if k in s} for s in st.samples],
    }


def text(sm):
    r, f, s, e = sm["rss_kib"] or {}, sm["fds"] or {}, sm["stats_requests"], sm["events"]
    h, i, v = sm["host"], sm["identity"], sm["vmm"]
    line = lambda d: (f"first {d.get('first')}  at 10 % {d.get('at_10pct')}  max {d.get('max')}"  # noqa: E731
                      f"  last {d.get('last')}  (last / at 10 % = {d.get('last_over_10pct')}; "
                      f"{d.get('slope_per_min_after_10pct')}/min after 10 %, "
                      f"{d.get('slope_per_min_second_half')}/min over the second half)")
    out = [
        f"ppa-vmm soak: {sm['verdict']}  ({sm['ran_s']} s, {sm['settings']['vcpus']} vCPUs mixed, "
        f"{sm['settings']['clients']} clients x {sm['settings']['rate']} Hz)",
        f"VMM RSS KiB   {line(r)}",
        f"VMM fds       {line(f)}",
        f"VMM threads   {line(sm['threads'] or {})}",
        f"stats         {s['ok']} answered ({s['rate_per_s']}/s), {s['errors']} errors, "
        f"{s['hangs']} hangs, {s['missed_ticks']} ticks skipped behind a late answer",
        f"stats latency p50 {s['p50_ms']} ms  p99 {s['p99_ms']} ms  p99.9 {s['p999_ms']} ms  "
        f"max {s['max_ms']} ms",
        f"  p99 by tenth of the run (ms): {s['p99_ms_by_tenth_of_run']}",
        f"kills         {sm['kills']['killed_mid_response']} clients killed mid-response, "
        f"{sm['kills']['reconnects']} reconnects, {sm['kills']['connect_fail']} connect failures",
        f"events        {e['received_total']} received {e['received']}, {e['lost']} lost "
        f"({e['dropped_messages']} dropped messages); {e['subscriber']}",
        f"scrapes       {sm['scrapes']['ok']} ok, {sm['scrapes']['failed']} failed, p50 "
        f"{sm['scrapes']['p50_ms']} ms, max {sm['scrapes']['max_ms']} ms, "
        f"{sm['scrapes']['bytes_last']} bytes",
        f"set-limit     {sm['set_limit']['ok']} ok, {sm['set_limit']['failed']} failed, p50 "
        f"{sm['set_limit']['p50_ms']} ms, max {sm['set_limit']['max_ms']} ms",
        f"identity      {i.get('checked')} vCPUs, max |error| {i.get('max_abs_identity_error_ns')} ns, "
        f"all within tolerance: {i.get('all_within')}",
        f"VMM end       {v.get('end')}, exit code {v.get('exit_code')}, stopped in "
        f"{v.get('stop_s')} s, overloads {v.get('overloads')}",
        f"groups        {v.get('groups')}",
        f"host          {h.get('cpus')} CPUs, kernel {h.get('kernel')}: busy {h.get('busy_pct')} %, "
        f"steal {h.get('steal_pct')} %, idle {h.get('idle_pct')} %, load1 first/max/last "
        f"{h.get('load1_first_max_last')}; VMM {h.get('vmm_cpu_pct_of_one_cpu')} % of a CPU, "
        f"load generator {h.get('load_generator_cpu_s')} CPU s at nice "
        f"{sm['settings']['client_nice']} ({sm['client_nice']})",
        f"VMM threads   % of a CPU: {h.get('vmm_threads_cpu_pct_of_one_cpu')}",
    ]
    for fl in sm["failures"]:
        out.append(f"FAIL: {fl}")
    for er in sm["errors_seen"][:5]:
        out.append(f"seen: {er}")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", required=True)
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--out", required=True)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--rate", type=float, default=20)
    ap.add_argument("--kill-fraction", type=float, default=0.10)
    ap.add_argument("--vcpus", type=int, default=64)
    ap.add_argument("--cpu-limit", default="100%")
    ap.add_argument("--group-limit", default="20%")
    ap.add_argument("--runaway-ms", type=int, default=200)
    ap.add_argument("--sample-interval", type=float, default=None)
    ap.add_argument("--client-nice", type=int, default=-10)
    args = ap.parse_args()
    if args.vcpus < 4:
        ap.error("--vcpus must be at least 4")
    if args.clients < 1 or args.rate <= 0 or not 0 <= args.kill_fraction <= 1:
        ap.error("--clients must be >= 1, --rate > 0 and --kill-fraction within 0..1")
    if args.sample_interval is None:
        args.sample_interval = max(0.5, min(5.0, args.duration / 20))
    os.makedirs(args.out, exist_ok=True)
    sockdir = tempfile.mkdtemp(prefix="ppa-soak-")  # a short path: sun_path has 108 bytes
    sock_path = os.path.join(sockdir, "vmm.sock")
    port = free_port()

    stop = threading.Event()
    interrupted = []

    def on_signal(signum, _frame):
        interrupted.append(signum)
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    st = Stats()
    try:
        proc, cmd, version = start_vmm(args, sock_path, port)
    except SystemExit:
        os.rmdir(sockdir)  # the VMM removes its socket file when it ends
        raise
    print(f"soak: VMM pid {proc.pid} up ({version}); {args.duration:g} s of load; out {args.out}",
          flush=True)
    set_thread_nice(st, args.client_nice)
    t0 = now()
    gen0 = os.times()
    threads = [
        threading.Thread(target=run_sampler, args=(proc.pid, st, t0, args.sample_interval, stop)),
        threading.Thread(target=run_pollers, args=(args, sock_path, st, t0, stop)),
        threading.Thread(target=run_subscriber, args=(args, sock_path, st), daemon=True),
        threading.Thread(target=run_scraper, args=(args, f"http://127.0.0.1:{port}/metrics", st, stop)),
        threading.Thread(target=run_limits, args=(args, sock_path, st, stop)),
    ]
    for th in threads:
        th.start()
    died = False
    last_print = t0
    while not stop.wait(0.5):
        if proc.poll() is not None:
            died = True
            break
        t = now()
        if t - t0 >= args.duration:
            break
        if t - last_print >= 60:
            last_print = t
            smp = st.samples[-1] if st.samples else {}
            print(f"soak: {t - t0:.0f} s: {st.stats_ok} stats answered, RSS "
                  f"{smp.get('VmRSS')} KiB, {smp.get('fds')} fds", flush=True)
    ran_s = now() - t0
    final = proc_sample(proc.pid) if not died else None
    if final is not None:
        final["t"] = round(ran_s, 2)
        final["host_cpu"] = read_cpu_line()
        final["load1"] = loadavg()
    stop.set()
    for th in threads[:2] + threads[3:]:
        th.join()
    if final is not None:
        st.samples.append(final)
    gen1 = os.times()
    # Stop the VM through the socket and wait for its report.
    shutdown_answer, exit_code, stop_s = None, proc.returncode, None
    if not died:
        t = now()
        try:
            shutdown_answer = request(sock_path, {"id": "end", "cmd": "shutdown"})
        except (OSError, ValueError) as e:
            shutdown_answer = f"shutdown failed: {e}"
        try:
            exit_code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            exit_code = None
        stop_s = round(now() - t, 2)
        threads[2].join(timeout=5)
    ctx = {"ran_s": ran_s, "died": died, "exit_code": exit_code, "stop_s": stop_s,
           "shutdown_answer": shutdown_answer, "cmd": cmd, "version": version,
           "gen_cpu_s": (gen1.user + gen1.system) - (gen0.user + gen0.system)}
    sm = summarize(args, st, ctx)
    if interrupted:
        sm["failures"].insert(0, f"interrupted by signal {interrupted[0]} after {ran_s:.0f} s")
        sm["verdict"] = "FAIL"
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(sm, f, indent=1)
        f.write("\n")
    txt = text(sm)
    with open(os.path.join(args.out, "summary.txt"), "w") as f:
        f.write(txt)
    sys.stdout.write(txt)
    try:
        os.rmdir(sockdir)
    except OSError:
        pass
    return 0 if sm["verdict"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
