//! `[agent] metrics`: a small HTTP/1.1 responder for `/metrics` (Prometheus text format),
//! the live topology page `/` and its data `/topology.json`.
//!
//! GET and HEAD only, one request per connection (`Connection: close`), no request body.
//! Each connection is its own task, so a slow client never holds up the agent's loop: the
//! loop only answers the status request, as it does for `hyphae status`. Bounded on every
//! side: [`MAX_CONNECTIONS`] at once (more are closed unanswered), a request head of at
//! most [`MAX_REQUEST_HEAD`] bytes read within [`READ_TIMEOUT`], and the reply written
//! within [`WRITE_TIMEOUT`]. Why not an HTTP crate: docs/DECISIONS.md.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};

use crate::control::{Request, Status};
use crate::control_server::Call;

/// Connections served at once; a Prometheus server and a few open pages need far fewer.
const MAX_CONNECTIONS: usize = 32;

/// Longest request head (request line and headers) read; browsers send well under 2 KiB.
const MAX_REQUEST_HEAD: usize = 8192;

/// How long a client may take to send its request head.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// How long writing a reply may take.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the agent's loop may take to answer the status request.
const STATUS_TIMEOUT: Duration = Duration::from_secs(5);

/// The topology page: one file, no build step, nothing fetched from elsewhere.
const PAGE: &str = include_str!("topology.html");

/// The content type of the Prometheus text exposition format.
const METRICS_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Serves HTTP on `listener` until the agent stops.
pub(crate) async fn serve(listener: TcpListener, agent: mpsc::Sender<Call>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors (EMFILE) and the like: wait instead of spinning.
                tracing::warn!(error = %e, "metrics listener: cannot accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::debug!("metrics listener: too many connections, one closed");
            continue;
        };
        let agent = agent.clone();
        tokio::spawn(async move {
            connection(stream, &agent).await;
            drop(slot);
        });
    }
}

/// One connection: read the request head, answer it, close.
async fn connection(mut stream: TcpStream, agent: &mpsc::Sender<Call>) {
    let head = match tokio::time::timeout(READ_TIMEOUT, read_head(&mut stream)).await {
        Ok(Some(head)) => head,
        Ok(None) | Err(_) => return,
    };
    let (reply, with_body) = match parse_request_line(&head) {
        Err(reply) => (reply, true),
        Ok((method, path)) => (route(path, agent).await, method == Method::Get),
    };
    let write = write_reply(&mut stream, reply, with_body);
    let _ = tokio::time::timeout(WRITE_TIMEOUT, write).await;
}

/// Reads until the blank line that ends the head; `None` if the client closes first or the
/// head is longer than [`MAX_REQUEST_HEAD`].
async fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n") {
            return Some(String::from_utf8_lossy(&buf).into_owned());
        }
        if buf.len() > MAX_REQUEST_HEAD {
            return None;
        }
    }
}

#[derive(Debug, PartialEq)]
enum Method {
    Get,
    Head,
}

/// A reply: status line, content type, body.
#[derive(Debug)]
struct Reply {
    status: &'static str,
    content_type: &'static str,
    body: Vec<u8>,
}

impl Reply {
    fn ok(content_type: &'static str, body: impl Into<Vec<u8>>) -> Self {
        Self {
            status: "200 OK",
            content_type,
            body: body.into(),
        }
    }

    fn error(status: &'static str, message: &str) -> Self {
        Self {
            status,
            content_type: "text/plain; charset=utf-8",
            body: format!("{message}\n").into_bytes(),
        }
    }
}

/// The method and path (without query) of the request line, or the error reply.
fn parse_request_line(head: &str) -> Result<(Method, &str), Reply> {
    let line = head.lines().next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Reply::error("400 Bad Request", "bad request line"));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(Reply::error(
            "505 HTTP Version Not Supported",
            "HTTP/1.x only",
        ));
    }
    let method = match method {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        _ => return Err(Reply::error("405 Method Not Allowed", "GET or HEAD only")),
    };
    let path = target.split(['?', '#']).next().unwrap_or_default();
    Ok((method, path))
}

async fn route(path: &str, agent: &mpsc::Sender<Call>) -> Reply {
    match path {
        "/" | "/index.html" => Reply::ok("text/html; charset=utf-8", PAGE),
        "/metrics" => match status(agent).await {
            Ok(status) => match crate::metrics::encode(&status) {
                Ok(text) => Reply::ok(METRICS_TYPE, text),
                Err(e) => Reply::error("500 Internal Server Error", &e.to_string()),
            },
            Err(reply) => reply,
        },
        "/topology.json" => match status(agent).await {
            Ok(status) => Reply::ok(
                "application/json",
                crate::topology::Topology::from(&status).to_json(),
            ),
            Err(reply) => reply,
        },
        _ => Reply::error("404 Not Found", "not found: try / or /metrics"),
    }
}

/// The agent's status, asked from its loop as `hyphae status` does.
async fn status(agent: &mpsc::Sender<Call>) -> Result<Status, Reply> {
    let unavailable = |why: &str| Reply::error("503 Service Unavailable", why);
    let (call, rx) = Call::new(Request::Status);
    agent
        .send(call)
        .await
        .map_err(|_| unavailable("the agent is stopping"))?;
    let value = tokio::time::timeout(STATUS_TIMEOUT, rx)
        .await
        .map_err(|_| unavailable("the agent did not answer in time"))?
        .map_err(|_| unavailable("the agent is stopping"))?;
    serde_json::from_value(value).map_err(|e| unavailable(&format!("status: {e}")))
}

/// Writes `reply`; a HEAD request gets the head alone (with the body's length).
async fn write_reply(stream: &mut TcpStream, reply: Reply, with_body: bool) -> std::io::Result<()> {
    // The page's script and style are inline; nothing else may load or be sent anywhere.
    let head = format!(
        "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\
         Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n\
         Content-Security-Policy: default-src 'none'; script-src 'unsafe-inline'; \
         style-src 'unsafe-inline'; connect-src 'self'\r\n\r\n",
        reply.status,
        reply.content_type,
        reply.body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    if with_body {
        stream.write_all(&reply.body).await?;
    }
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines() {
        fn ok(head: &str) -> Result<(Method, &str), &'static str> {
            parse_request_line(head).map_err(|r| r.status)
        }
        assert_eq!(
            ok("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Ok((Method::Get, "/metrics"))
        );
        assert_eq!(
            ok("HEAD /topology.json?t=1 HTTP/1.0\r\n\r\n"),
            Ok((Method::Head, "/topology.json"))
        );
        assert_eq!(ok("POST / HTTP/1.1\r\n\r\n"), Err("405 Method Not Allowed"));
        assert_eq!(
            ok("GET / SPDY/3\r\n\r\n"),
            Err("505 HTTP Version Not Supported")
        );
        assert_eq!(ok("GET /\r\n\r\n"), Err("400 Bad Request"));
        assert_eq!(ok("GET / HTTP/1.1 x\r\n\r\n"), Err("400 Bad Request"));
        assert_eq!(ok(""), Err("400 Bad Request"));
    }
}
