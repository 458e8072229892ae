//! Unit tests of request parsing and the wire shapes.

use super::*;
use serde_json::json;

fn parse(s: &str) -> Result<Request, (Value, ErrorBody)> {
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
        (r#"{"cmd":"groups"}"#, Command::Groups {}),
        (r#"{"cmd":"guest"}"#, Command::Guest {}),
        (r#"{"cmd":"pause"}"#, Command::Pause {}),
        (r#"{"cmd":"resume"}"#, Command::Resume {}),
        (r#"{"cmd":"shutdown"}"#, Command::Shutdown {}),
        (r#"{"cmd":"metrics"}"#, Command::Metrics {}),
        (
            r#"{"cmd":"subscribe","events":["vcpu-exit","threshold"]}"#,
            Command::Subscribe {
                events: vec![EventKind::VcpuExit, EventKind::Threshold],
            },
        ),
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
fn refuses_bad_requests_with_the_right_kind() {
    assert_eq!(kind("{"), ErrorKind::BadJson);
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
        end: "exited".into(),
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
