//! `ppa-vmm`: the command line over the PPA-VMM library.
//!
//! `run` builds a VM from flags and/or a JSON config file (the same fields), runs it and prints
//! the final report; `demo` runs the embedded default. Before either reads anything, SIGTERM,
//! SIGINT and SIGHUP are blocked and handed to a `signals` thread ([`ppa_vmm::signals`]): the
//! first one ends a start-up at once (128 + its number) and shuts a running VM down as the
//! `shutdown` command does, a second one exits at once. A report file is checked before the
//! VM is built and written atomically at the end.
//!
//! Exit codes: 0 every vCPU exited with code 0, or a shutdown (the command or a stop signal)
//! ended the run and no vCPU failed; 1 a vCPU failed, exited non-zero or was stopped; 2 bad
//! input or a setup error (nothing ran); 3 the run ended but its report or histograms could not
//! be written; 128 + N a stop signal N during start-up, or a second one during the run, forced
//! the exit (143 SIGTERM, 130 SIGINT, 129 SIGHUP), without a report.
//!
//! The package (cli/) is the binary and what only it uses: the command line and what is
//! generated from it ([`cli`]), and `ppa-vmm bench` ([`bench`]); the VMM itself is the
//! `ppa_vmm` library, and `ctl`, `top` and `host` come from the `ppa_vmm_client` crate.

pub mod bench;
pub mod cli;
pub mod firecracker;

use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use crate::cli::{BenchArgs, BenchKind, Cli, Command};
use clap::FromArgMatches;
use ppa_vmm::config::{ReportFormat, ReportOptions, RunOptions};
use ppa_vmm::report::{check_writable, write_atomic};
use ppa_vmm::signals::{SignalError, StopSignals, Watcher};
use ppa_vmm::vm::Vm;
use ppa_vmm_api::describe;
use ppa_vmm_client::rundir::{Descriptor, Registration, RunDir, CALIBRATION_FILE};

/// The config file named by `--config`, with the command line laid over it.
fn options(cli: RunOptions) -> Result<RunOptions, Box<dyn std::error::Error>> {
    let file = match &cli.config {
        Some(path) => RunOptions::from_file(path)?,
        None => RunOptions::default(),
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

/// Exit code of a run whose report or histograms could not be written.
const EXIT_REPORT_LOST: i32 = 3;

/// Checks, before the VM is built, that the report and histogram files can be written.
fn check_outputs(opts: &ReportOptions) -> Result<(), Box<dyn std::error::Error>> {
    let check = |flag: &str, path: &std::path::Path| {
        check_writable(path).map_err(|e| format!("{flag} {}: {}", path.display(), describe(&e)))
    };
    if let Some(path) = &opts.histograms_file {
        check("--histograms-file", path)?;
    }
    if let (Some(path), false) = (&opts.file, opts.format == ReportFormat::None) {
        check("--report-file", path)?;
    }
    Ok(())
}

fn emit(
    report: &ppa_vmm::report::Report,
    opts: &ReportOptions,
) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(path) = &opts.histograms_file {
        write_atomic(path, report.histograms_text().as_bytes())?;
    }
    let text = match opts.format {
        ReportFormat::None => return Ok(()),
        ReportFormat::Json => serde_json::to_string_pretty(report)? + "\n",
        ReportFormat::Text => report.to_text(),
    };
    match &opts.file {
        Some(path) => write_atomic(path, text.as_bytes())?,
        None => {
            use std::io::Write;
            match std::io::stdout().lock().write_all(text.as_bytes()) {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    return Err(format!("cannot write the report to stdout: {e}").into())
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// With `--name` or `--run-dir`: the run directory, checked (made when missing), and the
/// name and socket path the VM takes there.
fn run_dir_plan(opts: &mut RunOptions) -> Result<Option<RunDir>, Box<dyn std::error::Error>> {
    if opts.name.is_none() && opts.run_dir.is_none() {
        return Ok(None);
    }
    let dir = RunDir::open(opts.run_dir.as_deref(), true)?;
    let name = opts
        .name
        .get_or_insert_with(|| format!("ppa-vmm-{}", std::process::id()))
        .clone();
    if opts.api_sock.is_none() {
        opts.api_sock = Some(dir.socket_path(&name)?);
    }
    Ok(Some(dir))
}

/// Where the run stands, for the first stop signal: while the VM is set up the process ends at
/// once; while it runs the signal is the `shutdown` command; after its end nothing (a second
/// signal still forces the exit).
pub(crate) enum Phase {
    /// The config, the run directory, the VM being built.
    Starting,
    /// The VM built: its handle.
    Running(ppa_vmm::handle::VmHandle),
    /// The run has ended.
    Ended,
}

/// Blocks the stop signals and starts the `signals` thread at once, before anything of the
/// run is read or made, so that a stop signal ends even a start-up that is stuck.
pub(crate) fn watch_signals() -> Result<(Watcher, Arc<Mutex<Phase>>), SignalError> {
    let phase = Arc::new(Mutex::new(Phase::Starting));
    let target = Arc::clone(&phase);
    let watcher = StopSignals::block()?.watch(move |c| {
        let now = std::mem::replace(
            &mut *target.lock().unwrap_or_else(|e| e.into_inner()),
            Phase::Ended,
        );
        match now {
            Phase::Starting => ppa_vmm::signals::abandon_start(c),
            Phase::Running(h) => {
                ppa_vmm::signals::announce_shutdown(c);
                h.shutdown_by_signal(c.name());
            }
            Phase::Ended => {}
        }
    })?;
    Ok((watcher, phase))
}

/// What another door (`ppa-vmm firecracker`) changes in a run: the vCPU threads' names, and
/// what to do with the VM's handle once it is built, just before its vCPUs start.
#[derive(Default)]
pub(crate) struct RunHooks<'a> {
    /// How the vCPU threads are named.
    pub vcpu_names: ppa_vmm::config::VcpuNames,
    /// Called with the built VM's handle before it runs.
    pub on_built: Option<&'a mut dyn FnMut(&ppa_vmm::handle::VmHandle)>,
}

/// Builds and runs the VM with the stop signals watched; prints or writes the report.
fn run(
    opts: RunOptions,
    watcher: &Watcher,
    phase: &Mutex<Phase>,
) -> Result<i32, Box<dyn std::error::Error>> {
    run_with(opts, watcher, phase, RunHooks::default())
}

/// [`run`] with the hooks of another door.
pub(crate) fn run_with(
    mut opts: RunOptions,
    watcher: &Watcher,
    phase: &Mutex<Phase>,
    hooks: RunHooks<'_>,
) -> Result<i32, Box<dyn std::error::Error>> {
    opts.seccomp.get_or_insert(ppa_vmm::seccomp::Mode::Kill);
    let run_dir = run_dir_plan(&mut opts)?;
    let (mut config, report_opts) = opts.into_config()?;
    config.vcpu_names = hooks.vcpu_names;
    // KVM's exit cost is kept per host in the run directory: that of this VM, else the
    // default one when it is there and usable (never made only for this).
    config.calibration_cache = run_dir
        .clone()
        .or_else(|| RunDir::open(None, false).ok())
        .map(|d| d.path().join(CALIBRATION_FILE));
    check_outputs(&report_opts)?;
    let _registration: Option<Registration> = match &run_dir {
        Some(dir) => {
            let r = dir.register(&Descriptor::of_self(
                config.name.as_deref().unwrap_or_default(),
                config.vcpus,
                config.api_sock.clone(),
            ))?;
            // Removed by a forced exit too (a stop signal in start-up, a second one later).
            ppa_vmm::signals::remove_at_forced_exit(r.path());
            Some(r)
        }
        None => None,
    };
    // Opened now, with every privilege and before any filter; Vm::run only writes to it.
    let notifier = ppa_vmm::notify::Notifier::from_env()
        .map_err(|e| format!("cannot reach NOTIFY_SOCKET: {e}"))?;
    // The `signals` thread enters its kind in this mode (Vm::run arms the same mode again for
    // the others).
    ppa_vmm::seccomp::arm(config.seccomp);
    watcher.confine()?;
    let mut vm = Vm::try_from(config)?;
    if let Some(n) = notifier {
        vm.set_notifier(n);
    }
    // The `signals` thread holds the VM's handle only until the run ends, since the handle
    // keeps the PPA page alive and its file goes with the last holder.
    *phase.lock().unwrap_or_else(|e| e.into_inner()) = Phase::Running(vm.handle());
    if let Some(f) = hooks.on_built {
        f(&vm.handle());
    }
    let outcome = vm.run();
    drop(std::mem::replace(
        &mut *phase.lock().unwrap_or_else(|e| e.into_inner()),
        Phase::Ended,
    ));
    let outcome = outcome?;
    if let Err(e) = emit(&outcome.report, &report_opts) {
        eprintln!(
            "ppa-vmm: error: the run ended ({}) but {}",
            outcome.report.vm.end,
            describe(e.as_ref())
        );
        return Ok(EXIT_REPORT_LOST);
    }
    Ok(outcome.exit_code)
}

/// Prints a bench result as one JSON object or as its table.
fn print_result<T: serde::Serialize>(
    r: &T,
    json: bool,
    text: impl Fn(&T) -> String,
) -> Result<(), Box<dyn std::error::Error>> {
    if json {
        println!("{}", serde_json::to_string(r)?);
    } else {
        print!("{}", text(r));
    }
    Ok(())
}

fn bench(args: BenchArgs) -> Result<i32, Box<dyn std::error::Error>> {
    use crate::bench::{limit, socket};
    match args.which {
        BenchKind::Overhead => print_result(
            &crate::bench::overhead(crate::bench::OverheadOptions {
                exits: args.exits.unwrap_or(crate::bench::OVERHEAD_EXITS),
                rounds: args.rounds.unwrap_or(BenchKind::Overhead.default_rounds()),
            })?,
            args.json,
            crate::bench::OverheadResult::to_text,
        )?,
        BenchKind::Limit => print_result(
            &limit::limit(limit::LimitOptions {
                periods: args.periods,
                percent: 25,
                rounds: args.rounds.unwrap_or(BenchKind::Limit.default_rounds()),
                hogs: args.hogs,
                cgroup_unavailable: None,
            })?,
            args.json,
            limit::LimitResult::to_text,
        )?,
        BenchKind::Net => print_result(
            &crate::bench::net::net(crate::bench::net::NetOptions {
                packets: args.packets,
                rounds: args.rounds.unwrap_or(BenchKind::Net.default_rounds()),
                echoes: args.echoes,
                exits: args
                    .exits
                    .or(BenchKind::Net.default_exits())
                    .unwrap_or_default(),
            })?,
            args.json,
            crate::bench::net::NetResult::to_text,
        )?,
        BenchKind::Disk => print_result(
            &crate::bench::disk::disk(crate::bench::disk::DiskOptions {
                blocks: args.blocks,
                rounds: args.rounds.unwrap_or(BenchKind::Disk.default_rounds()),
                poll_us: args.poll_us,
            })?,
            args.json,
            crate::bench::disk::DiskResult::to_text,
        )?,
        BenchKind::Socket if args.exits.is_some() => {
            return Err(
                "`--exits` sets the length of `bench overhead`; `bench socket` runs \
                        each VM for a measured window (`--window-ms`)"
                    .into(),
            )
        }
        BenchKind::Stops => print_result(
            &crate::bench::stops::stops(crate::bench::stops::StopsOptions {
                rounds: args.rounds.unwrap_or(BenchKind::Stops.default_rounds()),
                run_ms: 2_000,
            })?,
            args.json,
            crate::bench::stops::StopsResult::to_text,
        )?,
        BenchKind::Start => print_result(
            &crate::bench::start::start(crate::bench::start::StartOptions {
                rounds: args.rounds.unwrap_or(BenchKind::Start.default_rounds()),
            })?,
            args.json,
            crate::bench::start::StartResult::to_text,
        )?,
        BenchKind::Socket => print_result(
            &socket::socket(socket::SocketOptions {
                vcpus: args.vcpus,
                window: std::time::Duration::from_millis(args.window_ms),
                rounds: args.rounds.unwrap_or(BenchKind::Socket.default_rounds()),
                rate: args.rate,
                client_nice: args.client_nice,
            })?,
            args.json,
            socket::SocketResult::to_text,
        )?,
    }
    Ok(0)
}

/// Prints generated text to stdout (quiet when the reader went away): exit code 0, or 2 when
/// stdout cannot be written.
fn print_out(text: &str) -> ExitCode {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            eprintln!("ppa-vmm: error: cannot write to stdout: {e}");
            ExitCode::from(2)
        }
        _ => ExitCode::SUCCESS,
    }
}

/// Log records to stderr as `ppa-vmm: LEVEL: message`, at the level `PPA_VMM_LOG` names
/// (error, warn, info, debug, trace; default warn).
struct StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            let level = r.level().as_str().to_ascii_lowercase();
            eprintln!("ppa-vmm: {level}: {}", r.args());
        }
    }

    fn flush(&self) {}
}

fn init_log() {
    static LOG: StderrLog = StderrLog;
    let level = std::env::var("PPA_VMM_LOG")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(log::LevelFilter::Warn);
    if log::set_logger(&LOG).is_ok() {
        log::set_max_level(level);
    }
}

/// The command line; under the name `firecracker` (a link to this binary, which is how
/// Kata Containers and firecracker-containerd run it) it is `ppa-vmm firecracker ARGS`.
fn parse_cli() -> Cli {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let called = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .is_some_and(|n| n == "firecracker");
    if called {
        args.insert(1, "firecracker".into());
    }
    // `cli_command` rather than `Cli::command`: it adds the bench defaults to the help.
    match Cli::from_arg_matches(&crate::cli::cli_command().get_matches_from(args)) {
        Ok(c) => c,
        Err(e) => e.exit(),
    }
}

/// Makes a panic on any thread end the process after its message, as `panic = "abort"` does:
/// the test profile (Cargo.toml `ci`) unwinds, and a VMM must not run on with a vCPU or
/// device thread gone.
fn abort_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        std::process::abort();
    }));
}

fn main() -> ExitCode {
    abort_on_panic();
    let cli = parse_cli();
    // The firecracker subcommand installs a log of its own (Firecracker's line shape).
    if !matches!(cli.command, Command::Firecracker(_)) {
        init_log();
    }
    let args = match cli.command {
        Command::Firecracker(args) => return crate::firecracker::main(*args),
        Command::Ctl(opts) => return ExitCode::from(ppa_vmm_client::ctl::run(opts) as u8),
        Command::Top(opts) => return ExitCode::from(ppa_vmm_client::top::run(opts) as u8),
        Command::Host(opts) => return ExitCode::from(ppa_vmm_client::host::run(opts) as u8),
        Command::Run(args) => Some(args),
        Command::Demo => None,
        Command::Completions { shell } => return print_out(&crate::cli::completions(shell)),
        Command::Man => {
            return match crate::cli::man_page() {
                Ok(page) => print_out(&page),
                Err(e) => {
                    eprintln!("ppa-vmm: error: cannot render the man page: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Schema { which } => return print_out(&which.schema()),
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
    // Still one thread: every thread started from here on inherits the blocked stop signals,
    // and from here on a stop signal takes effect at once, whatever the start-up waits for.
    let (watcher, phase) = match watch_signals() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("ppa-vmm: error: {}", describe(&e));
            return ExitCode::from(2);
        }
    };
    let opts = match args {
        Some(args) => options(*args),
        None => Ok(demo_options()),
    };
    match opts.and_then(|o| run(o, &watcher, &phase)) {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            eprintln!("ppa-vmm: error: {}", describe(e.as_ref()));
            ExitCode::from(2)
        }
    }
}
