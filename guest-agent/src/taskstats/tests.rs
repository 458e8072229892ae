//! Parsing netlink datagrams as the kernel builds them, and (as root) a real exit.

use super::*;

fn attr(ty: u16, payload: &[u8]) -> Vec<u8> {
    let mut a = Vec::new();
    a.extend_from_slice(&((4 + payload.len()) as u16).to_le_bytes());
    a.extend_from_slice(&ty.to_le_bytes());
    a.extend_from_slice(payload);
    while a.len() % 4 != 0 {
        a.push(0);
    }
    a
}

fn msg(ty: u16, seq: u32, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(&((16 + body.len()) as u32).to_le_bytes());
    m.extend_from_slice(&ty.to_le_bytes());
    m.extend_from_slice(&0u16.to_le_bytes());
    m.extend_from_slice(&seq.to_le_bytes());
    m.extend_from_slice(&0u32.to_le_bytes());
    m.extend_from_slice(body);
    m
}

/// A `struct taskstats` of `len` bytes (416 for version 13) with distinct values in the
/// fields read, as far as they fit.
fn payload(version: u16, len: usize, flag: u8) -> Vec<u8> {
    let mut p = vec![0u8; len.max(432)];
    let mut put = |off: usize, v: u64| p[off..off + 8].copy_from_slice(&v.to_le_bytes());
    put(16, 3);
    put(24, 1000);
    put(40, 5);
    put(56, 6);
    put(72, 5_000_000);
    put(152, 4000);
    put(160, 1000);
    put(272, 9);
    put(280, 2);
    put(320, 7);
    put(424, 8);
    p[0..2].copy_from_slice(&version.to_le_bytes());
    p[8] = flag;
    p[80..86].copy_from_slice(b"worker");
    p[128..132].copy_from_slice(&77u32.to_le_bytes());
    p[368..372].copy_from_slice(&70u32.to_le_bytes());
    p.truncate(len);
    p
}

/// An exit notification: PID + STATS nested in AGGR_PID, with the padding attribute newer
/// kernels put before STATS.
fn exit(family: u16, version: u16, len: usize, flag: u8) -> Vec<u8> {
    let mut nested = attr(TASKSTATS_TYPE_PID, &77u32.to_le_bytes());
    nested.extend(attr(6, &[]));
    nested.extend(attr(TASKSTATS_TYPE_STATS, &payload(version, len, flag)));
    let mut body = vec![TASKSTATS_CMD_NEW, 1, 0, 0];
    body.extend(attr(TASKSTATS_TYPE_AGGR_PID, &nested));
    msg(family, 0, &body)
}

#[test]
fn an_exit_notification_of_a_6_1_kernel() {
    let p = parse(&exit(31, 13, 416, AGROUP | 1), 31);
    assert_eq!(p.tasks.len(), 1);
    let t = p.tasks[0];
    assert_eq!((t.tid, t.tgid), (77, 70));
    assert_eq!(&t.comm[..7], b"worker\0");
    assert_eq!(
        (t.cpu_ns, t.run_delay_ns, t.timeslices),
        (5_000_000, 1000, 3)
    );
    assert_eq!((t.nvcsw, t.nivcsw), (9, 2));
    assert_eq!((t.utime_ns, t.stime_ns), (4_000_000, 1_000_000), "µs to ns");
    assert_eq!(
        t.delays,
        [5, 6, 7, 0, 0, 0, 0],
        "no IRQ delay before version 14"
    );
    assert!(t.group_end);
}

#[test]
fn a_task_that_ran_one_slice_counts_its_elapsed_time_less_its_wait() {
    // Switched onto a CPU once, never updated by a tick: the scheduler says 0.
    let mut p = payload(13, 416, AGROUP);
    p[16..24].copy_from_slice(&1u64.to_le_bytes()); // one timeslice
    p[72..80].copy_from_slice(&0u64.to_le_bytes()); // sum_exec_runtime not updated
    p[144..152].copy_from_slice(&2000u64.to_le_bytes()); // 2 ms since fork
    let t = stats(&p).unwrap();
    assert_eq!((t.sched_cpu_ns, t.elapsed_ns), (0, 2_000_000));
    assert_eq!(
        t.cpu_ns,
        2_000_000 - 1000,
        "elapsed less the 1 µs of run-queue wait"
    );
    // With more slices the scheduler's figure stands: the task may have slept.
    p[16..24].copy_from_slice(&2u64.to_le_bytes());
    assert_eq!(stats(&p).unwrap().cpu_ns, 0);
}

#[test]
fn newer_and_older_struct_versions() {
    let t = parse(&exit(31, 16, 560, 0), 31).tasks[0];
    assert_eq!(t.delays[3], 8, "version 14 and later carry the IRQ delay");
    assert!(!t.group_end);
    // Shorter than version 1: not a record.
    assert!(parse(&exit(31, 1, 200, 0), 31).tasks.is_empty());
}

#[test]
fn other_families_acks_family_replies_and_truncation() {
    // Another family's message is skipped.
    assert!(parse(&exit(32, 13, 416, 0), 31).tasks.is_empty());
    // An error/ack message.
    let err = msg(NLMSG_ERROR, 9, &(-libc::EPERM).to_le_bytes());
    assert_eq!(parse(&err, 31).acks, vec![(9, -libc::EPERM)]);
    // A family lookup reply.
    let mut body = vec![1, 1, 0, 0];
    body.extend(attr(CTRL_ATTR_FAMILY_NAME, b"TASKSTATS\0"));
    body.extend(attr(CTRL_ATTR_FAMILY_ID, &31u16.to_le_bytes()));
    assert_eq!(parse(&msg(GENL_ID_CTRL, 1, &body), 0).family, Some(31));
    // Two messages in one datagram, the second cut short: the first is kept.
    let mut two = exit(31, 13, 416, 0);
    let second = exit(31, 13, 416, 0);
    two.extend_from_slice(&second[..100]);
    assert_eq!(parse(&two, 31).tasks.len(), 1);
    // Garbage lengths end the parse without a panic.
    let mut bad = exit(31, 13, 416, 0);
    bad[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(parse(&bad, 31).tasks.is_empty());
    let mut bad = exit(31, 13, 416, 0);
    bad[20..22].copy_from_slice(&9000u16.to_le_bytes());
    assert!(parse(&bad, 31).tasks.is_empty());
}

#[test]
fn a_request_is_laid_out_as_netlink_wants() {
    let r = request(31, NLM_F_ACK, 5, TASKSTATS_CMD_GET, 3, b"0-1\0");
    assert_eq!(r.len(), 16 + 4 + 8);
    assert_eq!(u32_at(&r, 0) as usize, r.len());
    assert_eq!(u16::from_le_bytes([r[6], r[7]]), NLM_F_REQUEST | NLM_F_ACK);
    assert_eq!(u32_at(&r, 8), 5);
    assert_eq!(&r[16..20], &[TASKSTATS_CMD_GET, 1, 0, 0]);
    assert_eq!(&r[20..28], &[8, 0, 3, 0, b'0', b'-', b'1', 0]);
}

fn cpu_ns(clock: libc::clockid_t) -> u64 {
    crate::clock_ns(clock).unwrap_or(0)
}

/// As root: a child that spins 3 ms of CPU and exits is notified with that CPU time (the
/// scheduler's figure at its last update, which its own last clock read made).
#[test]
fn a_real_exit_is_notified_with_its_cpu_time() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: registering for exit notifications needs CAP_NET_ADMIN; skipped");
        return;
    }
    let possible = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    let mut ts = Taskstats::open(&possible).expect("taskstats as root");
    // A shared page for the child to leave its CPU time in.
    let shared = crate::shared_page()
        .expect("a shared page")
        .as_ptr()
        .cast::<u64>();
    // SAFETY: the child only spins on clock_gettime, stores a word and calls _exit, all
    // async-signal-safe, so forking a multi-threaded test process is sound.
    let child = unsafe { libc::fork() };
    if child == 0 {
        let t0 = cpu_ns(libc::CLOCK_PROCESS_CPUTIME_ID);
        let mut t = t0;
        while t - t0 < 3_000_000 {
            t = cpu_ns(libc::CLOCK_PROCESS_CPUTIME_ID);
        }
        // SAFETY: the shared page is mapped in the child too; _exit never returns.
        unsafe {
            shared.write_volatile(t);
            libc::_exit(0)
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(child, &mut status, 0) };
    // SAFETY: the child wrote the word before it exited.
    let seen = unsafe { shared.read_volatile() };
    let mut found = None;
    for _ in 0..200 {
        ts.drain(|e| {
            if e.tid == child as u32 {
                found = Some(e);
            }
        })
        .unwrap();
        if found.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let e = found.expect("the child's exit was notified");
    assert_eq!(e.tgid, child as u32);
    assert!(e.group_end, "a one-thread process ends with its thread");
    assert!(
        e.cpu_ns >= seen && e.cpu_ns < seen + 1_000_000,
        "notified {} ns, the child measured {seen} ns",
        e.cpu_ns
    );
    // A query for a live thread (this one) answers; one for the dead child does not.
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() } as u32;
    assert_eq!(ts.query(me).unwrap().map(|t| t.tid), Some(me));
    assert_eq!(ts.query(child as u32).unwrap(), None);
}

#[test]
fn every_delay_kind_and_its_count_by_struct_version() {
    // (count, total) offsets of include/uapi/linux/taskstats.h: blkio, swapin, freepages, irq,
    // thrashing, compact, wpcopy.
    let at = [
        (32, 40),
        (48, 56),
        (312, 320),
        (416, 424),
        (328, 336),
        (352, 360),
        (400, 408),
    ];
    let with = |version: u16, len: usize| {
        let mut p = payload(version, 560, 0);
        for (k, (c, t)) in at.iter().enumerate() {
            p[*c..c + 8].copy_from_slice(&(100 + k as u64).to_le_bytes());
            p[*t..t + 8].copy_from_slice(&(200 + k as u64).to_le_bytes());
        }
        p.truncate(len);
        stats(&p).unwrap()
    };
    let t = with(16, 560);
    assert_eq!(t.delays, [200, 201, 202, 203, 204, 205, 206]);
    assert_eq!(t.delay_counts, [100, 101, 102, 103, 104, 105, 106]);
    // Debian 12's 6.1: version 13, no IRQ delay yet.
    let t = with(13, 416);
    assert_eq!(t.delays, [200, 201, 202, 0, 204, 205, 206]);
    assert_eq!(t.delay_counts, [100, 101, 102, 0, 104, 105, 106]);
    // Version 10: no compaction nor write-protect copy; version 8: no thrashing.
    assert_eq!(with(10, 360).delays, [200, 201, 202, 0, 204, 0, 0]);
    assert_eq!(with(8, 344).delay_counts, [100, 101, 102, 0, 0, 0, 0]);
}
