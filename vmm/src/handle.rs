//! [`VmHandle`]: what other threads (the control socket, the sampler, benches) hold of a
//! running VM, and [`VmStatus`], the VM-wide state it shares with the run loop. Every call
//! reads the vCPUs' published state or sets a request bit; none takes a lock a vCPU thread
//! waits on.
//!
//! This module depends on the vCPUs' shared state, the accounting, the limiter and the PPA page,
//! and on nothing that serves or runs a VM, so the control socket and the sampler use it
//! without depending on `vm`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use ppa_vmm_api::{VmState, VmStats};
use thiserror::Error;

use crate::accounting::host::process_cpu_ns;
use crate::accounting::snapshot::{HistSnapshots, VcpuTimes};
use crate::accounting::{AccountingControl, Level, Thresholds};
use crate::limits::limiter::Limiter;
use crate::ppa_page::PpaPage;
use crate::pressure::PressureBoard;
use crate::sync::now_ns;
use crate::vcpu::{Requests, VcpuShared};

/// Why a request on a handle was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum HandleError {
    /// A request named a vCPU the VM does not have.
    #[error("the VM has no vCPU {index} (it has {count})")]
    NoSuchVcpu {
        /// Index asked for.
        index: usize,
        /// vCPUs of the VM.
        count: usize,
    },
}

/// VM-wide state that the run loop and every [`VmHandle`] share.
#[derive(Debug)]
pub struct VmStatus {
    name: String,
    /// CLOCK_MONOTONIC when the vCPUs were released (0 before).
    start_ns: AtomicU64,
    shutdown: AtomicBool,
    /// The stop signal (`SIGTERM`, `SIGINT`, `SIGHUP`) that asked for the shutdown, if one did.
    stop_signal: OnceLock<&'static str>,
    finished: AtomicBool,
    /// CPU pressure of the VM and its groups, posted by the sampler.
    pressure: PressureBoard,
    /// How its vCPU threads are named.
    vcpu_names: crate::vcpu::VcpuNames,
}

impl VmStatus {
    /// A VM called `name` that has not started.
    pub fn new(name: String) -> Self {
        VmStatus {
            name,
            start_ns: AtomicU64::new(0),
            shutdown: AtomicBool::new(false),
            stop_signal: OnceLock::new(),
            finished: AtomicBool::new(false),
            pressure: PressureBoard::default(),
            vcpu_names: crate::vcpu::VcpuNames::Ppa,
        }
    }

    /// How the vCPU threads are named.
    pub fn vcpu_names(&self) -> crate::vcpu::VcpuNames {
        self.vcpu_names
    }

    /// The same status with the vCPU threads named as `names` says.
    pub fn with_vcpu_names(mut self, names: crate::vcpu::VcpuNames) -> Self {
        self.vcpu_names = names;
        self
    }

    /// Marks the start (the moment the vCPUs are released).
    pub fn mark_started(&self) {
        self.start_ns.store(now_ns(), Ordering::Release);
    }

    /// Marks the end (every vCPU thread has ended).
    pub fn mark_finished(&self) {
        self.finished.store(true, Ordering::Release);
    }
}

/// A handle on a VM's accounting, usable from other threads while it runs (the control socket
/// uses it). Every call is a reader: none takes a lock a vCPU thread waits on.
#[derive(Clone)]
pub struct VmHandle {
    control: Arc<AccountingControl>,
    vcpus: Arc<[Arc<VcpuShared>]>,
    status: Arc<VmStatus>,
    limiter: Arc<Limiter>,
    ppa_page: Option<Arc<PpaPage>>,
    devices: Arc<[Arc<dyn crate::devices::Device>]>,
}

impl VmHandle {
    /// A handle over given parts (a VM's own handle comes from `Vm::handle`; tests build
    /// handles over synthetic vCPUs with this).
    pub fn new(
        control: Arc<AccountingControl>,
        vcpus: Vec<Arc<VcpuShared>>,
        status: Arc<VmStatus>,
        limiter: Arc<Limiter>,
        ppa_page: Option<Arc<PpaPage>>,
    ) -> Self {
        VmHandle {
            control,
            vcpus: vcpus.into(),
            status,
            limiter,
            ppa_page,
            devices: Arc::new([]),
        }
    }

    /// The same handle with the VM's devices (those with threads of their own).
    pub fn with_devices(mut self, devices: Vec<Arc<dyn crate::devices::Device>>) -> Self {
        self.devices = devices.into();
        self
    }

    /// The VM's devices.
    pub fn devices(&self) -> &[Arc<dyn crate::devices::Device>] {
        &self.devices
    }

    /// Every device's figures now.
    pub fn device_stats(&self) -> Vec<ppa_vmm_api::DeviceStats> {
        self.devices.iter().map(|d| d.stats()).collect()
    }

    /// The PPA page, when the VM has one.
    pub fn ppa_page(&self) -> Option<&PpaPage> {
        self.ppa_page.as_deref()
    }

    /// The CPU limits.
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// The VM's CPU pressure (the sampler posts it every 8 ms).
    pub fn pressure(&self) -> &PressureBoard {
        &self.status.pressure
    }

    /// The VM's name.
    pub fn name(&self) -> &str {
        &self.status.name
    }

    /// The name of vCPU `id`'s thread (`vcpu0`, or Firecracker's `fc_vcpu 0`).
    pub fn vcpu_thread_name(&self, id: usize) -> String {
        self.status.vcpu_names().name(id)
    }

    /// Time since the vCPUs were released (0 before).
    pub fn uptime_ns(&self) -> u64 {
        match self.status.start_ns.load(Ordering::Acquire) {
            0 => 0,
            t => now_ns().saturating_sub(t),
        }
    }

    /// Created, running, paused, stopping or finished.
    pub fn state(&self) -> VmState {
        if self.status.finished.load(Ordering::Acquire) {
            VmState::Finished
        } else if self.status.shutdown.load(Ordering::Acquire) {
            VmState::Stopping
        } else if self.status.start_ns.load(Ordering::Acquire) == 0 {
            VmState::Created
        } else if self.paused() {
            VmState::Paused
        } else {
            VmState::Running
        }
    }

    /// Whether every vCPU thread has ended.
    pub fn finished(&self) -> bool {
        self.status.finished.load(Ordering::Acquire)
    }

    /// Stops every vCPU at its next exit (a paused vCPU too); the run then ends as
    /// `shutdown` and writes its final report.
    pub fn shutdown(&self) {
        self.status.shutdown.store(true, Ordering::Release);
        self.vcpus.iter().for_each(|v| v.kick(Requests::STOP));
    }

    /// [`VmHandle::shutdown`] on a stop signal, named in the final report (the first one
    /// named stays).
    pub fn shutdown_by_signal(&self, name: &'static str) {
        let _ = self.status.stop_signal.set(name);
        self.shutdown();
    }

    /// The stop signal that asked for the shutdown, when one did.
    pub fn stop_signal(&self) -> Option<&'static str> {
        self.status.stop_signal.get().copied()
    }

    /// Whether a shutdown was asked for.
    pub fn shutdown_requested(&self) -> bool {
        self.status.shutdown.load(Ordering::Acquire)
    }

    /// The VM's own figures (the `vm` object of `stats` and of the metrics), now.
    pub fn vm_stats(&self) -> VmStats {
        VmStats {
            name: self.name().to_string(),
            pid: std::process::id(),
            state: self.state(),
            vcpus: self.vcpu_count(),
            uptime_ns: self.uptime_ns(),
            level: self.level(),
            thresholds: self.thresholds(),
            host_threads_ns: self.host_threads_ns(),
            host_cpu_ns: self.host_cpu_ns(),
            pressure: self.pressure().vm().pressure(),
        }
    }

    /// The process's CPU now: the vCPU threads, the device threads, the rest.
    pub fn host_cpu_ns(&self) -> ppa_vmm_api::HostCpuSplit {
        let vcpus: u64 = self
            .vcpus
            .iter()
            .filter_map(|v| v.acct.thread_cpu_ns())
            .sum();
        let devices: u64 = self.devices.iter().map(|d| d.cpu_ns()).sum();
        ppa_vmm_api::HostCpuSplit {
            vcpus,
            devices,
            service: process_cpu_ns().saturating_sub(vcpus + devices),
        }
    }

    /// CPU time of every thread of the process that is not a vCPU thread (the main thread,
    /// the sampler, the control socket), now.
    pub fn host_threads_ns(&self) -> u64 {
        let vcpu: u64 = self
            .vcpus
            .iter()
            .filter_map(|v| v.acct.thread_cpu_ns())
            .sum();
        process_cpu_ns().saturating_sub(vcpu)
    }

    /// Number of vCPUs.
    pub fn vcpu_count(&self) -> usize {
        self.vcpus.len()
    }

    /// The accounting level.
    pub fn level(&self) -> Level {
        self.control.level()
    }

    /// Switches the accounting level; each vCPU applies it at its next exit.
    pub fn set_level(&self, level: Level) {
        self.control.set_level(level);
    }

    /// The thresholds.
    pub fn thresholds(&self) -> Thresholds {
        self.control.thresholds()
    }

    /// Replaces the thresholds.
    pub fn set_thresholds(&self, t: Thresholds) {
        self.control.set_thresholds(t);
    }

    fn vcpu(&self, index: usize) -> Result<&Arc<VcpuShared>, HandleError> {
        self.vcpus.get(index).ok_or(HandleError::NoSuchVcpu {
            index,
            count: self.vcpus.len(),
        })
    }

    /// Restarts the figures of one vCPU, or of all (and of every device), from zero.
    pub fn reset(&self, vcpu: Option<usize>) -> Result<(), HandleError> {
        match vcpu {
            Some(i) => self.vcpu(i)?.acct.reset(),
            None => {
                self.vcpus.iter().for_each(|v| v.acct.reset());
                self.devices.iter().for_each(|d| d.reset());
            }
        }
        Ok(())
    }

    /// The section 4 fields of one vCPU now, with its histograms.
    pub fn times(&self, vcpu: usize) -> Result<(VcpuTimes, HistSnapshots), HandleError> {
        Ok(self.vcpu(vcpu)?.times())
    }

    /// Parks every vCPU at its next exit (a running vCPU is kicked out of KVM_RUN) until
    /// [`VmHandle::resume`]; the parked time is each vCPU's paused_ns.
    pub fn pause(&self) {
        self.vcpus.iter().for_each(|v| v.kick(Requests::PAUSE));
    }

    /// Releases every paused vCPU.
    pub fn resume(&self) {
        self.vcpus.iter().for_each(|v| v.resume());
    }

    /// Whether a pause is in force.
    pub fn paused(&self) -> bool {
        self.vcpus.iter().any(|v| v.pause_requested())
    }

    /// The shared state of every vCPU.
    pub fn vcpus(&self) -> &[Arc<VcpuShared>] {
        &self.vcpus
    }
}
