//! Firecracker's endpoints with Firecracker's semantics: a request in, a response out, the
//! instance's life (`Not started` → `Running` ⇄ `Paused`) kept here.
//!
//! Data flow: the server hands each whole [`Request`] to [`Api::handle`]: the path and method
//! pick the endpoint; the body is read into its [`super::model`] type (unknown fields, a bad
//! value: 400 with serde's sentence, as Firecracker answers), then the endpoint is checked
//! against the instance's life (a pre-boot resource after `InstanceStart`, or a post-boot
//! action before it: 400 with Firecracker's sentence) and applied to the [`Resources`]
//! (before the start) or to the running VM's `VmHandle` (pause, resume, the end asked by
//! `SendCtrlAltDel`). `InstanceStart` gives the resources, translated into our run options, to
//! the [`Starter`], which builds and starts the VM on the main thread and answers once the
//! vCPUs run. Each request is counted in the shared [`MetricsState`].

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ppa_vmm::config::RunOptions;
use ppa_vmm::handle::VmHandle;
use ppa_vmm_api::{VcpuMicroState, VmState};
use serde::de::DeserializeOwned;
use thiserror::Error;

use super::http::{Method, Request, Response};
use super::metrics::{MetricsError, MetricsState};
use super::model::{
    ActionType, BootSource, Drive, InstanceActionInfo, InstanceInfo, Logger, MachineConfig,
    MachineConfigUpdate, Metrics, NetworkInterface, PartialDrive, PartialNetworkInterface,
    RateLimiter, VmPatch, VmStateChange,
};
use super::resources::{rate_buckets, unsupported_why, ResourceError, Resources};

/// The version `GET /version` and `GET /` report.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "-ppa-vmm");

/// Why a request was refused: each message is the `fault_message` (Firecracker's wording
/// where Firecracker has one).
#[derive(Debug, Error)]
pub enum RequestError {
    /// No endpoint at this method and path.
    #[error("Invalid request method and/or path: {0} {1}.")]
    PathMethod(&'static str, String),
    /// A body that is not the endpoint's JSON.
    #[error("An error occurred when deserializing the json body of a request: {0}.")]
    Body(serde_json::Error),
    /// A PUT or PATCH without a body.
    #[error("Empty {0} request.")]
    Empty(&'static str),
    /// A GET with a body.
    #[error("GET request cannot have a body.")]
    GetBody,
    /// An empty id in the path.
    #[error("The ID cannot be empty.")]
    EmptyId,
    /// An id with other characters.
    #[error("API Resource IDs can only contain alphanumeric characters and underscores.")]
    InvalidId,
    /// The path's id is not the body's.
    #[error("The id from the path [{0}] does not match the id from the body [{1}]!")]
    IdMismatch(String, String),
    /// A pre-boot resource after the start.
    #[error("The requested operation is not supported after starting the microVM.")]
    PostBoot,
    /// A post-boot action before the start.
    #[error("The requested operation is not supported before starting the microVM.")]
    PreBoot,
    /// A resource refused.
    #[error(transparent)]
    Resource(#[from] ResourceError),
    /// The metrics file.
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    /// The logger.
    #[error(transparent)]
    Logger(#[from] super::logger::LoggerError),
    /// The start failed.
    #[error("Start microvm error: {0}")]
    Start(String),
    /// An interface `PATCH` names none of the VM's.
    #[error("Network interface error: the VM has no network interface {0}.")]
    NoSuchNet(String),
    /// An endpoint of a Firecracker feature PPA-VMM does not have.
    #[error("{0} /{1} is not supported: {why}.", why = unsupported_why(.1))]
    Unsupported(&'static str, String),
}

/// The first 64 characters of an id, for messages.
fn cut(id: &str) -> String {
    id.chars().take(64).collect()
}

/// A limiter as Firecracker's `PATCH` leaves it: `patch` absent keeps `have`; each bucket
/// `patch` leaves out keeps `have`'s (one of size or refill time 0 limits nothing).
fn patch_limiter(have: Option<&RateLimiter>, patch: Option<RateLimiter>) -> Option<RateLimiter> {
    let Some(p) = patch else {
        return have.cloned();
    };
    Some(RateLimiter {
        bandwidth: p
            .bandwidth
            .or_else(|| have.and_then(|h| h.bandwidth.clone())),
        ops: p.ops.or_else(|| have.and_then(|h| h.ops.clone())),
    })
}

/// Gives device `id` of `vm` the buckets `rate` (`rate=` parts; none: no limit), live
/// (`set-rate`, docs/limits.md).
fn set_rate(vm: &VmHandle, id: &str, rate: &[String]) -> Result<(), RequestError> {
    let value = if rate.is_empty() {
        ppa_vmm::devices::rate::NONE.to_string()
    } else {
        rate.join("+")
    };
    let refuse = |why: String| ResourceError::RateUpdate { id: cut(id), why };
    let d = vm
        .devices()
        .iter()
        .find(|d| d.id() == id)
        .ok_or_else(|| refuse("the VM has no such device".into()))?;
    d.set_rate(&value)
        .map(|_| ())
        .map_err(|e| refuse(ppa_vmm_api::describe(&e)).into())
}

/// Builds and starts the VM (the main thread, in the binary).
pub trait Starter {
    /// Builds the VM of `options` and returns its handle once its vCPUs run, or why not.
    fn start(&mut self, options: RunOptions) -> Result<VmHandle, String>;
}

/// The API's state: the resources before the start, the VM after it.
pub struct Api<S: Starter> {
    id: String,
    /// The resources as configured.
    pub resources: Resources,
    base: RunOptions,
    starter: S,
    vm: Option<VmHandle>,
    metrics: Arc<Mutex<MetricsState>>,
}

/// Firecracker's resource ids: letters, digits and `_`.
fn checked_id(id: Option<&str>) -> Result<&str, RequestError> {
    match id {
        None | Some("") => Err(RequestError::EmptyId),
        Some(id) if id.chars().all(|c| c == '_' || c.is_alphanumeric()) => Ok(id),
        Some(_) => Err(RequestError::InvalidId),
    }
}

/// The body as `T`.
fn body<T: DeserializeOwned>(req: &Request) -> Result<T, RequestError> {
    if req.body.is_empty() {
        return Err(RequestError::Empty(req.method.as_str()));
    }
    serde_json::from_slice(&req.body).map_err(RequestError::Body)
}

/// Firecracker's metrics name of the resource at `first` (the `machine_cfg` of
/// `put_api_requests.machine_cfg_count`), if it counts one.
fn metric_name(first: &str) -> Option<&'static str> {
    Some(match first {
        "" => "instance_info",
        "version" => "vmm_version",
        "machine-config" => "machine_cfg",
        "boot-source" => "boot_source",
        "drives" => "drive",
        "network-interfaces" => "network",
        "actions" => "actions",
        "logger" => "logger",
        "metrics" => "metrics",
        "vsock" => "vsock",
        _ => return None,
    })
}

impl<S: Starter> Api<S> {
    /// The API of instance `id`, whose VM's options start from `base`.
    pub fn new(
        id: String,
        resources: Resources,
        base: RunOptions,
        starter: S,
        metrics: Arc<Mutex<MetricsState>>,
    ) -> Self {
        Api {
            id,
            resources,
            base,
            starter,
            vm: None,
            metrics,
        }
    }

    /// The running VM, once started.
    pub fn vm(&self) -> Option<&VmHandle> {
        self.vm.as_ref()
    }

    /// The VM started outside the API (`--config-file`).
    pub fn set_started(&mut self, vm: VmHandle) {
        self.vm = Some(vm);
    }

    /// Answers one request, and counts it.
    pub fn handle(&mut self, req: &Request) -> Response {
        let result = self.route(req);
        let first = req.path.trim_start_matches('/').split('/').next();
        if let Some(name) = first.and_then(metric_name) {
            let group = match req.method {
                Method::Get => "get_api_requests",
                Method::Put => "put_api_requests",
                Method::Patch => "patch_api_requests",
            };
            let mut m = self.metrics.lock().unwrap_or_else(|e| e.into_inner());
            m.count(group, name, result.is_err());
        }
        match result {
            Ok(r) => r,
            Err(e) => {
                log::info!("{} {}: {e}", req.method.as_str(), req.path);
                Response::fault(e.to_string())
            }
        }
    }

    /// Refuses a pre-boot resource once the VM has started.
    fn pre_boot(&self) -> Result<(), RequestError> {
        match self.vm {
            Some(_) => Err(RequestError::PostBoot),
            None => Ok(()),
        }
    }

    /// The running VM, or the refusal of a post-boot action before the start.
    fn post_boot(&self) -> Result<&VmHandle, RequestError> {
        self.vm.as_ref().ok_or(RequestError::PreBoot)
    }

    fn route(&mut self, req: &Request) -> Result<Response, RequestError> {
        let mut parts = req.path.trim_start_matches('/').split_terminator('/');
        let first = parts.next().unwrap_or("");
        let second = parts.next();
        if parts.next().is_some() {
            return Err(RequestError::PathMethod(
                req.method.as_str(),
                req.path.clone(),
            ));
        }
        if req.method == Method::Get && !req.body.is_empty() {
            return Err(RequestError::GetBody);
        }
        match (req.method, first, second) {
            (Method::Get, "", None) => Ok(Response::ok(&self.instance_info())),
            (Method::Get, "version", None) => Ok(Response::ok(
                &serde_json::json!({ "firecracker_version": VERSION }),
            )),
            (Method::Get, "machine-config", None) => Ok(Response::ok(&self.resources.machine)),
            (Method::Get, "vm", Some("config")) => Ok(Response::ok(&self.resources.full_config())),
            (Method::Put, "machine-config", None) => {
                let m: MachineConfig = body(req)?;
                self.pre_boot()?;
                self.resources.put_machine(m)?;
                Ok(Response::no_content())
            }
            (Method::Patch, "machine-config", None) => {
                let u: MachineConfigUpdate = body(req)?;
                if u == MachineConfigUpdate::default() {
                    return Err(RequestError::Empty("PATCH"));
                }
                self.pre_boot()?;
                self.resources.patch_machine(u)?;
                Ok(Response::no_content())
            }
            (Method::Put, "boot-source", None) => {
                let b: BootSource = body(req)?;
                self.pre_boot()?;
                self.resources.put_boot(b)?;
                Ok(Response::no_content())
            }
            (Method::Put | Method::Patch, "drives" | "network-interfaces", id) => {
                let id = checked_id(id)?.to_string();
                self.device(req, first, &id)
            }
            (Method::Put, "actions", None) => {
                let a: InstanceActionInfo = body(req)?;
                self.action(a.action_type)
            }
            (Method::Patch, "vm", None) => {
                let p: VmPatch = body(req)?;
                let vm = self.post_boot()?;
                match p.state {
                    VmStateChange::Paused => pause(vm),
                    VmStateChange::Resumed => vm.resume(),
                }
                Ok(Response::no_content())
            }
            (Method::Put, "logger", None) => {
                let l: Logger = body(req)?;
                self.pre_boot()?;
                super::logger::configure(&l)?;
                self.resources.logger = Some(l);
                Ok(Response::no_content())
            }
            (Method::Put, "metrics", None) => {
                let m: Metrics = body(req)?;
                self.pre_boot()?;
                let mut state = self.metrics.lock().unwrap_or_else(|e| e.into_inner());
                state.configure(&m, &self.id)?;
                self.resources.metrics = Some(m);
                Ok(Response::no_content())
            }
            (
                method,
                what @ ("vsock" | "balloon" | "mmds" | "snapshot" | "cpu-config" | "entropy"
                | "serial" | "pmem" | "hotplug"),
                _,
            ) => Err(RequestError::Unsupported(method.as_str(), what.to_string())),
            (method, _, _) => Err(RequestError::PathMethod(method.as_str(), req.path.clone())),
        }
    }

    /// `PUT`/`PATCH` of a drive or a network interface `id`.
    fn device(&mut self, req: &Request, kind: &str, id: &str) -> Result<Response, RequestError> {
        let mismatch = |body_id: &str| {
            (body_id != id).then(|| RequestError::IdMismatch(id.into(), body_id.into()))
        };
        match (req.method, kind) {
            (Method::Put, "drives") => {
                let d: Drive = body(req)?;
                mismatch(&d.drive_id).map_or(Ok(()), Err)?;
                self.pre_boot()?;
                self.resources.put_drive(d)?;
            }
            (Method::Patch, "drives") => {
                let d: PartialDrive = body(req)?;
                mismatch(&d.drive_id).map_or(Ok(()), Err)?;
                let vm = self.post_boot()?.clone();
                let Some(have) = self
                    .resources
                    .drives
                    .iter_mut()
                    .find(|x| x.drive_id == d.drive_id)
                else {
                    return Err(ResourceError::NoSuchDrive(cut(&d.drive_id)).into());
                };
                if d.path_on_host
                    .as_ref()
                    .is_some_and(|p| Some(p) != have.path_on_host.as_ref())
                {
                    return Err(ResourceError::DriveSwap(cut(&d.drive_id)).into());
                }
                // Firecracker's update: a bucket left out keeps the one in force.
                let patched = Drive {
                    rate_limiter: patch_limiter(have.rate_limiter.as_ref(), d.rate_limiter),
                    ..have.clone()
                };
                let rate = rate_buckets(patched.rate_limiter.as_ref(), "", "ops");
                // The device checks the value itself (`set-rate`); the drive's file is not
                // opened again (a writable open from this thread is outside its seccomp filter).
                if rate != rate_buckets(have.rate_limiter.as_ref(), "", "ops") {
                    set_rate(&vm, &d.drive_id, &rate)?;
                }
                *have = patched;
            }
            (Method::Put, _) => {
                let n: NetworkInterface = body(req)?;
                mismatch(&n.iface_id).map_or(Ok(()), Err)?;
                self.pre_boot()?;
                self.resources.put_net(n)?;
            }
            _ => {
                let n: PartialNetworkInterface = body(req)?;
                mismatch(&n.iface_id).map_or(Ok(()), Err)?;
                let vm = self.post_boot()?.clone();
                let Some(have) = self
                    .resources
                    .nets
                    .iter_mut()
                    .find(|x| x.iface_id == n.iface_id)
                else {
                    return Err(RequestError::NoSuchNet(n.iface_id));
                };
                // Checked as a PUT of the same interface with these limiters would be, and
                // applied as Firecracker's update: a limiter or a bucket left out keeps the one
                // in force; the device's buckets are replaced, full, when they change.
                let patched = NetworkInterface {
                    rx_rate_limiter: patch_limiter(
                        have.rx_rate_limiter.as_ref(),
                        n.rx_rate_limiter,
                    ),
                    tx_rate_limiter: patch_limiter(
                        have.tx_rate_limiter.as_ref(),
                        n.tx_rate_limiter,
                    ),
                    ..have.clone()
                };
                let (now, asked) = (
                    super::resources::net_spec(have)?,
                    super::resources::net_spec(&patched)?,
                );
                if now != asked {
                    let mut rate = rate_buckets(patched.rx_rate_limiter.as_ref(), "rx-", "packets");
                    rate.extend(rate_buckets(
                        patched.tx_rate_limiter.as_ref(),
                        "tx-",
                        "packets",
                    ));
                    set_rate(&vm, &n.iface_id, &rate)?;
                }
                *have = patched;
            }
        }
        Ok(Response::no_content())
    }

    /// `PUT /actions`.
    fn action(&mut self, a: ActionType) -> Result<Response, RequestError> {
        match a {
            ActionType::InstanceStart => {
                self.pre_boot()?;
                let options = self.resources.to_run_options(self.base.clone())?;
                let vm = self.starter.start(options).map_err(RequestError::Start)?;
                self.vm = Some(vm);
            }
            ActionType::SendCtrlAltDel => self.post_boot()?.shutdown(),
            ActionType::FlushMetrics => {
                let vm = self.post_boot()?.clone();
                let mut m = self.metrics.lock().unwrap_or_else(|e| e.into_inner());
                m.flush(Some(&vm))?;
            }
        }
        Ok(Response::no_content())
    }

    /// What `GET /` answers.
    pub fn instance_info(&self) -> InstanceInfo {
        let state = match self.vm.as_ref().map(VmHandle::state) {
            None => "Not started",
            Some(VmState::Paused) => "Paused",
            Some(_) => "Running",
        };
        InstanceInfo {
            app_name: "Firecracker".into(),
            id: self.id.clone(),
            state: state.into(),
            vmm_version: VERSION.into(),
        }
    }
}

/// Pauses the VM and waits (at most 1 s) until every vCPU that has not ended is parked, so
/// that a `GET` right after the answer sees it paused, as Firecracker's pause is synchronous.
fn pause(vm: &VmHandle) {
    vm.pause();
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        let all = vm.vcpus().iter().all(|v| {
            matches!(
                v.summary().state,
                VcpuMicroState::Paused | VcpuMicroState::Finished
            )
        });
        if all {
            return;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}
