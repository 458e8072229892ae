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
            offset_of!(HostVm, guest_reset),
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
    assert_eq!(VERSION, 0x0001_0005);
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
    const { assert!(MINOR >= 4) };
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

/// Every byte of each record belongs to a field (no padding), as the `Record` contract
/// requires: the fields' sizes add up to the record's. The patterns name every field, so a
/// field added without updating this test does not compile.
#[test]
fn every_record_is_its_fields_without_padding() {
    use core::mem::{size_of, size_of_val};
    let HostVcpu {
        seq,
        vcpu,
        updated_ns,
        wall_ns,
        used_ns,
        guest_ns,
        vmm_ns,
        steal_ns,
        halted_ns,
        idle_ns,
        limited_ns,
        paused_ns,
        exits,
        overloads,
        blocked_ns,
        kvm_ns,
        interrupted_ns,
    } = HostVcpu::default();
    assert_eq!(
        size_of_val(&seq)
            + size_of_val(&vcpu)
            + size_of_val(&updated_ns)
            + size_of_val(&wall_ns)
            + size_of_val(&used_ns)
            + size_of_val(&guest_ns)
            + size_of_val(&vmm_ns)
            + size_of_val(&steal_ns)
            + size_of_val(&halted_ns)
            + size_of_val(&idle_ns)
            + size_of_val(&limited_ns)
            + size_of_val(&paused_ns)
            + size_of_val(&exits)
            + size_of_val(&overloads)
            + size_of_val(&blocked_ns)
            + size_of_val(&kvm_ns)
            + size_of_val(&interrupted_ns),
        size_of::<HostVcpu>(),
        "HostVcpu"
    );
    let HostVm {
        seq,
        flags,
        updated_ns,
        host_cpu_vcpus_ns,
        host_cpu_devices_ns,
        host_cpu_service_ns,
        net_tx_packets,
        net_rx_packets,
        net_tx_bytes,
        net_rx_bytes,
        net_drops,
        pressure_some_total_us,
        pressure_full_total_us,
        pressure_some_avg,
        pressure_full_avg,
        guest_reset,
    } = HostVm::default();
    assert_eq!(
        size_of_val(&seq)
            + size_of_val(&flags)
            + size_of_val(&updated_ns)
            + size_of_val(&host_cpu_vcpus_ns)
            + size_of_val(&host_cpu_devices_ns)
            + size_of_val(&host_cpu_service_ns)
            + size_of_val(&net_tx_packets)
            + size_of_val(&net_rx_packets)
            + size_of_val(&net_tx_bytes)
            + size_of_val(&net_rx_bytes)
            + size_of_val(&net_drops)
            + size_of_val(&pressure_some_total_us)
            + size_of_val(&pressure_full_total_us)
            + size_of_val(&pressure_some_avg)
            + size_of_val(&pressure_full_avg)
            + size_of_val(&guest_reset),
        size_of::<HostVm>(),
        "HostVm"
    );
    let GuestHeader {
        seq,
        magic,
        major,
        minor,
        nr_cpus,
        updated_ns,
        threads_offset,
        threads_count,
        thread_record_size,
        cpus_offset,
        cpus_count,
        cpu_record_size,
        transient_count,
        transient_cpu_ns,
    } = GuestHeader::default();
    assert_eq!(
        size_of_val(&seq)
            + size_of_val(&magic)
            + size_of_val(&major)
            + size_of_val(&minor)
            + size_of_val(&nr_cpus)
            + size_of_val(&updated_ns)
            + size_of_val(&threads_offset)
            + size_of_val(&threads_count)
            + size_of_val(&thread_record_size)
            + size_of_val(&cpus_offset)
            + size_of_val(&cpus_count)
            + size_of_val(&cpu_record_size)
            + size_of_val(&transient_count)
            + size_of_val(&transient_cpu_ns),
        size_of::<GuestHeader>(),
        "GuestHeader"
    );
    let GuestThread {
        seq,
        tid,
        tgid,
        last_cpu,
        comm,
        on_cpu_ns,
        utime_ns,
        stime_ns,
        run_delay_ns,
        timeslices,
        nvcsw,
        nivcsw,
        blkio_delay_ns,
        swapin_delay_ns,
        freepages_delay_ns,
        irq_delay_ns,
        updated_ns,
        work,
        reserved,
    } = GuestThread::default();
    assert_eq!(
        size_of_val(&seq)
            + size_of_val(&tid)
            + size_of_val(&tgid)
            + size_of_val(&last_cpu)
            + size_of_val(&comm)
            + size_of_val(&on_cpu_ns)
            + size_of_val(&utime_ns)
            + size_of_val(&stime_ns)
            + size_of_val(&run_delay_ns)
            + size_of_val(&timeslices)
            + size_of_val(&nvcsw)
            + size_of_val(&nivcsw)
            + size_of_val(&blkio_delay_ns)
            + size_of_val(&swapin_delay_ns)
            + size_of_val(&freepages_delay_ns)
            + size_of_val(&irq_delay_ns)
            + size_of_val(&updated_ns)
            + size_of_val(&work)
            + size_of_val(&reserved),
        size_of::<GuestThread>(),
        "GuestThread"
    );
    let GuestCpu {
        seq,
        cpu,
        user_ns,
        system_ns,
        idle_ns,
        iowait_ns,
        irq_ns,
        softirq_ns,
        steal_ns,
        interrupts,
        context_switches,
        softirqs,
        updated_ns,
        reserved,
    } = GuestCpu::default();
    assert_eq!(
        size_of_val(&seq)
            + size_of_val(&cpu)
            + size_of_val(&user_ns)
            + size_of_val(&system_ns)
            + size_of_val(&idle_ns)
            + size_of_val(&iowait_ns)
            + size_of_val(&irq_ns)
            + size_of_val(&softirq_ns)
            + size_of_val(&steal_ns)
            + size_of_val(&interrupts)
            + size_of_val(&context_switches)
            + size_of_val(&softirqs)
            + size_of_val(&updated_ns)
            + size_of_val(&reserved),
        size_of::<GuestCpu>(),
        "GuestCpu"
    );
    let GuestAgent {
        seq,
        magic,
        size,
        flags,
        pid,
        threads_seen,
        threads_published,
        reserved0,
        interval_ns,
        samples,
        sample_cpu_ns,
        sample_max_cpu_ns,
        agent_cpu_ns,
        rest_count,
        rest_on_cpu_ns,
        rest_interval_on_cpu_ns,
        unseen_count,
        unseen_cpu_ns,
        exited_processes,
        exits_missed,
        updated_ns,
        reserved,
    } = GuestAgent::default();
    assert_eq!(
        size_of_val(&seq)
            + size_of_val(&magic)
            + size_of_val(&size)
            + size_of_val(&flags)
            + size_of_val(&pid)
            + size_of_val(&threads_seen)
            + size_of_val(&threads_published)
            + size_of_val(&reserved0)
            + size_of_val(&interval_ns)
            + size_of_val(&samples)
            + size_of_val(&sample_cpu_ns)
            + size_of_val(&sample_max_cpu_ns)
            + size_of_val(&agent_cpu_ns)
            + size_of_val(&rest_count)
            + size_of_val(&rest_on_cpu_ns)
            + size_of_val(&rest_interval_on_cpu_ns)
            + size_of_val(&unseen_count)
            + size_of_val(&unseen_cpu_ns)
            + size_of_val(&exited_processes)
            + size_of_val(&exits_missed)
            + size_of_val(&updated_ns)
            + size_of_val(&reserved),
        size_of::<GuestAgent>(),
        "GuestAgent"
    );
}

/// The bytes of a record, as a C reader sees them.
fn bytes_of<T: Record>(r: &T) -> Vec<u8> {
    // SAFETY: `Record`s are plain data without padding: every byte is initialised.
    unsafe { core::slice::from_raw_parts((r as *const T).cast::<u8>(), core::mem::size_of::<T>()) }
        .to_vec()
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}

#[test]
fn layout_1_5_puts_each_new_word_where_docs_abi_says() {
    use super::alarms::{GuestAlarm, GuestAlarms};
    use core::mem::{offset_of, size_of};
    // Thread: threshold counts at 152, 160, 168; thrashing and compaction at 176, 184; the
    // tail at 192: wpcopy, then the seven counts.
    let mut t = GuestThreadFull::default();
    t.thread.set_ext(1, b'R', 7);
    t.thread.set_v15([11, 12, 13], [14, 15]);
    t.tail.wpcopy_delay_ns = 16;
    t.tail.delay_counts = [21, 22, 23, 24, 25, 26, 27];
    let b = bytes_of(&t);
    assert_eq!(b.len(), 256);
    for (off, v) in [
        (144, 7),
        (152, 11),
        (160, 12),
        (168, 13),
        (176, 14),
        (184, 15),
        (192, 16),
    ] {
        assert_eq!(u64_at(&b, off), v, "thread offset {off}");
    }
    for k in 0..7 {
        assert_eq!(u64_at(&b, 200 + 8 * k), 21 + k as u64, "count {k}");
    }
    assert_eq!(t.thread.over(), [11, 12, 13]);
    assert_eq!(t.delays_ns()[4..], [14, 15, 16]);
    // CPU: irq and softirq counts at 168 and 176.
    let mut c = GuestCpu::default();
    c.set_over([31, 32]);
    let b = bytes_of(&c);
    assert_eq!((u64_at(&b, 168), u64_at(&b, 176)), (31, 32));
    assert_eq!(c.over(), [31, 32]);
    // Agent: alarms offset and size at 136 and 140, reset generation at 144, its time at 152.
    let mut a = GuestAgent::default();
    a.set_v15(Some((384, 4224)), 3, 99);
    let b = bytes_of(&a);
    assert_eq!(u32::from_le_bytes(b[136..140].try_into().unwrap()), 384);
    assert_eq!(u32::from_le_bytes(b[140..144].try_into().unwrap()), 4224);
    assert_eq!((u64_at(&b, 144), u64_at(&b, 152)), (3, 99));
    assert_eq!(a.alarms(), Some((384, 4224)));
    assert_eq!((a.reset_generation(), a.reset_ns()), (3, 99));
    a.set_v15(None, 0, 0);
    assert_eq!(a.alarms(), None);
    // The VM record's last word.
    assert_eq!(offset_of!(HostVm, guest_reset), 120);
    // The alarm ring.
    assert_eq!(size_of::<GuestAlarms>(), 128);
    assert_eq!(
        [
            offset_of!(GuestAlarms, magic),
            offset_of!(GuestAlarms, slots),
            offset_of!(GuestAlarms, record_size),
            offset_of!(GuestAlarms, written),
            offset_of!(GuestAlarms, suppressed),
            offset_of!(GuestAlarms, thresholds),
            offset_of!(GuestAlarms, reserved),
        ],
        [4, 8, 12, 16, 24, 32, 72]
    );
    assert_eq!(size_of::<GuestAlarm>(), 64);
    assert_eq!(
        [
            offset_of!(GuestAlarm, kind),
            offset_of!(GuestAlarm, number),
            offset_of!(GuestAlarm, tid),
            offset_of!(GuestAlarm, cpu),
            offset_of!(GuestAlarm, comm),
            offset_of!(GuestAlarm, value),
            offset_of!(GuestAlarm, threshold),
            offset_of!(GuestAlarm, guest_ns),
        ],
        [4, 8, 16, 20, 24, 40, 48, 56]
    );
}
