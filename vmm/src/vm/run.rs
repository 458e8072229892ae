//! Running a VM to its end: the helper threads, the vCPU threads, the supervision loop, and
//! one guard that takes everything down on every path.
//!
//! Data flow: [`Vm::run`] starts the control socket, the limiter and the sampler, spawns one
//! `vcpu<N>` thread per vCPU behind a start gate, places the threads (cgroup backend), releases
//! them together, then waits on a channel for each to finish ([`supervise`]): on the first
//! failure, a guest's stop request, or when the maximum run time passes, it kicks the others
//! to stop. The [`Running`] guard owns every thread: whether the run ends normally or a step
//! fails, it stops and joins the vCPUs, then the sampler and the limiter, then the server. The
//! report is built from what the vCPUs published, the payload's part from its devices.

use std::sync::atomic::AtomicU32;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use super::{RunOutcome, Vm, VmError};
use crate::accounting::host::{host_steal_ns, process_cpu_ns};
use crate::api::ApiServer;
use crate::handle::VmHandle;
use crate::hypervisor::{self as hv, ExitEvent, Hypervisor};
use crate::limits::limiter::Limiter;
use crate::report::{realtime_ns, Report, RunRecord};
use crate::sampler::Sampler;
use crate::sync::{futex_wake, now_ns};
use crate::vcpu::{self, Requests, ThreadState, VcpuEnd, VcpuShared, VcpuThread};
use ppa_vmm_api::VcpuEndKind;

/// The vcpu-exit event of a vCPU whose thread has ended.
fn vcpu_exit_event(v: &VcpuShared, uptime_ns: u64) -> ppa_vmm_api::Event {
    let (end, exit_code) = v
        .end()
        .map_or((VcpuEndKind::Stopped, None), VcpuEnd::kind_and_code);
    ppa_vmm_api::Event::VcpuExit {
        uptime_ns,
        vcpu: v.id,
        end,
        exit_code,
    }
}

/// Every thread of a running VM; dropping it stops and joins them all, vCPUs first.
struct Running {
    shared: Vec<Arc<VcpuShared>>,
    gate: Arc<AtomicU32>,
    vcpus: Vec<JoinHandle<()>>,
    sampler: Option<Sampler>,
    limiter: Arc<Limiter>,
    limiter_thread: Option<JoinHandle<()>>,
    server: Option<ApiServer>,
    devices: Vec<Arc<dyn crate::devices::Device>>,
}

impl Running {
    fn stop_all(&self) {
        self.shared.iter().for_each(|s| s.kick(Requests::STOP));
    }

    /// Stops (if still running) and joins the vCPU threads, then the device threads, the
    /// sampler and the limiter.
    fn join_vcpus_and_helpers(&mut self) {
        if !self.vcpus.is_empty() {
            self.stop_all();
            futex_wake(&self.gate);
            for h in self.vcpus.drain(..) {
                let _ = h.join();
            }
        }
        for d in &self.devices {
            d.stop();
        }
        if let Some(s) = self.sampler.take() {
            s.stop();
        }
        self.limiter.stop();
        if let Some(t) = self.limiter_thread.take() {
            let _ = t.join();
        }
    }

    fn push(&self, event: ppa_vmm_api::Event) {
        if let Some(s) = &self.server {
            s.hub().push(event);
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.join_vcpus_and_helpers();
        if let Some(s) = self.server.take() {
            s.stop();
        }
    }
}

/// Waits for every vCPU to finish; stops the rest on the first failure or guest stop request,
/// or when `deadline` passes. Returns whether the deadline stopped the run.
fn supervise(
    run: &Running,
    done: &Receiver<usize>,
    deadline: Option<Instant>,
    handle: &VmHandle,
) -> bool {
    let n = run.shared.len();
    let mut timed_out = false;
    let mut stopping = false;
    let mut finished = 0;
    while finished < n {
        let got = match (deadline, timed_out) {
            (Some(d), false) => done.recv_timeout(d.saturating_duration_since(Instant::now())),
            _ => done.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match got {
            Ok(id) => {
                finished += 1;
                let v = &run.shared[id];
                run.push(vcpu_exit_event(v, handle.uptime_ns()));
                let stop_others = v
                    .end()
                    .is_some_and(|e| e.is_failure() || matches!(e, VcpuEnd::GuestStop));
                if stop_others && !stopping {
                    log::warn!("vCPU {id} ended the run: stopping the other vCPUs");
                    stopping = true;
                    run.stop_all();
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                log::warn!("maximum run time reached: stopping every vCPU");
                timed_out = true;
                run.stop_all();
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    timed_out
}

/// How and when a run ended, as the supervision saw it.
struct Ended {
    /// First spawn to last join.
    uptime_ns: u64,
    /// CLOCK_REALTIME when the vCPU threads were started, ns.
    start_realtime_ns: u64,
    /// CLOCK_REALTIME when the last vCPU thread was joined, ns.
    end_realtime_ns: u64,
    /// The host's steal counter at the start, when it has one.
    steal_at_start: Option<u64>,
    /// Whether --max-runtime stopped the run.
    timed_out: bool,
}

/// Waits (at most 5 s, in 100 µs steps) until every vCPU thread and every device thread has
/// its tid (each sets it first thing), so that it can be placed before the start gate opens.
fn wait_tids(vcpus: &[Arc<VcpuShared>], handle: &VmHandle) {
    let until = Instant::now() + std::time::Duration::from_secs(5);
    // The device threads too: one that had not yet stored its tid when the threads were
    // placed kept the process's CPUs (seen in CI, a loaded host: `net0-qp0` on `0-1` with
    // `--pin net0-qp0=0`).
    let devices_pending = || {
        handle
            .devices()
            .iter()
            .any(|d| d.threads().iter().any(|t| t.host_tid == 0))
    };
    while (vcpus.iter().any(|v| v.host_tid() == 0) || devices_pending()) && Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
}

/// Waits (at most 1 s, in 100 µs steps) until every vCPU thread has left its start gate.
fn wait_running(vcpus: &[Arc<VcpuShared>]) {
    let until = Instant::now() + std::time::Duration::from_secs(1);
    while vcpus.iter().any(|v| v.state() == ThreadState::Created) && Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
}

impl<H: Hypervisor> Vm<H>
where
    <H::Vm as hv::Vm>::Vcpu: 'static,
{
    /// The baseline of `bench overhead`: runs vCPU 0 on this thread in a bare run loop with no
    /// VMM logic (no bus, no accounting, no other vCPU) until the guest writes its exit
    /// doorbell at `exit_gpa`. Returns (exits, ns from the first run to the last return).
    pub fn run_raw(mut self, exit_gpa: u64) -> Result<(u64, u64), VmError> {
        use hv::Vcpu as _;
        let vcpu = &mut self.vcpus[0];
        let mut exits = 0u64;
        let t0 = now_ns();
        loop {
            match vcpu.run() {
                Ok(ExitEvent::MmioWrite { addr, .. }) if addr == exit_gpa => break,
                Ok(_) => exits += 1,
                Err(e) => {
                    return Err(VmError::Hypervisor(hv::HvError::Call {
                        step: "run the raw benchmark loop",
                        source: e.0,
                    }))
                }
            }
        }
        Ok((exits + 1, now_ns() - t0))
    }

    /// Runs every vCPU to its end and returns the final report.
    pub fn run(mut self) -> Result<RunOutcome, VmError> {
        let handle = self.handle();
        // The vCPU threads' stamp clock and CPU reader ask the host once (files in /sys and
        // /proc), before the filters forbid opening them.
        crate::stamp_clock::tsc_usable();
        crate::accounting::host::rdpid_usable();
        crate::seccomp::arm(self.seccomp);
        // The helpers started from here inherit the service threads' CPUs.
        let service = self
            .placement
            .cpus_for(&crate::placement::ThreadRole::Service);
        crate::placement::set_affinity(0, &service)
            .map_err(|e| VmError::Thread("main (its CPU set)", e))?;
        let mut run = self.start_helpers(&handle)?;
        let start = Instant::now();
        let start_realtime_ns = realtime_ns();
        let steal_at_start = host_steal_ns();
        let done_rx = self.spawn_vcpus(&mut run)?;
        wait_tids(&run.shared, &handle);
        handle.place_threads(true)?;
        let devices: Vec<i32> = handle
            .devices()
            .iter()
            .flat_map(|d| d.threads())
            .map(|t| t.host_tid)
            .collect();
        let service: Vec<i32> = self.placement.service().iter().map(|t| t.0).collect();
        self.limiter
            .place_threads(&devices, &service)
            .map_err(VmError::Cgroup)?;
        crate::seccomp::enter(crate::seccomp::Kind::Main);
        self.status.mark_started();
        futex_wake(&run.gate);
        if let Some(n) = &self.notifier {
            // The control socket was bound and served before the vCPUs started.
            wait_running(&run.shared);
            let _ = n.send(&format!(
                "READY=1\nSTATUS=running: {} vCPUs of VM {}\nMAINPID={}",
                run.shared.len(),
                handle.name(),
                std::process::id()
            ));
        }

        let timed_out = supervise(&run, &done_rx, self.max_runtime.map(|d| start + d), &handle);
        if let Some(n) = &self.notifier {
            let _ = n.send("STOPPING=1\nSTATUS=stopping: every vCPU has ended");
        }
        run.join_vcpus_and_helpers();
        self.status.mark_finished();
        let report = self.report(
            &run,
            &handle,
            Ended {
                uptime_ns: start.elapsed().as_nanos() as u64,
                start_realtime_ns,
                end_realtime_ns: realtime_ns(),
                steal_at_start,
                timed_out,
            },
        );
        let exit_code = report.exit_code();
        run.push(ppa_vmm_api::Event::VmExit {
            uptime_ns: report.vm.uptime_ns,
            end: report.vm.end,
        });
        drop(run);
        Ok(RunOutcome { report, exit_code })
    }

    /// Starts the control socket, the limiter, the sampler and the device threads, each owned
    /// by the returned guard (so a failure further on stops those already started).
    fn start_helpers(&mut self, handle: &VmHandle) -> Result<Running, VmError> {
        let mut run = Running {
            shared: std::mem::take(&mut self.shared),
            gate: Arc::new(AtomicU32::new(0)),
            vcpus: Vec::with_capacity(self.vcpus.len()),
            sampler: None,
            limiter: Arc::clone(&self.limiter),
            limiter_thread: None,
            server: None,
            devices: self.devices.clone(),
        };
        run.server = ApiServer::start(
            self.server_options.clone(),
            handle.clone(),
            Arc::clone(&self.hub),
        )?;
        if let Some(a) = run.server.as_ref().and_then(ApiServer::metrics_addr) {
            log::info!("serving metrics at http://{a}/metrics");
        }
        let l = Arc::clone(&self.limiter);
        let placement = Arc::clone(&self.placement);
        run.limiter_thread = Some(
            std::thread::Builder::new()
                .name("limiter".into())
                .spawn(move || {
                    placement.register_current("limiter");
                    l.run()
                })
                .map_err(|e| VmError::Thread("limiter", e))?,
        );
        run.sampler = Some(
            Sampler::start(
                handle.clone(),
                Arc::clone(&self.control),
                self.overload.enabled().then(|| crate::sampler::Overload {
                    config: self.overload.clone(),
                    vm: handle.clone(),
                    hub: Arc::clone(&self.hub),
                }),
                self.boot.needs_platform(),
                Arc::clone(&self.hub),
            )
            .map_err(|e| VmError::Thread("sampler", e))?,
        );
        for d in &run.devices {
            d.start(&self.control)
                .map_err(|e| VmError::Thread("device", e))?;
        }
        Ok(run)
    }

    /// Spawns one thread per vCPU, each waiting at the start gate; returns the channel on
    /// which each sends its index when it ends.
    fn spawn_vcpus(&mut self, run: &mut Running) -> Result<Receiver<usize>, VmError> {
        let (done_tx, done_rx) = channel();
        let warm_up = self.boot.warm_up();
        for (s, vcpu) in run.shared.clone().iter().zip(self.vcpus.drain(..)) {
            let name = self.status.vcpu_names().name(s.id);
            run.vcpus.push(vcpu::spawn_named(
                VcpuThread {
                    vcpu,
                    shared: Arc::clone(s),
                    buses: Arc::clone(&self.buses),
                    done: done_tx.clone(),
                    control: Arc::clone(&self.control),
                    start_gate: Arc::clone(&run.gate),
                    warm_up,
                },
                name,
            )?);
        }
        Ok(done_rx)
    }

    /// The final report, from everything the run published; called once every thread but the
    /// server's has been joined.
    fn report(&self, run: &Running, handle: &VmHandle, ended: Ended) -> Report {
        // Every vCPU thread has exited: the process CPU clock includes them, and each published
        // its own CPU time on its way out.
        let vcpu_cpu: u64 = run
            .shared
            .iter()
            .filter_map(|s| s.acct.finals.get().map(|f| f.cpu_ns))
            .sum();
        let host_threads_ns = process_cpu_ns().saturating_sub(vcpu_cpu);
        let devices: Vec<ppa_vmm_api::DeviceStats> =
            run.devices.iter().map(|d| d.stats()).collect();
        let device_cpu: u64 = devices.iter().map(|d| d.cpu_ns).sum();
        Report::build(RunRecord {
            info: &self.info,
            vcpus: &run.shared,
            vm_payload: self.boot.vm_report(),
            vcpu_payloads: (0..run.shared.len())
                .map(|i| self.boot.vcpu_report(i, &self.buses))
                .collect(),
            name: handle.name().to_string(),
            start_realtime_ns: ended.start_realtime_ns,
            end_realtime_ns: ended.end_realtime_ns,
            uptime_ns: ended.uptime_ns,
            timed_out: ended.timed_out,
            shutdown: handle.shutdown_requested(),
            signal: handle.stop_signal(),
            host_threads_ns,
            host_cpu_ns: ppa_vmm_api::HostCpuSplit {
                vcpus: vcpu_cpu,
                devices: device_cpu,
                service: host_threads_ns.saturating_sub(device_cpu),
                vcpu_stops: handle.vcpu_stops_ns(),
            },
            host_steal_ns: ended
                .steal_at_start
                .zip(host_steal_ns())
                .map(|(a, b)| b.saturating_sub(a)),
            level: self.control.level(),
            pressure: Some(handle.pressure().report()),
            groups: self.limiter.groups(),
            devices,
            guest: self
                .ppa_page
                .as_ref()
                .map(|p| crate::report::guest_view(p, &run.shared)),
        })
    }
}
