//! `ppa-agent`: the command line (docs/agent.md). Parses the options, merges them over the
//! config file, and runs the agent, `--probe`, `show` or `bench`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use ppa_agent::agent::{self, interval_arg, AgentError, Limit};
use ppa_agent::config::{Config, DEFAULT_PATH};
use ppa_guest_abi::ppa_page::alarms::AlarmKind;

/// The PPA guest agent: publishes precise per-thread and per-CPU accounting of this Linux
/// guest into the PPA page PPA-VMM shares with it.
#[derive(Debug, Parser)]
#[command(name = "ppa-agent", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// Say whether a usable PPA page is here and exit: 0 found, 3 no page here, 4 a page the
    /// agent cannot use (for systemd's ExecCondition).
    #[arg(long)]
    probe: bool,
    /// Config file (default /etc/ppa-agent.conf, when it exists).
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Publish into this file (a VMM's --ppa-page-file) instead of discovering the page.
    #[arg(long, value_name = "PATH", global = true)]
    page_file: Option<PathBuf>,
    /// Time between samples, e.g. 100ms, 1s (default 1s).
    #[arg(long, value_name = "DURATION", value_parser = interval_arg, global = true)]
    interval: Option<Duration>,
    /// Most thread records to publish (1 to 1024; the page may hold fewer).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    max_threads: Option<u32>,
    /// Do not use taskstats exit notifications; count exits from /proc.
    #[arg(long)]
    no_taskstats: bool,
    /// Print one line per exit notification on stderr.
    #[arg(long)]
    log_exits: bool,
    /// Samples an exited thread stays published with its final figures and state X
    /// (default 3; 0: exited threads only add to the transient figures).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=i64::from(ppa_agent::config::MAX_LINGER)))]
    linger: Option<u32>,
    /// Threshold of a thread's mean run-queue wait per wait in a sample interval, e.g. 10ms
    /// (off or 0: off, the default); each interval over it counts and raises an alarm.
    #[arg(long, value_name = "DURATION", value_parser = threshold_arg)]
    alarm_run_delay: Option<u64>,
    /// Threshold of a thread's on-CPU time per timeslice, e.g. 100ms.
    #[arg(long, value_name = "DURATION", value_parser = threshold_arg)]
    alarm_slice: Option<u64>,
    /// Threshold of a thread's involuntary context switches per sample interval.
    #[arg(long, value_name = "N", value_parser = count_arg)]
    alarm_nivcsw: Option<u64>,
    /// Threshold of a CPU's hard-interrupt time per sample interval, e.g. 5ms.
    #[arg(long, value_name = "DURATION", value_parser = threshold_arg)]
    alarm_irq: Option<u64>,
    /// Threshold of a CPU's softirq time per sample interval, e.g. 5ms.
    #[arg(long, value_name = "DURATION", value_parser = threshold_arg)]
    alarm_softirq: Option<u64>,
    /// Take one sample, publish it and exit.
    #[arg(long)]
    once: bool,
    /// Stop after this many samples.
    #[arg(long, value_name = "N")]
    samples: Option<u64>,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Print this guest's vCPUs as the host measured them (the page's host section), beside
    /// the guest kernel's own steal figure.
    Show,
    /// Measure the agent's CPU per sample with 100, 1,000 and 5,000 extra threads.
    Bench {
        /// Thread counts, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "100,1000,5000")]
        threads: Vec<usize>,
        /// Samples per case.
        #[arg(long, default_value_t = 20)]
        samples: usize,
    },
}

fn threshold_arg(s: &str) -> Result<u64, String> {
    ppa_agent::config::parse_threshold(s).map_err(|e| e.to_string())
}

fn count_arg(s: &str) -> Result<u64, String> {
    ppa_agent::config::parse_count(s)
        .ok_or_else(|| format!("\"{s}\" is not a count from 0 (off) to 1000000000"))
}

fn config(cli: &Cli) -> Result<Config, String> {
    let mut c = match &cli.config {
        Some(p) => Config::load(p).map_err(|e| ppa_agent::describe(&e))?,
        None if std::path::Path::new(DEFAULT_PATH).exists() => {
            Config::load(std::path::Path::new(DEFAULT_PATH)).map_err(|e| ppa_agent::describe(&e))?
        }
        None => Config::default(),
    };
    if let Some(p) = &cli.page_file {
        c.page_file = Some(p.clone());
    }
    if let Some(i) = cli.interval {
        c.interval = i;
    }
    if let Some(n) = cli.max_threads {
        c.max_threads = n;
    }
    if cli.no_taskstats {
        c.taskstats = false;
    }
    if cli.log_exits {
        c.log_exits = true;
    }
    if let Some(n) = cli.linger {
        c.linger = n;
    }
    for (kind, v) in [
        (AlarmKind::RunDelay, cli.alarm_run_delay),
        (AlarmKind::Slice, cli.alarm_slice),
        (AlarmKind::Nivcsw, cli.alarm_nivcsw),
        (AlarmKind::Irq, cli.alarm_irq),
        (AlarmKind::Softirq, cli.alarm_softirq),
    ] {
        if let Some(v) = v {
            c.thresholds.set(kind, v);
        }
    }
    Ok(c)
}

fn fail(e: &AgentError) -> ExitCode {
    eprintln!("ppa-agent: {}", ppa_agent::describe(e));
    ExitCode::from(e.exit_code() as u8)
}

fn main() -> ExitCode {
    // A panic on any thread ends the agent after its message, as `panic = "abort"` does
    // (the test profile, Cargo.toml `ci`, unwinds).
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        std::process::abort();
    }));
    let cli = Cli::parse();
    let cfg = match config(&cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ppa-agent: {e}");
            return ExitCode::from(2);
        }
    };
    if cli.probe {
        return ExitCode::from(agent::probe(&cfg) as u8);
    }
    match &cli.cmd {
        Some(Cmd::Show) => match ppa_agent::show::show(&cfg) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&e),
        },
        Some(Cmd::Bench { threads, samples }) => {
            let opts = ppa_agent::bench::BenchOptions {
                threads: threads.clone(),
                samples: (*samples).max(1),
                interval: cfg.interval,
            };
            match ppa_agent::bench::run(&opts) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("ppa-agent: bench: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        None => {
            let limit = Limit {
                samples: if cli.once { Some(1) } else { cli.samples },
            };
            match agent::run(&cfg, limit) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&e),
            }
        }
    }
}
