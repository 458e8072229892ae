//! Layout (golden numbers) and the sequence protocol under two threads.

extern crate std;

use super::*;
use core::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::vec::Vec;

#[test]
fn the_vm_record_is_found_only_where_a_13_header_puts_it() {
    let h = RegionHeader {
        magic: REGION_MAGIC,
        major: 1,
        minor: 3,
        total_size: 65536,
        header_size: 64,
        host_offset: 64,
        host_count: 2,
        host_record_size: 128,
        guest_offset: 448,
        guest_size: 65536 - 448,
        host_refresh_ns: 10_000_000,
        vm_offset: 320,
        vm_size: 128,
        reserved: [0; 2],
    };
    assert_eq!(h.vm_record(), Some((320, 128)));
    // A 1.2 writer's header: zero words, or a minor below 3, means none.
    assert_eq!(
        RegionHeader {
            vm_offset: 0,
            vm_size: 0,
            ..h
        }
        .vm_record(),
        None
    );
    assert_eq!(RegionHeader { minor: 2, ..h }.vm_record(), None);
    // Misplaced: into the guest section, unaligned, too small, past the end, overflowing.
    assert_eq!(
        RegionHeader {
            vm_offset: 400,
            ..h
        }
        .vm_record(),
        None
    );
    assert_eq!(
        RegionHeader {
            vm_offset: 324,
            vm_size: 124,
            ..h
        }
        .vm_record(),
        None
    );
    assert_eq!(RegionHeader { vm_size: 64, ..h }.vm_record(), None);
    assert_eq!(
        RegionHeader {
            guest_offset: 70000,
            vm_offset: 65500,
            ..h
        }
        .vm_record(),
        None
    );
    assert_eq!(
        RegionHeader {
            vm_offset: u32::MAX - 7,
            ..h
        }
        .vm_record(),
        None
    );
    // A later minor may make the record larger; the reader takes the 1.3 part.
    assert_eq!(
        RegionHeader {
            minor: 4,
            vm_size: 192,
            guest_offset: 512,
            ..h
        }
        .vm_record(),
        Some((320, 192))
    );
}

#[test]
fn golden_layout() {
    // The numbers docs/abi.md gives, so a C implementation can be checked against them.
    assert_eq!(size_of::<RegionHeader>(), 64);
    assert_eq!(
        [
            offset_of!(RegionHeader, magic),
            offset_of!(RegionHeader, major),
            offset_of!(RegionHeader, minor),
            offset_of!(RegionHeader, total_size),
            offset_of!(RegionHeader, header_size),
            offset_of!(RegionHeader, host_offset),
            offset_of!(RegionHeader, host_count),
            offset_of!(RegionHeader, host_record_size),
            offset_of!(RegionHeader, guest_offset),
            offset_of!(RegionHeader, guest_size),
            offset_of!(RegionHeader, host_refresh_ns),
            offset_of!(RegionHeader, vm_offset),
            offset_of!(RegionHeader, vm_size),
            offset_of!(RegionHeader, reserved),
        ],
        [0, 4, 6, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48]
    );
    assert_eq!(size_of::<HostVm>(), 128);
    assert_eq!(
        [
            offset_of!(HostVm, seq),
            offset_of!(HostVm, flags),
            offset_of!(HostVm, updated_ns),
            offset_of!(HostVm, host_cpu_vcpus_ns),
            offset_of!(HostVm, host_cpu_devices_ns),
            offset_of!(HostVm, host_cpu_service_ns),
            offset_of!(HostVm, net_tx_packets),
            offset_of!(HostVm, net_rx_packets),
            offset_of!(HostVm, net_tx_bytes),
            offset_of!(HostVm, net_rx_bytes),
            offset_of!(HostVm, net_drops),
            offset_of!(HostVm, pressure_some_total_us),
            offset_of!(HostVm, pressure_full_total_us),
            offset_of!(HostVm, pressure_some_avg),
            offset_of!(HostVm, pressure_full_avg),
            offset_of!(HostVm, reserved),
        ],
        [0, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 108, 120]
    );
    assert_eq!(size_of::<HostVcpu>(), 128);
    assert_eq!(
        [
            offset_of!(HostVcpu, seq),
            offset_of!(HostVcpu, vcpu),
            offset_of!(HostVcpu, updated_ns),
            offset_of!(HostVcpu, wall_ns),
            offset_of!(HostVcpu, used_ns),
            offset_of!(HostVcpu, guest_ns),
            offset_of!(HostVcpu, vmm_ns),
            offset_of!(HostVcpu, steal_ns),
            offset_of!(HostVcpu, halted_ns),
            offset_of!(HostVcpu, idle_ns),
            offset_of!(HostVcpu, limited_ns),
            offset_of!(HostVcpu, paused_ns),
            offset_of!(HostVcpu, exits),
            offset_of!(HostVcpu, overloads),
            offset_of!(HostVcpu, blocked_ns),
            offset_of!(HostVcpu, kvm_ns),
            offset_of!(HostVcpu, interrupted_ns),
        ],
        [0, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120]
    );
    assert_eq!(size_of::<GuestHeader>(), 64);
    assert_eq!(
        [
            offset_of!(GuestHeader, seq),
            offset_of!(GuestHeader, magic),
            offset_of!(GuestHeader, major),
            offset_of!(GuestHeader, minor),
            offset_of!(GuestHeader, nr_cpus),
            offset_of!(GuestHeader, updated_ns),
            offset_of!(GuestHeader, threads_offset),
            offset_of!(GuestHeader, threads_count),
            offset_of!(GuestHeader, thread_record_size),
            offset_of!(GuestHeader, cpus_offset),
            offset_of!(GuestHeader, cpus_count),
            offset_of!(GuestHeader, cpu_record_size),
            offset_of!(GuestHeader, transient_count),
            offset_of!(GuestHeader, transient_cpu_ns),
        ],
        [0, 4, 8, 10, 12, 16, 24, 28, 32, 36, 40, 44, 48, 56]
    );
    assert_eq!(size_of::<GuestThread>(), 192);
    assert_eq!(
        [
            offset_of!(GuestThread, seq),
            offset_of!(GuestThread, tid),
            offset_of!(GuestThread, tgid),
            offset_of!(GuestThread, last_cpu),
            offset_of!(GuestThread, comm),
            offset_of!(GuestThread, on_cpu_ns),
            offset_of!(GuestThread, utime_ns),
            offset_of!(GuestThread, stime_ns),
            offset_of!(GuestThread, run_delay_ns),
            offset_of!(GuestThread, timeslices),
            offset_of!(GuestThread, nvcsw),
            offset_of!(GuestThread, nivcsw),
            offset_of!(GuestThread, blkio_delay_ns),
            offset_of!(GuestThread, swapin_delay_ns),
            offset_of!(GuestThread, freepages_delay_ns),
            offset_of!(GuestThread, irq_delay_ns),
            offset_of!(GuestThread, updated_ns),
            offset_of!(GuestThread, work),
            offset_of!(GuestThread, reserved),
        ],
        [0, 4, 8, 12, 16, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128, 136]
    );
    assert_eq!(size_of::<GuestCpu>(), 192);
    assert_eq!(
        [
            offset_of!(GuestCpu, seq),
            offset_of!(GuestCpu, cpu),
            offset_of!(GuestCpu, user_ns),
            offset_of!(GuestCpu, system_ns),
            offset_of!(GuestCpu, idle_ns),
            offset_of!(GuestCpu, iowait_ns),
            offset_of!(GuestCpu, irq_ns),
            offset_of!(GuestCpu, softirq_ns),
            offset_of!(GuestCpu, steal_ns),
            offset_of!(GuestCpu, interrupts),
            offset_of!(GuestCpu, context_switches),
            offset_of!(GuestCpu, softirqs),
            offset_of!(GuestCpu, updated_ns),
            offset_of!(GuestCpu, reserved),
        ],
        [0, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 160, 168]
    );
    assert_eq!(size_of::<GuestAgent>(), 192);
    assert_eq!(
        [
            offset_of!(GuestAgent, seq),
            offset_of!(GuestAgent, magic),
            offset_of!(GuestAgent, size),
            offset_of!(GuestAgent, flags),
            offset_of!(GuestAgent, pid),
            offset_of!(GuestAgent, threads_seen),
            offset_of!(GuestAgent, threads_published),
            offset_of!(GuestAgent, reserved0),
            offset_of!(GuestAgent, interval_ns),
            offset_of!(GuestAgent, samples),
            offset_of!(GuestAgent, sample_cpu_ns),
            offset_of!(GuestAgent, sample_max_cpu_ns),
            offset_of!(GuestAgent, agent_cpu_ns),
            offset_of!(GuestAgent, rest_count),
            offset_of!(GuestAgent, rest_on_cpu_ns),
            offset_of!(GuestAgent, rest_interval_on_cpu_ns),
            offset_of!(GuestAgent, unseen_count),
            offset_of!(GuestAgent, unseen_cpu_ns),
            offset_of!(GuestAgent, exited_processes),
            offset_of!(GuestAgent, exits_missed),
            offset_of!(GuestAgent, updated_ns),
            offset_of!(GuestAgent, reserved),
        ],
        [
            0, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128,
            136
        ]
    );
    assert_eq!(REGION_MAGIC.to_le_bytes(), *b"PPAP");
    assert_eq!(GUEST_MAGIC.to_le_bytes(), *b"PPAG");
    assert_eq!(AGENT_MAGIC.to_le_bytes(), *b"PPAA");
    assert_eq!(VERSION, 0x0001_0004);
}

#[test]
fn thread_words_of_1_1_sit_where_the_c_layout_puts_them() {
    let mut t = GuestThread::default();
    t.set_ext(THREAD_KERNEL, b'S', 123_456);
    assert_eq!(
        (t.flags(), t.state(), t.interval_on_cpu_ns()),
        (1, b'S', 123_456)
    );
    // SAFETY: GuestThread is repr(C) integers (192 bytes, asserted); viewing it as bytes is
    // sound for as long as `t` lives.
    let bytes = unsafe {
        core::slice::from_raw_parts(
            (&t as *const GuestThread).cast::<u8>(),
            size_of::<GuestThread>(),
        )
    };
    assert_eq!(
        u32::from_le_bytes(bytes[136..140].try_into().unwrap()),
        1,
        "flags @136"
    );
    assert_eq!(bytes[140], b'S', "state @140");
    assert_eq!(&bytes[141..144], &[0, 0, 0], "pad");
    assert_eq!(
        u64::from_le_bytes(bytes[144..152].try_into().unwrap()),
        123_456,
        "@144"
    );
    // A 1.0 writer's zeroes read as no flags, unknown state, nothing in the interval.
    let z = GuestThread::default();
    assert_eq!((z.flags(), z.state(), z.interval_on_cpu_ns()), (0, 0, 0));
}

#[test]
fn an_agent_record_is_looked_for_only_where_a_1_1_writer_left_room() {
    let h = GuestHeader {
        magic: GUEST_MAGIC,
        major: 1,
        minor: 1,
        threads_offset: 256,
        threads_count: 3,
        cpus_offset: 256 + 3 * 192,
        cpus_count: 2,
        ..Default::default()
    };
    assert!(agent_record_fits(&h));
    // The tiny guest's layout: tables right after the header.
    assert!(!agent_record_fits(&GuestHeader {
        threads_offset: 64,
        ..h
    }));
    assert!(!agent_record_fits(&GuestHeader {
        cpus_offset: 200,
        ..h
    }));
    // An empty table's offset does not matter.
    assert!(agent_record_fits(&GuestHeader {
        cpus_offset: 0,
        cpus_count: 0,
        ..h
    }));
    // A 1.0 header never has one.
    assert!(!agent_record_fits(&GuestHeader { minor: 0, ..h }));
}

#[test]
fn kvm_and_interrupted_time_are_read_only_from_a_1_4_writer_that_measured_them() {
    let r = HostVcpu {
        kvm_ns: 7,
        interrupted_ns: NOT_MEASURED,
        ..Default::default()
    };
    assert_eq!((r.kvm(4), r.interrupted(4)), (Some(7), None));
    // A 1.3 writer left the words zero: not a measured zero.
    let old = HostVcpu::default();
    assert_eq!((old.kvm(3), old.interrupted(3)), (None, None));
    assert_eq!(MINOR, 4);
}

#[test]
fn write_then_read_and_stuck_odd_counters() {
    let mut rec = HostVcpu::default();
    let v = HostVcpu {
        vcpu: 3,
        steal_ns: 42,
        ..Default::default()
    };
    // SAFETY: `rec` is a valid, aligned record owned by this test.
    unsafe { write_record(&mut rec, &v) };
    assert_eq!(rec.seq, 2, "even after one write");
    // SAFETY: as above.
    let got = unsafe { read_record(&rec, 4) }.unwrap();
    assert_eq!((got.vcpu, got.steal_ns, got.seq), (3, 42, 2));
    // A writer that died mid-write (or a hostile one) leaves the counter odd: the reader
    // gives up after its tries instead of spinning.
    rec.seq = 7;
    // SAFETY: as above.
    let r = unsafe { read_record(&rec, 100) };
    assert_eq!(r, Err(ReadError::Torn { tries: 100 }));
}

/// A shared record both threads reach through a raw pointer (as guest and VMM reach the page).
struct Shared(*mut GuestThread);
// SAFETY: the record is accessed only through the sequence protocol in this test.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

#[test]
fn a_torn_record_is_never_returned_as_valid() {
    let boxed = std::boxed::Box::new(GuestThread::default());
    let shared = Arc::new(Shared(std::boxed::Box::into_raw(boxed)));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (shared, stop) = (Arc::clone(&shared), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) {
                k += 1;
                // Every payload word carries the same value: a torn copy mixes two.
                let v = GuestThread {
                    tid: k as u32,
                    tgid: k as u32,
                    last_cpu: k as u32,
                    comm: [k as u8; COMM_LEN],
                    on_cpu_ns: k,
                    utime_ns: k,
                    stime_ns: k,
                    run_delay_ns: k,
                    timeslices: k,
                    nvcsw: k,
                    nivcsw: k,
                    blkio_delay_ns: k,
                    swapin_delay_ns: k,
                    freepages_delay_ns: k,
                    irq_delay_ns: k,
                    updated_ns: k,
                    work: k,
                    reserved: [k; 7],
                    seq: 0,
                };
                // SAFETY: the record lives until both threads are joined; one writer.
                unsafe { write_record(shared.0, &v) };
            }
            k
        })
    };
    let (mut ok, mut torn) = (0u64, 0u64);
    let mut last = 0u64;
    for _ in 0..200_000 {
        // SAFETY: as above; this thread only reads.
        match unsafe { read_record(shared.0 as *const GuestThread, 8) } {
            Ok(r) => {
                let k = r.on_cpu_ns;
                let words = [
                    r.utime_ns,
                    r.stime_ns,
                    r.run_delay_ns,
                    r.timeslices,
                    r.nvcsw,
                    r.nivcsw,
                    r.blkio_delay_ns,
                    r.swapin_delay_ns,
                    r.freepages_delay_ns,
                    r.irq_delay_ns,
                    r.updated_ns,
                    r.work,
                ];
                assert!(words.iter().all(|w| *w == k), "torn copy returned: {r:?}");
                assert!(r.reserved.iter().all(|w| *w == k), "torn copy: {r:?}");
                assert_eq!(r.tid, k as u32);
                assert_eq!(r.comm, [k as u8; COMM_LEN]);
                assert!(k >= last, "went back from {last} to {k}");
                last = k;
                ok += 1;
            }
            Err(ReadError::Torn { .. }) => torn += 1,
        }
    }
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().unwrap();
    // SAFETY: both threads are done; the pointer came from Box::into_raw.
    drop(unsafe { std::boxed::Box::from_raw(shared.0) });
    assert!(written > 100, "the writer ran ({written} writes)");
    assert!(ok > 0, "some reads succeeded ({ok} ok, {torn} torn)");
    let _ = Vec::<u8>::new();
}
