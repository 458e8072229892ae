//! The PPA page seen from both sides with a real guest: the tiny guest publishes each vCPU's
//! worker thread through ppa-guest-abi, the VMM decodes it (`guest`, the report), and the
//! figures are compared with the guest's own rdtsc measurements field for field (how close
//! they come to the host's accounting is the accuracy target's, tests/accuracy/guest_page.rs).
//! The `hostile` workload then writes each kind of bad data into the page from inside the VM.

mod common;

use std::time::Duration;

use common::page::paused_busy_workers;
use common::vmm::Vmm;
use common::{assert_all_exited_ok, guest_thread, reported, run_vm, serial};
use ppa_vmm_api::{GuestView, Stats};
use serde_json::json;

#[test]
fn busy_workers_publish_what_the_guest_measured() {
    let _g = serial();
    // Live, paused: what `guest` and `stats` say.
    let (mut vmm, mut c, g) = paused_busy_workers();
    let s: Stats = c.stats();
    assert!(g.published && g.errors.is_empty(), "{g:?}");
    assert_eq!(
        (g.threads.len(), g.cpus.len(), g.nr_cpus),
        (3, 3, 3),
        "{g:?}"
    );
    assert!(s.vcpus.iter().all(|v| v.paused_ns > 0), "{s:?}");
    for i in 0..3 {
        let t = guest_thread(&g, &format!("busy-{i}"));
        assert!(!t.stale, "{t:?}");
    }
    c.ok(json!({"cmd": "resume"}));

    let (code, report) = vmm.wait();
    assert_eq!(code, 0, "{report}");
    let g: GuestView = serde_json::from_value(report["guest"].clone()).expect("a guest view");
    assert!(g.published && g.errors.is_empty(), "{g:?}");
    assert_eq!(g.threads.len(), 3);
    for (i, v) in report["vcpus"].as_array().unwrap().iter().enumerate() {
        assert_eq!(v["exit_code"], json!(0), "{v}");
        let host = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"));
        let seen_by_guest = |k: &str| {
            v["guest_reported"][k]
                .as_u64()
                .unwrap_or_else(|| panic!("vCPU {i} reported no {k}: {v}"))
        };
        let t = guest_thread(&g, &format!("busy-{i}"));
        // The final record is the guest's final measurement, field for field.
        assert_eq!((t.tid, t.tgid, t.last_cpu), (i as u32 + 1, 1, i as u32));
        assert_eq!(t.on_cpu_ns, seen_by_guest("ran_ns"), "vCPU {i}");
        assert_eq!(t.utime_ns, t.on_cpu_ns, "vCPU {i}");
        assert_eq!(t.run_delay_ns, seen_by_guest("lost_ns"), "vCPU {i}");
        assert_eq!(t.nivcsw, seen_by_guest("gaps"), "vCPU {i}");
        assert_eq!(t.work, seen_by_guest("iterations"), "vCPU {i}");
        // (How often it published is the accuracy target's.)
        assert!(seen_by_guest("publishes") > 0, "{v}");

        // The CPU record carries the same time as user and the steal the guest read.
        let cpu = g
            .cpus
            .iter()
            .find(|c| c.cpu as usize == i)
            .expect("a CPU record");
        assert_eq!(cpu.times_ns[0], t.on_cpu_ns);
        let seen = seen_by_guest("steal_seen_ns");
        assert_eq!(cpu.times_ns[6], seen);
        // The steal the guest saw is the host's live figure as of a record it read: never
        // ahead of the final figure but for a sleep inside KVM_RUN that the live read placed
        // in steal (the thread was runnable again), which the final figures count as blocked
        // (docs/abi.md). (How old that record was is the accuracy target's.)
        let (steal, wall) = (host("steal_ns"), host("wall_ns"));
        let seen_wall = seen_by_guest("steal_seen_wall_ns");
        assert!(steal > 0, "three busy vCPUs on two cores steal: {v}");
        assert!(
            seen <= steal + host("blocked_ns") && seen_wall <= wall,
            "vCPU {i}: {seen} {steal} {v}"
        );
    }
}

/// Runs one vCPU writing `mode` into the page for 150 ms; returns the final decoded view.
fn hostile_alone(mode: &str) -> GuestView {
    let out = run_vm(1, &[&format!("hostile:ms=150,mode={mode}")]);
    assert_all_exited_ok(&out.report);
    let v = &out.report.vcpus[0];
    assert!(reported(v, "iterations") > 0, "{mode}: the writer ran");
    out.report.guest.clone().expect("a PPA page")
}

fn assert_error(g: &GuestView, mode: &str, needle: &str) {
    assert!(
        g.errors.iter().any(|e| e.contains(needle)),
        "{mode}: no error mentions {needle:?}: {:?}",
        g.errors
    );
}

#[test]
fn each_kind_of_hostile_data_is_reported_and_the_valid_part_shown() {
    let _g = serial();
    let g = hostile_alone("magic");
    assert_error(&g, "magic", "magic is 0xdeadbeef");
    assert!(g.threads.is_empty() && !g.published, "{g:?}");

    let g = hostile_alone("version");
    assert_error(&g, "version", "layout 9.0");
    assert!(g.threads.is_empty(), "{g:?}");

    let g = hostile_alone("counts");
    assert_error(&g, "counts", "4294967295 thread records, more than");
    assert_error(&g, "counts", "CPU table (1000");

    let g = hostile_alone("offsets");
    assert_error(&g, "offsets", "offset 4294967040");
    assert_error(&g, "offsets", "past the section");

    let g = hostile_alone("odd");
    assert_error(&g, "odd", "thread record 0 stayed mid-update");
    assert_eq!(g.threads.len(), 1, "the valid record is shown: {g:?}");
    assert_eq!(g.threads[0].comm, "fine");

    let g = hostile_alone("names");
    assert_error(&g, "names", "thread record 1: its name is not valid UTF-8");
    assert_error(
        &g,
        "names",
        "thread record 2: its name has control characters",
    );
    assert_eq!(g.threads.len(), 3, "the records are shown: {g:?}");
    let names: Vec<&str> = g.threads.iter().map(|t| t.comm.as_str()).collect();
    assert!(
        names.contains(&"AAAAAAAAAAAAAAAA"),
        "no NUL: all 16 bytes: {names:?}"
    );
    for n in names {
        assert!(!n.chars().any(char::is_control), "{n:?} is shown escaped");
    }

    // Random words over the whole section: whatever it decodes to, it says what is wrong.
    let g = hostile_alone("storm");
    assert!(!g.errors.is_empty(), "{g:?}");
}

#[test]
fn a_guest_rewriting_the_page_never_yields_a_torn_record_and_disturbs_nothing() {
    let _g = serial();
    // vCPU 0 rewrites one record as fast as it can with the writer protocol; every counting
    // field holds the pass number, so a torn copy would show fields that differ.
    let vmm = Vmm::start(
        "rewrite",
        &[
            "--vcpus",
            "2",
            "--workload",
            "0=hostile:ms=60000,mode=rewrite",
            "--workload",
            "1=busy:ms=60000,publish=off",
        ],
    );
    let mut c = vmm.connect();
    std::thread::sleep(Duration::from_millis(200));
    // Each read either returns the record whole or says it stayed mid-update (the reader
    // gives up after 8 tries rather than wait for a writer that never pauses): nothing else.
    let (mut whole, mut busy) = (0, 0);
    let mut last_k = 0;
    for _ in 0..300 {
        let g: GuestView = serde_json::from_value(c.ok(json!({"cmd": "guest"}))).unwrap();
        match (g.threads.as_slice(), g.errors.as_slice()) {
            ([t], []) => {
                let k = t.on_cpu_ns;
                assert_eq!(
                    (t.utime_ns, t.stime_ns, t.run_delay_ns, t.work, t.updated_ns),
                    (k, k, k, k, k),
                    "a torn record was returned as valid: {t:?}"
                );
                assert_eq!(t.comm, "rewrite");
                assert!(k >= last_k, "the pass number went back: {last_k} -> {k}");
                last_k = k;
                whole += 1;
            }
            ([], [e]) if e.starts_with("thread record 0 stayed mid-update") => busy += 1,
            _ => panic!("neither the record nor a mid-update error: {g:?}"),
        }
    }
    eprintln!("300 reads of a record rewritten without pause: {whole} whole, {busy} mid-update");
    let before = c.stats();
    std::thread::sleep(Duration::from_millis(100));
    let after = c.stats();
    assert_eq!(after.vm.state, ppa_vmm_api::VmState::Running);
    for (a, b) in before.vcpus.iter().zip(&after.vcpus) {
        assert!(b.used_ns > a.used_ns, "vCPU {} went on", a.id);
    }
    let (code, report) = vmm.shutdown();
    assert_eq!(code, 0);
    assert_eq!(report["vm"]["end"], json!("shutdown"));
}

#[test]
fn every_hostile_mode_in_turn_leaves_the_vmm_its_socket_and_neighbours_undisturbed() {
    let _g = serial();
    let vmm = Vmm::start(
        "all",
        &[
            "--vcpus",
            "2",
            "--workload",
            "0=hostile:ms=2000,mode=all",
            "--workload",
            "1=busy:ms=2000,publish=off",
        ],
    );
    let mut c = vmm.connect();
    // 100 reads 5 ms apart (about 0.6 s of the 2 s run): every mode, 10 ms each, is seen.
    let mut with_errors = 0;
    for _ in 0..100 {
        let g: GuestView = serde_json::from_value(c.ok(json!({"cmd": "guest"}))).unwrap();
        with_errors += usize::from(!g.errors.is_empty());
        assert!(
            g.threads.len() <= 1024 && g.errors.len() <= 65,
            "bounded: {g:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(with_errors > 0, "no read of 100 reported a problem");
    // The vCPUs and the sampler went on: the stats snapshot moves.
    let before = c.stats();
    std::thread::sleep(Duration::from_millis(100));
    let after = c.stats();
    for (a, b) in before.vcpus.iter().zip(&after.vcpus) {
        assert!(
            b.used_ns > a.used_ns && b.wall_ns > a.wall_ns,
            "vCPU {}",
            a.id
        );
    }
    let mut vmm = vmm;
    let (code, report) = vmm.wait();
    assert_eq!(code, 0, "both vCPUs exited with code 0: {report}");
    assert!(
        report["vcpus"][1]["guest_reported"]["iterations"].as_u64() > Some(0),
        "the neighbour worked: {report}"
    );
}
