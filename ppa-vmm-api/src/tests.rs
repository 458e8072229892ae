//! Unit tests of request parsing and the wire shapes.

use super::*;
use serde_json::json;

fn parse(s: &str) -> Result<Request, (RequestId, ErrorBody)> {
    parse_request(s.as_bytes())
}

fn kind(s: &str) -> ErrorKind {
    parse(s).unwrap_err().1.kind
}

#[test]
fn parses_every_command() {
    let cases = [
        (r#"{"id":1,"cmd":"version"}"#, Command::Version {}),
        (r#"{"cmd":"stats"}"#, Command::Stats {}),
        (r#"{"cmd":"vcpu","vcpu":3}"#, Command::Vcpu { vcpu: 3 }),
        (
            r#"{"cmd":"histogram","name":"guest_run","format":"text"}"#,
            Command::Histogram {
                name: "guest_run".into(),
                vcpu: None,
                format: HistogramFormat::Text,
            },
        ),
        (r#"{"cmd":"reset"}"#, Command::Reset { vcpu: None }),
        (
            r#"{"cmd":"reset","vcpu":0}"#,
            Command::Reset { vcpu: Some(0) },
        ),
        (
            r#"{"cmd":"set-level","level":"full"}"#,
            Command::SetLevel { level: Level::Full },
        ),
        (
            r#"{"cmd":"set-thresholds","guest_run_ns":5000}"#,
            Command::SetThresholds {
                exit_handling_ns: None,
                guest_run_ns: Some(5000),
                wakeup_latency_ns: None,
                steal_window_ns: None,
            },
        ),
        (r#"{"cmd":"threads"}"#, Command::Threads {}),
        (
            r#"{"cmd":"set-limit","group":"vm","limit":"50%"}"#,
            Command::SetLimit {
                group: "vm".into(),
                limit: "50%".into(),
            },
        ),
        (
            r#"{"cmd":"set-pin","key":"net0-qp1","cpus":"0-3,6"}"#,
            Command::SetPin {
                key: "net0-qp1".into(),
                cpus: "0-3,6".into(),
            },
        ),
        (
            r#"{"cmd":"set-rate","device":"blk0","rate":"ops:1k/1s"}"#,
            Command::SetRate {
                device: "blk0".into(),
                rate: "ops:1k/1s".into(),
            },
        ),
        (r#"{"cmd":"groups"}"#, Command::Groups {}),
        (r#"{"cmd":"guest"}"#, Command::Guest {}),
        (r#"{"cmd":"guest-reset"}"#, Command::GuestReset {}),
        (r#"{"cmd":"pause"}"#, Command::Pause {}),
        (r#"{"cmd":"resume"}"#, Command::Resume {}),
        (r#"{"cmd":"shutdown"}"#, Command::Shutdown {}),
        (r#"{"cmd":"metrics"}"#, Command::Metrics {}),
        (
            r#"{"cmd":"subscribe","events":["vcpu-exit","threshold"]}"#,
            Command::Subscribe {
                events: vec![EventKind::VcpuExit, EventKind::Threshold],
                pressure: None,
            },
        ),
        (
            r#"{"cmd":"device","name":"net0"}"#,
            Command::Device {
                name: "net0".into(),
            },
        ),
        (r#"{"cmd":"pressure"}"#, Command::Pressure {}),
    ];
    let mut names: Vec<String> = cases
        .iter()
        .map(|(l, _)| serde_json::from_str::<Value>(l).unwrap()["cmd"].to_string())
        .collect();
    names.dedup();
    assert_eq!(names.len(), COMMANDS.len(), "every command is covered");
    for (line, want) in cases {
        let r = parse(line).unwrap_or_else(|e| panic!("{line}: {e:?}"));
        assert_eq!(r.command, want, "{line}");
        // Round trip through the client's encoder.
        let again = parse(&r.to_line()).unwrap();
        assert_eq!(again, r);
    }
    assert_eq!(parse(r#"{"id":"a","cmd":"stats"}"#).unwrap().id, json!("a"));
    assert_eq!(parse(r#"{"cmd":"stats"}"#).unwrap().id, Value::Null);
}

#[test]
fn a_key_given_twice_is_refused() {
    // serde_json's maps keep the last of two equal keys: the request must not be read at all.
    let (id, e) = parse(r#"{"id":1,"cmd":"version","cmd":"shutdown"}"#).unwrap_err();
    assert_eq!(e.kind, ErrorKind::BadRequest, "{e:?}");
    assert_eq!(id, json!(1), "the id is still echoed");
    assert!(e.message.contains("`cmd` more than once"), "{}", e.message);
    for line in [
        r#"{"cmd":"shutdown","cmd":"version"}"#,
        r#"{"cmd":"vcpu","vcpu":0,"vcpu":1}"#,
        r#"{"cmd":"set-limit","group":"a","limit":"5%","limit":"none"}"#,
        r#"{"cmd":"stats","cmd":"stats"}"#,
    ] {
        assert_eq!(kind(line), ErrorKind::BadRequest, "{line}");
    }
    // An id given twice is not echoed: neither can be trusted.
    let (id, e) = parse(r#"{"id":1,"id":2,"cmd":"version"}"#).unwrap_err();
    assert!(id.is_null(), "{id:?}");
    assert_eq!(e.kind, ErrorKind::BadRequest);
    // Inside nested objects too (the id, an argument).
    let (id, e) = parse(r#"{"id":{"a":1,"a":2},"cmd":"version"}"#).unwrap_err();
    assert_eq!(e.kind, ErrorKind::BadRequest);
    assert!(e.message.contains("`a` more than once"), "{}", e.message);
    assert_eq!(id.get(), r#"{"a":1,"a":2}"#);
    assert_eq!(
        kind(r#"{"cmd":"subscribe","events":[{"x":1,"x":1}]}"#),
        ErrorKind::BadRequest
    );
    // Equal keys in different objects are fine; bad JSON stays bad JSON.
    assert!(parse(r#"{"id":{"cmd":1},"cmd":"version"}"#).is_ok());
    assert_eq!(kind(r#"{"cmd":"version","cmd":"#), ErrorKind::BadJson);
}

#[test]
fn an_id_with_line_breaks_is_echoed_on_one_line() {
    // Found by the request fuzzer: raw line breaks between an id's tokens (a handler given a
    // request directly; the server splits lines at LF, but CR reaches it) were echoed, and the
    // response was no longer one line.
    for (id, echoed) in [
        ("[\n\n1,{\"a\":true}]", "[1,{\"a\":true}]"),
        ("[1,\r 2]", "[1, 2]"),
        ("{\"k\" :\r\n\"v w\"}", "{\"k\" :\"v w\"}"),
    ] {
        let line = format!(r#"{{"id":{id},"cmd":"version"}}"#);
        let r = parse(&line).unwrap_or_else(|e| panic!("{line:?}: {e:?}"));
        assert_eq!(r.id.get(), echoed, "{line:?}");
        assert_eq!(
            r.id.to_value(),
            serde_json::from_str::<serde_json::Value>(id).unwrap(),
            "the same value"
        );
        let resp = Response::ok(r.id.clone(), json!(null)).to_line();
        assert!(
            resp.ends_with('\n') && !resp.trim_end_matches('\n').contains(['\n', '\r']),
            "{resp:?}"
        );
        let bad = format!(r#"{{"id":{id},"cmd":"vcpu"}}"#);
        assert_eq!(parse(&bad).unwrap_err().0.get(), echoed, "{bad:?}");
    }
}

#[test]
fn the_id_is_echoed_exactly() {
    for id in [
        "1",
        "-7",
        "1.0",
        "1e2",
        "0.1",
        "18446744073709551617",
        "123456789012345678901234567890.000000000000000000001",
        "-0",
        r#""x-1""#,
        r#""\u00e9\n""#,
        "null",
        "true",
        r#"[1, {"a" : 2.50}]"#,
    ] {
        let line = format!(r#"{{"id":{id},"cmd":"version"}}"#);
        let r = parse(&line).unwrap_or_else(|e| panic!("{line}: {e:?}"));
        assert_eq!(r.id.get(), id, "{line}");
        let resp = Response::ok(r.id.clone(), json!(null)).to_line();
        assert!(
            resp.starts_with(&format!("{{\"id\":{id},")),
            "{line} -> {resp}"
        );
        // A client reading the response gets the same text back.
        let back: Response = serde_json::from_str(&resp).unwrap();
        assert_eq!(back.id, r.id);
        // And an error response too.
        let bad = format!(r#"{{"id":{id},"cmd":"vcpu"}}"#);
        assert_eq!(parse(&bad).unwrap_err().0.get(), id, "{bad}");
    }
    // The client's encoder writes the id as given.
    let r = Request {
        id: RequestId::from(18_446_744_073_709_551_615),
        command: Command::Version {},
    };
    assert_eq!(
        r.to_line(),
        r#"{"id":18446744073709551615,"cmd":"version"}"#
    );
}

#[test]
fn refuses_bad_requests_with_the_right_kind() {
    assert_eq!(kind("{"), ErrorKind::BadJson);
    let not_utf8 = parse_request(b"{\"cmd\":\"st\xffats\"}").unwrap_err().1;
    assert_eq!(not_utf8.kind, ErrorKind::BadJson, "{not_utf8:?}");
    assert_eq!(kind("[1,2]"), ErrorKind::BadJson);
    assert_eq!(kind("\"stats\""), ErrorKind::BadJson);
    assert_eq!(kind(r#"{"id":1}"#), ErrorKind::UnknownCommand);
    assert_eq!(kind(r#"{"cmd":7}"#), ErrorKind::UnknownCommand);
    assert_eq!(kind(r#"{"cmd":"stat"}"#), ErrorKind::UnknownCommand);
    assert_eq!(kind(r#"{"cmd":""}"#), ErrorKind::UnknownCommand);
    assert_eq!(
        kind(r#"{"cmd":"stats","verbose":true}"#),
        ErrorKind::BadRequest
    );
    assert_eq!(kind(r#"{"cmd":"version","x":1}"#), ErrorKind::BadRequest);
    assert_eq!(kind(r#"{"cmd":"vcpu"}"#), ErrorKind::BadRequest);
    assert_eq!(kind(r#"{"cmd":"vcpu","vcpu":-1}"#), ErrorKind::BadRequest);
    assert_eq!(kind(r#"{"cmd":"vcpu","vcpu":"0"}"#), ErrorKind::BadRequest);
    assert_eq!(
        kind(r#"{"cmd":"set-level","level":"max"}"#),
        ErrorKind::BadRequest
    );
    assert_eq!(
        kind(r#"{"cmd":"set-thresholds","guest_run":5}"#),
        ErrorKind::BadRequest
    );
    assert_eq!(
        kind(r#"{"cmd":"subscribe","events":["vm-exit","reboot"]}"#),
        ErrorKind::BadRequest
    );
    assert_eq!(
        kind(r#"{"cmd":"histogram","name":"x","format":"xml"}"#),
        ErrorKind::BadRequest
    );
    // The id survives an argument error, so the client can match the response.
    let (id, e) = parse(r#"{"id":42,"cmd":"vcpu","vcpu":"x"}"#).unwrap_err();
    assert_eq!(id, json!(42));
    assert!(e.message.contains("vcpu"), "{}", e.message);
}

#[test]
fn refuses_over_long_lines_before_parsing() {
    let mut line = br#"{"cmd":"stats","pad":""#.to_vec();
    line.resize(MAX_REQUEST_BYTES + 1, b'a');
    assert_eq!(parse_request(&line).unwrap_err().1.kind, ErrorKind::TooLong);
    let ok = br#"{"cmd":"stats"}"#;
    let mut padded = ok.to_vec();
    padded.resize(MAX_REQUEST_BYTES, b' ');
    assert!(parse_request(&padded).is_ok());
}

#[test]
fn responses_have_the_spec_shape() {
    let ok = Response::ok(json!(7), json!({"a": 1})).to_line();
    assert_eq!(ok, "{\"id\":7,\"ok\":true,\"result\":{\"a\":1}}\n");
    let err = Response::err(json!(null), ErrorBody::new(ErrorKind::NoSuchVcpu, "no")).to_line();
    assert_eq!(
        err,
        "{\"id\":null,\"ok\":false,\"error\":{\"kind\":\"no-such-vcpu\",\"message\":\"no\"}}\n"
    );
    let back: Response = serde_json::from_str(&err).unwrap();
    assert!(!back.ok);
    assert!(serde_json::from_str::<Response>(r#"{"id":1,"ok":true,"extra":1}"#).is_err());
}

#[test]
fn events_have_the_spec_shape() {
    let e = Event::VcpuExit {
        uptime_ns: 5,
        vcpu: 1,
        end: VcpuEndKind::Exited,
        exit_code: Some(0),
    };
    let line = e.to_line();
    assert!(line.starts_with("{\"event\":\"vcpu-exit\""), "{line}");
    assert_eq!(serde_json::from_str::<Event>(&line).unwrap(), e);
    assert_eq!(e.kind(), Some(EventKind::VcpuExit));
    assert_eq!(Event::Dropped { count: 3 }.kind(), None);
}

#[test]
fn levels_and_thresholds() {
    for l in [Level::Off, Level::Basic, Level::Full] {
        assert_eq!(l.name().parse::<Level>().unwrap(), l);
        assert_eq!(Level::from_u8(l as u8), l);
    }
    assert!("max"
        .parse::<Level>()
        .unwrap_err()
        .contains("off, basic or full"));
    let t = Thresholds {
        guest_run_ns: 1,
        steal_window_ns: 2,
        ..Default::default()
    };
    let u = ThresholdsUpdate {
        guest_run_ns: Some(9),
        ..Default::default()
    };
    let n = u.apply(t);
    assert_eq!((n.guest_run_ns, n.steal_window_ns), (9, 2));
}

/// Checks that every value of a names enum is spelt `expected` on the wire, in text and by
/// `FromStr`, in declaration order.
fn check_names<T>(all: &[T], expected: &[&str])
where
    T: Copy
        + PartialEq
        + std::fmt::Debug
        + std::fmt::Display
        + std::str::FromStr<Err = UnknownName>
        + serde::Serialize
        + serde::de::DeserializeOwned,
{
    assert_eq!(all.len(), expected.len());
    for (v, name) in all.iter().zip(expected) {
        assert_eq!(serde_json::to_string(v).unwrap(), format!("\"{name}\""));
        assert_eq!(v.to_string(), *name);
        assert_eq!(name.parse::<T>().unwrap(), *v);
        assert_eq!(serde_json::from_value::<T>(json!(name)).unwrap(), *v);
    }
    let e = "nonsense".parse::<T>().unwrap_err();
    assert_eq!(e.known, expected);
    assert!(e.to_string().starts_with("`nonsense` is not "), "{e}");
    assert!(serde_json::from_value::<T>(json!("nonsense")).is_err());
}

#[test]
fn names_keep_their_wire_spelling() {
    check_names(
        &VcpuMicroState::ALL,
        &["guest", "vmm", "idle", "limited", "paused", "finished"],
    );
    check_names(&SplitKind::ALL, &["exact", "estimated", "mixed", "none"]);
    check_names(
        &VmState::ALL,
        &["created", "running", "paused", "stopping", "finished"],
    );
    check_names(&VmEnd::ALL, &["completed", "failed", "timeout", "shutdown"]);
    check_names(&VcpuEndKind::ALL, &["exited", "failed", "error", "stopped"]);
    check_names(
        &ThreadState::ALL,
        &["created", "running", "parked", "finished"],
    );
    check_names(&LimitBackend::ALL, &["vmm", "cgroup"]);
    check_names(&LimitKick::ALL, &["timer", "limiter", "kernel"]);
    check_names(
        &Threshold::ALL,
        &[
            "exit_handling_ns",
            "guest_run_ns",
            "wakeup_latency_ns",
            "steal_window_ns",
        ],
    );
    check_names(&OverloadKind::ALL, &["runaway", "overload"]);
    check_names(&ThrottleEndWhy::ALL, &["period", "redistributed", "turn"]);
    assert_eq!(LimitBackend::default(), LimitBackend::Vmm);
    assert_eq!(
        format!("[{:>8}|{:<7}]", VmState::Running, VmEnd::Failed),
        "[ running|failed ]"
    );
    assert!(VmEnd::Completed.is_clean() && VmEnd::Shutdown.is_clean());
    assert!(!VmEnd::Failed.is_clean() && !VmEnd::Timeout.is_clean());
    assert_eq!(
        "max".parse::<Threshold>().unwrap_err().to_string(),
        "`max` is not a threshold (one of: exit_handling_ns, guest_run_ns, \
         wakeup_latency_ns, steal_window_ns)"
    );
}

#[test]
fn thresholds_by_name() {
    let mut t = Thresholds::default();
    for (i, th) in Threshold::ALL.into_iter().enumerate() {
        assert_eq!(th.index(), i);
        th.set(&mut t, 10 + i as u64);
    }
    let v = serde_json::to_value(t).unwrap();
    for th in Threshold::ALL {
        assert_eq!(th.of(&t), 10 + th.index() as u64);
        assert_eq!(v[th.as_str()], json!(th.of(&t)), "{th}");
    }
}

fn split() -> TimeSplit {
    TimeSplit {
        wall_ns: 1_000_000,
        used_ns: 600_000,
        guest_ns: 480_000,
        kvm_ns: 15_000,
        interrupted_ns: 5_000,
        vmm_ns: 100_000,
        steal_ns: 50_000,
        halted_ns: 40_000,
        idle_ns: 200_000,
        limited_ns: 60_000,
        paused_ns: 45_000,
        blocked_ns: 3_000,
    }
}

#[test]
fn time_split_identity() {
    let s = split();
    assert_eq!(s.accounted_ns(), 998_000);
    assert_eq!(s.identity_error_ns(), 2_000);
    // Stopped: max(0.5 % of wall, 200 µs) = 200 µs; running: 1 % = 10 µs.
    assert_eq!(TimeSplit::identity_tolerance_ns(1_000_000, true), 200_000);
    assert_eq!(
        TimeSplit::identity_tolerance_ns(1_000_000_000, true),
        5_000_000
    );
    assert_eq!(TimeSplit::identity_tolerance_ns(1_000_000, false), 10_000);
    assert!(s.identity_holds(true) && s.identity_holds(false));
    let over = TimeSplit {
        used_ns: 620_000,
        ..s
    };
    assert_eq!(over.identity_error_ns(), -18_000);
    assert!(over.identity_holds(true) && !over.identity_holds(false));
    assert!(identity_within(1_000_000, -15_000, true));
    assert!(!identity_within(1_000_000, -15_000, false));
}

#[test]
fn time_split_names_follow_the_fields() {
    let s = split();
    let v = serde_json::to_value(s).unwrap();
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    let names: Vec<String> = TimeSplit::NAMES.iter().map(|n| format!("{n}_ns")).collect();
    assert_eq!(keys.len(), names.len());
    for (name, value) in s.named() {
        assert_eq!(v[format!("{name}_ns")], json!(value), "{name}");
    }
    assert_eq!(TimeSplit::from_values(s.values()), s);
}

#[test]
fn time_split_deltas_and_resets() {
    let a = split();
    let mut b = a;
    b.wall_ns += 100;
    b.used_ns += 60;
    b.guest_ns -= 10;
    b.vmm_ns += 70;
    let d = b.since(&a);
    assert_eq!(
        (d.wall_ns, d.used_ns, d.guest_ns, d.vmm_ns),
        (100, 60, 0, 70)
    );
    assert_eq!(d.steal_ns + d.idle_ns + d.paused_ns, 0);
    assert!(!b.went_down_from(&a), "guest may move to vmm");
    for i in [0, 1, 6, 8, 9, 10] {
        let mut v = a.values();
        v[i] -= 1;
        assert!(
            TimeSplit::from_values(v).went_down_from(&a),
            "{}",
            TimeSplit::NAMES[i]
        );
    }
    // A live read's blocked time that turned into steal when the wait ended is no reset.
    let mut c = b;
    c.wall_ns += 100;
    c.steal_ns += 30;
    c.blocked_ns -= 20;
    c.halted_ns -= 1;
    assert!(!c.went_down_from(&b), "derived parts may go down live");
}

/// A vCPU's figures with every closed-set field set, to pin the JSON.
fn times() -> VcpuTimes {
    let s = split();
    VcpuTimes {
        id: 1,
        host_tid: 77,
        wall_ns: s.wall_ns,
        used_ns: s.used_ns,
        guest_ns: s.guest_ns,
        kvm_ns: Some(s.kvm_ns),
        interrupted_ns: Some(s.interrupted_ns),
        kvm_ns_estimate: Some(3),
        guest_code_ns_estimate: Some(4),
        parks: 2,
        vmm_ns: s.vmm_ns,
        steal_ns: s.steal_ns,
        halted_ns: s.halted_ns,
        idle_ns: s.idle_ns,
        limited_ns: s.limited_ns,
        paused_ns: s.paused_ns,
        blocked_ns: s.blocked_ns,
        split: SplitKind::Mixed,
        split_source: SplitSource::Records,
        records_lost: 1,
        records_preempted_ns: 0,
        records_on_cpu_ns: None,
        identity_error_ns: s.identity_error_ns(),
        state: VcpuMicroState::Limited,
        exits: [("hlt".to_string(), 5), ("io_out".to_string(), 0)].into(),
        exit_ns: Default::default(),
        kvm_ns_reason: None,
        interrupted_reason: None,
        kvm_exits: [("npf".to_string(), 7)].into(),
        kvm_exit_ns: [("npf".to_string(), 700)].into(),
        kvm_exits_to_user: 5,
        interrupts: [("local_timer".to_string(), 2)].into(),
        kvm_stats: Default::default(),
        host_cpus: Vec::new(),
        migrations: 0,
        thresholds: [(Threshold::GuestRun.to_string(), 9)].into(),
        kvm_run_wall_ns: 0,
        kvm_run_cpu_ns: Some(6),
        park_cpu_ns: 0,
        proc_ticks: None,
        overloads: 0,
        cpus: None,
        last_cpu: None,
        steal_before_start_ns: 5,
        stamp_clock: Some(StampClockMode::Tsc),
        stamp_clock_drifts: 1,
    }
}

#[test]
fn vcpu_figures_keep_their_json() {
    let t = times();
    assert_eq!(t.split(), split());
    assert_eq!(
        serde_json::to_string(&t).unwrap(),
        "{\"id\":1,\"host_tid\":77,\"wall_ns\":1000000,\"used_ns\":600000,\"guest_ns\":480000,\
         \"kvm_ns\":15000,\"interrupted_ns\":5000,\"kvm_ns_estimate\":3,\"guest_code_ns_estimate\":4,\"parks\":2,\
         \"vmm_ns\":100000,\"steal_ns\":50000,\"halted_ns\":40000,\"idle_ns\":200000,\
         \"limited_ns\":60000,\"paused_ns\":45000,\"blocked_ns\":3000,\"split\":\"mixed\",\
         \"split_source\":\"records\",\"records_lost\":1,\"records_preempted_ns\":0,\"records_on_cpu_ns\":null,\"identity_error_ns\":2000,\
         \"state\":\"limited\",\"exits\":{\"hlt\":5,\"io_out\":0},\"exit_ns\":{},\
         \"kvm_ns_reason\":null,\"interrupted_reason\":null,\"kvm_exits\":{\"npf\":7},\
         \"kvm_exit_ns\":{\"npf\":700},\"kvm_exits_to_user\":5,\"interrupts\":{\"local_timer\":2},\
         \"kvm_stats\":{},\
         \"host_cpus\":[],\"migrations\":0,\"thresholds\":{\"guest_run_ns\":9},\
         \"kvm_run_wall_ns\":0,\"kvm_run_cpu_ns\":6,\"park_cpu_ns\":0,\"proc_ticks\":null,\"overloads\":0,\
         \"cpus\":null,\"last_cpu\":null,\"steal_before_start_ns\":5,\"stamp_clock\":\"tsc\",\"stamp_clock_drifts\":1}"
    );
    let summary = VcpuSummary::from(t);
    assert_eq!(summary.split(), split());
    assert_eq!(
        serde_json::to_string(&summary).unwrap(),
        "{\"id\":1,\"host_tid\":77,\"state\":\"limited\",\"wall_ns\":1000000,\
         \"used_ns\":600000,\"guest_ns\":480000,\"kvm_ns\":15000,\"interrupted_ns\":5000,\
         \"vmm_ns\":100000,\
         \"steal_ns\":50000,\"halted_ns\":40000,\"idle_ns\":200000,\"limited_ns\":60000,\
         \"paused_ns\":45000,\"blocked_ns\":3000,\"identity_error_ns\":2000,\"parks\":2,\
         \"exits\":{\"hlt\":5},\
         \"overloads\":0,\"cpus\":null,\"last_cpu\":null}"
    );
    let back: VcpuSummary =
        serde_json::from_str(&serde_json::to_string(&summary).unwrap()).unwrap();
    assert_eq!(back, summary);
}

/// Why the wire structs keep the split's fields flat instead of a `#[serde(flatten)]`
/// member (time_split.rs): with flatten the keys come out in another order, so the JSON would
/// change. Flatten with `deny_unknown_fields` is documented as unsupported; serde 1.0.229
/// still refuses unknown keys, as checked here, but only after buffering the whole object.
#[test]
fn a_flattened_split_would_reorder_the_keys() {
    #[derive(serde::Serialize, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Flattened {
        id: usize,
        host_tid: i32,
        #[serde(flatten)]
        split: TimeSplit,
        kvm_ns_estimate: Option<u64>,
    }
    let t = times();
    let flat = Flattened {
        id: t.id,
        host_tid: t.host_tid,
        split: t.split(),
        kvm_ns_estimate: t.kvm_ns_estimate,
    };
    let wire = serde_json::to_string(&t).unwrap();
    let text = serde_json::to_string(&flat).unwrap();
    let at = |s: &str, key: &str| s.find(&format!("\"{key}\"")).unwrap();
    assert!(at(&wire, "kvm_ns_estimate") < at(&wire, "vmm_ns"), "{wire}");
    assert!(at(&text, "kvm_ns_estimate") > at(&text, "vmm_ns"), "{text}");
    let mut unknown: Value = serde_json::from_str(&text).unwrap();
    unknown["bogus"] = json!(1);
    assert!(serde_json::from_value::<Flattened>(unknown).is_err());
    assert!(serde_json::from_str::<Flattened>(&text).is_ok());
}

/// docs/control.md, whose examples these tests hold to the code.
const CONTROL_MD: &str = include_str!("../../docs/control.md");

#[test]
fn the_docs_quote_the_parsers_answers_word_for_word() {
    // Every quoted request line followed by its answer, where the answer comes from the
    // parser alone (bad JSON, an unknown command, bad arguments): the answer is the real one.
    let lines: Vec<&str> = CONTROL_MD.lines().map(str::trim).collect();
    let mut checked = Vec::new();
    for w in lines.windows(2) {
        let (req, want) = (w[0], w[1]);
        if !req.starts_with("{\"id\":") || !want.starts_with("{\"id\":") {
            continue;
        }
        let Ok(v) = serde_json::from_str::<Value>(want) else {
            continue;
        };
        if !matches!(
            v["error"]["kind"].as_str(),
            Some("bad-json" | "unknown-command" | "bad-request")
        ) {
            continue;
        }
        let (id, e) = parse_request(req.as_bytes())
            .err()
            .unwrap_or_else(|| panic!("docs/control.md: `{req}` is refused there"));
        assert_eq!(Response::err(id, e).to_line().trim_end(), want, "{req}");
        checked.push(req);
    }
    // The unknown command (with the whole list), a missing cmd, bad JSON, an unknown
    // argument, a missing one, a bad value, an unknown event kind, keys given twice.
    assert!(checked.len() >= 9, "{checked:#?}");
    assert!(checked.iter().any(|r| r.contains("frobnicate")));
}

#[test]
fn the_docs_name_every_event_kind() {
    let all: Vec<String> = EventKind::ALL
        .iter()
        .map(|k| {
            serde_json::to_value(k)
                .unwrap()
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    // `subscribe` without kinds: the result quoted is every kind, and the text counts them.
    let default = format!("\"result\":{{\"events\":{}}}", json!(all));
    assert!(
        CONTROL_MD.contains(&default),
        "docs/control.md lacks {default}"
    );
    assert_eq!(all.len(), 7, "docs/control.md says `the first seven`");
    assert!(CONTROL_MD
        .replace('\n', " ")
        .contains("every kind but `pressure` (the first seven);"));
    // The events table has a row for each, and for `dropped`.
    for kind in all.iter().map(String::as_str).chain(["dropped"]) {
        let row = format!("| `{kind}` |");
        assert!(
            CONTROL_MD.contains(&row),
            "docs/control.md lacks the row {row}"
        );
    }
}

#[test]
fn a_bare_command_parses_as_the_general_path_does() {
    use crate::request::{bare_command, parse_general};
    for name in ["stats", "version", "threads", "groups", "guest", "metrics"] {
        for line in [
            format!(r#"{{"cmd":"{name}"}}"#),
            format!(" \t{{\"cmd\":\"{name}\"}}\r"),
        ] {
            let general = parse_general(line.as_bytes()).unwrap();
            assert!(bare_command(line.as_bytes()).is_some(), "{line:?}");
            assert_eq!(parse(&line).unwrap(), general, "{line:?}");
            assert!(general.id.is_null());
        }
    }
    // Everything else takes the general path: ids, other spellings, arguments, commands that
    // change state, unknown ones, and a repeated `cmd` (which is refused there).
    for line in [
        r#"{"id":1,"cmd":"stats"}"#,
        r#"{ "cmd":"stats"}"#,
        r#"{"cmd":"st\u0061ts"}"#,
        r#"{"cmd":"vcpu"}"#,
        r#"{"cmd":"shutdown"}"#,
        r#"{"cmd":"pause"}"#,
        r#"{"cmd":"stats"}}"#,
        r#"{"cmd":"stats","cmd":"shutdown"}"#,
        r#"{"cmd":"Stats"}"#,
        r#"{"cmd":""}"#,
    ] {
        assert!(bare_command(line.as_bytes()).is_none(), "{line}");
        assert_eq!(
            format!("{:?}", parse(line)),
            format!("{:?}", parse_general(line.as_bytes())),
            "{line}"
        );
    }
    assert_eq!(
        kind(r#"{"cmd":"stats","cmd":"shutdown"}"#),
        ErrorKind::BadRequest
    );
    assert_eq!(
        parse(r#"{"cmd":"st\u0061ts"}"#).unwrap().command,
        Command::Stats {}
    );
}
