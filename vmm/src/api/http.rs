//! The HTTP side of the metrics endpoint: one request head (at most [`MAX_HTTP_HEAD`] bytes)
//! in, one response out, then the connection closes. Only `GET /metrics` (Prometheus text
//! format) and `HEAD /metrics` (its head) are served; the request line is read as RFC 9112
//! says, by `ppa_vmm_api::http`, which `ppa-vmm host serve` shares.

use ppa_vmm_api::http::{metrics_request, MetricsRequest};

use super::conn::{LineBuffer, Next};
use super::handler::Handler;

pub use ppa_vmm_api::http::MAX_HTTP_HEAD;

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

pub use ppa_vmm_api::http::http_response;

/// The response to a request line: the metrics for `GET /metrics`, their head alone for
/// `HEAD /metrics`, an error otherwise (`ppa_vmm_api::http::metrics_request`: 400 for a line
/// that is not HTTP/1.x, 505 for another version, 404 for another path, 405 with `Allow` for
/// another method).
pub fn http_reply(request_line: &str, handler: &mut Handler) -> String {
    match metrics_request(request_line) {
        MetricsRequest::Refuse(response) => response,
        MetricsRequest::Serve { head_only } => {
            let full = http_response(
                "200 OK",
                crate::metrics::CONTENT_TYPE,
                &handler.metrics_text(),
            );
            if head_only {
                ppa_vmm_api::http::head_only(&full).to_string()
            } else {
                full
            }
        }
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
        let post = http_reply("POST /metrics HTTP/1.1", &mut h);
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        assert!(post.contains("\r\nAllow: GET, HEAD\r\n"), "{post}");
        assert!(http_reply("", &mut h).starts_with("HTTP/1.1 400"));
    }

    /// Issue 28: `HEAD /metrics` got 405 (`curl -I` health checks failed), an absolute-form
    /// target got 404, and a request line without a version got 200.
    #[test]
    fn head_absolute_form_and_what_is_not_http() {
        let mut h = Handler::new(crate::api::tests_support::handle(2), 0);
        let get = http_reply("GET /metrics HTTP/1.1", &mut h);
        let head = http_reply("HEAD /metrics HTTP/1.1", &mut h);
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(head.ends_with("\r\n\r\n"), "no body: {head}");
        assert_eq!(head, get[..head.len()], "the same head as GET's");
        for line in [
            "GET http://127.0.0.1:9464/metrics HTTP/1.1",
            "GET HTTP://localhost/metrics?x=1 HTTP/1.1",
            "GET /metrics?name[]=ppa HTTP/1.0",
        ] {
            assert!(
                http_reply(line, &mut h).starts_with("HTTP/1.1 200 OK"),
                "{line}"
            );
        }
        assert!(http_reply("GET http://host HTTP/1.1", &mut h).starts_with("HTTP/1.1 404"));
        // A multi-byte character across byte 7 of the target (the fuzzer's find: it panicked).
        assert!(http_reply("GET ÿÿÿÿ/metrics HTTP/1.1", &mut h).starts_with("HTTP/1.1 404"));
        for line in [
            "GET /metrics",
            "GET /metrics HTTP/1.1 extra",
            "GET  /metrics HTTP/1.1",
            "GET /metrics FTP/1.1",
            "GET /metrics HTTP/1",
            "G\u{1}T /metrics HTTP/1.1",
            "\u{16}\u{3}\u{1} /metrics HTTP/1.1",
        ] {
            assert!(
                http_reply(line, &mut h).starts_with("HTTP/1.1 400"),
                "{line:?}"
            );
        }
        assert!(http_reply("GET /metrics HTTP/2.0", &mut h).starts_with("HTTP/1.1 505"));
        assert!(http_reply("CONNECT host:80 HTTP/1.1", &mut h).starts_with("HTTP/1.1 405"));
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
