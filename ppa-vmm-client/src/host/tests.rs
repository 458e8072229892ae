//! The host view on synthetic answers: list rows, top rows, the merged exposition.

use super::serve::{render, Compat};
use super::table;
use super::*;
use crate::rundir::{Descriptor, Scan};
use crate::tests::{stats, vcpu};

const MS: u64 = 1_000_000;
const S: u64 = 1_000 * MS;

fn descriptor(name: &str, pid: u32) -> Descriptor {
    Descriptor {
        name: name.into(),
        pid,
        proc_start: 1,
        started_realtime_ns: 0,
        version: "0.1.0".into(),
        vcpus: 2,
        socket: Some(PathBuf::from(format!("/run/x/{name}.sock"))),
    }
}

/// VM `a` answered twice 0.5 s apart (vCPU 0 used 250 ms, vCPU 1 100 ms, 50 ms of other
/// threads); VM `b` did not answer.
fn views() -> Vec<VmView> {
    let mut first = stats(&[vcpu(0, 10 * S, 4 * S, &[]), vcpu(1, 10 * S, S, &[])], 10);
    first.vm.host_threads_ns = 100 * MS;
    let mut c0 = vcpu(0, 10 * S + 500 * MS, 4 * S + 250 * MS, &[]);
    c0.steal_ns += 40 * MS;
    let mut second = stats(&[c0, vcpu(1, 10 * S + 500 * MS, S + 100 * MS, &[])], 10);
    second.vm.host_threads_ns = 150 * MS;
    second.vm.pressure.some.avg10 = 7.5;
    vec![
        VmView {
            descriptor: descriptor("a", 11),
            answer: Ok(Answer {
                stats: vec![first, second],
                interval_s: 0.5,
                metrics: Some(
                    "# HELP ppa_vm_vcpus Number of vCPUs.\n# TYPE ppa_vm_vcpus gauge\n\
                     ppa_vm_vcpus{vm=\"a\"} 2\n"
                        .into(),
                ),
            }),
        },
        VmView {
            descriptor: descriptor("b", 12),
            answer: Err(AskError::NoAnswer { waited_ms: 800 }),
        },
    ]
}

#[test]
fn list_rows_give_state_and_cpu_now_or_why_not() {
    let rows = list_rows(&views());
    assert_eq!(rows.len(), 2);
    assert_eq!(
        (rows[0].name.as_str(), rows[0].pid, rows[0].state.as_str()),
        ("a", 11, "running")
    );
    // (250 + 100 + 50) ms of CPU in 0.5 s: 80 % of one CPU.
    assert_eq!(rows[0].cpu_percent, Some(80.0));
    assert_eq!(rows[0].uptime_ns, Some(10 * S));
    assert_eq!(
        (rows[1].state.as_str(), rows[1].cpu_percent),
        ("not-answering", None)
    );
    assert!(rows[1].error.as_deref().unwrap().contains("no answer"));
    let json: serde_json::Value = serde_json::to_value(&rows).unwrap();
    for key in ["name", "pid", "state", "vcpus", "uptime_ns", "socket"] {
        assert!(json[0].get(key).is_some(), "{key} in {json}");
    }
    let text = list_text(
        &rows,
        &Scan {
            foreign: 2,
            ..Scan::default()
        },
    );
    assert!(text.lines().nth(1).unwrap().starts_with("a "), "{text}");
    assert!(text.contains("2 entries of other users skipped"), "{text}");
}

/// Issue 39, item 10: a `not-answering` row pushed its columns out of line (STATE was 12
/// wide), a long name did the same, and a VM that did not answer showed uptime 0.0.
#[test]
fn list_columns_stay_in_line_and_an_unknown_uptime_says_so() {
    let mut v = views();
    v.push(VmView {
        descriptor: descriptor("a-name-of-more-than-24-characters", 13),
        answer: Err(AskError::Closed),
    });
    let rows = list_rows(&v);
    assert_eq!(rows[1].uptime_ns, None);
    let json = serde_json::to_value(&rows).unwrap();
    assert_eq!(json[1]["uptime_ns"], serde_json::Value::Null);
    assert_eq!(json[0]["uptime_ns"], serde_json::json!(10 * S));
    let text = list_text(&rows, &Scan::default());
    let lines: Vec<&str> = text.lines().collect();
    let at = |h: &str| lines[0].find(h).unwrap();
    let end = |h: &str| at(h) + h.len();
    for (l, (name, state)) in lines[1..].iter().zip([
        ("a", "running"),
        ("b", "not-answering"),
        ("a-name-of-more-than-24-characters", "unreachable"),
    ]) {
        assert!(l.starts_with(name), "{text}");
        assert_eq!(&l[at("STATE")..at("STATE") + state.len()], state, "{text}");
        assert_eq!(l.find("/run/x/"), Some(at("SOCKET")), "{text}");
        // Right-aligned: the figures end where their headings end.
        assert_ne!(l.as_bytes()[end("UPTIME s") - 1], b' ', "{text}");
        assert_eq!(l.as_bytes()[end("UPTIME s")], b' ', "{text}");
    }
    assert_eq!(
        lines[2][..end("UPTIME s")].split_whitespace().last(),
        Some("unknown"),
        "{text}"
    );
    assert_eq!(
        lines[1][..end("UPTIME s")].split_whitespace().last(),
        Some("10.0"),
        "{text}"
    );
}

#[test]
fn top_rows_sum_the_vcpus_and_expand_on_request() {
    let groups = table::rows(&views(), &["a".to_string()], "used");
    assert_eq!(groups.len(), 2);
    let vm = &groups[0][0];
    assert_eq!(vm.name, "a");
    assert_eq!((vm.used, vm.rdy), (70.0, 8.0));
    assert_eq!(vm.dev, Some(10.0));
    assert_eq!(vm.some, Some(7.5));
    assert_eq!(groups[0].len(), 3, "the VM and its two vCPUs");
    assert_eq!(
        (groups[0][1].name.as_str(), groups[0][1].used),
        ("a/0", 50.0)
    );
    assert!(groups[1][0].error.is_some());
    let text = table::render(&groups, 0.5);
    assert!(text.contains("USED%") && text.contains("a/1"), "{text}");
    // Not expanded: one row.
    assert_eq!(table::rows(&views(), &[], "name")[0].len(), 1);
}

#[test]
fn the_exposition_merges_the_vms_and_adds_totals_and_compat_series() {
    let mut v = views();
    // A second VM that answered, with the same family: one HELP and TYPE for both.
    let mut b = v[0].clone();
    b.descriptor = descriptor("b", 12);
    if let Ok(a) = &mut b.answer {
        a.metrics = Some(
            "# HELP ppa_vm_vcpus Number of vCPUs.\n# TYPE ppa_vm_vcpus gauge\nppa_vm_vcpus{vm=\"b\"} 2\n"
                .into(),
        );
    }
    v[1] = b;
    let text = render(
        &v,
        &Scan::default(),
        &[Compat::Kubevirt, Compat::Libvirt],
        Duration::from_millis(3),
    );
    assert_eq!(
        text.matches("# TYPE ppa_vm_vcpus gauge").count(),
        1,
        "{text}"
    );
    assert!(
        text.contains("ppa_vm_vcpus{vm=\"a\"} 2\nppa_vm_vcpus{vm=\"b\"} 2\n"),
        "{text}"
    );
    assert!(text.contains("ppa_host_vms 2\n"));
    assert!(text.contains("ppa_host_vm_up{vm=\"a\"} 1\n"));
    assert!(text.contains(
        "kubevirt_vmi_vcpu_seconds_total{name=\"a\",namespace=\"\",id=\"0\",state=\"running\"} 4.250000000\n"
    ), "{text}");
    assert!(
        text.contains("kubevirt_vmi_vcpu_delay_seconds_total{name=\"a\",namespace=\"\",id=\"0\"} ")
    );
    assert!(text
        .contains("libvirt_domain_vcpu_time_seconds_total{domain=\"b\",vcpu=\"1\"} 1.100000000\n"));
    assert!(text.contains("libvirt_domain_vcpu_delay_seconds_total{domain=\"a\",vcpu=\"1\"} "));
    // Without --compat none of them.
    let plain = render(&v, &Scan::default(), &[], Duration::ZERO);
    assert!(!plain.contains("kubevirt_") && !plain.contains("libvirt_"));
    // A VM that did not answer: up 0, and its series absent.
    let mut gone = views();
    gone.remove(0);
    let text = render(&gone, &Scan::default(), &[], Duration::ZERO);
    assert!(text.contains("ppa_host_vm_up{vm=\"b\"} 0\n") && !text.contains("ppa_vm_vcpus"));
}
