//! `ppa-vmm`: the command line over the PPA-VMM library.
//!
//! `run` builds a VM from flags and/or a JSON config file (the same fields), runs it and prints
//! the final report; `demo` runs the embedded default. Exit codes: 0 every vCPU exited with
//! code 0; 1 a vCPU failed, exited non-zero or was stopped; 2 bad input or a setup error.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use ppa_vmm::accounting::Level;
use ppa_vmm::config::{ReportFormat, ReportOptions, RunOptions};
use ppa_vmm::vm::Vm;
use ppa_vmm_client::ctl::CtlOptions;
use ppa_vmm_client::describe;
use ppa_vmm_client::top::TopOptions;

#[derive(Parser)]
#[command(
    name = "ppa-vmm",
    version,
    about = "A KVM VMM for precise CPU accounting of VMs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Boot a VM and run it until every vCPU has exited.
    Run(Box<RunArgs>),
    /// Run the embedded demo: 4 vCPUs of the tiny guest with the mixed workload.
    Demo,
    /// Measure the VMM itself.
    Bench(BenchArgs),
    /// Send one request to a running VMM's control socket and print the result.
    Ctl(CtlOptions),
    /// A live per-vCPU table of a running VMM, like esxtop.
    Top(TopOptions),
}

#[derive(Args)]
struct BenchArgs {
    /// What to measure.
    #[arg(value_enum)]
    which: BenchKind,
    /// Print one JSON object whose last key is "verdict".
    #[arg(long)]
    json: bool,
    /// Exits per run (overhead; default 40000) or per vCPU per run (socket; default 1500).
    #[arg(long)]
    exits: Option<u64>,
    /// Rounds of alternated runs.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// vCPUs of the VM (socket).
    #[arg(long, default_value_t = 64)]
    vcpus: usize,
    /// `stats` requests per second in the loaded runs (socket).
    #[arg(long, default_value_t = 1000)]
    rate: u32,
    /// Periods per run (limit).
    #[arg(long, default_value_t = 50)]
    periods: u64,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum BenchKind {
    /// Exit throughput: raw KVM_RUN loop vs accounting off, basic, full.
    Overhead,
    /// Control socket: stats latency with 64 vCPUs, and guest throughput under 1000 stats/s.
    Socket,
    /// CPU limits: per-period error of the VMM's enforcement and of cgroups, 25 % of a busy vCPU.
    Limit,
}

#[derive(Args)]
struct RunArgs {
    /// JSON config file with the same fields as the flags (flags win).
    #[arg(long, value_name = "FILE.json")]
    config: Option<PathBuf>,
    /// Number of vCPUs (1..=256).
    #[arg(long)]
    vcpus: Option<usize>,
    /// Guest memory in MiB.
    #[arg(long)]
    memory_mib: Option<u64>,
    /// Embedded guest to boot (`tiny`).
    #[arg(long, conflicts_with = "kernel")]
    guest: Option<String>,
    /// Guest image file: an ELF that follows the tiny-guest protocol.
    #[arg(long, value_name = "PATH")]
    kernel: Option<PathBuf>,
    /// Workload `SPEC` for all vCPUs or `I=SPEC` for vCPU I (repeatable; later ones win).
    #[arg(long, value_name = "SPEC")]
    workload: Vec<String>,
    /// Final report format.
    #[arg(long, value_enum)]
    report: Option<ReportFormat>,
    /// Write the report to this file instead of stdout.
    #[arg(long, value_name = "PATH")]
    report_file: Option<PathBuf>,
    /// Write every histogram in the kstats text form (`slot S vcpu V count C avg A p P`) here.
    #[arg(long, value_name = "PATH")]
    histograms_file: Option<PathBuf>,
    /// Stop every vCPU after this many seconds.
    #[arg(long, value_name = "SECS")]
    max_runtime: Option<f64>,
    /// KVM device node.
    #[arg(long, value_name = "PATH")]
    kvm_device: Option<PathBuf>,
    /// Accounting level at start: off, basic or full (switchable at run time).
    #[arg(long, value_enum)]
    accounting: Option<Level>,
    /// Fractional bits of the log-linear histograms (0..=5).
    #[arg(long, value_name = "BITS")]
    histogram_bits: Option<u8>,
    /// A threshold counter, NAME=NS (exit_handling_ns, guest_run_ns, wakeup_latency_ns,
    /// steal_window_ns); repeatable.
    #[arg(long, value_name = "NAME=NS")]
    threshold: Vec<String>,
    /// The VM's name: the `vm` label of the metrics (default `ppa-vmm-PID`).
    #[arg(long)]
    name: Option<String>,
    /// Serve the control socket (JSON Lines, mode 0600) at this path while the VM runs.
    #[arg(long, value_name = "PATH")]
    api_sock: Option<PathBuf>,
    /// Serve the metrics over HTTP at http://IP:PORT/metrics while the VM runs.
    #[arg(long, value_name = "IP:PORT")]
    metrics_addr: Option<String>,
    /// VM-wide CPU limit: N% of one CPU (100 ms period) or QUOTA/PERIOD (e.g. 15ms/10ms).
    #[arg(long, value_name = "LIMIT")]
    cpu_limit: Option<String>,
    /// A vCPU group with its own CPU limit, NAME:VCPUS:LIMIT (e.g. dataplane:0-1:50%);
    /// repeatable.
    #[arg(long, value_name = "NAME:VCPUS:LIMIT")]
    vcpu_group: Vec<String>,
    /// Who enforces the limits: vmm (precise, default) or cgroup (CFS bandwidth control, for
    /// comparison).
    #[arg(long, value_name = "vmm|cgroup")]
    limit_backend: Option<String>,
    /// Raise an overload event when a vCPU stays in the guest this long (ms) without an exit
    /// or an idle (PPA's runaway process).
    #[arg(long, value_name = "MS")]
    runaway: Option<f64>,
    /// Raise an overload event when a vCPU uses more than PCT % of its time for WINDOWS
    /// windows of 100 ms in a row.
    #[arg(long, value_name = "PCT:WINDOWS")]
    overload: Option<String>,
    /// What a runaway or overload does besides the event: notify, pause or throttle:LIMIT.
    #[arg(long, value_name = "ACTION")]
    overload_action: Option<String>,
    /// Size of the PPA page shared with the guest, bytes (default 65536; 0: none).
    #[arg(long, value_name = "BYTES")]
    ppa_page_size: Option<u64>,
    /// Back the PPA page with this file, so host tools can map it (removed at the end).
    #[arg(long, value_name = "PATH")]
    ppa_page_file: Option<PathBuf>,
}

fn options(args: RunArgs) -> Result<RunOptions, Box<dyn std::error::Error>> {
    let file = match &args.config {
        Some(path) => RunOptions::from_file(path)?,
        None => RunOptions::default(),
    };
    let cli = RunOptions {
        vcpus: args.vcpus,
        memory_mib: args.memory_mib,
        guest: args.guest,
        kernel: args.kernel,
        workload: args.workload,
        report: args.report,
        report_file: args.report_file,
        histograms_file: args.histograms_file,
        max_runtime: args.max_runtime,
        kvm_device: args.kvm_device,
        accounting: args.accounting,
        histogram_bits: args.histogram_bits,
        threshold: args.threshold,
        name: args.name,
        api_sock: args.api_sock,
        metrics_addr: args.metrics_addr,
        cpu_limit: args.cpu_limit,
        vcpu_group: args.vcpu_group,
        limit_backend: args.limit_backend,
        runaway: args.runaway,
        overload: args.overload,
        overload_action: args.overload_action,
        ppa_page_size: args.ppa_page_size,
        ppa_page_file: args.ppa_page_file,
    };
    Ok(file.merge(cli))
}

fn demo_options() -> RunOptions {
    RunOptions {
        vcpus: Some(4),
        workload: vec!["mixed:ms=1500".to_string()],
        // The busy and the periodic vCPU share 60 % of one CPU: the periodic one takes what
        // it needs (max-min fair), the busy one is held to the rest.
        vcpu_group: vec!["app:0-1:60%".to_string()],
        report: Some(ReportFormat::Text),
        ..Default::default()
    }
}

fn emit(
    report: &ppa_vmm::report::Report,
    opts: &ReportOptions,
) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(path) = &opts.histograms_file {
        std::fs::write(path, report.histograms_text())
            .map_err(|e| format!("cannot write the histograms to {}: {e}", path.display()))?;
    }
    let text = match opts.format {
        ReportFormat::None => return Ok(()),
        ReportFormat::Json => serde_json::to_string_pretty(report)? + "\n",
        ReportFormat::Text => report.to_text(),
    };
    match &opts.file {
        Some(path) => std::fs::write(path, text)
            .map_err(|e| format!("cannot write the report to {}: {e}", path.display()))?,
        None => {
            use std::io::Write;
            match std::io::stdout().lock().write_all(text.as_bytes()) {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => return Err(e.into()),
                _ => {}
            }
        }
    }
    Ok(())
}

fn run(opts: RunOptions) -> Result<i32, Box<dyn std::error::Error>> {
    let (config, report_opts) = opts.into_config()?;
    let vm = Vm::try_from(config)?;
    let outcome = vm.run()?;
    emit(&outcome.report, &report_opts)?;
    Ok(outcome.exit_code)
}

fn bench(args: BenchArgs) -> Result<i32, Box<dyn std::error::Error>> {
    match args.which {
        BenchKind::Overhead => {
            let r = ppa_vmm::bench::overhead(ppa_vmm::bench::OverheadOptions {
                exits: args.exits.unwrap_or(40_000),
                rounds: args.rounds,
            })?;
            if args.json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                print!("{}", r.to_text());
            }
        }
        BenchKind::Limit => {
            let r = ppa_vmm::bench::limit::limit(ppa_vmm::bench::limit::LimitOptions {
                periods: args.periods,
                percent: 25,
            })?;
            if args.json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                print!("{}", r.to_text());
            }
        }
        BenchKind::Socket => {
            let r = ppa_vmm::bench::socket::socket(ppa_vmm::bench::socket::SocketOptions {
                vcpus: args.vcpus,
                exits: args.exits.unwrap_or(1500),
                rounds: args.rounds,
                rate: args.rate,
            })?;
            if args.json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                print!("{}", r.to_text());
            }
        }
    }
    Ok(0)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let opts = match cli.command {
        Command::Ctl(opts) => return ExitCode::from(ppa_vmm_client::ctl::run(opts) as u8),
        Command::Top(opts) => return ExitCode::from(ppa_vmm_client::top::run(opts) as u8),
        Command::Run(args) => options(*args),
        Command::Demo => Ok(demo_options()),
        Command::Bench(args) => {
            return match bench(args) {
                Ok(code) => ExitCode::from(code as u8),
                Err(e) => {
                    eprintln!("ppa-vmm: error: {}", describe(e.as_ref()));
                    ExitCode::from(2)
                }
            }
        }
    };
    match opts.and_then(run) {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            eprintln!("ppa-vmm: error: {}", describe(e.as_ref()));
            ExitCode::from(2)
        }
    }
}
