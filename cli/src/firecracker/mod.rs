//! `ppa-vmm firecracker`: Firecracker's API as a second door. The tools that drive
//! Firecracker (Kata Containers, firecracker-containerd, firecracker-go-sdk, Python clients)
//! start a PPA-VMM VM by running this binary, under the name `firecracker` or with this
//! subcommand, with Firecracker's flags; the VM then also has our own control socket and
//! run-directory descriptor, so `ctl`, `top` and `host` see it (docs/firecracker.md).
//!
//! Data flow: [`main`] reads the flags ([`FirecrackerArgs`]), installs the log
//! ([`logger`]), blocks the stop signals, binds the API socket and starts the `fc_api`
//! thread ([`server`] over [`api`]). The resources come from `PUT` requests or from
//! `--config-file` ([`resources`], in [`model`]'s layout); at `InstanceStart` (or at once with
//! `--config-file`) they become our [`RunOptions`], laid over `--ppa-config`'s, and the main
//! thread builds and runs the VM exactly as `ppa-vmm run` does (`crate::run_with`), with the
//! vCPU threads named as Firecracker names them. The `fc_api` thread gets the VM's handle
//! before the vCPUs start, and writes the metrics lines ([`metrics`]); the main thread writes
//! the last one when the VM ends, and the process exits as Firecracker's does.

pub mod api;
pub mod http;
pub mod logger;
pub mod metrics;
pub mod model;
pub mod resources;
pub mod server;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use ppa_vmm::config::{ReportFormat, RunOptions, VcpuNames};
use ppa_vmm::handle::VmHandle;
use ppa_vmm_api::describe;
use thiserror::Error;

use self::api::{Api, Starter};
use self::metrics::MetricsState;
use self::resources::Resources;

/// Firecracker's default API socket.
pub const DEFAULT_API_SOCK: &str = "/run/firecracker.socket";
/// Firecracker's default instance id.
pub const DEFAULT_ID: &str = "anonymous-instance";

/// The flags of `ppa-vmm firecracker`: Firecracker's own (same names, same meaning), then
/// ours.
#[derive(Debug, Clone, Args)]
pub struct FirecrackerArgs {
    /// The API socket (Firecracker's default: /run/firecracker.socket).
    #[arg(long, value_name = "PATH", default_value = DEFAULT_API_SOCK)]
    pub api_sock: PathBuf,
    /// A config file in Firecracker's JSON layout: the VM starts at once, without any API call.
    #[arg(long, value_name = "FILE")]
    pub config_file: Option<PathBuf>,
    /// Serve no API (needs --config-file).
    #[arg(long, requires = "config_file")]
    pub no_api: bool,
    /// The instance id: `GET /`'s id and the VM's name in the run directory.
    #[arg(long, default_value = DEFAULT_ID)]
    pub id: String,
    /// Log level: Error, Warning, Info, Debug, Trace or Off (default: Warning).
    #[arg(long, value_name = "LEVEL")]
    pub level: Option<String>,
    /// Log to this file or named pipe instead of stderr.
    #[arg(long, value_name = "PATH")]
    pub log_path: Option<String>,
    /// Put the level in each log line.
    #[arg(long)]
    pub show_level: bool,
    /// Put the source file and line in each log line.
    #[arg(long)]
    pub show_log_origin: bool,
    /// Only log lines of modules under this path.
    #[arg(long, value_name = "PATH")]
    pub module: Option<String>,
    /// Write the metrics lines to this file or named pipe (as `PUT /metrics`).
    #[arg(long, value_name = "PATH")]
    pub metrics_path: Option<String>,
    /// The largest request body, bytes.
    #[arg(long, value_name = "BYTES", default_value_t = http::DEFAULT_MAX_PAYLOAD)]
    pub http_api_max_payload_size: usize,
    /// No seccomp filters (ours: `--seccomp none`).
    #[arg(long)]
    pub no_seccomp: bool,
    /// Refused: PPA-VMM's filters are built in, one per thread kind (docs/security.md).
    #[arg(long, value_name = "FILE")]
    pub seccomp_filter: Option<PathBuf>,
    /// Refused: PPA-VMM has no boot-timer device.
    #[arg(long)]
    pub boot_timer: bool,
    /// The jailer's start time (accepted, not used).
    #[arg(long, value_name = "US")]
    pub start_time_us: Option<u64>,
    /// The jailer's start CPU time (accepted, not used).
    #[arg(long, value_name = "US")]
    pub start_time_cpu_us: Option<u64>,
    /// The jailer's parent's CPU time (accepted, not used).
    #[arg(long, value_name = "US")]
    pub parent_cpu_time_us: Option<u64>,
    /// Ours: run options in `ppa-vmm run`'s config-file layout, under Firecracker's (CPU
    /// limits, accounting level, thresholds, --metrics-addr, a final report file).
    #[arg(long, value_name = "FILE.json")]
    pub ppa_config: Option<PathBuf>,
    /// Ours: the run directory where the VM registers (default as `ppa-vmm run`'s).
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
}

/// Why `ppa-vmm firecracker` could not start.
#[derive(Debug, Error)]
pub enum FirecrackerError {
    /// A flag Firecracker has that PPA-VMM refuses.
    #[error("--{0} is not supported: {1}")]
    Flag(&'static str, &'static str),
    /// An id Firecracker would refuse.
    #[error("the instance id must be 1 to 64 letters, digits or `-`, not {0:?}")]
    Id(String),
    /// The API socket cannot be bound.
    #[error("cannot serve the Firecracker API on {path}")]
    Bind {
        /// Path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: ppa_vmm::unix_socket::SocketError,
    },
    /// The config file.
    #[error(transparent)]
    Resource(#[from] resources::ResourceError),
    /// The logger.
    #[error(transparent)]
    Logger(#[from] logger::LoggerError),
    /// The metrics file.
    #[error(transparent)]
    Metrics(#[from] metrics::MetricsError),
    /// `--ppa-config`.
    #[error(transparent)]
    PpaConfig(#[from] ppa_vmm::config::ConfigError),
    /// The API thread.
    #[error("cannot start the fc_api thread")]
    Thread(#[source] std::io::Error),
}

/// A start asked by `InstanceStart`: the options, and where to say how it went (the handle
/// once built, then an error if the run failed before the vCPUs started).
type StartAsk = (RunOptions, Sender<Result<VmHandle, String>>);

/// The API thread's side of a start: asks the main thread and waits until the vCPUs run.
struct ChannelStarter(Sender<StartAsk>);

impl Starter for ChannelStarter {
    fn start(&mut self, options: RunOptions) -> Result<VmHandle, String> {
        let (tx, rx) = channel();
        self.0
            .send((options, tx))
            .map_err(|_| "the main thread is gone".to_string())?;
        let vm = rx
            .recv()
            .map_err(|_| "the main thread is gone".to_string())??;
        wait_started(&vm, &rx)?;
        Ok(vm)
    }
}

/// Waits (at most 60 s) until `vm`'s vCPUs have been released, or the run failed first.
fn wait_started(vm: &VmHandle, rx: &Receiver<Result<VmHandle, String>>) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while vm.uptime_ns() == 0 && !vm.finished() && Instant::now() < deadline {
        if let Ok(Err(e)) = rx.recv_timeout(Duration::from_millis(1)) {
            return Err(e);
        }
    }
    Ok(())
}

/// Firecracker's flags that PPA-VMM refuses, with why.
fn refused_flags(a: &FirecrackerArgs) -> Result<(), FirecrackerError> {
    if a.seccomp_filter.is_some() {
        return Err(FirecrackerError::Flag(
            "seccomp-filter",
            "PPA-VMM's seccomp filters are built in, one per thread kind (docs/security.md); \
             --no-seccomp turns them off",
        ));
    }
    if a.boot_timer {
        return Err(FirecrackerError::Flag(
            "boot-timer",
            "PPA-VMM has no boot-timer device; its control socket's `stats` has the VM's uptime",
        ));
    }
    let id_ok = (1..=64).contains(&a.id.len())
        && a.id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    if !id_ok {
        return Err(FirecrackerError::Id(a.id.chars().take(80).collect()));
    }
    Ok(())
}

/// The options the VM starts from: `--ppa-config`'s, with ours for this mode (the name from
/// the id, no report on stdout unless asked: it is the guest console's in Firecracker).
fn base_options(a: &FirecrackerArgs) -> Result<RunOptions, FirecrackerError> {
    let mut o = match &a.ppa_config {
        Some(p) => RunOptions::from_file(p)?,
        None => RunOptions::default(),
    };
    o.name = Some(match a.id.as_str() {
        DEFAULT_ID => format!("{DEFAULT_ID}-{}", std::process::id()),
        id => id.to_string(),
    });
    o.run_dir = a.run_dir.clone().or(o.run_dir);
    o.report.get_or_insert(ReportFormat::None);
    if a.no_seccomp {
        o.seccomp = Some(ppa_vmm::seccomp::Mode::None);
    }
    Ok(o)
}

/// The logger and metrics of the command line and the config file.
fn configure_outputs(
    a: &FirecrackerArgs,
    r: &mut Resources,
    m: &Mutex<MetricsState>,
) -> Result<(), FirecrackerError> {
    let flags = model::Logger {
        log_path: a.log_path.clone(),
        level: a.level.clone(),
        show_level: Some(a.show_level),
        show_log_origin: Some(a.show_log_origin),
        module: a.module.clone(),
    };
    logger::configure(&flags)?;
    if let Some(l) = &r.logger {
        logger::configure(l)?;
    }
    let from_flag = a.metrics_path.clone().map(|metrics_path| model::Metrics {
        metrics_path,
        emit_id: false,
        properties: None,
    });
    if let Some(mc) = r.metrics.clone().or(from_flag) {
        m.lock()
            .unwrap_or_else(|e| e.into_inner())
            .configure(&mc, &a.id)?;
        r.metrics = Some(mc);
    }
    Ok(())
}

/// Everything before the VM: flags, log, config file, API socket.
struct Setup {
    args: FirecrackerArgs,
    base: RunOptions,
    resources: Resources,
    metrics: Arc<Mutex<MetricsState>>,
    listener: Option<std::os::unix::net::UnixListener>,
}

fn setup(args: FirecrackerArgs) -> Result<Setup, FirecrackerError> {
    refused_flags(&args)?;
    let base = base_options(&args)?;
    let mut resources = match &args.config_file {
        Some(path) => Resources::from_config_file(path)?.0,
        None => Resources::default(),
    };
    let metrics = Arc::new(Mutex::new(MetricsState::default()));
    configure_outputs(&args, &mut resources, &metrics)?;
    let listener = match args.no_api {
        true => None,
        false => Some(
            ppa_vmm::unix_socket::bind_unix(&args.api_sock).map_err(|source| {
                FirecrackerError::Bind {
                    path: args.api_sock.clone(),
                    source,
                }
            })?,
        ),
    };
    Ok(Setup {
        args,
        base,
        resources,
        metrics,
        listener,
    })
}

/// Starts the `fc_api` thread serving `api`.
fn spawn_server<S: Starter + Send + 'static>(
    api: Api<S>,
    s: &mut Setup,
) -> Result<(), FirecrackerError> {
    let mut server = server::Server::new(api, s.listener.take(), Arc::clone(&s.metrics));
    server.max_payload = s.args.http_api_max_payload_size;
    std::thread::Builder::new()
        .name("fc_api".into())
        .spawn(move || server.run())
        .map(drop)
        .map_err(FirecrackerError::Thread)
}

/// A starter that is never asked (the VM of `--config-file` is already started).
struct Started;

impl Starter for Started {
    fn start(&mut self, _: RunOptions) -> Result<VmHandle, String> {
        Err("the VM of --config-file has started".into())
    }
}

/// `ppa-vmm firecracker`.
pub fn main(args: FirecrackerArgs) -> ExitCode {
    logger::install(&args.id);
    // Before any other thread: every later thread inherits the blocked stop signals.
    let (watcher, phase) = match crate::watch_signals() {
        Ok(w) => w,
        Err(e) => return fail(&e),
    };
    let mut s = match setup(args) {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    let sock = (!s.args.no_api).then(|| s.args.api_sock.clone());
    let mut vm = None;
    let code = match s.args.config_file.is_some() {
        true => run_config_file(&mut s, &watcher, &phase, &mut vm),
        false => run_api(&mut s, &watcher, &phase, &mut vm),
    };
    // The last line: the VM's final figures.
    let last = s
        .metrics
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .flush(vm.as_ref());
    if let Err(e) = last {
        log::warn!("{e}");
    }
    if let Some(p) = sock {
        ppa_vmm::unix_socket::remove_socket_file(&p);
    }
    code
}

fn fail(e: &dyn std::error::Error) -> ExitCode {
    eprintln!("ppa-vmm: error: {}", describe(e));
    ExitCode::from(2)
}

/// The `--config-file` VM: started at once; the API (unless `--no-api`) serves it from its
/// start.
fn run_config_file(
    s: &mut Setup,
    watcher: &ppa_vmm::signals::Watcher,
    phase: &Mutex<crate::Phase>,
    built: &mut Option<VmHandle>,
) -> ExitCode {
    let options = match s.resources.to_run_options(s.base.clone()) {
        Ok(o) => o,
        Err(e) => return fail(&e),
    };
    let mut spawned: Result<(), FirecrackerError> = Ok(());
    let mut on_built = |vm: &VmHandle| {
        let mut a = Api::new(
            s.args.id.clone(),
            s.resources.clone(),
            s.base.clone(),
            Started,
            Arc::clone(&s.metrics),
        );
        a.set_started(vm.clone());
        *built = Some(vm.clone());
        spawned = spawn_server(a, s);
    };
    let hooks = crate::RunHooks {
        vcpu_names: VcpuNames::Firecracker,
        on_built: Some(&mut on_built),
    };
    let result = crate::run_with(options, watcher, phase, hooks);
    if let Err(e) = spawned {
        return fail(&e);
    }
    match result {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => fail(e.as_ref()),
    }
}

/// The API's VM: each `InstanceStart` until one starts; then its run.
fn run_api(
    s: &mut Setup,
    watcher: &ppa_vmm::signals::Watcher,
    phase: &Mutex<crate::Phase>,
    built: &mut Option<VmHandle>,
) -> ExitCode {
    let (ask_tx, ask_rx) = channel::<StartAsk>();
    let api = Api::new(
        s.args.id.clone(),
        s.resources.clone(),
        s.base.clone(),
        ChannelStarter(ask_tx),
        Arc::clone(&s.metrics),
    );
    if let Err(e) = spawn_server(api, s) {
        return fail(&e);
    }
    while let Ok((options, reply)) = ask_rx.recv() {
        let mut on_built = |vm: &VmHandle| {
            *built = Some(vm.clone());
            let _ = reply.send(Ok(vm.clone()));
        };
        let hooks = crate::RunHooks {
            vcpu_names: VcpuNames::Firecracker,
            on_built: Some(&mut on_built),
        };
        match crate::run_with(options, watcher, phase, hooks) {
            Ok(code) => return ExitCode::from(code as u8),
            Err(e) if built.is_none() => {
                // Nothing ran: the API answers 400 and the next InstanceStart may try again.
                let _ = reply.send(Err(describe(e.as_ref())));
            }
            Err(e) => {
                let _ = reply.send(Err(describe(e.as_ref())));
                // Time for the API thread to answer before the process ends.
                std::thread::sleep(Duration::from_millis(200));
                return fail(e.as_ref());
            }
        }
    }
    eprintln!("ppa-vmm: error: the fc_api thread ended");
    ExitCode::from(2)
}
