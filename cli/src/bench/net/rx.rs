//! The receive half of `bench net`: how fast the device drains frames waiting at its tap into
//! the guest, against a host loop reading the same frames from the same tap.
//!
//! Data flow: both runs first put `packets` frames in the tap's queue (its txqueuelen raised to
//! hold them, a packet socket sending them into it) while nothing reads it, so the sender is
//! not what is measured. The device's run starts the tiny guest's `net-rx` with `wait_ms`: the
//! device is started but no receive buffer is posted until the frames are all there; then the
//! guest posts its buffers and the device drains the tap into them (read straight into guest
//! memory), polled through the VM's handle for the first and the last frame delivered. Its
//! CPU per frame is the device's own mean (`cpu_ns_per_packet.rx`). The host loop opens the
//! tap's queue itself, fills it the same way, and reads the frames back one `read` each: its
//! frames per second and its thread's CPU per frame are the floor the device is compared
//! with.

use std::time::{Duration, Instant};

use ppa_vmm::devices::net::tap::{self, Tap, VNET_HDR_LEN};

use super::packet::{test_frame, PacketSocket};
use super::{quiet, vm, Layout, NetBenchError, TAP};
use ppa_vmm::config::RunOptions;

/// How long the guest waits with no buffer posted while the frames are sent (the sender
/// takes ~1.5 µs a frame here; 200,000 frames need ~0.3 s).
const WAIT_MS: u64 = 3000;

/// How often the device's run polls for its first and last frame delivered.
const POLL: Duration = Duration::from_millis(2);

/// Raises the tap's queue so that `packets` frames wait there, and sends them.
fn fill(packets: u64) -> Result<u64, NetBenchError> {
    tap::set_txqueuelen(TAP, (packets + 1024).min(u64::from(u32::MAX)) as u32)
        .map_err(|e| NetBenchError::Setup("raise the tap's queue", e))?;
    let s = PacketSocket::open(TAP, 1000)
        .map_err(|e| NetBenchError::Setup("open a packet socket", e))?;
    let f = test_frame([0xff; 6], [2, 0, 0, 0, 0, 9], 64, 0);
    let mut sent = 0;
    for _ in 0..packets {
        if s.send(&f) {
            sent += 1;
        }
    }
    Ok(sent)
}

/// One device run: (frames per second, the device's CPU per frame, frames delivered).
pub fn device_run(packets: u64, layout: Option<Layout>) -> Result<(f64, u64, u64), NetBenchError> {
    let vm = vm(RunOptions {
        vcpus: Some(1),
        pin: super::pins(layout, true),
        net: vec![format!("tap={TAP}")],
        workload: vec![format!(
            "net-rx:packets={packets},ms=60000,wait_ms={WAIT_MS}"
        )],
        ..Default::default()
    })?;
    let handle = vm.handle();
    let runner = std::thread::spawn(move || vm.run());
    let delivered = |h: &ppa_vmm::handle::VmHandle| -> u64 {
        h.device_stats().first().map_or(0, |d| {
            d.queues
                .iter()
                .filter(|q| q.kind == ppa_vmm_api::QueueKind::Rx)
                .map(|q| q.packets)
                .sum()
        })
    };
    let started = (0..5000).any(|_| {
        std::thread::sleep(Duration::from_millis(2));
        handle
            .device_stats()
            .first()
            .is_some_and(|d| d.driver.activations > 0)
    });
    let result = if started {
        let t_fill = Instant::now();
        let sent = fill(packets)?;
        if t_fill.elapsed() >= Duration::from_millis(WAIT_MS) {
            return Err(NetBenchError::Slow(
                "the frames took longer to send than the guest waits",
            ));
        }
        // The first and the last frame delivered, polled every 2 ms: each poll builds the
        // device's figures, and on a 2-CPU host polls every 200 µs took CPU the device thread
        // needed (the loop has no poller). Each end is late by at most a poll, so the window
        // (~400 ms for 200,000 frames here) is off by at most ±2 ms, 0.5 %.
        // The poller keeps off the data path's CPU.
        let _pinned = quiet::Pinned::to(layout.map(|l| l.rest));
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut first = None;
        let mut last = None;
        while Instant::now() < deadline {
            let n = delivered(&handle);
            if n > 0 && first.is_none() {
                first = Some(Instant::now());
            }
            if n >= sent {
                last = Some(Instant::now());
                break;
            }
            std::thread::sleep(POLL);
        }
        Ok((sent, first, last))
    } else {
        Err(NetBenchError::NoDriver)
    };
    handle.shutdown();
    let out = runner.join().map_err(|_| NetBenchError::NoDriver)??;
    let (sent, first, last) = result?;
    let dev = out.report.devices.first().ok_or(NetBenchError::NoDriver)?;
    let got: u64 = dev
        .queues
        .iter()
        .filter(|q| q.kind == ppa_vmm_api::QueueKind::Rx)
        .map(|q| q.packets)
        .sum();
    let secs = match (first, last) {
        (Some(a), Some(b)) => (b - a).as_secs_f64().max(1e-6),
        _ => {
            return Err(NetBenchError::Slow(
                "the device did not deliver every frame in 60 s",
            ))
        }
    };
    let per = dev.cpu_ns_per_packet.and_then(|p| p.rx).unwrap_or(0);
    Ok((sent.min(got) as f64 / secs, per, got))
}

/// One host loop: fills the tap, then reads the frames back on the data path's CPU: (frames
/// per second, CPU per frame, frames read).
pub fn raw_run(packets: u64, layout: Option<Layout>) -> Result<(f64, u64, u64), NetBenchError> {
    let t = Tap::open(TAP, 1)?.remove(0);
    let sent = fill(packets)?;
    let _pinned = quiet::Pinned::to(layout.map(|l| l.measured));
    let mut buf = vec![0u8; 65_536 + VNET_HDR_LEN];
    let cpu0 = ppa_vmm::accounting::host::thread_cpu_ns();
    let t0 = Instant::now();
    let mut got = 0u64;
    while got < sent {
        match t.read(&mut buf) {
            Ok(_) => got += 1,
            Err(_) => break,
        }
    }
    let ns = t0.elapsed().as_nanos().max(1) as f64;
    let cpu = ppa_vmm::accounting::host::thread_cpu_ns() - cpu0;
    Ok((got as f64 * 1e9 / ns, cpu / got.max(1), got))
}
