//! The HTTP that both Prometheus endpoints speak, the VMM's `--metrics-addr` and `ppa-vmm host
//! serve`: one request head of at most [`MAX_HTTP_HEAD`] bytes in, one response out, then the
//! connection closes. Only `GET /metrics` and `HEAD /metrics` are served; the request line is
//! read as RFC 9112 says (origin or absolute form, a required HTTP/1.x version).
//!
//! Data flow: each server gathers a head its own way (the VMM in its event loop's line
//! buffer, `host serve` in its connection table) and hands the request line to
//! [`metrics_request`]: either the metrics are to be served (a whole response, or its head
//! alone for `HEAD`, built by [`http_response`]), or the answer is an error response, ready
//! to send.

/// Longest HTTP request head accepted (request line and headers, up to and including the
/// empty line that ends them).
pub const MAX_HTTP_HEAD: usize = 8 << 10;

/// A whole HTTP/1.1 response that closes the connection.
pub fn http_response(status: &str, content_type: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// `response` without its body: what `HEAD` gets (the same head as `GET`'s, its
/// Content-Length included).
pub fn head_only(response: &str) -> &str {
    let end = response.find("\r\n\r\n").map_or(response.len(), |i| i + 4);
    &response[..end]
}

/// What a request line asks of a metrics endpoint.
#[derive(Debug, PartialEq, Eq)]
pub enum MetricsRequest {
    /// The metrics: the whole response for `GET`, its head alone for `HEAD` (`true`).
    Serve {
        /// `HEAD`: the head alone.
        head_only: bool,
    },
    /// Anything else: this whole response (400, 404, 405 or 505).
    Refuse(String),
}

/// What a request line asks of a metrics endpoint: 400 for a line that is not HTTP/1.x, 505
/// for another version, 404 for another path, 405 with `Allow` for another method.
pub fn metrics_request(request_line: &str) -> MetricsRequest {
    match parse_request_line(request_line) {
        RequestLine::Bad => MetricsRequest::Refuse(http_response(
            "400 Bad Request",
            "text/plain",
            "bad request\n",
        )),
        RequestLine::Version => MetricsRequest::Refuse(http_response(
            "505 HTTP Version Not Supported",
            "text/plain",
            "only HTTP/1.0 and HTTP/1.1 are served\n",
        )),
        RequestLine::Request(method @ ("GET" | "HEAD"), "/metrics") => MetricsRequest::Serve {
            head_only: method == "HEAD",
        },
        RequestLine::Request("GET" | "HEAD", _) => MetricsRequest::Refuse(http_response(
            "404 Not Found",
            "text/plain",
            "only /metrics is served\n",
        )),
        RequestLine::Request(..) => MetricsRequest::Refuse(http_response(
            "405 Method Not Allowed\r\nAllow: GET, HEAD",
            "text/plain",
            "only GET and HEAD are served\n",
        )),
    }
}

/// Where the head in `bytes` ends (the index past its empty line), when it is whole.
pub fn head_end(bytes: &[u8]) -> Option<usize> {
    let lf = bytes.iter().position(|&b| b == b'\n')?;
    let mut at = lf;
    loop {
        let rest = &bytes[at + 1..];
        match rest {
            [b'\n', ..] => return Some(at + 2),
            [b'\r', b'\n', ..] => return Some(at + 3),
            _ => {}
        }
        at += 1 + rest.iter().position(|&b| b == b'\n')?;
    }
}

/// The request line of a whole head (without its line end).
pub fn request_line(head: &[u8]) -> String {
    let first = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let first = first.strip_suffix(b"\r").unwrap_or(first);
    String::from_utf8_lossy(first).into_owned()
}

/// What a request line asks for, read as RFC 9112 says.
#[derive(Debug, PartialEq, Eq)]
enum RequestLine<'a> {
    /// Method, and the path of the target (origin form, or the path of the absolute form).
    Request(&'a str, &'a str),
    /// An HTTP version other than 1.x.
    Version,
    /// Not an HTTP/1.x request line.
    Bad,
}

/// Whether `s` is a method token (RFC 9110 `tchar`s).
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Splits `METHOD SP TARGET SP HTTP/1.x` (the version is required: a line without one is
/// not HTTP/1.x); the target's path comes from its origin form (`/metrics?x`) or absolute
/// form (`http://host:port/metrics`).
fn parse_request_line(line: &str) -> RequestLine<'_> {
    let parts: Vec<&str> = line.split(' ').collect();
    let [method, target, version] = parts[..] else {
        return RequestLine::Bad;
    };
    let Some(v) = version.strip_prefix("HTTP/") else {
        return RequestLine::Bad;
    };
    let digits = |s: &str| s.len() == 1 && s.bytes().all(|b| b.is_ascii_digit());
    match v.split_once('.') {
        Some((major, minor)) if digits(major) && digits(minor) => {
            if major != "1" {
                return RequestLine::Version;
            }
        }
        _ => return RequestLine::Bad,
    }
    if !is_token(method) {
        return RequestLine::Bad;
    }
    let path_and_query = if target.starts_with('/') {
        target
    } else if target.len() > 7 && target.as_bytes()[..7].eq_ignore_ascii_case(b"http://") {
        // Absolute form: the authority, then the path (empty means `/`). Compared as bytes: a
        // target may have a multi-byte character across byte 7, and the 7 bytes matched are
        // ASCII, so byte 7 is then a character boundary.
        let rest = &target[7..];
        rest.find('/').map_or("/", |i| &rest[i..])
    } else {
        // Authority form (CONNECT) and asterisk form (OPTIONS) name no resource here.
        return RequestLine::Request(method, "");
    };
    let path = path_and_query.split(['?', '#']).next().unwrap_or("");
    RequestLine::Request(method, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(line: &str) -> String {
        match metrics_request(line) {
            MetricsRequest::Serve { head_only } => format!("serve {head_only}"),
            MetricsRequest::Refuse(r) => r.lines().next().unwrap().to_string(),
        }
    }

    #[test]
    fn request_lines_are_read_as_rfc_9112_says() {
        assert_eq!(status("GET /metrics HTTP/1.1"), "serve false");
        assert_eq!(status("HEAD /metrics HTTP/1.0"), "serve true");
        assert_eq!(
            status("GET http://127.0.0.1:9465/metrics?x=1 HTTP/1.1"),
            "serve false"
        );
        assert_eq!(status("GET / HTTP/1.1"), "HTTP/1.1 404 Not Found");
        assert_eq!(
            status("POST /metrics HTTP/1.1"),
            "HTTP/1.1 405 Method Not Allowed"
        );
        assert_eq!(
            status("GET /metrics HTTP/2.0"),
            "HTTP/1.1 505 HTTP Version Not Supported"
        );
        for bad in [
            "",
            "GET /metrics",
            "GET  /metrics HTTP/1.1",
            "G\u{1}T / HTTP/1.1",
        ] {
            assert_eq!(status(bad), "HTTP/1.1 400 Bad Request", "{bad:?}");
        }
    }

    #[test]
    fn a_head_ends_at_its_empty_line_whatever_the_line_ends() {
        assert_eq!(head_end(b"GET /metrics HTTP/1.1\r\nHost: x\r\n"), None);
        assert_eq!(head_end(b"GET /metrics HTTP/1.1\r\n\r\nrest"), Some(25));
        assert_eq!(head_end(b"GET /metrics HTTP/1.0\n\n"), Some(23));
        assert_eq!(head_end(b"GET / HTTP/1.1\nHost: x\n\r\n"), Some(25));
        assert_eq!(head_end(b"no line end"), None);
        assert_eq!(
            request_line(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            "GET /metrics HTTP/1.1"
        );
        let full = http_response("200 OK", "text/plain", "body");
        assert!(head_only(&full).ends_with("Content-Length: 4\r\nConnection: close\r\n\r\n"));
    }
}
