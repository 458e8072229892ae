//! Request handling of the control socket: one request line in, one response line out.
//!
//! Data flow: the server hands each complete line to [`Handler::handle_line`], which parses
//! it ([`ppa_vmm_api::parse_request`]), runs the command against the VM through its
//! [`VmHandle`] (a reader of the vCPUs' published state: it takes no lock a vCPU thread waits
//! on) and encodes the response. Nothing here does I/O on sockets, so every command is
//! unit-tested on synthetic vCPUs without KVM.
//!
//! `stats` is answered from a snapshot of every vCPU that is reused for at most
//! `max_age_ns` (15 ms by default, stretched with the refresher's interval when its CPU
//! budget stretches that; see [`super::board`]): with 64 vCPUs a fresh snapshot costs about
//! two hundred system calls, and a monitoring client asking 1000 times a second must not
//! take CPU from the guests. Commands that change what `stats` shows drop it.

use ppa_vmm_api::{
    parse_request, Command, ErrorBody, ErrorKind, EventKind, HistogramFormat, PressureTrigger,
    Response, Stats, ThresholdsUpdate, VersionInfo, VmState,
};
use serde_json::Value;
use std::sync::Arc;

use super::board::{Board, Snapshot};
use super::listen::ChangeBudget;
use crate::accounting::histogram::{kstats_text, HistogramSnapshot, DEFAULT_FRAC_BITS};
use crate::accounting::snapshot::HistSnapshots;
use crate::handle::{HandleError, VmHandle};
use crate::sync::now_ns;

/// Default longest reuse of a `stats` snapshot.
pub const STATS_MAX_AGE_NS: u64 = 15_000_000;
/// How often the `api-stats` thread takes a snapshot while clients ask for `stats`.
pub const STATS_REFRESH_NS: u64 = 10_000_000;

/// What the server must do with a handled line.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Send this response line.
    Reply(String),
    /// Send a `stats` answer: this head, the snapshot's text, then `}` and the newline. The
    /// server writes the three parts with one `writev`, so the ~20 KB of a 64-vCPU snapshot
    /// go from the board to the socket without being copied into a line first.
    Stats(String, Arc<Snapshot>),
    /// Send this response line, then stream the events whose kinds are in the mask
    /// (bit `1 << kind as u8`); with a pressure trigger, check it every 10 ms.
    Subscribe(String, u8, Option<PressureTrigger>),
    /// Nothing was run: the client's state-changing requests are past its budget. Hand the
    /// same line in again after this long.
    Wait(std::time::Duration),
}

/// The tail of a `stats` answer after the snapshot's text.
pub const STATS_TAIL: &str = "}\n";

impl Outcome {
    /// The whole response line, copied into one string (for tests and the fuzzers).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn line(&self) -> String {
        match self {
            Outcome::Reply(r) | Outcome::Subscribe(r, _, _) => r.clone(),
            Outcome::Wait(_) => String::new(),
            Outcome::Stats(head, snap) => format!("{head}{}{STATS_TAIL}", snap.text),
        }
    }
}

/// Whether `cmd` changes the VM's state or its accounting (what a client's
/// [`ChangeBudget`] bounds).
pub fn changes_state(cmd: &Command) -> bool {
    matches!(
        cmd,
        Command::Reset { .. }
            | Command::SetLevel { .. }
            | Command::SetThresholds { .. }
            | Command::SetLimit { .. }
            | Command::SetPin { .. }
            | Command::SetRate { .. }
            | Command::Pause {}
            | Command::Resume {}
            | Command::Shutdown {}
    )
}

/// Bit of `kind` in a subscription mask.
pub fn kind_bit(kind: EventKind) -> u8 {
    1 << (kind as u8)
}

/// Runs requests against one VM.
pub struct Handler {
    vm: VmHandle,
    max_age_ns: u64,
    board: Arc<Board>,
    metrics: crate::metrics::Exporter,
}

/// What `version` answers.
fn version_info() -> VersionInfo {
    VersionInfo {
        version: env!("CARGO_PKG_VERSION").to_string(),
        api: ppa_vmm_api::API_VERSION,
        guest_abi: format!(
            "{}.{}",
            ppa_guest_abi::BOOT_INFO_VERSION >> 16,
            ppa_guest_abi::BOOT_INFO_VERSION & 0xffff
        ),
    }
}

/// What `device` answers for the device named `id`.
/// `guest-reset`: asks the guest agent to zero its baselines (a new generation in the host
/// section); answers the generation asked and the last one the agent honoured.
fn guest_reset(vm: &VmHandle) -> Result<Value, ErrorBody> {
    match vm.ppa_page() {
        Some(_) if vm.finished() => Err(ErrorBody::new(
            ErrorKind::InvalidState,
            "every vCPU has already ended: no guest agent can carry out a reset",
        )),
        Some(p) => {
            let honoured = p.guest_view().reset.map_or(0, |r| r.honoured);
            to_value(&ppa_vmm_api::GuestResetResult {
                generation: p.board().ask_reset(),
                honoured,
            })
        }
        None => Err(ErrorBody::new(
            ErrorKind::InvalidState,
            "this VM has no PPA page (it was started with --ppa-page-size 0), so no guest agent to reset",
        )),
    }
}

fn device(vm: &VmHandle, id: &str) -> Result<Value, ErrorBody> {
    to_value(&find_device(vm, id)?.stats())
}

/// The device `id` of `vm`, or an error that lists the devices it has.
fn find_device<'a>(
    vm: &'a VmHandle,
    id: &str,
) -> Result<&'a Arc<dyn crate::devices::Device>, ErrorBody> {
    vm.devices().iter().find(|d| d.id() == id).ok_or_else(|| {
        ErrorBody::new(
            ErrorKind::NoSuchDevice,
            format!(
                "the VM has no device {} (it has: {})",
                id.chars().take(64).collect::<String>(),
                if vm.devices().is_empty() {
                    "none".to_string()
                } else {
                    vm.devices()
                        .iter()
                        .map(|d| d.id().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ),
        )
    })
}

/// `set-rate`: the device's rate limiters take `rate`'s buckets; answers its figures.
fn set_rate(vm: &VmHandle, id: &str, rate: &str) -> Result<Value, ErrorBody> {
    let d = find_device(vm, id)?;
    d.set_rate(rate)
        .map_err(|e| ErrorBody::new(ErrorKind::BadRate, e.to_string()))?;
    to_value(&d.stats())
}

/// Every vCPU's overview and the VM's figures, taken now.
pub fn fresh_stats(vm: &VmHandle) -> Stats {
    let vcpus = vm.vcpus().iter().map(|v| v.summary()).collect();
    Stats {
        vm: vm.vm_stats(),
        vcpus,
        groups: vm.limiter().groups(),
        devices: vm.device_stats(),
    }
}

/// A snapshot for the board: [`fresh_stats`] with its JSON text.
pub fn snapshot(vm: &VmHandle) -> Snapshot {
    let at_ns = now_ns();
    let text = serde_json::to_string(&fresh_stats(vm)).unwrap_or_default();
    Snapshot { at_ns, text }
}

fn no_such_vcpu(e: HandleError) -> ErrorBody {
    ErrorBody::new(ErrorKind::NoSuchVcpu, e.to_string())
}

fn to_value<T: serde::Serialize>(v: &T) -> Result<Value, ErrorBody> {
    serde_json::to_value(v).map_err(|e| {
        ErrorBody::new(
            ErrorKind::Internal,
            format!("the result could not be encoded: {e}"),
        )
    })
}

/// The kinds a `subscribe` asks for and its pressure trigger, checked: a trigger needs
/// `pressure` among the kinds (or no kinds: then it adds it), and `pressure` needs a trigger.
fn subscription(
    events: Vec<EventKind>,
    pressure: Option<PressureTrigger>,
) -> Result<(Vec<EventKind>, Option<PressureTrigger>), ErrorBody> {
    let bad = |m: String| ErrorBody::new(ErrorKind::BadRequest, m);
    let mut kinds = if events.is_empty() {
        EventKind::ALL.to_vec()
    } else {
        events
    };
    let wants = kinds.contains(&EventKind::Pressure);
    match pressure {
        Some(t) => {
            t.validate().map_err(bad)?;
            if !wants {
                kinds.push(EventKind::Pressure);
            }
        }
        None if wants => {
            return Err(bad(
                "`pressure` events need a trigger: add \"pressure\": {\"kind\": \"some\", \"threshold_us\": T, \"window_us\": W}".into(),
            ))
        }
        None => {}
    }
    Ok((kinds, pressure))
}

impl Handler {
    /// A handler over `vm` that reuses `stats` snapshots for at most `max_age_ns`.
    #[cfg(test)]
    pub fn new(vm: VmHandle, max_age_ns: u64) -> Self {
        Self::with_board(vm, max_age_ns, Arc::new(Board::default()))
    }

    /// The same, serving snapshots a refresher posts on `board`.
    pub fn with_board(vm: VmHandle, max_age_ns: u64, board: Arc<Board>) -> Self {
        Handler {
            vm,
            max_age_ns,
            board,
            metrics: crate::metrics::Exporter::default(),
        }
    }

    /// The VM.
    pub fn vm(&self) -> &VmHandle {
        &self.vm
    }

    /// Handles one request line (without its newline), with no budget (tests, fuzzing).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn handle_line(&mut self, line: &[u8]) -> Outcome {
        self.handle(line, None)
    }

    /// Handles one request line of a client whose state-changing requests draw on `budget`:
    /// one past it is not run, and the answer is [`Outcome::Wait`].
    pub fn handle_line_from(&mut self, line: &[u8], budget: &mut ChangeBudget) -> Outcome {
        self.handle(line, Some(budget))
    }

    fn handle(&mut self, line: &[u8], budget: Option<&mut ChangeBudget>) -> Outcome {
        let req = match parse_request(line) {
            Ok(r) => r,
            Err((id, e)) => return Outcome::Reply(Response::err(id, e).to_line()),
        };
        let id = req.id;
        if let (true, Some(b)) = (changes_state(&req.command), budget) {
            if let Err(wait) = b.take(now_ns()) {
                return Outcome::Wait(wait);
            }
        }
        match req.command {
            Command::Stats {} => {
                let head = format!("{{\"id\":{},\"ok\":true,\"result\":", id.get());
                Outcome::Stats(head, self.stats())
            }
            Command::Subscribe { events, pressure } => match subscription(events, pressure) {
                Ok((kinds, trigger)) => {
                    let mask = kinds.iter().fold(0, |m, k| m | kind_bit(*k));
                    let result = serde_json::json!({ "events": kinds, "pressure": trigger });
                    Outcome::Subscribe(Response::ok(id, result).to_line(), mask, trigger)
                }
                Err(e) => Outcome::Reply(Response::err(id, e).to_line()),
            },
            cmd => Outcome::Reply(match self.run(cmd) {
                Ok(v) => Response::ok(id, v).to_line(),
                Err(e) => Response::err(id, e).to_line(),
            }),
        }
    }

    /// The `stats` snapshot: the posted one when young enough, else one taken now.
    pub fn stats(&mut self) -> Arc<Snapshot> {
        if let Some(s) = self.board.take(self.board.max_age_ns(self.max_age_ns)) {
            return s;
        }
        let s = Arc::new(snapshot(&self.vm));
        self.board.post(Arc::clone(&s));
        s
    }

    /// The metrics text (Prometheus text format), rendered at most once per 100 ms.
    pub fn metrics_text(&mut self) -> String {
        self.metrics.text(&self.vm).text.clone()
    }

    /// The metrics exporter (where the server hands over its connection counters).
    #[allow(
        dead_code,
        reason = "the API server attaches its counters here (issue 17)"
    )]
    pub fn metrics(&self) -> &crate::metrics::Exporter {
        &self.metrics
    }

    /// Drops the `stats` snapshot (after a command that changes what it shows).
    pub fn invalidate(&mut self) {
        self.board.clear();
    }

    fn run(&mut self, cmd: Command) -> Result<Value, ErrorBody> {
        let vm = self.vm.clone();
        match cmd {
            Command::Version {} => to_value(&version_info()),
            Command::Vcpu { vcpu } => to_value(&vm.times(vcpu).map_err(no_such_vcpu)?.0),
            Command::Histogram { name, vcpu, format } => self.histogram(&name, vcpu, format),
            Command::Reset { vcpu } => {
                vm.reset(vcpu).map_err(no_such_vcpu)?;
                self.invalidate();
                Ok(serde_json::json!({ "reset": vcpu.map_or(Value::from("all"), Value::from) }))
            }
            Command::SetLevel { level } => {
                let old = vm.level();
                vm.set_level(level);
                self.invalidate();
                Ok(serde_json::json!({ "level": level, "previous": old }))
            }
            Command::SetThresholds {
                exit_handling_ns,
                guest_run_ns,
                wakeup_latency_ns,
                steal_window_ns,
            } => {
                let update = ThresholdsUpdate {
                    exit_handling_ns,
                    guest_run_ns,
                    wakeup_latency_ns,
                    steal_window_ns,
                };
                let t = update.apply(vm.thresholds());
                vm.set_thresholds(t);
                self.invalidate();
                to_value(&t)
            }
            Command::Threads {} => to_value(&vm.threads()),
            Command::Device { name } => device(&vm, &name),
            Command::SetRate { device, rate } => set_rate(&vm, &device, &rate),
            Command::Pause {} | Command::Resume {} | Command::Shutdown {} if vm.finished() => Err(
                ErrorBody::new(ErrorKind::InvalidState, "every vCPU has already ended"),
            ),
            Command::Pause {} | Command::Resume {} if vm.shutdown_requested() => Err(
                ErrorBody::new(ErrorKind::InvalidState, "the VM is shutting down"),
            ),
            Command::Pause {} => {
                vm.pause();
                self.invalidate();
                Ok(serde_json::json!({ "state": VmState::Paused }))
            }
            Command::Resume {} => {
                vm.resume();
                self.invalidate();
                Ok(serde_json::json!({ "state": vm.state() }))
            }
            Command::Shutdown {} => {
                vm.shutdown();
                self.invalidate();
                Ok(serde_json::json!({ "state": VmState::Stopping }))
            }
            Command::Metrics {} => Ok(Value::String(self.metrics_text())),
            Command::SetLimit { group, limit } => {
                vm.limiter()
                    .set_limit(&group, &limit)
                    .map_err(|e| ErrorBody::new(ErrorKind::BadLimit, e.to_string()))?;
                self.invalidate();
                to_value(&vm.limiter().groups())
            }
            Command::SetPin { key, cpus } => {
                vm.set_pin(&format!("{key}={cpus}"))
                    .map_err(|e| ErrorBody::new(ErrorKind::BadPin, e.to_string()))?;
                to_value(&vm.threads())
            }
            Command::Groups {} => to_value(&vm.limiter().groups()),
            Command::Pressure {} => to_value(&vm.pressure().report()),
            Command::GuestReset {} => guest_reset(&vm),
            Command::Guest {} => match vm.ppa_page() {
                Some(p) => to_value(&crate::report::guest_view(p, vm.vcpus())),
                None => Err(ErrorBody::new(
                    ErrorKind::InvalidState,
                    "this VM has no PPA page (it was started with --ppa-page-size 0)",
                )),
            },
            // Answered by handle_line.
            Command::Stats {} | Command::Subscribe { .. } => Err(ErrorBody::new(
                ErrorKind::Internal,
                "this command is not handled here",
            )),
        }
    }

    fn histogram(
        &self,
        name: &str,
        vcpu: Option<usize>,
        format: HistogramFormat,
    ) -> Result<Value, ErrorBody> {
        if !HistSnapshots::is_name(name) {
            return Err(ErrorBody::new(
                ErrorKind::NoSuchHistogram,
                format!(
                    "there is no histogram `{name}` (there are: {}, kvm_exit_handling.REASON)",
                    HistSnapshots::names().join(", ")
                ),
            ));
        }
        let indices: Vec<usize> = match vcpu {
            Some(i) => {
                self.vm.times(i).map_err(no_such_vcpu)?;
                vec![i]
            }
            None => (0..self.vm.vcpu_count()).collect(),
        };
        let per_vcpu: Vec<(usize, HistogramSnapshot)> = indices
            .into_iter()
            .filter_map(|i| {
                let (_, h) = self.vm.times(i).ok()?;
                Some((i, h.get(name)?))
            })
            .collect();
        match format {
            HistogramFormat::Text => Ok(Value::String(kstats_text(name, &per_vcpu))),
            HistogramFormat::Json => {
                let bits = per_vcpu
                    .first()
                    .map_or(DEFAULT_FRAC_BITS, |(_, h)| h.frac_bits);
                let mut merged = HistogramSnapshot::empty(bits);
                per_vcpu.iter().for_each(|(_, h)| merged.merge(h));
                Ok(serde_json::json!({
                    "name": name,
                    "vcpu": vcpu,
                    "histogram": to_value(&merged.to_json())?,
                }))
            }
        }
    }
}

#[cfg(test)]
mod tests;
