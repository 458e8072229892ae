//! Unit tests of `ctl` (argument parsing, text output and the run loop against a fake VMM).

use super::*;
use crate::tests::{stats, vcpu, FakeServer, CLOSE};
use ppa_vmm_api::{ErrorKind, EventKind, HistogramFormat, HistogramJson, Level, Response};

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

#[test]
fn parses_commands_and_values() {
    assert_eq!(parse_command("stats", &[]).unwrap(), Command::Stats {});
    assert_eq!(
        parse_command("vcpu", &args(&["vcpu=0"])).unwrap(),
        Command::Vcpu { vcpu: 0 }
    );
    assert_eq!(
        parse_command("set-level", &args(&["level=full"])).unwrap(),
        Command::SetLevel { level: Level::Full }
    );
    assert_eq!(
        parse_command("histogram", &args(&["name=guest_run", "format=text"])).unwrap(),
        Command::Histogram {
            name: "guest_run".into(),
            vcpu: None,
            format: HistogramFormat::Text
        }
    );
    assert_eq!(
        parse_command(
            "set-thresholds",
            &args(&["guest_run_ns=5000", "steal_window_ns=null"])
        )
        .unwrap(),
        Command::SetThresholds {
            exit_handling_ns: None,
            guest_run_ns: Some(5000),
            wakeup_latency_ns: None,
            steal_window_ns: None
        }
    );
}

#[test]
fn subscribe_takes_json_or_comma_lists() {
    let both = Command::Subscribe {
        events: vec![EventKind::VcpuExit, EventKind::Threshold],
        pressure: None,
    };
    assert_eq!(
        parse_command("subscribe", &args(&[r#"events=["vcpu-exit","threshold"]"#])).unwrap(),
        both
    );
    assert_eq!(
        parse_command("subscribe", &args(&["events=vcpu-exit,threshold"])).unwrap(),
        both
    );
    assert_eq!(
        parse_command("subscribe", &args(&["events=vm-exit"])).unwrap(),
        Command::Subscribe {
            events: vec![EventKind::VmExit],
            pressure: None,
        }
    );
    assert_eq!(
        parse_command("subscribe", &[]).unwrap(),
        Command::Subscribe {
            events: vec![],
            pressure: None,
        }
    );
    assert!(parse_command("subscribe", &args(&["events=vcpu-exit,bogus"])).is_err());
}

fn refused(cmd: &str, a: &[&str]) -> ErrorBody {
    match parse_command(cmd, &args(a)) {
        Err(CtlError::Refused(body)) => body,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn refuses_an_unknown_command_with_the_list() {
    let e = parse_command("frobnicate", &args(&["x=1"])).unwrap_err();
    assert!(matches!(e, CtlError::UnknownCommand(_)), "{e:?}");
    let msg = e.to_string();
    assert!(msg.starts_with("unknown command `frobnicate`"), "{msg}");
    assert!(
        msg.contains("version, stats,")
            && msg.contains("set-limit, set-pin, set-rate, groups, guest,"),
        "{msg}"
    );
    assert!(msg.contains("ppa-vmm ctl --help"), "{msg}");
}

#[test]
fn the_docs_quote_the_unknown_command_message() {
    let docs = include_str!("../../../docs/control.md");
    let msg = format!(
        "{PREFIX}: {}",
        CtlError::UnknownCommand("frobnicate".into())
    );
    assert!(docs.contains(&msg), "docs/control.md lacks `{msg}`");
}

#[test]
fn refuses_what_the_server_would() {
    let e = refused("vcpu", &["vcpu=abc"]);
    assert_eq!(e.kind, ErrorKind::BadRequest);
    assert!(e.message.contains("invalid type"), "{e:?}");
    let e = refused("vcpu", &["vcpu=-1"]);
    assert_eq!(e.kind, ErrorKind::BadRequest);
    let e = refused("stats", &["foo=1"]);
    assert!(e.message.contains("unknown field `foo`"), "{e:?}");
    let e = refused("vcpu", &[]);
    assert!(e.message.contains("missing field `vcpu`"), "{e:?}");
    let e = refused("set-level", &["level=max"]);
    assert_eq!(e.kind, ErrorKind::BadRequest);
    // The message is the server's, word for word.
    let line = r#"{"cmd":"vcpu","vcpu":"abc"}"#;
    let server = parse_request(line.as_bytes()).unwrap_err().1;
    assert_eq!(refused("vcpu", &["vcpu=abc"]), server);
}

#[test]
fn refuses_malformed_arguments() {
    assert!(matches!(
        parse_command("vcpu", &args(&["vcpu"])),
        Err(CtlError::NotKeyValue(_))
    ));
    assert!(matches!(
        parse_command("vcpu", &args(&["=1"])),
        Err(CtlError::EmptyKey(_))
    ));
    assert!(matches!(
        parse_command("stats", &args(&["cmd=vcpu"])),
        Err(CtlError::ReservedKey(_))
    ));
    assert!(matches!(
        parse_command("vcpu", &args(&["vcpu=0", "vcpu=1"])),
        Err(CtlError::DuplicateKey(_))
    ));
}

#[test]
fn text_forms() {
    let raw = to_text("metrics", &Value::String("a 1\nb 2".into()));
    assert_eq!(raw, "a 1\nb 2\n");
    let flat = to_text(
        "version",
        &serde_json::json!({"version": "0.1.0", "api": 1, "x": {"y": [true, null]}}),
    );
    assert_eq!(flat, "api: 1\nversion: 0.1.0\nx.y.0: true\nx.y.1: null\n");
    let s = stats(&[vcpu(0, 1_000_000_000, 250_000_000, &[("io_out", 7)])], 1);
    let table = to_text("stats", &serde_json::to_value(&s).unwrap());
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    assert!(lines[0].starts_with("vm test"), "{table}");
    assert!(lines[1].contains("USED_MS") && lines[1].contains("EXITS"));
    assert!(lines[2].contains("1000.000") && lines[2].contains("250.000"));
    assert!(lines[2].ends_with(" 7"), "{table}");
}

fn opts(sock: &std::path::Path, command: &str, a: &[&str], text: bool) -> CtlOptions {
    CtlOptions {
        api_sock: sock.to_path_buf(),
        command: command.into(),
        args: args(a),
        text,
    }
}

#[test]
fn run_prints_results_and_errors() {
    let server = FakeServer::start(|req, _| {
        vec![Response::ok(req.id, serde_json::json!({"version": "x"})).to_line()]
    });
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run_to(
        opts(server.path(), "version", &[], true),
        &mut out,
        &mut err,
    );
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    assert_eq!(String::from_utf8_lossy(&out), "version: x\n");

    let server = FakeServer::start(|req, _| {
        let body = ErrorBody::new(ErrorKind::NoSuchVcpu, "the VM has no vCPU 9 (it has 1)");
        vec![Response::err(req.id, body).to_line()]
    });
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run_to(
        opts(server.path(), "vcpu", &["vcpu=9"], false),
        &mut out,
        &mut err,
    );
    assert_eq!(code, 1);
    assert_eq!(
        String::from_utf8_lossy(&err),
        "ppa-vmm ctl: no-such-vcpu: the VM has no vCPU 9 (it has 1)\n"
    );

    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run_to(
        opts(server.path(), "vcpu", &["vcpu=x"], false),
        &mut out,
        &mut err,
    );
    assert_eq!(code, 2);
    assert!(String::from_utf8_lossy(&err).starts_with("ppa-vmm ctl: bad arguments"));

    let missing = server.path().with_file_name("none.sock");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run_to(opts(&missing, "stats", &[], false), &mut out, &mut err);
    assert_eq!(code, 2);
    let msg = String::from_utf8_lossy(&err);
    assert!(msg.contains("there is no control socket at") && msg.contains("--api-sock"));
}

#[test]
fn subscribe_streams_until_close() {
    let server = FakeServer::start(|req, _| {
        vec![
            Response::ok(req.id, serde_json::json!({"events": ["vm-exit"]})).to_line(),
            "{\"event\":\"vm-exit\",\"uptime_ns\":5,\"end\":\"completed\"}\n".to_string(),
            CLOSE.into(),
        ]
    });
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let o = opts(server.path(), "subscribe", &["events=vm-exit"], false);
    let code = run_to(o, &mut out, &mut err);
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    assert_eq!(
        String::from_utf8_lossy(&out),
        "{\"events\":[\"vm-exit\"]}\n{\"event\":\"vm-exit\",\"uptime_ns\":5,\"end\":\"completed\"}\n"
    );
}

/// A server that answers `subscribe` with the kinds asked for, sends a threshold event
/// and, when `end`, the vm-exit event, then closes.
fn subscribe_server(end: bool) -> FakeServer {
    FakeServer::start(move |req, _| {
        let Command::Subscribe { events, .. } = &req.command else {
            panic!("{req:?}")
        };
        let mut lines = vec![
            Response::ok(req.id, serde_json::json!({ "events": events })).to_line(),
            "{\"event\":\"threshold\",\"uptime_ns\":1,\"vcpu\":0,\"name\":\"guest_run_ns\",\
             \"threshold_ns\":5,\"count\":1,\"total\":1}\n"
                .to_string(),
        ];
        if end {
            lines.push("{\"event\":\"vm-exit\",\"uptime_ns\":5,\"end\":\"shutdown\"}\n".into());
        }
        lines.push(CLOSE.into());
        lines
    })
}

#[test]
fn subscribe_tells_the_vms_end_from_a_lost_vmm() {
    // Asked for threshold events only: vm-exit is asked for too but not shown.
    let server = subscribe_server(true);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let o = opts(server.path(), "subscribe", &["events=threshold"], false);
    assert_eq!(run_to(o, &mut out, &mut err), 0);
    let out = String::from_utf8_lossy(&out);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "{\"events\":[\"threshold\"]}", "{out}");
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines[1].contains("\"threshold\""), "{out}");
    // The VMM went away without a vm-exit event: it was killed.
    let server = subscribe_server(false);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let o = opts(server.path(), "subscribe", &["events=threshold"], false);
    assert_eq!(run_to(o, &mut out, &mut err), crate::EXIT_VMM_LOST);
    let err = String::from_utf8_lossy(&err);
    assert!(err.contains("killed or crashed"), "{err}");
    // Every kind (the default) includes vm-exit.
    let server = subscribe_server(false);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let o = opts(server.path(), "subscribe", &[], false);
    assert_eq!(run_to(o, &mut out, &mut err), crate::EXIT_VMM_LOST);
}

fn group(name: &str, slots: usize) -> GroupStats {
    GroupStats {
        name: name.into(),
        vcpus: vec![0, 1],
        backend: ppa_vmm_api::LimitBackend::Vmm,
        limit: "50%".into(),
        quota_ns: 50_000_000,
        period_ns: 100_000_000,
        periods: 10,
        periods_ns: 1_000_000_000,
        throttled_periods: 9,
        used_ns: 500_123_000,
        stops: Default::default(),
        scope: Default::default(),
        devices_ns: 0,
        devices_limited_ns: 0,
        device_holds: 0,
        limited_ns: 400_000_000,
        turn_periods: 0,
        straddled_periods: 0,
        overshoot_max_ns: 41_000,
        overshoot: HistogramJson {
            frac_bits: 3,
            count: slots as u64,
            sum: 0,
            avg: 12_300,
            max: 41_000,
            p50: 11_000,
            p90: 30_000,
            p99: 40_000,
            p999: 41_000,
            slots: (0..slots)
                .map(|i| ppa_vmm_api::SlotJson {
                    slot: i,
                    lo: i as u64,
                    hi: i as u64,
                    count: 1,
                    sum: i as u64,
                })
                .collect(),
        },
        kicks: ppa_vmm_api::LimitKicks {
            path: ppa_vmm_api::LimitKick::Timer,
            timer: 9,
            rearms: 1,
            limiter: 0,
            stages: None,
        },
    }
}

#[test]
fn groups_text_is_one_line_per_limit() {
    let groups = vec![group("vm", 130), group("dataplane", 3)];
    let value = serde_json::to_value(&groups).unwrap();
    for cmd in ["groups", "set-limit"] {
        let text = to_text(cmd, &value);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1 + 2 + 1, "header, two limits, a note: {text}");
        assert!(lines[0].starts_with("GROUP") && lines[0].contains("P99_US"));
        let vm: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            vm,
            [
                "vm", "0,1", "50%", "vmm", "10", "9", "500.123", "50.01", "0", "0.000", "400.000",
                "130", "12.3", "11.0", "40.0", "41.0"
            ],
            "{text}"
        );
    }
    assert_eq!(to_text("groups", &serde_json::json!([])), "no CPU limits\n");
    // A limit whose timer stops were measured adds a line with each stage's p50/p99.
    let mut staged = group("dataplane", 3);
    let stage = |p50: u64, p99: u64| HistogramJson {
        count: 4,
        p50,
        p99,
        ..staged.overshoot.clone()
    };
    staged.kicks.stages = Some(ppa_vmm_api::KickStages {
        to_handler: stage(50_000, 120_000),
        to_decision: stage(3_000, 13_000),
        spin: stage(41_000, 97_000),
        to_park: stage(11_000, 25_500),
    });
    let text = to_text("groups", &serde_json::to_value([staged]).unwrap());
    assert_eq!(
        text.lines().last(),
        Some(
            "stop stages of dataplane: 4 timer stops, p50/p99 us to handler 50.0/120.0, \
             to decision 3.0/13.0, spin 41.0/97.0, to park 11.0/25.5"
        ),
        "{text}"
    );
    // Histogram slots elsewhere are summed up in one line.
    let h = serde_json::json!({"histogram": {"count": 2, "slots": [{"slot": 1}, {"slot": 2}]}});
    assert_eq!(
        to_text("histogram", &h),
        "histogram.count: 2\nhistogram.slots: 2 non-empty (listed in the JSON form)\n"
    );
}

/// Issue 28: `limit=150` was sent as the number 150 and refused with serde's "invalid type:
/// integer `150`, expected a string"; it is the limit `150`, which the server refuses with the
/// sentence `run --cpu-limit 150` gives.
#[test]
fn text_arguments_stay_text() {
    assert_eq!(
        parse_command("set-limit", &args(&["group=vm", "limit=150"])).unwrap(),
        Command::SetLimit {
            group: "vm".into(),
            limit: "150".into()
        }
    );
    assert_eq!(
        parse_command("set-limit", &args(&["group=7", r#"limit="50%""#])).unwrap(),
        Command::SetLimit {
            group: "7".into(),
            limit: "50%".into()
        }
    );
    assert_eq!(
        parse_command("histogram", &args(&["name=1"])).unwrap(),
        Command::Histogram {
            name: "1".into(),
            vcpu: None,
            format: HistogramFormat::Json
        }
    );
}

/// A server that answers `histogram` with its text form when asked for it, else JSON.
fn histogram_server() -> FakeServer {
    FakeServer::start(|req, _| {
        let Command::Histogram { format, .. } = &req.command else {
            panic!("{req:?}")
        };
        let result = match format {
            HistogramFormat::Text => {
                Value::String("slot 0 vcpu 0 count 3\nslot 1 vcpu 0 count 1\n".into())
            }
            HistogramFormat::Json => {
                serde_json::json!({"name": "guest_run", "histogram": {"slots": [[0, 3]]}})
            }
        };
        vec![Response::ok(req.id, result).to_line()]
    })
}

/// Issue 28: `format=text` printed a JSON string full of `\n`, and `--text` alone printed
/// "N non-empty (listed in the JSON form)"; either switch now prints the text form.
#[test]
fn one_switch_prints_a_histogram_as_text() {
    let server = histogram_server();
    let text = "slot 0 vcpu 0 count 3\nslot 1 vcpu 0 count 1\n";
    for (a, with_text) in [
        (&["name=guest_run", "format=text"][..], false),
        (&["name=guest_run"][..], true),
        (&["name=guest_run", "format=text"][..], true),
    ] {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run_to(
            opts(server.path(), "histogram", a, with_text),
            &mut out,
            &mut err,
        );
        assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
        assert_eq!(
            String::from_utf8_lossy(&out),
            text,
            "{a:?} --text {with_text}"
        );
    }
    // Asking for JSON explicitly keeps JSON.
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let o = opts(
        server.path(),
        "histogram",
        &["name=guest_run", "format=json"],
        false,
    );
    assert_eq!(run_to(o, &mut out, &mut err), 0);
    assert!(String::from_utf8_lossy(&out).contains("\"slots\""));
}

/// Issue 28: refusals quote their input cut to a few hundred bytes.
#[test]
fn refusals_quote_long_input_cut() {
    // Within the request's limit, so that each is refused for what it says.
    let long = "x".repeat(60_000);
    for e in [
        parse_command(&long, &[]).unwrap_err(),
        parse_command("vcpu", std::slice::from_ref(&long)).unwrap_err(),
        parse_command("vcpu", &[format!("vcpu=\"{long}\"")]).unwrap_err(),
        parse_command("stats", &[format!("{long}=1")]).unwrap_err(),
    ] {
        let m = e.to_string();
        assert!(m.len() < 2 * ppa_vmm_api::MESSAGE_MAX, "{}", m.len());
        assert!(m.contains('…'), "{m:.300}");
    }
}
