//! `ppa-vmm bench socket` (spec section 9): what the control socket costs the guests and how
//! fast it answers.
//!
//! Each round runs the same 64-vCPU tiny guest (doorbell exits back to back on every vCPU,
//! MMIO) three times, with the control socket open each time: with no client; with a client
//! thread that keeps its pace (1000 wake-ups a second, by absolute deadlines) but sends
//! nothing; and with that client sending `stats` at each wake-up and timing each request from
//! its write to the end of its response line. Throughput and latencies count over the same
//! steady window: from 100 ms after every vCPU thread runs (the start of 64 threads is not
//! what is measured; the client learns it from `threads`, which leaves the stats refresher
//! asleep) for `window` (3 s by default), after which the bench shuts the VM down. A bench
//! thread that sleeps through the window reads every vCPU's exit counters in-process at both
//! ends (so the no-client run has no socket traffic at all); the start of the threads and the
//! stragglers of a run that ends by itself spread a run's length by up to a second on the
//! development host, and counting over the uptime let that noise into every ratio. The client runs at nice 0 like a monitoring agent started by
//! systemd (`--client-nice` changes it: at -10 each of its own wake-ups preempts a vCPU
//! thread, which on the development host costs the guests 2-2.5 % by itself); its own
//! run-queue wait is taken out of the server's latency either way. Over the measured part of
//! each run the client also reads the CPU time of the `api` and `api-stats` threads: what the
//! VMM spent serving. The order rotates each round, with a pause between runs.
//! Throughput is every vCPU's exits in the window over its length; the results are medians of each
//! round's ratios (the runs of a round are seconds apart, so a drift of the host below
//! cancels out of each): with requests over without a client (the goal), the pacing client
//! alone over none (what any 1 kHz thread costs the guests here), and with requests over the
//! pacing client (what answering costs), and the latency percentiles of every request of
//! every loaded run.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use ppa_vmm::accounting::host::ThreadClock;
use ppa_vmm::config::RunOptions;
use ppa_vmm::handle::VmHandle;
use ppa_vmm::vm::{Vm, VmError};
use ppa_vmm_api::ThreadState;

/// Options of `bench socket`.
#[derive(Debug, Clone, Copy)]
pub struct SocketOptions {
    /// vCPUs of the VM.
    pub vcpus: usize,
    /// Length of the measured window of each run.
    pub window: Duration,
    /// Rounds (each runs both configurations).
    pub rounds: usize,
    /// `stats` requests per second in the loaded runs.
    pub rate: u32,
    /// Nice value of the client thread (0: as started; below 0 needs CAP_SYS_NICE).
    pub client_nice: i32,
}

impl Default for SocketOptions {
    fn default() -> Self {
        SocketOptions {
            vcpus: 64,
            window: Duration::from_secs(3),
            rounds: 5,
            rate: 1000,
            client_nice: 0,
        }
    }
}

/// Result of `bench socket`; `verdict` is last.
#[derive(Debug, Clone, Serialize)]
pub struct SocketResult {
    /// vCPUs of the VM.
    pub vcpus: usize,
    /// Rounds.
    pub rounds: usize,
    /// `stats` requests per second asked for.
    pub requests_per_s: u32,
    /// Nice value the client asked for.
    pub client_nice: i32,
    /// `stats` requests answered.
    pub requests: usize,
    /// Median `stats` latency, µs.
    pub stats_p50_us: f64,
    /// 90th percentile `stats` latency, µs.
    pub stats_p90_us: f64,
    /// 99th percentile `stats` latency, µs (target < 1000).
    pub stats_p99_us: f64,
    /// Largest `stats` latency, µs.
    pub stats_max_us: f64,
    /// Median `stats` latency less the client thread's own run-queue wait in it, µs.
    pub server_p50_us: f64,
    /// 99th percentile of the same, µs (target < 1000): what the VMM takes to answer.
    pub server_p99_us: f64,
    /// Largest of the same, µs.
    pub server_max_us: f64,
    /// Bytes of one `stats` response.
    pub stats_response_bytes: usize,
    /// CPU of the `api` thread while requests were sent, % of one CPU (median over rounds).
    pub api_cpu_percent: f64,
    /// CPU of the `api-stats` thread (the snapshots) in the same runs, % of one CPU.
    pub api_stats_cpu_percent: f64,
    /// CPU of the bench's own client thread in the same runs (sending, reading 20 KB answers,
    /// its schedstat reads), % of one CPU: part of what the requests cost the guests that is
    /// not the VMM's.
    pub client_cpu_percent: f64,
    /// Guest exits per second of each run without a client.
    pub idle_runs: Vec<f64>,
    /// Guest exits per second of each run with the pacing client sending nothing.
    pub client_only_runs: Vec<f64>,
    /// Guest exits per second of each run with requests.
    pub loaded_runs: Vec<f64>,
    /// Guest exits per second without a client (median over rounds).
    pub idle_exits_per_s: f64,
    /// Guest exits per second with the pacing client alone (median over rounds).
    pub client_only_exits_per_s: f64,
    /// Guest exits per second with requests (median over rounds).
    pub loaded_exits_per_s: f64,
    /// client only / idle, median of the rounds' ratios: what the client's own wake-ups cost
    /// the guests.
    pub client_ratio: f64,
    /// loaded / client only, median of the rounds' ratios: what answering costs the guests.
    pub server_ratio: f64,
    /// loaded / idle of each round (the runs of a round are seconds apart, so a slow drift
    /// of the host below cancels out of each ratio).
    pub round_ratios: Vec<f64>,
    /// The median exits/s with requests over the median without a client (the estimator
    /// before rounds were paired; for comparison).
    pub ratio_of_medians: f64,
    /// loaded / idle: the median of `round_ratios` (target >= 0.98).
    pub throughput_ratio_under_load: f64,
    /// `pass`, or `fail: ...` naming what missed its target.
    pub verdict: String,
}

fn sock_path(round: usize) -> PathBuf {
    std::env::temp_dir().join(format!("ppa-bench-{}-{round}.sock", std::process::id()))
}

/// What a run's client does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Load {
    /// No client.
    None,
    /// A client that wakes at the request rate and sends nothing.
    Pacing,
    /// A client that sends `stats` at each wake-up.
    Stats,
}

/// What a client measured.
#[derive(Debug, Default)]
struct Measured {
    /// Each request's latency, ns.
    lat: Vec<u64>,
    /// Of each, the client thread's own run-queue wait, ns.
    own_wait: Vec<u64>,
    /// Bytes of the last response.
    size: usize,
    /// CPU of the `api` and `api-stats` threads per second of the measured part, ns/s.
    server_cpu: Option<ServerCpu>,
}

/// CPU time of the server threads.
#[derive(Debug, Default, Clone, Copy)]
struct ServerCpu {
    /// The `api` thread.
    api_ns: u64,
    /// The `api-stats` thread.
    stats_ns: u64,
    /// The bench's client thread.
    client_ns: u64,
    /// Whether the `api` thread was found (it ends with the VM).
    found: bool,
}

/// The clocks of this process's threads named `api`, `api-stats` and `bench-client`, found
/// once per run: reading them every 200 ms is then three system calls, where walking
/// `/proc/self/task` and its ~70 `comm` files each time cost the guests what it measured.
struct ServerClocks(Vec<(&'static str, ThreadClock)>);

impl ServerClocks {
    fn find() -> ServerClocks {
        let mut found = Vec::new();
        let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
            return ServerClocks(found);
        };
        for e in dir.flatten() {
            let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
            let role = match comm.trim_end() {
                "api" => "api",
                "api-stats" => "api-stats",
                "bench-client" => "bench-client",
                _ => continue,
            };
            if let Ok(c) = ThreadClock::of_tid(tid) {
                found.push((role, c));
            }
        }
        ServerClocks(found)
    }

    /// Their CPU time so far.
    fn now(&self) -> ServerCpu {
        let mut c = ServerCpu::default();
        for (role, clock) in &self.0 {
            let Ok(ns) = clock.read_ns() else {
                continue;
            };
            match *role {
                "api" => {
                    c.api_ns += ns;
                    c.found = true;
                }
                "api-stats" => c.stats_ns += ns,
                _ => c.client_ns += ns,
            }
        }
        c
    }
}

impl ServerCpu {
    /// What was used from `self` to `later`, per second of `wall_ns`.
    fn rate_until(self, later: ServerCpu, wall_ns: u64) -> ServerCpu {
        let per_s = |a: u64, b: u64| {
            (u128::from(b.saturating_sub(a)) * 1_000_000_000 / u128::from(wall_ns.max(1))) as u64
        };
        ServerCpu {
            api_ns: per_s(self.api_ns, later.api_ns),
            stats_ns: per_s(self.stats_ns, later.stats_ns),
            client_ns: per_s(self.client_ns, later.client_ns),
            found: self.found && later.found,
        }
    }
}

/// The client's answers, read straight from the socket into one buffer with room for a
/// whole answer (20 KB at 64 vCPUs), so that one read takes it, as a careful monitor's
/// would (an 8 KiB buffer made three reads, and a `BufReader` one more copy of each
/// answer). Bytes, not a String: the client checks the head of each answer and need not
/// spend CPU validating 20 KB of UTF-8 a thousand times a second.
struct Answers {
    stream: UnixStream,
    buf: Vec<u8>,
    /// Bytes of the last answer.
    len: usize,
}

impl Answers {
    fn new(stream: UnixStream) -> Self {
        Answers {
            stream,
            buf: vec![0; 64 * 1024],
            len: 0,
        }
    }

    /// The next answer line. The client has one request outstanding at a time, so the
    /// answer ends with the last byte read when that byte is its newline.
    fn next(&mut self) -> std::io::Result<&[u8]> {
        self.len = 0;
        loop {
            if self.len == self.buf.len() {
                self.buf.resize(self.buf.len() * 2, 0);
            }
            let n = self.stream.read(&mut self.buf[self.len..])?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.len += n;
            if self.buf[self.len - 1] == b'\n' {
                return Ok(&self.buf[..self.len]);
            }
        }
    }
}

/// Wakes at `rate` per second until `stop`, sending `stats` each time when `send`; returns
/// each latency and the client's own run-queue wait in it (its schedstat `run_delay`, read
/// before the write and after the response), and the size of the last response.
fn client(path: &Path, o: &SocketOptions, stop: &AtomicBool, send: bool) -> Measured {
    if o.client_nice != 0 {
        ppa_vmm::probes::raise_priority(o.client_nice, "bench client");
    }
    let t0 = Instant::now();
    let stream = loop {
        match UnixStream::connect(path) {
            Ok(s) => break s,
            Err(_) if t0.elapsed() < Duration::from_secs(30) && !stop.load(Ordering::Acquire) => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(_) => return Measured::default(),
        }
    };
    let own = ppa_vmm::accounting::host::SchedStatFile::own().ok();
    let run_delay = || {
        own.as_ref()
            .and_then(|f| f.read().ok())
            .map_or(0, |s| s.run_delay_ns)
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let Ok(mut writer) = stream.try_clone() else {
        return Measured::default();
    };
    let mut reader = Answers::new(stream);
    let mut m = Measured::default();
    // Steady state only: wait until every vCPU thread runs, then 100 ms more (spawning 64
    // threads and their first KVM_RUN is not what this measures). `threads` says so without
    // asking for `stats`, which would start the refresher in the runs that send nothing.
    let mut running_since: Option<Instant> = None;
    while !stop.load(Ordering::Acquire) {
        if writer.write_all(b"{\"cmd\":\"threads\"}\n").is_err() {
            return Measured::default();
        }
        let Ok(line) = reader.next() else {
            return Measured::default();
        };
        let created = line.windows(9).any(|w| w == b"\"created\"");
        if line.starts_with(b"{\"id\":null,\"ok\":true") && !created {
            let since = *running_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= Duration::from_millis(100) {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let step = Duration::from_nanos(1_000_000_000 / u64::from(o.rate.max(1)));
    // The server threads' CPU from here to the last reading before the VM ended (read every
    // 200 ms: the threads are gone once `stop` is seen).
    let clocks = ServerClocks::find();
    let (cpu0, since) = (clocks.now(), Instant::now());
    let mut cpu_last = (cpu0, since);
    let mut next = Instant::now();
    while !stop.load(Ordering::Acquire) {
        let now = Instant::now();
        if now.duration_since(cpu_last.1) >= Duration::from_millis(200) {
            let c = clocks.now();
            if c.found {
                cpu_last = (c, now);
            }
        }
        if now < next {
            std::thread::sleep(next - now);
        }
        next += step;
        if !send {
            continue;
        }
        let waited = run_delay();
        let sent = Instant::now();
        if writer.write_all(b"{\"cmd\":\"stats\"}\n").is_err() {
            break;
        }
        match reader.next() {
            Ok(line) if line.starts_with(b"{\"id\":null,\"ok\":true") => {
                m.lat.push(sent.elapsed().as_nanos() as u64);
                m.own_wait.push(run_delay().saturating_sub(waited));
            }
            _ => break,
        }
    }
    m.size = reader.len;
    let wall = cpu_last.1.duration_since(since).as_nanos() as u64;
    m.server_cpu = Some(cpu0.rate_until(cpu_last.0, wall)).filter(|c| c.found && wall > 0);
    m
}

/// One run; returns exits/s, and what the client measured when it sends requests.
fn run_once(o: &SocketOptions, round: usize, load: Load) -> Result<(f64, Measured), VmError> {
    let path = sock_path(round);
    let opts = RunOptions {
        vcpus: Some(o.vcpus),
        memory_mib: Some(64),
        // More exits than any window takes: the bench ends the run.
        workload: vec!["exits:n=1000000000,kind=mmio".to_string()],
        api_sock: Some(path.clone()),
        ..Default::default()
    };
    let (config, _) = opts.into_config()?;
    let vm = Vm::try_from(config)?;
    let stop = Arc::new(AtomicBool::new(false));
    let loader = (load != Load::None)
        .then(|| {
            let (stop, path, o) = (Arc::clone(&stop), path.clone(), *o);
            // Named, so that traces (`perf sched`) tell it from the main thread.
            std::thread::Builder::new()
                .name("bench-client".into())
                .spawn(move || client(&path, &o, &stop, load == Load::Stats))
                .map_err(|e| VmError::Thread("bench client", e))
        })
        .transpose()?;
    let handle = vm.handle();
    let window = o.window;
    let observer = std::thread::Builder::new()
        .name("bench-window".into())
        .spawn(move || {
            let rate = steady_rate(&handle, window);
            handle.shutdown();
            rate
        })
        .map_err(|e| VmError::Thread("bench window", e))?;
    let out = vm.run();
    stop.store(true, Ordering::Release);
    let m = loader.and_then(|h| h.join().ok()).unwrap_or_default();
    let rate = observer.join().ok().flatten();
    out?;
    let rate = rate.ok_or(VmError::Thread(
        "bench window",
        std::io::Error::other("the VM ended before its measured window did"),
    ))?;
    Ok((rate, m))
}

/// Every vCPU's exits so far (each counter has one writer; no snapshot is needed for a sum).
pub(super) fn exits_so_far(vm: &VmHandle) -> u64 {
    vm.vcpus()
        .iter()
        .flat_map(|v| v.acct.meter.exits.iter().map(|c| c.get()))
        .sum()
}

/// The guests' exits per second over `window`, from 100 ms after every vCPU thread runs;
/// `None` if the VM ended first. Sleeps through the window (two wake-ups a run), so it costs
/// the guests nothing the three kinds of run do not share.
fn steady_rate(vm: &VmHandle, window: Duration) -> Option<f64> {
    while vm.vcpus().iter().any(|v| v.state() == ThreadState::Created) {
        if vm.finished() {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(100));
    let (t0, e0) = (Instant::now(), exits_so_far(vm));
    std::thread::sleep(window);
    let (t1, e1) = (Instant::now(), exits_so_far(vm));
    let ended = vm.finished()
        || vm
            .vcpus()
            .iter()
            .any(|v| v.state() == ThreadState::Finished);
    let ns = t1.duration_since(t0).as_nanos() as f64;
    (!ended && ns > 0.0).then(|| e1.saturating_sub(e0) as f64 * 1e9 / ns)
}

/// Each latency less the client's own run-queue wait during it (never below zero: the
/// schedstat reads bracket the request slightly wider than its timing).
fn less_own_wait<'a>(lat: &'a [u64], own_wait: &'a [u64]) -> impl Iterator<Item = u64> + 'a {
    lat.iter().zip(own_wait).map(|(&l, &w)| l - w.min(l))
}

/// `a[r] / b[r]` of each round `r` that has both (0 where `b[r]` is 0).
fn paired(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter()
        .zip(b)
        .map(|(a, b)| if *b > 0.0 { a / b } else { 0.0 })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn percentile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64 / 1e3
}

/// Runs `bench socket`.
pub fn socket(o: SocketOptions) -> Result<SocketResult, VmError> {
    let (mut idle, mut pacing, mut loaded) = (Vec::new(), Vec::new(), Vec::new());
    let (mut lat, mut server) = (Vec::new(), Vec::new());
    let mut size = 0;
    let (mut api_cpu, mut stats_cpu, mut client_cpu) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..o.rounds.max(1) {
        let mut order = [Load::None, Load::Pacing, Load::Stats];
        order.rotate_left(round % 3);
        for load in order {
            let (rate, m) = run_once(&o, round, load)?;
            match load {
                Load::None => idle.push(rate),
                Load::Pacing => pacing.push(rate),
                Load::Stats => {
                    loaded.push(rate);
                    server.extend(less_own_wait(&m.lat, &m.own_wait));
                    lat.extend(m.lat);
                    size = size.max(m.size);
                    if let Some(c) = m.server_cpu {
                        api_cpu.push(c.api_ns as f64 / 1e7);
                        stats_cpu.push(c.stats_ns as f64 / 1e7);
                        client_cpu.push(c.client_ns as f64 / 1e7);
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    lat.sort_unstable();
    server.sort_unstable();
    let round_ratios = paired(&loaded, &idle);
    let ratio = median(round_ratios.clone());
    let (client_ratio, server_ratio) = (
        median(paired(&pacing, &idle)),
        median(paired(&loaded, &pacing)),
    );
    let (idle_runs, client_only_runs, loaded_runs) = (idle.clone(), pacing.clone(), loaded.clone());
    let (idle, pacing, loaded) = (median(idle), median(pacing), median(loaded));
    let ratio_of_medians = if idle > 0.0 { loaded / idle } else { 0.0 };
    let p99 = percentile(&lat, 0.99);
    let server_p99 = percentile(&server, 0.99);
    let mut fails = Vec::new();
    if server_p99 >= 1000.0 {
        fails.push(format!(
            "stats p99 less the client's own wait {server_p99:.0} us >= 1000 us"
        ));
    }
    if ratio < 0.98 {
        fails.push(format!("throughput ratio {ratio:.4} < 0.98"));
    }
    if lat.is_empty() {
        fails.push("no request was answered".to_string());
    }
    Ok(SocketResult {
        vcpus: o.vcpus,
        rounds: o.rounds.max(1),
        requests_per_s: o.rate,
        client_nice: o.client_nice,
        requests: lat.len(),
        stats_p50_us: percentile(&lat, 0.5),
        stats_p90_us: percentile(&lat, 0.9),
        stats_p99_us: p99,
        stats_max_us: lat.last().map_or(0.0, |&v| v as f64 / 1e3),
        server_p50_us: percentile(&server, 0.5),
        server_p99_us: server_p99,
        server_max_us: server.last().map_or(0.0, |&v| v as f64 / 1e3),
        stats_response_bytes: size,
        api_cpu_percent: median(api_cpu),
        api_stats_cpu_percent: median(stats_cpu),
        client_cpu_percent: median(client_cpu),
        idle_runs,
        client_only_runs,
        loaded_runs,
        idle_exits_per_s: idle,
        client_only_exits_per_s: pacing,
        loaded_exits_per_s: loaded,
        client_ratio,
        server_ratio,
        round_ratios,
        ratio_of_medians,
        throughput_ratio_under_load: ratio,
        verdict: if fails.is_empty() {
            "pass".to_string()
        } else {
            format!("fail: {}", fails.join("; "))
        },
    })
}

impl SocketResult {
    /// A table for people.
    pub fn to_text(&self) -> String {
        format!(
            "bench socket: {} vCPUs, {} rounds, {} stats/s requested by a client at nice {}\n\
             stats latency   p50 {:.1} us   p90 {:.1} us   p99 {:.1} us   max {:.1} us   ({} requests, {} bytes each)\n\
             less the client's own run-queue wait   p50 {:.1} us   p99 {:.1} us (goal < 1000)   max {:.1} us\n\
             server threads  api {:.2} % of a CPU   api-stats {:.2} %   (the bench's client thread {:.2} %)\n\
             guest exits/s   no client {:.0}   pacing client alone {:.0}   with requests {:.0}   (medians)\n\
             ratios          with requests / no client {:.4} (goal >= 0.98)   pacing client alone / no client {:.4}   with requests / pacing client {:.4}\n\
             \x20               (medians of each round's ratios; rounds: {}; ratio of the medians {:.4})\n\
             verdict: {}\n",
            self.vcpus,
            self.rounds,
            self.requests_per_s,
            self.client_nice,
            self.stats_p50_us,
            self.stats_p90_us,
            self.stats_p99_us,
            self.stats_max_us,
            self.requests,
            self.stats_response_bytes,
            self.server_p50_us,
            self.server_p99_us,
            self.server_max_us,
            self.api_cpu_percent,
            self.api_stats_cpu_percent,
            self.client_cpu_percent,
            self.idle_exits_per_s,
            self.client_only_exits_per_s,
            self.loaded_exits_per_s,
            self.throughput_ratio_under_load,
            self.client_ratio,
            self.server_ratio,
            self.round_ratios
                .iter()
                .map(|r| format!("{r:.4}"))
                .collect::<Vec<_>>()
                .join(" "),
            self.ratio_of_medians,
            self.verdict
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_read_whole_whatever_its_size_and_chunks() {
        // As in the bench, one request is outstanding at a time: the peer sends the next
        // answer only after the previous one was read.
        let (ours, mut peer) = UnixStream::pair().unwrap();
        let mut a = Answers::new(ours);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let big = format!("{{\"ok\":true,\"x\":\"{}\"}}\n", "y".repeat(200_000));
        let sent = big.clone();
        let w = std::thread::spawn(move || {
            for chunk in sent.as_bytes().chunks(7_000) {
                peer.write_all(chunk).unwrap();
            }
            rx.recv().unwrap();
            peer.write_all(b"short\n").unwrap();
        });
        let first = a.next().unwrap();
        assert!(
            first == big.as_bytes(),
            "{} bytes read of {}",
            first.len(),
            big.len()
        );
        tx.send(()).unwrap();
        assert_eq!(a.next().unwrap(), b"short\n");
        assert_eq!(a.len, 6);
        w.join().unwrap();
        assert!(a.next().is_err(), "the peer closed: no answer");
    }

    #[test]
    fn percentiles_of_sorted_latencies() {
        let v: Vec<u64> = (1..=100).map(|i| i * 1000).collect();
        // Index round(99 * 0.5) = 50 (halves round away from zero).
        assert_eq!(percentile(&v, 0.5), 51.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[], 0.99), 0.0);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
    }

    #[test]
    fn rounds_are_paired_before_the_median() {
        // The host slows down in round 1: each round's ratio is 0.99, the medians' is not.
        let idle = [100.0, 80.0, 100.0];
        let loaded = [99.0, 79.2, 99.0];
        assert_eq!(paired(&loaded, &idle), [0.99, 0.99, 0.99]);
        assert_eq!(median(paired(&loaded, &idle)), 0.99);
        assert_eq!(paired(&[1.0], &[0.0]), [0.0]);
    }

    #[test]
    fn the_servers_share_is_the_latency_less_the_clients_own_wait() {
        let lat = [3_000_000, 20_000, 5_000];
        let wait = [2_950_000, 0, 9_000];
        assert_eq!(
            less_own_wait(&lat, &wait).collect::<Vec<_>>(),
            [50_000, 20_000, 0]
        );
    }
}
