//! The control socket's server side: one task per connection reads one request line and
//! hands it to the agent's loop as a [`Call`]; the loop answers with the JSON reply
//! (docs/CONTROL.md), at once or (`set_name`) once the claim is decided.

use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot};

use crate::control::{self, Request};

/// A control request handed to the agent's loop, and where its reply goes.
pub(crate) struct Call {
    pub(crate) request: Request,
    pub(crate) reply: oneshot::Sender<serde_json::Value>,
}

impl Call {
    /// A request for the agent's loop, and where its reply will come.
    pub(crate) fn new(request: Request) -> (Self, oneshot::Receiver<serde_json::Value>) {
        let (reply, rx) = oneshot::channel();
        (Self { request, reply }, rx)
    }
}

/// How long a client may take to send its request line.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves the control socket until the agent stops.
pub(crate) async fn serve(listener: UnixListener, agent: mpsc::Sender<Call>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors (EMFILE) and the like: give the agent a moment to
                // free some instead of spinning on the error.
                tracing::warn!(error = %e, "control socket: cannot accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let agent = agent.clone();
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut line = String::new();
            let mut reader = BufReader::new(read).take(control::MAX_REQUEST as u64);
            match tokio::time::timeout(READ_TIMEOUT, reader.read_line(&mut line)).await {
                Ok(Ok(_)) => {}
                Ok(Err(_)) | Err(_) => return,
            }
            let reply = match serde_json::from_str::<Request>(&line) {
                Ok(request) => {
                    let (call, rx) = Call::new(request);
                    if agent.send(call).await.is_err() {
                        return;
                    }
                    match rx.await {
                        Ok(reply) => reply,
                        Err(_) => return,
                    }
                }
                Err(e) => json!({ "error": format!("bad request: {e}") }),
            };
            let _ = write.write_all(format!("{reply}\n").as_bytes()).await;
        });
    }
}
