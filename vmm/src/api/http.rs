//! The HTTP side of the metrics endpoint: one request head in, one response out, then the
//! connection closes. Only `GET /metrics` is served (Prometheus text format).

use super::conn::{LineBuffer, Next};
use super::handler::Handler;

/// Longest HTTP request head accepted.
pub const MAX_HTTP_HEAD: usize = 8 << 10;

/// Takes a complete HTTP request head out of `input`; returns its request target.
pub fn http_head_complete(input: &mut LineBuffer) -> Option<String> {
    // A line end then an empty line, whichever of `\n` and `\r\n` each uses.
    if !input.contains(b"\n\n") && !input.contains(b"\n\r\n") {
        return None;
    }
    let mut first: Option<String> = None;
    loop {
        match input.next_line(MAX_HTTP_HEAD) {
            Next::Line(l) if l.is_empty() => return Some(first.unwrap_or_default()),
            Next::Line(l) => {
                if first.is_none() {
                    first = Some(String::from_utf8_lossy(&l).into_owned());
                }
            }
            Next::TooLong(_) | Next::Pending => return Some(first.unwrap_or_default()),
        }
    }
}

/// A whole HTTP/1.1 response that closes the connection.
pub fn http_response(status: &str, content_type: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// The response to a request line: the metrics for `GET /metrics`, an error otherwise.
pub fn http_reply(request_line: &str, handler: &mut Handler) -> String {
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => http_response(
            "200 OK",
            crate::metrics::CONTENT_TYPE,
            &handler.metrics_text(),
        ),
        ("GET", _) => http_response("404 Not Found", "text/plain", "only /metrics is served\n"),
        ("", _) => http_response("400 Bad Request", "text/plain", "bad request\n"),
        _ => http_response(
            "405 Method Not Allowed",
            "text/plain",
            "only GET is served\n",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_replies() {
        let mut h = Handler::new(crate::api::tests_support::handle(2), 0);
        let ok = http_reply("GET /metrics HTTP/1.1", &mut h);
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains("ppa_vcpu_used_seconds_total"), "{ok}");
        let body = ok.split("\r\n\r\n").nth(1).unwrap();
        let len: usize = ok
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(len, body.len());
        assert!(http_reply("GET / HTTP/1.1", &mut h).starts_with("HTTP/1.1 404"));
        assert!(http_reply("POST /metrics HTTP/1.1", &mut h).starts_with("HTTP/1.1 405"));
        assert!(http_reply("", &mut h).starts_with("HTTP/1.1 400"));
    }

    #[test]
    fn http_head_is_taken_whole() {
        let mut b = LineBuffer::default();
        b.push(b"GET /metrics HTTP/1.1\r\nHost: x\r\n");
        assert_eq!(http_head_complete(&mut b), None);
        b.push(b"Accept: */*\r\n\r\n");
        assert_eq!(
            http_head_complete(&mut b).as_deref(),
            Some("GET /metrics HTTP/1.1")
        );
        // A bare LF line end, then a CRLF empty line (found by the fuzzer: never taken).
        b.push(b"GET /metrics HTTP/1.1\nHost: x\n\r\n");
        assert_eq!(
            http_head_complete(&mut b).as_deref(),
            Some("GET /metrics HTTP/1.1")
        );
    }
}
