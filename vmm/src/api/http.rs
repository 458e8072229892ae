//! The HTTP side of the metrics endpoint: one request head (at most [`MAX_HTTP_HEAD`] bytes)
//! in, one response out, then the connection closes. Only `GET /metrics` is served
//! (Prometheus text format).

use super::conn::{LineBuffer, Next};
use super::handler::Handler;

/// Longest HTTP request head accepted (request line and headers, up to and including the
/// empty line that ends them).
pub const MAX_HTTP_HEAD: usize = 8 << 10;

/// What the bytes of an HTTP connection hold so far.
#[derive(Debug, PartialEq, Eq)]
pub enum Head {
    /// Not the whole head yet, and not over [`MAX_HTTP_HEAD`].
    Pending,
    /// The head is over [`MAX_HTTP_HEAD`], complete or not.
    TooLarge,
    /// A whole head: its request line.
    Complete(String),
}

/// Takes a complete HTTP request head out of `input`, or says why there is none.
pub fn http_head(input: &mut LineBuffer) -> Head {
    if !input.contains(b"\n\n") && !input.contains(b"\n\r\n") {
        return if input.len() > MAX_HTTP_HEAD {
            Head::TooLarge
        } else {
            Head::Pending
        };
    }
    let before = input.len();
    let mut first = None;
    while let Next::Line(l) = input.next_line(usize::MAX) {
        if l.is_empty() {
            break;
        }
        first.get_or_insert(l);
    }
    if before - input.len() > MAX_HTTP_HEAD {
        return Head::TooLarge;
    }
    Head::Complete(String::from_utf8_lossy(&first.unwrap_or_default()).into_owned())
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
        assert_eq!(http_head(&mut b), Head::Pending);
        b.push(b"Accept: */*\r\n\r\n");
        assert_eq!(
            http_head(&mut b),
            Head::Complete("GET /metrics HTTP/1.1".into())
        );
        let mut b = LineBuffer::default();
        b.push(b"GET /metrics HTTP/1.0\n\n");
        assert_eq!(
            http_head(&mut b),
            Head::Complete("GET /metrics HTTP/1.0".into())
        );
        // A bare LF line end, then a CRLF empty line (found by the fuzzer: never taken).
        b.push(b"GET /metrics HTTP/1.1\nHost: x\n\r\n");
        assert_eq!(
            http_head(&mut b),
            Head::Complete("GET /metrics HTTP/1.1".into())
        );
    }

    #[test]
    fn http_head_limit_is_exact() {
        let head = |total: usize| {
            let start = b"GET /metrics HTTP/1.1\r\nX: ";
            let mut h = start.to_vec();
            h.resize(total - 4, b'a');
            h.extend_from_slice(b"\r\n\r\n");
            assert_eq!(h.len(), total);
            h
        };
        let mut b = LineBuffer::default();
        b.push(&head(MAX_HTTP_HEAD));
        assert!(matches!(http_head(&mut b), Head::Complete(_)));
        // One byte more, arriving whole in one read: refused all the same.
        let mut b = LineBuffer::default();
        b.push(&head(MAX_HTTP_HEAD + 1));
        assert_eq!(http_head(&mut b), Head::TooLarge);
        // Over the limit without its end yet.
        let mut b = LineBuffer::default();
        b.push(&[b'a'; MAX_HTTP_HEAD + 1]);
        assert_eq!(http_head(&mut b), Head::TooLarge);
        let mut b = LineBuffer::default();
        b.push(&[b'a'; MAX_HTTP_HEAD]);
        assert_eq!(http_head(&mut b), Head::Pending);
    }
}
