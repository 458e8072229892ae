//! Accuracy of what the control socket and the PPA page's host section show while a VM runs:
//! the identity within its live tolerance, and the host records against `stats`. The exact
//! parts are in tests/api.rs and tests/ppa_page.rs.

use std::time::Duration;

use crate::common::page::HostSection;
use crate::common::serial;
use crate::common::vmm::Vmm;
use serde_json::json;

#[test]
fn live_stats_over_the_socket_hold_the_identity() {
    let _g = serial();
    let vmm = Vmm::start(
        "identity",
        &["--vcpus", "2", "--workload", "mixed:ms=60000"],
    );
    let mut c = vmm.connect();
    std::thread::sleep(Duration::from_millis(300));
    // Live stats satisfy the identity within 1 % while running.
    let a = c.stats();
    assert_eq!(a.vcpus.len(), 2);
    for v in &a.vcpus {
        assert!(
            v.identity_holds(false),
            "vCPU {}: identity error {} ns of {} ns wall",
            v.id,
            v.identity_error_ns,
            v.wall_ns
        );
    }
    let (code, _) = vmm.shutdown();
    assert_eq!(code, 0);
}

#[test]
fn the_host_section_matches_stats_and_holds_the_identity() {
    let _g = serial();
    let vmm = Vmm::with_page("page", &["--vcpus", "3", "--workload", "busy:ms=60000"]);
    let mut c = vmm.connect();
    // Long enough that 1 % of wall (the live identity's tolerance) is well above the
    // one-off start costs.
    std::thread::sleep(Duration::from_millis(1500));
    let page = HostSection::map(&vmm.page());
    for _ in 0..5 {
        let recs: Vec<_> = (0..3).map(|i| page.record(i)).collect();
        let s = c.ok(json!({"cmd": "stats"}));
        for (i, rec) in recs.iter().enumerate() {
            let v = &s["vcpus"][i];
            let g = |k: &str| v[k].as_u64().unwrap();
            // The record (refreshed every 10 ms) and the stats snapshot (up to 15 ms old) were
            // taken at slightly different times: used differs by at most the wall time between
            // them. Steal (schedstat run_delay) only moves when the waiting thread gets a CPU,
            // so it may also lag by one run-queue wait (under 30 ms for 3 vCPUs on 2 CPUs).
            let gap = g("wall_ns").abs_diff(rec.wall_ns);
            for (k, x, slack) in [
                ("used_ns", rec.used_ns, 1_000_000),
                ("steal_ns", rec.steal_ns, 30_000_000),
            ] {
                assert!(
                    g(k).abs_diff(x) <= gap + slack,
                    "vCPU {i} {k}: record {x}, stats {} ({gap} ns apart)",
                    g(k)
                );
            }
            // So does the live answer (a busy vCPU inside its first KVM_RUN has no exit yet).
            let err = v["identity_error_ns"].as_i64().unwrap();
            assert!(
                err.unsigned_abs() <= g("wall_ns") / 100,
                "vCPU {i} live: identity error {err} ns: {v}"
            );
            // The record holds the identity on its own (blocked_ns since layout 1.2).
            let sum = rec.used_ns
                + rec.steal_ns
                + rec.halted_ns
                + rec.idle_ns
                + rec.limited_ns
                + rec.paused_ns
                + rec.blocked_ns;
            assert!(
                rec.wall_ns.abs_diff(sum) <= rec.wall_ns / 100,
                "vCPU {i}: {rec:?}"
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(page);
    let (code, _) = vmm.shutdown();
    assert_eq!(code, 0);
}
