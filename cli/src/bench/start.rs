//! `bench start`: how long `ppa-vmm run` takes from exec until its control socket answers,
//! the wait of a host that starts many VMs (spec section 11, "Ready fast").
//!
//! Data flow: each round spawns this executable as `ppa-vmm run` of a tiny idle guest (1 vCPU,
//! 16 MiB, no prefault) with a control socket in a directory of its own, polls the socket
//! every 100 µs with a `version` request from the moment of the spawn, stops the VM with
//! `shutdown` once it answered, and waits for it. Rounds alternate a run directory whose
//! calibration cache is empty (cold: the VMM measures KVM's exit cost on a scratch VM) with
//! one whose cache holds this host's figures (warm).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;
use thiserror::Error;

/// Why the bench could not measure.
#[derive(Debug, Error)]
pub enum StartError {
    /// This executable could not be found or started.
    #[error("cannot start {what}")]
    Spawn {
        /// What.
        what: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A scratch directory could not be made.
    #[error("cannot make the directory {0}")]
    Dir(String, #[source] std::io::Error),
    /// The VMM never answered.
    #[error("the VMM's control socket did not answer within 10 s (run it by hand to see why)")]
    NoAnswer,
}

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct StartOptions {
    /// Rounds of each kind.
    pub rounds: usize,
}

/// The result: exec → socket answering, ms, per round and kind.
#[derive(Debug, Clone, Serialize)]
pub struct StartResult {
    /// Cold cache: each round's time, ms.
    pub cold_ms: Vec<f64>,
    /// Warm cache: each round's time, ms.
    pub warm_ms: Vec<f64>,
    /// Median of the cold rounds, ms.
    pub cold_median_ms: f64,
    /// Median of the warm rounds, ms.
    pub warm_median_ms: f64,
    /// The goal, ms.
    pub goal_ms: f64,
    /// `met` when the warm median is within the goal, else `missed`.
    pub verdict: String,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// Sends one request line and reads one line back.
fn ask(sock: &Path, line: &str) -> Option<String> {
    let mut s = UnixStream::connect(sock).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(line.as_bytes()).ok()?;
    let mut out = String::new();
    BufReader::new(s).read_line(&mut out).ok()?;
    out.contains("\"ok\":true").then_some(out)
}

/// One start: ms from the spawn to the first answer.
fn one(exe: &Path, run_dir: &Path) -> Result<f64, StartError> {
    let sock = run_dir.join("bench.sock");
    let _ = std::fs::remove_file(&sock);
    let t0 = Instant::now();
    let mut child = Command::new(exe)
        .args([
            "run",
            "--guest",
            "tiny",
            "--vcpus",
            "1",
            "--memory-mib",
            "16",
        ])
        .args(["--prefault", "false", "--workload", "idle:ms=60000"])
        .args(["--report", "none", "--max-runtime", "60", "--name", "bench"])
        .arg("--run-dir")
        .arg(run_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| StartError::Spawn {
            what: exe.display().to_string(),
            source: e,
        })?;
    let deadline = t0 + Duration::from_secs(10);
    let took = loop {
        if ask(&sock, "{\"id\":1,\"cmd\":\"version\"}\n").is_some() {
            break t0.elapsed();
        }
        if Instant::now() > deadline || child.try_wait().ok().flatten().is_some() {
            let _ = child.kill();
            let _ = child.wait();
            return Err(StartError::NoAnswer);
        }
        std::thread::sleep(Duration::from_micros(100));
    };
    let _ = ask(&sock, "{\"id\":2,\"cmd\":\"shutdown\"}\n");
    let _ = child.wait();
    Ok(took.as_secs_f64() * 1e3)
}

/// Runs the rounds.
pub fn start(opts: StartOptions) -> Result<StartResult, StartError> {
    let exe = std::env::current_exe().map_err(|source| StartError::Spawn {
        what: "this executable".into(),
        source,
    })?;
    let base = std::env::temp_dir().join(format!("ppa-bench-start-{}", std::process::id()));
    let warm_dir = base.join("warm");
    let cold_dir = base.join("cold");
    std::fs::create_dir_all(&warm_dir)
        .map_err(|e| StartError::Dir(warm_dir.display().to_string(), e))?;
    // One start fills the warm directory's cache.
    let first = one(&exe, &warm_dir);
    let (mut cold_ms, mut warm_ms) = (Vec::new(), Vec::new());
    let result = first.and_then(|_| {
        for _ in 0..opts.rounds.max(1) {
            let _ = std::fs::remove_dir_all(&cold_dir);
            std::fs::create_dir_all(&cold_dir)
                .map_err(|e| StartError::Dir(cold_dir.display().to_string(), e))?;
            cold_ms.push(one(&exe, &cold_dir)?);
            warm_ms.push(one(&exe, &warm_dir)?);
        }
        Ok(())
    });
    let _ = std::fs::remove_dir_all(&base);
    result?;
    let goal_ms = 10.0;
    let warm_median_ms = median(&warm_ms);
    Ok(StartResult {
        cold_median_ms: median(&cold_ms),
        warm_median_ms,
        cold_ms,
        warm_ms,
        goal_ms,
        verdict: if warm_median_ms <= goal_ms {
            "met"
        } else {
            "missed"
        }
        .into(),
    })
}

impl StartResult {
    /// The table.
    pub fn to_text(&self) -> String {
        let list = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{x:.1}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        format!(
            "exec → control socket answering (tiny idle guest, 1 vCPU, 16 MiB, no prefault)\n\
             cold calibration cache: median {:.1} ms  ({})\n\
             warm calibration cache: median {:.1} ms  ({})\n\
             goal {:.0} ms: {}\n",
            self.cold_median_ms,
            list(&self.cold_ms),
            self.warm_median_ms,
            list(&self.warm_ms),
            self.goal_ms,
            self.verdict
        )
    }
}
