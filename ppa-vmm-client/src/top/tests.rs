//! Unit tests of `top` (rates, totals, rendering and the run loop against a fake VMM).

use super::*;
use crate::tests::{stats, vcpu, FakeServer, CLOSE};
use ppa_vmm_api::Response;

const MS: u64 = 1_000_000;
const S: u64 = 1_000 * MS;

fn rates(row: &Row) -> &Rates {
    row.rates.as_ref().expect("the row has rates")
}

/// Two samples 1 s apart: vCPU 0 used 250 ms (200 guest, 50 VMM), 100 ms steal, 20 io_out
/// and 5 hlt exits; vCPU 1 used 900 ms and 1000 mmio_write exits.
fn samples() -> (Stats, Stats) {
    let p0 = vcpu(0, 10 * S, 4 * S, &[("io_out", 100), ("hlt", 10)]);
    let p1 = vcpu(1, 10 * S, 2 * S, &[("mmio_write", 50)]);
    let mut c0 = vcpu(0, 11 * S, 4 * S + 250 * MS, &[("io_out", 120), ("hlt", 15)]);
    c0.guest_ns = 4 * S + 200 * MS;
    c0.vmm_ns = 50 * MS;
    c0.steal_ns = 100 * MS;
    c0.idle_ns = p0.idle_ns + 600 * MS;
    c0.halted_ns = 50 * MS;
    let c1 = vcpu(1, 11 * S, 2 * S + 900 * MS, &[("mmio_write", 1050)]);
    (stats(&[p0, p1], 10), stats(&[c0, c1], 11))
}

#[test]
fn rates_over_the_interval() {
    let (prev, cur) = samples();
    let r = rows(&prev, &cur);
    assert_eq!(r.len(), 2);
    let a = rates(&r[0]);
    assert_eq!(a.used_pct, 25.0);
    assert_eq!(a.guest_pct, 20.0);
    assert_eq!(a.vmm_pct, 5.0);
    assert_eq!(a.rdy_pct, 10.0);
    assert_eq!(a.idle_pct, 65.0);
    assert_eq!(a.lmtd_pct, 0.0);
    assert_eq!(a.exits_per_s, 25.0);
    assert_eq!(a.top_exit(), Some("io_out"));
    assert_eq!(r[0].tid, 1000);
    let b = rates(&r[1]);
    assert_eq!(b.used_pct, 90.0);
    assert_eq!(b.exits_per_s, 1000.0);
    assert_eq!(b.top_exit(), Some("mmio_write"));

    let t = total(&r);
    assert_eq!(t.vcpu, None);
    let t = rates(&t);
    assert_eq!(t.used_pct, 115.0);
    assert_eq!(t.exits_per_s, 1025.0);
    assert_eq!(t.top_exit(), Some("mmio_write"));
}

#[test]
fn sys_is_kvm_time_where_measured_and_the_total_has_it_only_if_every_row_does() {
    let (mut prev, mut cur) = samples();
    // vCPU 0 measured kvm_ns: 30 ms of its 200 ms inside KVM_RUN went to KVM.
    prev.vcpus[0].kvm_ns = Some(100 * MS);
    cur.vcpus[0].kvm_ns = Some(130 * MS);
    cur.vcpus[0].guest_ns -= 130 * MS;
    prev.vcpus[0].guest_ns -= 100 * MS;
    let r = rows(&prev, &cur);
    assert_eq!(rates(&r[0]).sys_pct, Some(3.0));
    assert_eq!(rates(&r[0]).guest_pct, 17.0);
    assert_eq!(rates(&r[1]).sys_pct, None, "vCPU 1 has no kvm_ns");
    assert_eq!(rates(&total(&r)).sys_pct, None);
    let line = cells(&r[1]);
    assert_eq!(line[4], "-", "{line:?}");
    assert_eq!(cells(&r[0])[4], "3.0");
    for v in [&mut prev.vcpus[1], &mut cur.vcpus[1]] {
        v.kvm_ns = Some(0);
    }
    let r = rows(&prev, &cur);
    assert_eq!(rates(&total(&r)).sys_pct, Some(3.0));
    let mut sorted = r.clone();
    sort_rows(&mut sorted, SortKey::Sys);
    assert_eq!(sorted[0].vcpu, Some(0));
}

#[test]
fn no_exits_and_half_intervals() {
    let prev = stats(&[vcpu(0, S, 0, &[("hlt", 3)])], 1);
    let cur = stats(&[vcpu(0, S + 500 * MS, 125 * MS, &[("hlt", 3)])], 2);
    let r = rows(&prev, &cur);
    assert_eq!(rates(&r[0]).used_pct, 25.0);
    assert_eq!(rates(&r[0]).exits_per_s, 0.0);
    assert_eq!(rates(&r[0]).top_exit(), None);
    // The same sample twice: no time passed, no rates, but no reset either.
    let r = rows(&cur, &cur);
    assert!(r[0].rates.is_none() && !r[0].reset);
}

#[test]
fn a_reset_between_samples_flags_the_row() {
    let (prev, mut cur) = samples();
    // vCPU 1 was reset half a second ago: its counters restarted from zero.
    cur.vcpus[1] = vcpu(1, 500 * MS, 400 * MS, &[("mmio_write", 7)]).into();
    let r = rows(&prev, &cur);
    assert!(!r[0].reset && r[0].rates.is_some());
    assert!(r[1].reset && r[1].rates.is_none());
    let t = total(&r);
    assert!(t.reset && t.rates.is_none());
    // A reset shows only through an exit counter going down.
    let (prev, mut cur) = samples();
    cur.vcpus[0].exits.insert("hlt".into(), 1);
    assert!(rows(&prev, &cur)[0].reset);
    // The next refresh uses the new baseline.
    let mut next = cur.clone();
    next.vcpus[0].wall_ns += S;
    next.vcpus[0].used_ns += 500 * MS;
    next.vcpus[0].idle_ns += 500 * MS;
    let r = rows(&cur, &next);
    assert!(!r[0].reset);
    assert_eq!(rates(&r[0]).used_pct, 50.0);
}

#[test]
fn vcpus_in_one_sample_only_are_left_out() {
    let (prev, mut cur) = samples();
    cur.vcpus.push(vcpu(2, S, S, &[]).into());
    cur.vcpus.swap(0, 2);
    let r = rows(&prev, &cur);
    assert_eq!(
        r.iter().map(|r| r.vcpu).collect::<Vec<_>>(),
        [Some(0), Some(1)]
    );
}

/// `top`'s arguments as the binary parses them.
#[derive(Debug, clap::Parser)]
struct Cli {
    #[command(flatten)]
    top: TopOptions,
}

fn parse(args: &[&str]) -> Result<TopOptions, clap::Error> {
    use clap::Parser;
    let argv = ["top", "--api-sock", "s"].iter().chain(args);
    Cli::try_parse_from(argv).map(|c| c.top)
}

#[test]
fn options_parse_as_documented() {
    let o = parse(&[]).unwrap();
    assert_eq!(
        (o.once, o.interval_ms, o.sort),
        (false, 1000, SortKey::Vcpu)
    );
    let o = parse(&["--once", "--interval", "200", "--sort", "exits"]).unwrap();
    assert_eq!((o.once, o.interval_ms, o.sort), (true, 200, SortKey::Exits));
}

#[test]
fn sort_keys_ignore_case_and_take_the_header_suffix() {
    let sort = |k: &str| parse(&["--sort", k]).map(|o| o.sort);
    assert_eq!(sort("USED").unwrap(), SortKey::Used);
    assert_eq!(sort("rdy%").unwrap(), SortKey::Rdy);
    assert_eq!(sort("Exits/s").unwrap(), SortKey::Exits);
    assert_eq!(sort("LMTD%").unwrap(), SortKey::Lmtd);
    // A name that is no column is refused with the list of columns.
    let e = sort("tid").unwrap_err();
    assert_eq!(e.kind(), clap::error::ErrorKind::InvalidValue);
    let msg = e.to_string();
    assert!(msg.contains("'tid'"), "{msg}");
    assert!(
        msg.contains("vcpu, used, guest, sys, vmm, rdy, idle, lmtd, psd, exits"),
        "the columns, and not the aliases: {msg}"
    );
}

#[test]
fn sort_rows_by_each_kind_of_column() {
    let (prev, mut cur) = samples();
    cur.vcpus.push(vcpu(2, S, 0, &[]).into());
    let mut prev = prev;
    prev.vcpus.push(vcpu(2, 0, 0, &[]).into());
    let mut r = rows(&prev, &cur);
    let ids = |r: &[Row]| r.iter().map(|r| r.vcpu.unwrap()).collect::<Vec<_>>();
    sort_rows(&mut r, SortKey::Used);
    assert_eq!(ids(&r), [1, 0, 2]);
    sort_rows(&mut r, SortKey::Rdy);
    assert_eq!(ids(&r), [0, 1, 2]);
    sort_rows(&mut r, SortKey::Idle);
    assert_eq!(ids(&r), [2, 0, 1]);
    sort_rows(&mut r, SortKey::Vcpu);
    assert_eq!(ids(&r), [0, 1, 2]);
    r[0].rates = None;
    sort_rows(&mut r, SortKey::Exits);
    assert_eq!(ids(&r), [1, 2, 0], "rows without rates go last");
}

#[test]
fn render_has_a_line_per_vcpu_and_the_total() {
    let (prev, mut cur) = samples();
    cur.vcpus[1] = vcpu(1, 500 * MS, 400 * MS, &[]).into();
    cur.vm.pressure.some.avg10 = 12.5;
    let r = rows(&prev, &cur);
    let text = render(&r, &total(&r), &cur.vm, SortKey::Used);
    println!("{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2 + 1 + 2 + 1, "{text}");
    assert!(lines[0].contains("vm test") && lines[0].contains("vcpus 2"));
    assert!(
        lines[0].contains("pressure some 12.50 % full 0.00 % (avg10)"),
        "{text}"
    );
    assert!(lines[0].contains("level full") && lines[0].contains("uptime 11.000 s"));
    assert!(lines[2].starts_with("VCPU") && lines[2].ends_with("TOP-EXIT"));
    assert!(
        lines[3].starts_with("   0") && lines[3].ends_with("io_out"),
        "{text}"
    );
    assert!(
        lines[4].starts_with("   1") && lines[4].ends_with("(reset)"),
        "{text}"
    );
    assert!(lines[5].starts_with("  VM"), "{text}");
    // Columns line up: every header ends where its numbers end.
    let end = lines[2].find("USED%").unwrap() + "USED%".len();
    assert_eq!(&lines[3][end - 4..end], "25.0");
    assert_eq!(&lines[4][end - 1..end], "-");
}

#[test]
fn render_a_four_vcpu_vm() {
    let prev = stats(
        &(0..4)
            .map(|i| vcpu(i, 10 * S, S, &[("io_out", 10)]))
            .collect::<Vec<_>>(),
        10,
    );
    let cur = stats(
        &(0..4)
            .map(|i| {
                let mut v = vcpu(i, 11 * S, 2 * S, &[("io_out", 10 + 1000 * i as u64)]);
                v.idle_ns = prev.vcpus[i].idle_ns;
                v
            })
            .collect::<Vec<_>>(),
        11,
    );
    let r = rows(&prev, &cur);
    let t = total(&r);
    assert_eq!(rates(&t).used_pct, 400.0);
    let text = render(&r, &t, &cur.vm, SortKey::Exits);
    println!("{text}");
    assert_eq!(text.lines().count(), 3 + 4 + 1);
    assert!(text.lines().nth(3).unwrap().starts_with("   3"), "{text}");
}

fn top_opts(sock: &std::path::Path, once: bool, interval_ms: u64, sort: SortKey) -> TopOptions {
    TopOptions {
        api_sock: sock.to_path_buf(),
        once,
        interval_ms,
        sort,
    }
}

/// A VMM that answers `subscribe`, then `stats` with `answers` in turn; after them it
/// closes the connection, first sending the vm-exit event when `vm_exit`.
fn fake_vmm(answers: Vec<Stats>, vm_exit: bool) -> FakeServer {
    let next = std::sync::atomic::AtomicUsize::new(0);
    FakeServer::start(move |req, _| match req.command {
        Command::Subscribe { .. } => {
            vec![Response::ok(req.id, serde_json::json!({"events": ["vm-exit"]})).to_line()]
        }
        // A VM without a PPA page, as the VMM answers: the guest pane is off (the pane's own
        // tests give it a page). Before, this took the next sample and `top` drew one table
        // fewer.
        Command::Guest {} => vec![Response::err(
            req.id,
            ppa_vmm_api::ErrorBody::new(ppa_vmm_api::ErrorKind::InvalidState, "no PPA page"),
        )
        .to_line()],
        _ => {
            let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            match answers.get(n) {
                Some(s) => {
                    vec![Response::ok(req.id, serde_json::to_value(s).unwrap()).to_line()]
                }
                None if vm_exit => vec![
                    "{\"event\":\"vm-exit\",\"uptime_ns\":9,\"end\":\"completed\"}\n".into(),
                    CLOSE.into(),
                ],
                None => Vec::new(),
            }
        }
    })
}

#[test]
fn run_once_and_until_the_vm_ends() {
    let (prev, cur) = samples();
    let server = fake_vmm(vec![prev, cur], true);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run_to(
        top_opts(server.path(), true, 10, SortKey::Vcpu),
        &mut out,
        &mut err,
    );
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    let text = String::from_utf8_lossy(&out);
    assert!(!text.contains(CLEAR));
    assert_eq!(text.lines().count(), 6, "{text}");

    let (prev, cur) = samples();
    let server = fake_vmm(vec![prev, cur], true);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run_to(
        top_opts(server.path(), false, 10, SortKey::Used),
        &mut out,
        &mut err,
    );
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    let text = String::from_utf8_lossy(&out);
    assert_eq!(text.matches(CLEAR).count(), 1, "{text}");
    assert!(text.ends_with("The VM has ended (completed).\n"), "{text}");
}

/// Issue 28: `top` wrote screen escape codes into a pipe; off a terminal its tables follow
/// each other as plain text.
#[test]
fn off_a_terminal_the_tables_are_plain_text() {
    let (prev, cur) = samples();
    let (cur2, _) = samples();
    let server = fake_vmm(vec![prev, cur, cur2], true);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run_on(
        top_opts(server.path(), false, 10, SortKey::Vcpu),
        &mut out,
        &mut err,
        Screen::Plain,
    );
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    let text = String::from_utf8_lossy(&out);
    assert!(!text.contains('\x1b'), "{text:?}");
    assert!(text.starts_with("ppa-vmm top - "), "{text}");
    assert!(text.contains("\n\nppa-vmm top - "), "{text}");
}

#[test]
fn a_killed_vmm_is_an_error() {
    let (prev, cur) = samples();
    let server = fake_vmm(vec![prev, cur], false);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run_to(
        top_opts(server.path(), false, 10, SortKey::Vcpu),
        &mut out,
        &mut err,
    );
    assert_eq!(code, crate::EXIT_VMM_LOST);
    let err = String::from_utf8_lossy(&err);
    assert!(err.starts_with("ppa-vmm top: the VMM closed"), "{err}");
    assert!(!String::from_utf8_lossy(&out).contains("has ended"));
}

#[test]
fn finished_vcpus_show_their_final_figures() {
    // vCPU 1 finished before the interval: its counters did not move.
    let (prev, mut cur) = samples();
    let mut done = prev.vcpus[1].clone();
    done.state = VcpuMicroState::Finished;
    cur.vcpus[1] = done.clone();
    let mut before = prev.clone();
    before.vcpus[1] = done;
    let r = rows(&before, &cur);
    assert!(r[1].finished && !r[1].reset, "{:?}", r[1]);
    // Over its whole life: 2 s used of 10 s, 50 exits.
    let life = rates(&r[1]);
    assert_eq!(life.used_pct, 20.0);
    assert_eq!(life.exits_per_s, 5.0);
    // The total is vCPU 0's interval alone, not `-`.
    let t = total(&r);
    assert_eq!(rates(&t).used_pct, 25.0, "{t:?}");
    let text = render(&r, &t, &cur.vm, SortKey::Vcpu);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[4].ends_with("(finished)"), "{text}");
    assert!(lines[4].contains("20.0"), "{text}");
    assert!(
        lines[5].starts_with("  VM") && lines[5].contains("25.0"),
        "{text}"
    );
    // A vCPU that ended halfway through the interval counts for the half it ran.
    let (prev, mut cur) = samples();
    cur.vcpus[1].wall_ns = prev.vcpus[1].wall_ns + 500 * MS;
    cur.vcpus[1].used_ns = prev.vcpus[1].used_ns + 500 * MS;
    cur.vcpus[1].guest_ns = cur.vcpus[1].used_ns;
    cur.vcpus[1].state = VcpuMicroState::Finished;
    let r = rows(&prev, &cur);
    assert!(!r[1].finished);
    assert_eq!(rates(&r[1]).used_pct, 100.0);
    assert_eq!(rates(&total(&r)).used_pct, 25.0 + 50.0);
    // Every vCPU finished: the VM used nothing.
    let (prev, mut cur) = samples();
    for v in &mut cur.vcpus {
        v.state = VcpuMicroState::Finished;
    }
    let r = rows(&cur, &cur);
    let t = total(&r);
    assert_eq!(rates(&t).used_pct, 0.0);
    assert!(r.iter().all(|r| r.finished));
    drop(prev);
}

#[test]
fn run_refuses_a_short_interval() {
    let server = FakeServer::start(|_, _| Vec::new());
    let (mut out, mut err) = (Vec::new(), Vec::new());
    assert_eq!(
        run_to(
            top_opts(server.path(), true, 5, SortKey::Vcpu),
            &mut out,
            &mut err
        ),
        2
    );
    assert_eq!(
        String::from_utf8_lossy(&err),
        "ppa-vmm top: the interval must be at least 10 ms, not 5 ms\n"
    );
}
